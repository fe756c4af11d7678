"""Issue 36 item 4's levers on the stack, each measured alone in one run (``bench_stack.py --only levers``).

Each lever is a switch of the Celery workers' environment (default on in the product):

* ``preload``: ``NEXUS_CELERY_PRELOAD`` -- the workers import the nexus modules once before they fork;
* ``end_in_triggerer``: ``NEXUS_WAITS_END_IN_TRIGGERER`` -- a deferred wait that passes ends in the triggerer
  (Airflow's ``TaskSuccessEvent``), without a worker resuming it.

Per configuration (both off, each alone, both on), the two workers are restarted with its switches and a
``tenant_rollout`` of ``--lever-tenants`` fresh production-shaped MariaDB tenants runs to its end (the same form
and answerer as the rollout part). Each tenant has a short old backlog (:data:`BACKLOG` items) that its live old
runtime finishes at :data:`RATE` a second once the fence is armed (``arm_when_drain_below`` 0): its
``wait_for_drain`` defers inside the pause, the wait the triggerer lever acts on. One unmeasured rollout first
warms the stack (the first run after a start pays the DAGs' first parse and the workers' first tasks). Rounds
interleave the configurations (round r starts at configuration r), so a drift of the machine spreads over all
of them. Reported per configuration: the median over its tenants of the
admission pause less the answer's wait (what the product itself adds), of the pause's time in tasks and between
tasks, and each lever's ratio to both off (medians of the rounds).
"""

from __future__ import annotations

import statistics
import time
import uuid
from typing import Any

import benchlib
from stack_fleet import OldRuntime, _builder
from stack_report import say
from stack_rollout import CUTOVER_DAG, ROLLOUT_DAG, airflow_rollout, rollout_wave_size
from stack_rollout_tenants import rollout_tenants

from scripts.stack_topology import ProductionStack

#: configuration -> the workers' switches.
CONFIGURATIONS = {
    "neither": {"NEXUS_CELERY_PRELOAD": "0", "NEXUS_WAITS_END_IN_TRIGGERER": "0"},
    "preload": {"NEXUS_CELERY_PRELOAD": "1", "NEXUS_WAITS_END_IN_TRIGGERER": "0"},
    "end_in_triggerer": {"NEXUS_CELERY_PRELOAD": "0", "NEXUS_WAITS_END_IN_TRIGGERER": "1"},
    "both": {"NEXUS_CELERY_PRELOAD": "1", "NEXUS_WAITS_END_IN_TRIGGERER": "1"},
}
WORKERS = ("worker-1", "worker-2")


def switch_workers(stack: ProductionStack, switches: dict[str, str]) -> None:
    """Restart both workers with ``switches`` in their environment."""
    for name in WORKERS:
        stack.components[name].env.update(switches)
        stack.restart(name, wait=False)
    stack.wait_healthy()


BACKLOG, RATE = 6, 2.0


def one_rollout(stack: ProductionStack, server: str, tenants: int, limit_s: float) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:4]
    names = [f"lv{tag}{i:02d}" for i in range(tenants)]
    builders = {name: _builder("draining", 40 + i, {}, BACKLOG) for i, name in enumerate(names)}
    dsns = rollout_tenants(stack, server, names, connections=True, builders=builders)
    runtimes = [OldRuntime(dsns[n], n, RATE, once_fenced=True) for n in names]
    for r in runtimes:
        r.start()
    try:
        got = airflow_rollout(stack, names, limit_s, rollout_wave_size(len(names)), cutover={"arm_when_drain_below": 0})
    finally:
        for r in runtimes:
            r.halt.set()
    pause = got.get("admission_pause_less_answer_wait") or {}
    parts = got.get("pause_breakdown_median") or {}
    return {"state": got["state"], "succeeded": got["succeeded"], "tenants": tenants,
            "pause_less_answer_wait_s": pause.get("median_s"), "in_tasks_s": parts.get("in_tasks_s"),
            "between_s": parts.get("between_s"), "tasks_s": parts.get("tasks_s"), "wall_s": got["wall_s"]}


def measure_levers(stack: ProductionStack, args) -> dict[str, Any]:
    server = benchlib.server_url()
    stack.wait_for_dag(ROLLOUT_DAG, 120)
    stack.wait_for_dag(CUTOVER_DAG, 120)
    names = list(CONFIGURATIONS)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    switch_workers(stack, CONFIGURATIONS["both"])
    warm = one_rollout(stack, server, 1, args.rollout_limit)
    say(f"levers: warm-up rollout {warm['state']} (not measured)")
    for r in range(args.lever_rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            switch_workers(stack, CONFIGURATIONS[name])
            t0 = time.monotonic()
            got = one_rollout(stack, server, args.lever_tenants, args.rollout_limit)
            runs[name].append(got)
            say(f"levers: round {r + 1}, {name}: {got['state']} in {time.monotonic() - t0:.0f}s, pause less answer "
                f"wait {got['pause_less_answer_wait_s']} s (in tasks {got['in_tasks_s']}, between {got['between_s']})")
    switch_workers(stack, CONFIGURATIONS["both"])  # the product's defaults again

    def median_of(name: str, key: str) -> float | None:
        values = [r[key] for r in runs[name] if r.get(key) is not None and r["state"] == "success"]
        return round(statistics.median(values), 2) if values else None

    out: dict[str, Any] = {"tenants_per_rollout": args.lever_tenants, "rounds": args.lever_rounds,
                           "switches": CONFIGURATIONS, "runs": runs}
    for name in names:
        out[name] = {k: median_of(name, k) for k in ("pause_less_answer_wait_s", "in_tasks_s", "between_s")}
    base = out["neither"]["pause_less_answer_wait_s"]
    out["pause_ratio_vs_neither"] = {n: round(out[n]["pause_less_answer_wait_s"] / base, 3)
                                     if base and out[n]["pause_less_answer_wait_s"] else None for n in names}
    say(f"levers: pause less answer wait by configuration {({n: out[n]['pause_less_answer_wait_s'] for n in names})}; "
        f"ratio to neither {out['pause_ratio_vs_neither']}")
    return out

"""Issue 36 item 4's levers on the stack, each measured alone in one run (``bench_stack.py --only levers``).

Each lever is a switch of the Celery workers' environment (default on in the product):

* ``preload``: ``NEXUS_CELERY_PRELOAD`` -- the workers import the nexus modules once before they fork;
* ``end_in_triggerer``: ``NEXUS_WAITS_END_IN_TRIGGERER`` -- a deferred wait that passes ends in the triggerer
  (Airflow's ``TaskSuccessEvent``), without a worker resuming it;
* ``fused``: ``NEXUS_FUSED_TASKS`` -- the fused tasks of ``nexus_airflow.declared.FUSED`` (the new host's
  readiness wait and the release as one task); it changes the DAG's shape, so the DAG processor, the workers and
  the API server are restarted with it and the bench waits until the DAG Airflow serves has that shape.

Per configuration (``--levers``, default every one), the components are restarted with its switches and a
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

_OFF = {"NEXUS_CELERY_PRELOAD": "0", "NEXUS_WAITS_END_IN_TRIGGERER": "0", "NEXUS_FUSED_TASKS": "0"}
#: configuration -> the components' switches ("neither": every lever off).
CONFIGURATIONS = {
    "neither": _OFF,
    "preload": {**_OFF, "NEXUS_CELERY_PRELOAD": "1"},
    "end_in_triggerer": {**_OFF, "NEXUS_WAITS_END_IN_TRIGGERER": "1"},
    "both": {**_OFF, "NEXUS_CELERY_PRELOAD": "1", "NEXUS_WAITS_END_IN_TRIGGERER": "1"},
    "fused": {**_OFF, "NEXUS_FUSED_TASKS": "1"},
    "preload_fused": {**_OFF, "NEXUS_CELERY_PRELOAD": "1", "NEXUS_FUSED_TASKS": "1"},
}
#: The product's defaults (the configuration the stack is left in).
DEFAULTS = "preload_fused"
WORKERS = ("worker-1", "worker-2")
#: The components that parse the cutover DAG or read its XComs by the fused shape.
SHAPED = ("dag-processor", "api-server", *WORKERS)


def switch_workers(stack: ProductionStack, switches: dict[str, str]) -> None:
    """Restart the workers with ``switches`` in their environment (and, when the fused switch changes, the DAG
    processor and the API server too, then wait until the cutover DAG Airflow serves has the switch's shape)."""
    shape_changes = any(stack.components[n].env.get("NEXUS_FUSED_TASKS", "1") != switches["NEXUS_FUSED_TASKS"]
                        for n in SHAPED)
    for name in SHAPED if shape_changes else WORKERS:
        stack.components[name].env.update(switches)
        stack.restart(name, wait=False)
    stack.wait_healthy()
    stack.login()
    if shape_changes:
        wait_for_shape(stack, fused=switches["NEXUS_FUSED_TASKS"] == "1")


def wait_for_shape(stack: ProductionStack, *, fused: bool, timeout_s: float = 180.0) -> None:
    """Until the serialized cutover DAG has (``fused``) or lacks the fused tasks' shape: its task
    ``verify_readiness`` is absent when fused."""
    deadline = time.monotonic() + timeout_s
    while True:
        tasks = {t["task_id"] for t in stack.request("GET", f"/api/v2/dags/{CUTOVER_DAG}/tasks").get("tasks", [])}
        if tasks and ("verify_readiness" not in tasks) == fused:
            return
        if time.monotonic() > deadline:
            raise RuntimeError(f"the cutover DAG did not take the {'fused' if fused else 'unfused'} shape in "
                               f"{timeout_s:.0f}s: tasks {sorted(tasks)}")
        time.sleep(3.0)


BACKLOG, RATE = 6, 2.0


def one_rollout(stack: ProductionStack, server: str, tenants: int, limit_s: float, parallel: int | None = None) -> dict[str, Any]:
    tag = uuid.uuid4().hex[:4]
    names = [f"lv{tag}{i:02d}" for i in range(tenants)]
    builders = {name: _builder("draining", 40 + i, {}, BACKLOG) for i, name in enumerate(names)}
    dsns = rollout_tenants(stack, server, names, connections=True, builders=builders)
    runtimes = [OldRuntime(dsns[n], n, RATE, once_fenced=True) for n in names]
    for r in runtimes:
        r.start()
    try:
        wave = max(rollout_wave_size(len(names)), parallel or 0)  # --lever-parallel lanes in one wave
        got = airflow_rollout(stack, names, limit_s, wave, extra={"max_parallel": parallel} if parallel else None,
                              cutover={"arm_when_drain_below": 0})
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
    names = list(getattr(args, "levers", None) or CONFIGURATIONS)
    runs: dict[str, list[dict[str, Any]]] = {n: [] for n in names}
    switch_workers(stack, CONFIGURATIONS[DEFAULTS])
    warm = one_rollout(stack, server, 1, args.rollout_limit)
    say(f"levers: warm-up rollout {warm['state']} (not measured)")
    for r in range(args.lever_rounds):
        for name in names[r % len(names):] + names[:r % len(names)]:
            switch_workers(stack, CONFIGURATIONS[name])
            t0 = time.monotonic()
            got = one_rollout(stack, server, args.lever_tenants, args.rollout_limit, getattr(args, "lever_parallel", None))
            runs[name].append(got)
            say(f"levers: round {r + 1}, {name}: {got['state']} in {time.monotonic() - t0:.0f}s, pause less answer "
                f"wait {got['pause_less_answer_wait_s']} s (in tasks {got['in_tasks_s']}, between {got['between_s']})")
    switch_workers(stack, CONFIGURATIONS[DEFAULTS])  # the product's defaults again

    def median_of(name: str, key: str) -> float | None:
        values = [r[key] for r in runs[name] if r.get(key) is not None and r["state"] == "success"]
        return round(statistics.median(values), 2) if values else None

    out: dict[str, Any] = {"tenants_per_rollout": args.lever_tenants, "rounds": args.lever_rounds,
                           "switches": CONFIGURATIONS, "runs": runs}
    for name in names:
        out[name] = {k: median_of(name, k) for k in ("pause_less_answer_wait_s", "in_tasks_s", "between_s")}
    base = out[names[0]]["pause_less_answer_wait_s"]  # the first configuration named is the baseline
    out["pause_ratio_vs_baseline"] = {n: round(out[n]["pause_less_answer_wait_s"] / base, 3)
                                     if base and out[n]["pause_less_answer_wait_s"] else None for n in names}
    out["baseline"] = names[0]
    say(f"levers: pause less answer wait by configuration {({n: out[n]['pause_less_answer_wait_s'] for n in names})}; "
        f"ratio to {names[0]} {out['pause_ratio_vs_baseline']}")
    return out

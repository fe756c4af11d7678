"""Issue 36's production-shaped fleet (``bench_stack.py --only fleet``): no tenant's pause depends on another.

A real fleet is not drained. The tenants (``nexus_sim``'s production-shaped MariaDB tenant each) are drawn as
one is: most **drained**; some **draining** for a minute or two, a live old runtime finishing its old projection
backlog at a measured rate; a few with a **long** backlog (minutes); one whose drain **cannot finish** (an old
WorkItem leased to a live old worker that never completes it). Ordinary work arrives on every tenant
throughout (``nexus_sim.traffic.LiveTraffic``, ordinary only: the drain must not wait for it).

One ``tenant_rollout`` takes them all, the canary first and the rest in one wave with ``approval: per_wave``
(the wave's question asked for its ready tenants, a late one asking its own follow-up), the form's
``arm_when_drain_below`` at its default, every question answered by the bench once it parked plus a 3 s grace.
Reported per tenant: its kind, its outcome and the step it stopped at, its admission pause (the fence row's),
its own residual drain at arming (the pre-arm wait's last look: old items left, their ETA at the measured rate),
the seconds its question waited for the answer, and what its pause would be if it depended on nothing but that
tenant: that residual drain + its answer's wait + the CLI's own pause (``nexus-cutover run`` of a fresh drained
copy, measured in the same run). The fleet figure is the median over the succeeded tenants of pause / own pause.
"""

from __future__ import annotations

import datetime as dt
import statistics
import threading
import time
import uuid
from typing import Any

import benchlib
from stack_report import say
from stack_rollout import (
    CONFIRM,
    CUTOVER_DAG,
    ROLLOUT_DAG,
    Answerer,
    airflow_rollout,
    cli_rollout,
)
from stack_rollout_tenants import SLOW_OLD_WORKER, Heartbeat, rollout_tenants

from scripts.stack_topology import ProductionStack

#: kind -> (tenants quick, full), (old backlog items quick, full), items the old runtime finishes per second.
KINDS = {
    "drained": ((3, 8), (0, 0), 0.0),
    "draining": ((1, 3), (60, 120), 1.0),  # 1-2 minutes of drain when the rollout starts
    "long": ((1, 2), (360, 900), 2.0),  # 3-7.5 minutes
    "stuck": ((1, 1), (0, 0), 0.0),  # one item leased to a live old worker that never completes it
}
#: Each kind's part of its tenants' names.
CODES = {"drained": "dd", "draining": "dg", "long": "lg", "stuck": "st"}
#: The tenants' pre_arm_timeout (quick, full): above the long backlog's drain; the stuck tenant stops there.
PRE_ARM_TIMEOUT_S = (300, 720)
SIZES = {"active_packs": 1, "plain_lanes": 2, "generations": 2, "greenfield_pack": False}
WAVE_CONFIRM = "Confirm: every old writer of every tenant of this wave stopped"
BACKLOG_PACK = "pk-backlog"


class FleetAnswerer(Answerer):
    """Answers the tenants' own questions and the wave's, and says how long each waited."""

    def __init__(self, stack: ProductionStack):
        super().__init__(stack, options=(CONFIRM, WAVE_CONFIRM))

    def waits_by_question(self) -> dict[str, dict[str, Any]]:
        """Every answered question: its run, task and seconds asked -> answered."""
        from stack_rollout import _at

        return {f"{d['task_instance']['dag_run_id']}/{d['task_instance']['task_id']}": {
            "run_id": d["task_instance"]["dag_run_id"], "task": d["task_instance"]["task_id"],
            "wait_s": (_at(d["responded_at"]) - _at(d["created_at"])).total_seconds()}
            for d in self.details() if d.get("responded_at")}


def _builder(kind: str, seed: int, planted: dict[str, Any], backlog: int = 0):
    """The tenant factory ``rollout_tenants`` calls with the namespace: the production-shaped tenant, plus its
    kind's old backlog (a pack of pending old projection WorkItems) or stuck item; its Planted kept in
    ``planted`` (for its ordinary traffic)."""

    def for_namespace(ns: str):
        def build(engine) -> None:
            from nexus_cutover import catalog
            from nexus_cutover.clock import utcnow
            from nexus_sim.scenario import TenantScenario
            from nexus_sim.scenario.production import build_production_tenant

            planted[ns] = build_production_tenant(engine, namespace=ns, seed=seed, **SIZES).planted
            if not backlog and kind != "stuck":
                return
            more = TenantScenario(namespace=ns, event_id_start=900_000, work_id_start=900_000)
            pack = more.pack(BACKLOG_PACK)
            for lane in range(backlog):
                pack.lane(f"backlog-{lane:04d}").generation(1, status="pending")
            if kind == "stuck":
                pack.lane("lane-slow").generation(1, status="processing", lease_owner=SLOW_OLD_WORKER,
                                                  lease_expires_at=utcnow() + dt.timedelta(hours=2))
                more.process(catalog.ROLE_PROJECTION_WORKER, process_id=SLOW_OLD_WORKER)
            more.write(engine)

        return build

    return for_namespace


class OldRuntime(threading.Thread):
    """The tenant's live old runtime: finishes ``rate`` old items a second until its backlog is drained, then
    stops (its registry rows stopped: the writers a person would stop). ``once_fenced``: it only heartbeats until
    the cutover fence is armed (so the drain falls inside the pause, whenever the tenant's run arms)."""

    def __init__(self, dsn: str, namespace: str, rate: float, *, once_fenced: bool = False):
        super().__init__(daemon=True)
        self.dsn, self.namespace, self.rate, self.halt = dsn, namespace, rate, threading.Event()
        self.once_fenced = once_fenced
        self.drained_at: float | None = None
        self.errors: list[str] = []

    def run(self) -> None:
        from nexus_cutover.db import make_engine
        from nexus_sim.old_runtime import OldRuntimeSimulator

        engine = make_engine(self.dsn)
        sim = OldRuntimeSimulator(engine, self.namespace, process_id=f"old-rt-{self.namespace}", work_per_step=1,
                                  retry_delay_s=0.0)
        from nexus_cutover.projection.cutover_fence import cutover_fence_in_force

        try:
            sim.register()
            while not self.halt.wait(1.0 / self.rate):
                if self.once_fenced and cutover_fence_in_force(engine, self.namespace) is None:
                    sim._heartbeat_if_due()
                    continue
                self.once_fenced = False
                sim.step()
                if sim.drained():
                    sim.stop()
                    self.drained_at = time.monotonic()
                    return
        except Exception as exc:  # noqa: BLE001 - reported with the figures, never hidden
            self.errors.append(f"{type(exc).__name__}: {exc}")
        finally:
            engine.dispose()


def _own_question_wait(run_id: str, rollout_run: str, waits: dict[str, dict[str, Any]], shown: dict[int, set[str]],
                       tenant: str) -> float:
    """The seconds the question that confirmed ``tenant`` waited: its own, else its wave's."""
    own = waits.get(f"{run_id}/confirm_writers_stopped")
    if own:
        return own["wait_s"]
    for wave, tenants in shown.items():
        if tenant in tenants and (w := waits.get(f"{rollout_run}/wave_{wave:02d}.confirm")):
            return w["wait_s"]
    return 0.0


def measure_fleet(stack: ProductionStack, args) -> dict[str, Any]:
    server = benchlib.server_url()
    tag = uuid.uuid4().hex[:4]
    size = 0 if args.quick else 1
    counts = {kind: shape[0][size] for kind, shape in KINDS.items()}
    backlogs = {kind: shape[1][size] for kind, shape in KINDS.items()}
    names = {f"fl{tag}{CODES[kind]}{i:02d}": kind for kind, n in counts.items() for i in range(n)}
    order = sorted(names, key=lambda n: (names[n] != "drained", n))  # a drained canary, then the fleet
    planted: dict[str, Any] = {}
    builders = {name: _builder(names[name], 70 + i, planted, backlogs[names[name]]) for i, name in enumerate(order)}
    t0 = time.monotonic()
    dsns = rollout_tenants(stack, server, order, connections=True, builders=builders)
    say(f"fleet: {len(order)} production-shaped MariaDB tenants built in {time.monotonic() - t0:.0f}s ({counts})")
    stack.wait_for_dag(ROLLOUT_DAG, 120)
    stack.wait_for_dag(CUTOVER_DAG, 120)
    from nexus_cutover.db import make_engine
    from nexus_sim.traffic import LiveTraffic

    engines = {n: make_engine(dsns[n]) for n in order}
    traffic = {n: LiveTraffic(engines[n], planted[n], receipts_per_tick=0, future_per_tick=0,
                              ordinary_per_tick=1, complete_ordinary_per_tick=1, interval_s=3.0, seed=i).start()
               for i, n in enumerate(order)}
    runtimes = {n: OldRuntime(dsns[n], n, KINDS[k][2]) for n, k in names.items() if backlogs[k]}
    stuck = [Heartbeat(dsns[n], SLOW_OLD_WORKER) for n, k in names.items() if k == "stuck"]
    for thread in [*runtimes.values(), *stuck]:
        thread.start()
    started = time.monotonic()
    try:
        answerer = FleetAnswerer(stack)
        run = airflow_rollout(stack, order, args.fleet_limit, len(order) - 1, answerer=answerer,
                              extra={"approval": "per_wave", "max_parallel": min(16, len(order) - 1),
                                     "max_failed": 1},
                              cutover={"drain_timeout": 600, "pre_arm_timeout": PRE_ARM_TIMEOUT_S[size]})
    finally:
        for thread in [*runtimes.values(), *stuck]:
            thread.halt.set()
        for t in traffic.values():
            t.stop()
        for e in engines.values():
            e.dispose()
    rollout_run = run["rollout_run_id"]
    summary = (run.get("rollout_summary") or {}).get("tenants") or {}
    waits = {k: w for k, w in answerer.waits_by_question().items() if rollout_run in w["run_id"]}
    shown = {}
    for wave in range(2):
        with_shown = stack.xcom(ROLLOUT_DAG, rollout_run, f"wave_{wave:02d}.confirm", key="shown") or {}
        shown[wave] = set(with_shown)
    cli = cli_rollout(_cli_copies(stack, server, tag), 10, parallel=2)
    cli_pause = (cli.get("admission_pause") or {}).get("median_s")
    tenants: dict[str, Any] = {}
    for name in order:
        s = summary.get(name, {})
        run_id = s.get("run_id") or f"rollout__{rollout_run}__{name}"
        pre_arm = stack.xcom(CUTOVER_DAG, run_id, "wait_for_short_drain") or {}
        answer = _own_question_wait(run_id, rollout_run, waits, shown, name)
        residual = pre_arm.get("eta_s") if pre_arm.get("remaining") else 0.0
        own = (residual or 0.0) + answer + (cli_pause or 0.0) if s.get("state") == "success" else None
        pause = s.get("admission_pause_s")
        tenants[name] = {"kind": names[name], "state": s.get("state"), "stopped_at": s.get("task"),
                         "reason": s.get("reason"), "pause_s": pause,
                         "remaining_at_arming": pre_arm.get("remaining"), "residual_drain_eta_s": residual,
                         "answer_wait_s": round(answer, 1), "own_pause_s": round(own, 1) if own else None,
                         "pause_vs_own": round(pause / own, 2) if pause and own else None,
                         "old_runtime_errors": runtimes[name].errors if name in runtimes else []}
    ratios = [t["pause_vs_own"] for t in tenants.values() if t["pause_vs_own"]]
    over_own = sorted(t["pause_s"] - t["own_pause_s"] for t in tenants.values() if t["pause_s"] and t["own_pause_s"])
    out = {"tenants": len(order), "kinds": counts, "backlogs": backlogs, "pre_arm_timeout_s": PRE_ARM_TIMEOUT_S[size],
           "old_items_per_s": {k: shape[2] for k, shape in KINDS.items()}, "cli_pause_s": cli_pause,
           "wall_s": round(time.monotonic() - started, 1), "airflow": run, "per_tenant": tenants,
           "pause_vs_own_median": round(statistics.median(ratios), 2) if ratios else None,
           # the goal: pause <= own residual drain + answer wait + 10 s, p95 over the fleet
           "pause_over_own_p95_s": round(over_own[min(len(over_own) - 1, int(0.95 * len(over_own)))], 1)
           if over_own else None,
           "questions": waits}
    if getattr(args, "fleet_calm", False):  # the same wave without its slow tenants: is a drained tenant's pause the same?
        drained_wave = [t["pause_s"] for n, t in tenants.items() if t["kind"] == "drained" and n != order[0]
                        and t["pause_s"]]
        out["calm"] = calm_wave(stack, server, tag, counts["drained"], args.fleet_limit)
        calm_median = out["calm"].get("wave_pause_median_s")
        out["drained_wave_pause_median_s"] = round(statistics.median(drained_wave), 1) if drained_wave else None
        out["drained_pause_vs_calm_wave"] = (round(out["drained_wave_pause_median_s"] / calm_median, 2)
                                             if drained_wave and calm_median else None)
    say(f"fleet: {sum(t['state'] == 'success' for t in tenants.values())}/{len(order)} succeeded; pause vs own "
        f"median {out['pause_vs_own_median']}; per tenant: "
        + "; ".join(f"{n} {t['kind']} {t['state']} pause {t['pause_s']} own {t['own_pause_s']}"
                    for n, t in tenants.items()))
    return out


def calm_wave(stack: ProductionStack, server: str, tag: str, drained: int, limit_s: float) -> dict[str, Any]:
    """The fleet's drained tenants' rollout without the slow ones: ``drained`` fresh drained production-shaped tenants,
    a canary and one ``per_wave`` wave, answered as the fleet's; the wave tenants' median pause."""
    names = [f"cw{tag}{i:02d}" for i in range(drained)]
    builders = {name: _builder("drained", 110 + i, {}) for i, name in enumerate(names)}
    rollout_tenants(stack, server, names, connections=True, builders=builders)
    run = airflow_rollout(stack, names, limit_s, len(names) - 1, answerer=FleetAnswerer(stack),
                          extra={"approval": "per_wave", "max_parallel": min(16, len(names) - 1), "max_failed": 1})
    tenants = (run.get("rollout_summary") or {}).get("tenants") or {}
    wave = [t["admission_pause_s"] for n, t in tenants.items() if n != names[0] and t.get("admission_pause_s")]
    say(f"fleet: the calm wave ({drained} drained tenants): {run['state']}, wave pauses {sorted(wave)}")
    return {"tenants": drained, "state": run["state"], "succeeded": run["succeeded"], "wave_pauses_s": sorted(wave),
            "wave_pause_median_s": round(statistics.median(wave), 1) if wave else None}


def _cli_copies(stack: ProductionStack, server: str, tag: str) -> dict[str, str]:
    """Two fresh drained production-shaped tenants for the CLI's own pause (no Airflow connection): name -> DSN."""
    names = [f"cl{tag}{i}" for i in range(2)]
    builders = {name: _builder("drained", 90 + i, {}) for i, name in enumerate(names)}
    return rollout_tenants(stack, server, names, connections=False, builders=builders)

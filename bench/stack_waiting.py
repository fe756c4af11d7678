"""The part ``waiting`` of ``make bench-stack``: many tenants waiting in the cutover's drain trigger on one real
triggerer, then the failover of their triggers to the other (the measurement is described in bench/bench_stack.py).

* Each tenant is a copy of one SQLite file whose old projection work stays pending (leased by a live old worker,
  no one draining it), reached through its own Airflow connection ``nexus_bench_t_<i>`` (``AIRFLOW_CONN_*``); the
  bench DAG :data:`WAIT_DAG` (bench/stack_dags/) defers one task instance per tenant to the triggerer.
* No trigger may fire: every task instance must still be deferred at the end, else the part fails; then the run is
  ended, so that its triggers do not load the survivor during the rollout parts.
* Polls are counted from the trigger logs (one :data:`POLL_MARK` line a poll) only when every poll is logged
  (``--quiet-log-s 0``); the statements of one poll are counted by SQLite's trace callback on a copy.
* Every wait is bounded (:func:`wait_for`, ``--ramp-limit``).

Imports ``bench/stack_proc.py`` and ``bench/stack_report.py``; imported by ``bench/bench_stack.py`` (which puts
``bench/``, the repository and ``plugins/`` on ``sys.path`` first).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import shutil
import sqlite3
import time
from pathlib import Path
from typing import Any

from stack_proc import Sampler, cpu_s, held_across, idle, memory_mb
from stack_report import say

from nexus_cutover.polling import settled_after
from scripts.demo_airflow import ApiError
from scripts.stack_processes import wait_for as stack_wait_for
from scripts.stack_topology import ProductionStack

WAIT_DAG = "nexus_bench_waiting_tenants"
POLL_MARK = b"WorkItems remaining"  # in every DrainPoller message: one per poll in the trigger's log


# --------------------------------------------------------------------------- setup


def build_sqlite_tenant(path: Path) -> None:
    """Old projection work in every live status, leased by a live old worker: the drain stays ``waiting``. The
    additive schema is applied, as ``apply_schema`` has at every real drain (without it, each poll would look for
    the column again)."""
    from nexus_cutover import catalog
    from nexus_cutover.clock import utcnow
    from nexus_cutover.db import make_engine
    from nexus_cutover.schema import apply_steps, create_legacy_schema, projection_steps
    from nexus_sim.scenario import TenantScenario

    sqlite3.connect(path).close()
    engine = make_engine(f"sqlite:///{path}")
    try:
        create_legacy_schema(engine)
        sc = TenantScenario(namespace="bench")
        pack, now = sc.pack("pk-bench"), utcnow()
        for i, status in enumerate(("pending", "retry", "processing", "blocked")):
            extra = {"retry": {"attempt": 1, "next_attempt_at": now + dt.timedelta(days=30)},
                     "processing": {"lease_owner": "old-worker-1", "lease_expires_at": now + dt.timedelta(days=30)}}
            pack.lane(f"lane-{i}").generation(3, status=status, **extra.get(status, {}))
        sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-1")
        sc.write(engine)
        apply_steps(engine, projection_steps(engine))
    finally:
        engine.dispose()


def sqlite_tenants(root: Path, n: int) -> tuple[Path, dict[str, str]]:
    """``n`` copies of one built tenant; returns their folder and the ``AIRFLOW_CONN_*`` variables naming them."""
    folder = root / "tenants"
    folder.mkdir(parents=True)
    build_sqlite_tenant(folder / "t0.db")
    env = {}
    for i in range(n):
        if i:
            shutil.copyfile(folder / "t0.db", folder / f"t{i}.db")
        env[f"AIRFLOW_CONN_NEXUS_BENCH_T_{i}"] = json.dumps({"conn_type": "sqlite", "host": str(folder / f"t{i}.db")})
    return folder, env


def statements_per_poll(path: Path) -> int:
    """Statements SQLite runs for one steady-state poll of the real DrainPoller (its second poll)."""
    from sqlalchemy import event

    from nexus_airflow.pollers import DrainPoller

    os.environ["AIRFLOW_CONN_NEXUS_BENCH_PROBE"] = json.dumps({"conn_type": "sqlite", "host": str(path)})
    poller = DrainPoller("nexus_bench_probe", "bench", "2099-01-01T00:00:00", 30 * 86400.0)
    count = [0]
    event.listen(poller.engine, "connect",
                 lambda dbapi, _rec: dbapi.set_trace_callback(lambda _sql: count.__setitem__(0, count[0] + 1)))
    try:
        if poller.poll()["state"] != "waiting":
            raise RuntimeError("the bench tenant is not waiting: its drain would end")
        count[0] = 0
        poller.poll()
        return count[0]
    finally:
        poller.close()


# --------------------------------------------------------------------------- measuring


def trigger_log_polls(stack: ProductionStack, run_id: str) -> dict[int, dict[int, int]]:
    """job id -> {map index -> polls logged}, from every trigger log of the bench run."""
    base = stack.home / "logs" / f"dag_id={WAIT_DAG}" / f"run_id={run_id}" / "task_id=wait_for_drain"
    out: dict[int, dict[int, int]] = {}
    for path in base.glob("map_index=*/*.trigger.*.log"):
        job = int(path.name.rsplit(".trigger.", 1)[1].split(".")[0])
        index = int(path.parent.name.split("=")[1])
        with contextlib.suppress(OSError):
            out.setdefault(job, {})[index] = path.read_bytes().count(POLL_MARK)
    return out


def deferral_state(stack: ProductionStack, run_id: str) -> dict[str, int]:
    rows = stack.metadata("SELECT coalesce(ti.state, 'none'), coalesce(tr.triggerer_id, -1), count(*) FROM task_instance ti "
                          "LEFT JOIN trigger tr ON tr.id = ti.trigger_id WHERE ti.dag_id = %s AND ti.run_id = %s "
                          "GROUP BY 1, 2", (WAIT_DAG, run_id))
    out: dict[str, int] = {}
    for state, job, n in rows:
        out[state] = out.get(state, 0) + n
        if state == "deferred":
            out[f"job:{job}"] = out.get(f"job:{job}", 0) + n
    return out


def running_triggerer_jobs(stack: ProductionStack) -> list[int]:
    rows = stack.metadata("SELECT id FROM job WHERE job_type = 'TriggererJob' AND state = 'running' "
                          "AND latest_heartbeat > now() - interval '20 seconds' ORDER BY id")
    return [int(r[0]) for r in rows]


def wait_for(what: str, cond, timeout_s: float, every_s: float = 1.0):
    return stack_wait_for(what, cond, timeout_s, every_s)  # the bench looks every second (its takeover times)


def every_poll_logged(args) -> bool:
    """Whether each poll writes a trigger log line (``--quiet-log-s 0``): only then are polls counted from the logs.
    With the product's change-only log a tenant that does not change logs its first poll, then one line per 5 min."""
    return args.quiet_log_s is not None and args.quiet_log_s == 0


def steady(stack: ProductionStack, run_id: str, pid: int, job: int, n: int, base: dict, tenants_dir: Path,
           window_s: float, interval_s: float, per_poll: int, polls_logged: bool = True) -> dict[str, Any]:
    """One measured window on the triggerer ``pid`` (job ``job``) holding all ``n`` waiting tenants."""
    polls0 = sum(trigger_log_polls(stack, run_id).get(job, {}).values())
    c0, t0 = cpu_s(pid), time.monotonic()
    with Sampler(pid, tenants_dir) as s:
        time.sleep(window_s)
    elapsed = time.monotonic() - t0
    cpu = cpu_s(pid) - c0
    polls = sum(trigger_log_polls(stack, run_id).get(job, {}).values()) - polls0
    mem = memory_mb(pid)
    idle_cpu = base["cpu_core_fraction"] * elapsed
    return {
        "window_s": round(elapsed, 1), **{k: round(v, 1) for k, v in mem.items()},
        "mb_per_waiting_tenant": round((mem["rss_mb"] - base["rss_mb"]) / n, 4),
        "pss_mb_per_waiting_tenant": round((mem["pss_mb"] - base["pss_mb"]) / n, 4),
        "cpu_s": round(cpu, 2), "cpu_core_fraction": round(cpu / elapsed, 3),
        "cpu_ms_per_tenant_minute": round(cpu / elapsed * 60_000 / n, 3),
        "cpu_ms_per_tenant_minute_above_idle": round((cpu - idle_cpu) / elapsed * 60_000 / n, 3),
        **({"polls": polls, "polls_per_s": round(polls / elapsed, 2),
            "statements_per_s": round(polls * per_poll / elapsed, 1)} if polls_logged else
           {"polls": "not counted: polls are logged on a change only (--quiet-log-s 0 logs and counts each)"}),
        "expected_polls_per_s": round(n / interval_s, 2), "statements_per_poll": per_poll,
        "rss_mb_max": round(max(s.rss, default=0.0), 1), "open_tenant_files_samples": len(s.fds),
        "open_tenant_files_max": max(s.fds, default=0),
        "open_tenant_files_mean": round(sum(s.fds) / max(1, len(s.fds)), 3),
        "samples_with_open_tenant_files": sum(1 for f in s.fds if f),
        "idle_connections": held_across(s.tenants),
    }


def measure_waiting(stack: ProductionStack, args, tenants_dir: Path) -> dict[str, Any]:
    n, out = args.tenants, {"tenants": args.tenants, "poll_interval_s": args.poll_interval}
    out["statements_per_poll"] = per_poll = statements_per_poll(tenants_dir / "t0.db")
    t1, t2 = stack.components["triggerer-1"], stack.components["triggerer-2"]
    t2.stop()  # every trigger of the run goes to triggerer-1
    job1 = wait_for("one triggerer left", lambda: (lambda j: j[0] if len(j) == 1 else None)(running_triggerer_jobs(stack)),
                    90)
    out["idle_triggerer"] = base1 = idle(t1.pid, args.idle)
    say(f"waiting: triggerer-1 (job {job1}) idle: {base1}")
    started = time.monotonic()
    run_id = stack.trigger(WAIT_DAG, {})["dag_run_id"]
    wait_for(f"{n} task instances deferred", lambda: deferral_state(stack, run_id).get("deferred", 0) >= n, args.ramp_limit)
    out["all_deferred_s"] = round(time.monotonic() - started, 1)
    wait_for(f"{n} triggers on triggerer-1", lambda: deferral_state(stack, run_id).get(f"job:{job1}", 0) >= n, args.ramp_limit)
    out["all_assigned_s"] = round(time.monotonic() - started, 1)
    wait_for("every tenant polled", lambda: len(trigger_log_polls(stack, run_id).get(job1, {})) >= n, args.ramp_limit, 2.0)
    out["all_polled_s"] = round(time.monotonic() - started, 1)
    say(f"waiting: {n} deferred in {out['all_deferred_s']}s, on triggerer-1 in {out['all_assigned_s']}s, "
        f"all polled in {out['all_polled_s']}s")
    # past the first polls (each tenant's imports, its first has_column probe) and the wait's quick first looks
    time.sleep(args.poll_interval + settled_after(args.poll_interval))
    out["one_triggerer"] = steady(stack, run_id, t1.pid, job1, n, base1, tenants_dir, args.window, args.poll_interval, per_poll,
                                  every_poll_logged(args))
    say(f"waiting: one triggerer: {out['one_triggerer']}")
    out["failover"] = failover(stack, run_id, job1, n, tenants_dir, args, per_poll)
    state = deferral_state(stack, run_id)
    out["final_ti_states"] = state
    if state.get("deferred", 0) != n:
        raise RuntimeError(f"not every task instance is still deferred: {state}")
    # the waiting tenants are done with: their triggers must not load the survivor during the rollout
    try:
        stack.request("PATCH", f"/api/v2/dags/{WAIT_DAG}/dagRuns/{run_id}", {"state": "failed"})
        out["waiting_run_ended"] = True
    except ApiError as exc:
        out["waiting_run_ended"] = f"could not end the waiting run: {exc}"
    return out


def failover(stack: ProductionStack, run_id: str, job1: int, n: int, tenants_dir: Path, args, per_poll: int) -> dict:
    """triggerer-2 started again (idle), triggerer-1 SIGKILLed: the survivor takes every trigger over."""
    t2 = stack.components["triggerer-2"]
    t2.start()
    job2 = wait_for("triggerer-2 heartbeating",
                    lambda: next((j for j in running_triggerer_jobs(stack) if j != job1), None), 120)
    time.sleep(5)  # past its start-up
    out: dict[str, Any] = {"survivor_idle": (base2 := idle(t2.pid, args.idle))}
    out["held_by_survivor_before_kill"] = deferral_state(stack, run_id).get(f"job:{job2}", 0)
    polls_before = trigger_log_polls(stack, run_id)
    out["polls_on_killed_before_kill"] = sum(polls_before.get(job1, {}).values())
    killed_at = time.monotonic()
    stack.kill("triggerer-1")
    say(f"failover: triggerer-1 (job {job1}) SIGKILLed; triggerer-2 is job {job2}")
    wait_for(f"{n} triggers on the survivor", lambda: deferral_state(stack, run_id).get(f"job:{job2}", 0) >= n,
             args.ramp_limit)
    out["takeover_all_assigned_s"] = round(time.monotonic() - killed_at, 1)
    wait_for("every tenant polled on the survivor", lambda: len(trigger_log_polls(stack, run_id).get(job2, {})) >= n,
             args.ramp_limit, 2.0)
    out["takeover_all_polled_s"] = round(time.monotonic() - killed_at, 1)
    say(f"failover: all {n} on the survivor after {out['takeover_all_assigned_s']}s, all polled there after "
        f"{out['takeover_all_polled_s']}s")
    time.sleep(args.poll_interval + settled_after(args.poll_interval))  # a trigger taken over starts its wait anew
    out["survivor"] = steady(stack, run_id, t2.pid, job2, n, base2, tenants_dir, args.window, args.poll_interval, per_poll,
                             every_poll_logged(args))
    say(f"failover: survivor: {out['survivor']}")
    return out

"""Issue 13's scale figures on the real distributed Airflow stack (``make bench-stack``).

    bash scripts/with-mariadb.sh .venv/bin/python bench/bench_stack.py [--quick] [--only waiting rollout]

One stack of ``scripts/stack.py`` (PostgreSQL metadata, Redis, CeleryExecutor: scheduler, dag-processor,
api-server, two triggerers, two Celery workers; every process separate), started and stopped here, with a
dags folder of its own: the project's ``dags/*.py`` (copied) plus ``bench/stack_dags/``.

**waiting** -- ``--tenants`` tenants waiting in the cutover's drain trigger on one real triggerer process.
Each tenant is its own SQLite file with old projection work that stays pending (a live old worker, no one
draining it), reached through its own Airflow connection ``nexus_bench_t_<i>`` (``AIRFLOW_CONN_*``). The
bench DAG ``nexus_bench_waiting_tenants`` maps one ``start_from_trigger`` task over the tenants: the scheduler
defers every task instance straight to the triggerer (no worker), where the real ``StatusPollTrigger`` runs
the real ``DrainPoller``. triggerer-2 is stopped first, so triggerer-1 takes every trigger. Measured on that
process tree from /proc: RSS (and PSS) idle, then with every tenant waiting (per tenant: the difference / N),
CPU (utime+stime) over ``--window`` s per tenant-minute, the polls made (one line per poll in each trigger's
log, with ``--quiet-log-s 0``: the product logs a wait's change only) times the statements one poll sends
(counted by SQLite's trace callback on a copy, the same poller),
and the tenant-database files held open, sampled every 0.5 s (an open handle between polls would stay
visible; polls in flight are the only expected ones). Then triggerer-2 is started again, triggerer-1 is
SIGKILLed: the time until the survivor holds every trigger and until every tenant polled there, and the
survivor's memory and CPU after. No trigger may fire (every task instance stays deferred).

**rollout** -- ``--rollout-tenants`` MariaDB tenants (default 11: the canary and one wave of 10; 100 does not
fit the time on 2 cores) with small drained histories and no old writers, through ``tenant_rollout`` (form
fields ``tenants`` and ``cutover_conf`` only, its other fields at their defaults), each tenant's writer-stop
confirmation answered over REST by this script as a second user, each tenant's new host stopped once its run
succeeded; against the floor: the same steps for fresh copies of the same tenants by ``nexus-cutover run``,
4 at a time (the rollout's ``max_parallel``), same poll interval. Wall time per tenant = total wall / tenants.
The waiting run is ended first (its 1,000 triggers would fill the survivor's capacity).

**preflight** -- issue 27's ``preflight_vs_plan_loop`` (``bench/bench_preflight.py``: the fleet preflight over
``--preflight-tenants`` production-shaped MariaDB tenants against a loop of ``nexus-cutover plan`` at the same
concurrency, one run, interleaved rounds). Needs no Airflow process: measured before the stack starts, and a run
of ``--only preflight`` starts no stack.

Figures go under the key ``stack`` of bench/results.json (merged: other figures are kept).
"""

from __future__ import annotations

import argparse
import contextlib
import copy
import datetime as dt
import json
import os
import random
import re
import shutil
import sqlite3
import statistics
import subprocess
import sys
import tempfile
import threading
import time
import uuid
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(BENCH), str(REPO), str(REPO / "plugins")]
import benchlib  # noqa: E402
from bench_preflight import GOAL as PREFLIGHT_GOAL  # noqa: E402

from nexus_airflow.metrics import pause_summary  # noqa: E402  (the rollout summary's own median/p95)
from nexus_airflow.rollout import MAX_WAVES  # noqa: E402
from nexus_cutover.polling import settled_after  # noqa: E402
from scripts.demo_airflow import ApiError  # noqa: E402
from scripts.stack import ProductionStack, descendants, mariadb_tenant, pids_with_env, signal_all  # noqa: E402
from scripts.stack import wait_for as stack_wait_for  # noqa: E402

WAIT_DAG = "nexus_bench_waiting_tenants"
ROLLOUT_DAG = "tenant_rollout"
CUTOVER_DAG = "connector_projection_cutover"
CONFIRM = "Confirm: all old writers stopped"
POLL_MARK = b"WorkItems remaining"  # in every DrainPoller message: one per poll in the trigger's log
CLK = os.sysconf("SC_CLK_TCK")
GOALS = {"mb_per_waiting_tenant": 0.2, "cpu_ms_per_tenant_minute": 20.0, "idle_connections": 0,
         "preflight_vs_plan_loop": PREFLIGHT_GOAL}


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


# --------------------------------------------------------------------------- /proc


def tree(pid: int) -> list[int]:
    return [pid, *descendants(pid)]


def _status_kb(pid: int, field: str, name: str = "status") -> int:
    try:
        for line in Path(f"/proc/{pid}/{name}").read_text().splitlines():
            if line.startswith(field + ":"):
                return int(line.split()[1])
    except OSError:
        pass
    return 0


def memory_mb(pid: int) -> dict[str, float]:
    """RSS and PSS of the process tree (PSS counts a page shared by the tree's processes once)."""
    pids = tree(pid)
    return {"rss_mb": sum(_status_kb(p, "VmRSS") for p in pids) / 1024,
            "pss_mb": sum(_status_kb(p, "Pss", "smaps_rollup") for p in pids) / 1024, "processes": len(pids)}


def cpu_s(pid: int) -> float:
    """utime+stime of the tree, plus what its reaped children used (cutime+cstime)."""
    total = 0
    for p in tree(pid):
        try:
            st = Path(f"/proc/{p}/stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        total += sum(int(x) for x in st[11:15])
    return total / CLK


def open_tenant_files(pid: int, tenants_dir: Path) -> tuple[int, frozenset[str]]:
    """File descriptors of the tree on tenant database files (a .db, its -wal, its -shm), and the tenants."""
    prefix, n, tenants = str(tenants_dir) + "/", 0, set()
    for p in tree(pid):
        with contextlib.suppress(OSError):
            for fd in os.listdir(f"/proc/{p}/fd"):
                with contextlib.suppress(OSError):
                    target = os.readlink(f"/proc/{p}/fd/{fd}")
                    if target.startswith(prefix):
                        n += 1
                        tenants.add(target[len(prefix):].split(".db", 1)[0])
    return n, frozenset(tenants)


def held_across(samples: list[frozenset[str]], k: int = 3) -> int:
    """Most tenants whose database stayed open in ``k`` consecutive samples (>= (k-1) x the period): a
    connection kept between polls shows here; a poll in flight (milliseconds) does not."""
    return max((len(frozenset.intersection(*samples[i:i + k])) for i in range(len(samples) - k + 1)), default=0)


class Sampler:
    """Samples memory and open tenant files of one process tree every ``every_s`` in a thread."""

    def __init__(self, pid: int, tenants_dir: Path, every_s: float = 0.5):
        self.pid, self.dir, self.every = pid, tenants_dir, every_s
        self.fds: list[int] = []
        self.tenants: list[frozenset[str]] = []
        self.rss: list[float] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.is_set():
            fds, tenants = open_tenant_files(self.pid, self.dir)
            self.fds.append(fds)
            self.tenants.append(tenants)
            self.rss.append(memory_mb(self.pid)["rss_mb"])
            self._stop.wait(self.every)

    def __enter__(self) -> Sampler:
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join(10)


# --------------------------------------------------------------------------- waiting tenants: setup


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


def dags_folder(root: Path) -> Path:
    """The project's DAG files (copied) plus the bench-only DAG."""
    folder = root / "dags"
    folder.mkdir(parents=True)
    for src in [*sorted((REPO / "dags").glob("*.py")), *sorted((BENCH / "stack_dags").glob("*.py"))]:
        shutil.copyfile(src, folder / src.name)
    return folder


# --------------------------------------------------------------------------- waiting tenants: measuring


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


def idle(pid: int, seconds: float) -> dict[str, float]:
    c0, t0 = cpu_s(pid), time.monotonic()
    time.sleep(seconds)
    cpu = cpu_s(pid) - c0
    return {**memory_mb(pid), "cpu_core_fraction": cpu / (time.monotonic() - t0)}


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


# --------------------------------------------------------------------------- rollout


def drained_tenant(namespace: str, extra: Callable[[Any, Any], None] | None = None):
    """One pack's drained history; ``extra(scenario, pack)`` adds to it before it is written."""
    def build(engine) -> None:
        from nexus_cutover.schema import create_legacy_schema
        from nexus_sim.scenario import TenantScenario, drained_pack_history

        create_legacy_schema(engine)
        sc = TenantScenario(namespace=namespace)
        pack = sc.pack("pk-one")
        drained_pack_history(pack, random.Random(11), lanes=3, generations=4)
        if extra is not None:
            extra(sc, pack)
        sc.write(engine)

    return build


def rollout_conf() -> dict[str, Any]:
    """The shared per-tenant fields (tests/stack's: poll 10 s, the runbook's floor; the reference host)."""
    return {"host_controller": "command", "poll_interval": 10, "stale_heartbeat": 20, "drain_timeout": 300,
            "writers_stop_timeout": 120, "confirm_timeout": 900, "readiness_timeout": 120, "checkpoint_timeout": 60}


APPROVER = "approver"  # a second user of the stack: the one who triggered a run may not confirm it


class Answerer:
    """Answers every pending writer-stop confirmation of the cutover runs over REST, logged in as
    :data:`APPROVER` (a person other than the one who triggered the rollout, as in the UI)."""

    def __init__(self, stack: ProductionStack, grace_s: float = 3.0):
        self.stack, self.grace = copy.copy(stack), grace_s
        body = stack.request("POST", "/auth/token", {"username": APPROVER, "password": stack_password(stack, APPROVER)},
                             auth=False)
        self.stack.token = body["access_token"]
        self.first_seen: dict[str, float] = {}
        self.answered: set[str] = set()
        self.other: list[str] = []

    def tick(self) -> None:
        for d in self.details():
            ti = d["task_instance"]
            key = f"{ti['dag_id']}/{ti['dag_run_id']}/{ti['task_id']}/{ti.get('map_index', -1)}"
            if d.get("response_received") or key in self.answered:
                continue
            if ti["dag_id"] != CUTOVER_DAG or CONFIRM not in d["options"]:
                if key not in self.other:
                    self.other.append(key)
                    say(f"rollout: a question this bench does not answer: {key} {d['options']}")
                continue
            # a HITL answered within ~1 s of parking can be lost (apache/airflow#71172): a short grace
            if time.monotonic() - self.first_seen.setdefault(key, time.monotonic()) < self.grace:
                continue
            self.stack.answer_hitl(ti["dag_id"], ti["dag_run_id"], ti["task_id"], CONFIRM, ti.get("map_index", -1))
            self.answered.add(key)

    def details(self) -> list[dict]:
        """Every HITL detail, page by page: the API serves at most 100 a page whatever ``limit`` says (a 300-tenant
        rollout's questions past the first 100 went unanswered and timed out when only the first page was read)."""
        return self.stack.paged("/api/v2/dags/~/dagRuns/~/hitlDetails", "hitl_details")

    def answer_waits(self) -> dict[str, float]:
        """Per cutover run, the seconds its writer-stop question waited for this answerer (asked -> answered:
        the grace and this loop's own latency, a person's time in a real rollout, not the product's)."""
        return {d["task_instance"]["dag_run_id"]: (_at(d["responded_at"]) - _at(d["created_at"])).total_seconds()
                for d in self.details()
                if d["task_instance"]["dag_id"] == CUTOVER_DAG and d.get("responded_at") and CONFIRM in d["options"]}


def stack_password(stack: ProductionStack, user: str) -> str:
    return json.loads((stack.home / "simple_auth_manager_passwords.json.generated").read_text())[user]


def stop_host(pid: int | None) -> None:
    from scripts.demo import stop_pid_if_ours

    if pid:
        stop_pid_if_ours(int(pid), "nexus")


#: The old worker of the tenant whose drain times out: its item stays leased to it while it heartbeats.
SLOW_OLD_WORKER = "old-worker-slow"


def audit_refusing_tenant(namespace: str):
    """Drained, plus a lane whose coalesced ordinal-0 inputs sit beside positive ordinals: the audit refuses
    (``mixed_history_indirect``) and the tenant's run stops at ``audit_and_checkpoint``, writing nothing."""
    def mixed(_sc, pack) -> None:
        lane = pack.lane("lane-mixed")
        lane.generation(2, legacy=True)
        lane.generation(1)
    return drained_tenant(namespace, mixed)


def slow_drain_tenant(namespace: str):
    """Drained, plus one old WorkItem ``processing`` under a live lease of :data:`SLOW_OLD_WORKER`, which
    heartbeats (the bench's :class:`Heartbeat`) and never completes it: the drain waits to its timeout."""
    def leased(sc, pack) -> None:
        from nexus_cutover import catalog
        from nexus_cutover.clock import utcnow

        pack.lane("lane-slow").generation(1, status="processing", lease_owner=SLOW_OLD_WORKER,
                                          lease_expires_at=utcnow() + dt.timedelta(hours=2))
        sc.process(catalog.ROLE_PROJECTION_WORKER, process_id=SLOW_OLD_WORKER)
    return drained_tenant(namespace, leased)


class Heartbeat(threading.Thread):
    """Keeps a registry row's heartbeat fresh every ``every_s`` until stopped (an old worker that is alive)."""

    def __init__(self, dsn: str, process_id: str, every_s: float = 5.0):
        super().__init__(daemon=True)
        self.dsn, self.process_id, self.every_s, self.halt = dsn, process_id, every_s, threading.Event()

    def run(self) -> None:
        from sqlalchemy import update

        from nexus_cutover import catalog
        from nexus_cutover.clock import utcnow
        from nexus_cutover.db import make_engine

        engine = make_engine(self.dsn)
        try:
            while not self.halt.wait(self.every_s):
                with engine.begin() as conn:
                    conn.execute(update(catalog.ProcessRegistry)
                                 .where(catalog.ProcessRegistry.c.ProcessId == self.process_id)
                                 .values(LastHeartbeatAt=utcnow()))
        finally:
            engine.dispose()


def rollout_tenants(stack: ProductionStack, server: str, names: list[str], *, connections: bool,
                    builders: dict[str, Any] | None = None, unreachable: tuple[str, ...] = ()) -> dict[str, str]:
    """One MariaDB database per tenant (built 4 at a time; ``builders`` per tenant, else drained); returns
    tenant -> DSN (never printed). An ``unreachable`` tenant's connection names a port nothing listens on."""

    def one(name: str) -> tuple[str, str]:
        made = mariadb_tenant(server, f"nx_bench_{name}", (builders or {}).get(name, drained_tenant)(name))
        if connections:
            conn = {**made["conn"], "port": 1} if name in unreachable else made["conn"]
            stack.put_connection(f"nexus_tenant_{name}", **conn)
        return name, made["dsn"]

    with ThreadPoolExecutor(4) as pool:
        return dict(pool.map(one, names))


def measure_rollout(stack: ProductionStack, args) -> dict[str, Any]:
    server = benchlib.server_url()
    tag = uuid.uuid4().hex[:4]
    names = [f"ro{tag}{i:03d}" for i in range(args.rollout_tenants)]
    t0 = time.monotonic()
    rollout_tenants(stack, server, names, connections=True)
    say(f"rollout: {len(names)} MariaDB tenants built in {time.monotonic() - t0:.0f}s")
    stack.wait_for_dag(ROLLOUT_DAG, 120)
    stack.wait_for_dag(CUTOVER_DAG, 120)
    wave_size = rollout_wave_size(len(names))
    out: dict[str, Any] = {"tenants": len(names), "parallel": 4, "wave_size": wave_size,
                           "poll_interval_s": rollout_conf()["poll_interval"]}
    out["airflow"] = airflow_rollout(stack, names, args.rollout_limit, wave_size)
    out.update(against_cli_floor(stack, server, out["airflow"], [f"cl{tag}{i:03d}" for i in range(args.rollout_tenants)],
                                 out["airflow"]["wall_s_per_tenant"]))
    return out


def against_cli_floor(stack: ProductionStack, server: str, a: dict[str, Any], cli_names: list[str],
                      airflow_s_per_tenant: float | None, *, parallel: int = 4) -> dict[str, Any]:
    """The CLI floor over fresh drained tenants (``nexus-cutover run``, ``parallel`` at a time) and the Airflow
    rollout's figures over it: wall per tenant, the admission pause's median and p95 (with and without the
    answer's wait)."""
    dsns = rollout_tenants(stack, server, cli_names, connections=False)
    out: dict[str, Any] = {"cli_floor": cli_rollout(dsns, rollout_conf()["poll_interval"], parallel)}
    c = out["cli_floor"]
    if airflow_s_per_tenant and c["wall_s_per_tenant"]:
        out["airflow_over_cli_floor"] = round(airflow_s_per_tenant / c["wall_s_per_tenant"], 2)
    # The admission pause (fence armed -> released, the fence row's own times; the answer given at once in both)
    a_pause, c_pause = (a.get("rollout_summary") or {}).get("admission_pause"), c["admission_pause"]
    if a_pause and c_pause:
        for stat in ("median_s", "p95_s"):
            out[f"admission_pause_{stat[:-2]}_over_cli"] = round(a_pause[stat] / c_pause[stat], 2)
    # The same, less the seconds each question waited for its answer (the CLI's answer is a flag: no wait)
    less = a.get("admission_pause_less_answer_wait")
    if less and c_pause:
        for stat in ("median_s", "p95_s"):
            out[f"admission_pause_less_answer_wait_{stat[:-2]}_over_cli"] = round(less[stat] / c_pause[stat], 2)
    return out


def rollout_wave_size(tenants: int) -> int:
    """The form's default wave size (10), or the smallest that keeps the canary and the waves within the DAG's
    :data:`MAX_WAVES` (the form refuses more: 300 tenants need waves of 16)."""
    return max(10, -(-(tenants - 1) // (MAX_WAVES - 1)))


def measure_rollout_faults(stack: ProductionStack, args) -> dict[str, Any]:
    """Issue 27's bad input: a rollout where one tenant's database is unreachable, one refuses at the audit and
    one's drain times out (one per wave after the canary, ``max_failed`` 1 per wave, ``on_preflight_stop`` run:
    each starts and stops where it must). The others must succeed; the three are read back from the rollout's
    summary with their task and reason."""
    server = benchlib.server_url()
    tag = uuid.uuid4().hex[:4]
    names = [f"rf{tag}{i:03d}" for i in range(args.fault_tenants)]
    wave_size = max(2, rollout_wave_size(len(names))) if not args.quick else 2
    parallel = min(wave_size, 16)  # every slot busy: the DAG's max_active_runs, the CLI floor at the same concurrency
    unreachable, refusing, slow = names[1], names[1 + wave_size], names[1 + 2 * wave_size]
    builders = {refusing: audit_refusing_tenant, slow: slow_drain_tenant}
    t0 = time.monotonic()
    dsns = rollout_tenants(stack, server, names, connections=True, builders=builders, unreachable=(unreachable,))
    say(f"rollout with faults: {len(names)} MariaDB tenants built in {time.monotonic() - t0:.0f}s "
        f"(unreachable {unreachable}, audit refusal {refusing}, drain timeout {slow})")
    stack.wait_for_dag(ROLLOUT_DAG, 120)
    stack.wait_for_dag(CUTOVER_DAG, 120)
    heartbeat = Heartbeat(dsns[slow], SLOW_OLD_WORKER)
    heartbeat.start()
    drain_timeout = 60
    try:
        run = airflow_rollout(stack, names, args.rollout_limit, wave_size,
                              extra={"max_failed": 1, "on_preflight_stop": "run", "max_parallel": parallel},
                              cutover={"drain_timeout": drain_timeout})
    finally:
        heartbeat.halt.set()
    tenants = (run.get("rollout_summary") or {}).get("tenants") or {}
    expected = {unreachable: "resolve_packs", refusing: "audit_and_checkpoint", slow: "wait_for_drain"}
    named = {n: {k: tenants.get(n, {}).get(k) for k in ("state", "task", "reason")} for n in expected}
    others = [n for n in names if n not in expected]
    out = {"tenants": len(names), "wave_size": wave_size, "parallel": parallel, "max_failed": 1,
           "drain_timeout_s": drain_timeout,
           "faults": {"unreachable": unreachable, "audit_refusal": refusing, "drain_timeout": slow}, "named": named,
           "others_succeeded": sum(tenants.get(n, {}).get("state") == "success" for n in others),
           "others": len(others), "airflow": run}
    out["as_expected"] = (out["others_succeeded"] == len(others)
                          and all(named[n]["state"] == "failed" and named[n]["reason"]
                                  and re.fullmatch(rf"{task}(_\d+)?", str(named[n]["task"]))  # a mapped task: _<index>
                                  for n, task in expected.items()))
    if run["wall_s"] and out["others_succeeded"]:
        out["wall_s_per_succeeded_tenant"] = round(run["wall_s"] / out["others_succeeded"], 1)
    say(f"rollout with faults: {out['others_succeeded']}/{len(others)} others succeeded; named: {named}")
    out.update(against_cli_floor(stack, server, run, [f"cf{tag}{i:03d}" for i in range(len(others))],
                                 out.get("wall_s_per_succeeded_tenant"), parallel=parallel))
    return out


def airflow_rollout(stack: ProductionStack, names: list[str], limit_s: float, wave_size: int, *,
                    extra: dict[str, Any] | None = None, cutover: dict[str, Any] | None = None) -> dict[str, Any]:
    answerer = Answerer(stack)
    started = time.monotonic()
    rollout_run = stack.trigger(ROLLOUT_DAG, {"tenants": names, "wave_size": wave_size, **(extra or {}),
                                              "cutover_conf": {**rollout_conf(), **(cutover or {})}})["dag_run_id"]
    done: dict[str, dict] = {}
    state = "queued"
    while time.monotonic() - started < limit_s:
        answerer.tick()
        for run in cutover_runs(stack, rollout_run):
            if run["state"] in ("success", "failed") and run["dag_run_id"] not in done:
                done[run["dag_run_id"]] = run
                if run["state"] == "success":
                    stop_host((stack.xcom(CUTOVER_DAG, run["dag_run_id"], "start_new_host") or {}).get("pid"))
        state = stack.dag_run(ROLLOUT_DAG, rollout_run)["state"]
        if state in ("success", "failed"):
            break
        time.sleep(2)
    wall = time.monotonic() - started
    stopped = state not in ("success", "failed")
    if stopped:  # the limit: end it, so that the CLI floor does not run beside it
        for dag_id, run_id in [(ROLLOUT_DAG, rollout_run),
                               *((CUTOVER_DAG, r["dag_run_id"]) for r in cutover_runs(stack, rollout_run)
                                 if r["state"] not in ("success", "failed"))]:
            with contextlib.suppress(ApiError):
                stack.request("PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}", {"state": "failed"})
    failed_tasks = sorted({t["task_id"] for t in stack.task_instances(ROLLOUT_DAG, rollout_run) if t.get("state") == "failed"})
    summary = stack.xcom(ROLLOUT_DAG, rollout_run, "summary", key="summary")
    per = [_seconds(r) for r in done.values() if r["state"] == "success"]
    ok = sum(1 for r in done.values() if r["state"] == "success")
    say(f"rollout (Airflow): {state} in {wall:.0f}s; {ok}/{len(names)} tenants succeeded")
    waits = answerer.answer_waits()
    pause_parts = [{**pause_breakdown(stack.task_instances(CUTOVER_DAG, r["dag_run_id"])),
                    "answer_wait_s": waits.get(r["dag_run_id"], 0.0)}
                   for r in done.values() if r["state"] == "success"]
    return {"state": state, "stopped_at_limit_s": round(limit_s) if stopped else None, "wall_s": round(wall, 1),
            "succeeded": ok, "finished_runs": len(done),
            "wall_s_per_tenant": round(wall / len(names), 1) if ok == len(names) else None,
            "tenant_run_s_mean": round(sum(per) / len(per), 1) if per else None,
            "tenant_run_s_max": round(max(per), 1) if per else None,
            "confirmations_answered": len(answerer.answered), "unanswered_questions": answerer.other,
            "rollout_failed_tasks": failed_tasks, "rollout_summary": summary,
            "pause_breakdown_median": _median_breakdown(pause_parts) if pause_parts else None,
            "slot_held_after_task_end": slot_held_after_end(stack),
            "admission_pause_less_answer_wait": _pause_less_answer_wait(summary, done, waits)}


def slot_held_after_end(stack: ProductionStack, dag_id: str = CUTOVER_DAG) -> dict[str, Any] | None:
    """How long each task of ``dag_id`` kept its worker slot after it ended: from its log's last line to its
    supervisor's "Workload finished" line in the worker's log (the Celery task ends there and frees the slot).
    Airflow 3.3.2's supervisor can sleep up to ``[workers] min_heartbeat_interval`` after its process exited."""
    finished: dict[str, dt.datetime] = {}
    for log in (stack.root / "logs").glob("worker-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if m := re.match(r"(\S+?)Z? .*Workload finished .*workload_id=(\S+)", line):
                finished[m.group(2)] = dt.datetime.fromisoformat(m.group(1))
    held = []
    for path in (stack.home / "logs" / f"dag_id={dag_id}").rglob("attempt=*.log"):
        lines = [json.loads(x) for x in path.read_text(errors="replace").splitlines() if x.startswith("{")]
        ti_id = next((x["ti_id"] for x in lines if "ti_id" in x), None)
        if ti_id in finished and lines:
            held.append((finished[ti_id] - dt.datetime.fromisoformat(lines[-1]["timestamp"].rstrip("Z"))).total_seconds())
    held = [h for h in held if h >= 0]  # a parked HITL try's log goes on in its resumed try: not a slot held
    if not held:
        return None
    summary = pause_summary(held) or {}
    return {"tasks": summary.pop("tenants"), **summary, "over_2s": sum(1 for h in held if h > 2.0)}


def _pause_less_answer_wait(summary: dict | None, done: dict[str, dict], waits: dict[str, float]) -> dict | None:
    """Each succeeded tenant's admission pause (the rollout summary's, from the fence row) less the seconds its
    question waited for the answer: what the product itself adds to the pause."""
    tenants = (summary or {}).get("tenants") or {}
    values = [t["admission_pause_s"] - waits.get(t.get("run_id"), 0.0) for t in tenants.values()
              if t.get("admission_pause_s") is not None and t.get("run_id") in done]
    return pause_summary(values) if values else None


def _median_breakdown(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each part of :func:`pause_breakdown` over the tenants, and of each task's seconds in it."""
    out: dict[str, Any] = {k: round(statistics.median(p[k] for p in parts), 1)
                           for k in ("window_s", "in_tasks_s", "queued_s", "between_s", "answer_wait_s")}
    names = sorted({n for p in parts for n in p["tasks_s"]})
    out["tasks_s"] = {n: round(statistics.median(p["tasks_s"].get(n, 0.0) for p in parts), 1) for n in names}
    return out


def _at(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def pause_breakdown(tis: list[dict]) -> dict[str, float]:
    """Where one tenant's admission pause goes in Airflow: from ``arm_fence``'s end to ``resume_admission``'s start,
    the seconds inside tasks (start -> end, clipped to the window; a deferred wait counts inside its task), queued
    (queued -> first start: a worker taking it) and the rest (a task ended -> the next one queued: the scheduler's
    loop), from the task instances' own times."""
    end_of = {t["task_id"].rsplit(".", 1)[-1]: t for t in tis}
    lo, hi = _at(end_of["arm_fence"]["end_date"]), _at(end_of["resume_admission"]["start_date"])
    inside = queued = 0.0
    tasks: dict[str, float] = {}
    for t in tis:
        start, end, q = _at(t.get("start_date")), _at(t.get("end_date")), _at(t.get("queued_when"))
        if start and end and end > lo and start < hi:
            seconds = (min(end, hi) - max(start, lo)).total_seconds()
            inside += seconds
            name = t["task_id"].rsplit(".", 1)[-1]
            tasks[name] = tasks.get(name, 0.0) + seconds
        if q and start and q <= start and start > lo and q < hi:  # (a resumed deferral is queued after its start)
            queued += (min(start, hi) - max(q, lo)).total_seconds()
    window = (hi - lo).total_seconds()
    return {"window_s": window, "in_tasks_s": inside, "queued_s": queued, "between_s": window - inside - queued,
            "tasks_s": tasks}


def cutover_runs(stack: ProductionStack, rollout_run: str) -> list[dict]:
    runs = stack.paged(f"/api/v2/dags/{CUTOVER_DAG}/dagRuns", "dag_runs")  # every page: the API serves 100 a page
    return [r for r in runs if r["dag_run_id"].startswith(f"rollout__{rollout_run}__")]


def _seconds(run: dict) -> float:
    start, end = (dt.datetime.fromisoformat(run[k].replace("Z", "+00:00")) for k in ("start_date", "end_date"))
    return (end - start).total_seconds()


def cli_rollout(dsns: dict[str, str], poll_s: int, parallel: int = 4) -> dict[str, Any]:
    """``nexus-cutover run`` per tenant, ``parallel`` at a time, each tenant's host stopped when its run ends."""
    exe = str(Path(sys.executable).parent / "nexus-cutover")
    host = str(Path(sys.executable).parent / "nexus-host")
    marker = f"nexus-bench-cli-{uuid.uuid4().hex[:8]}"

    def one(item: tuple[str, str]) -> tuple[int, float, float | None]:
        name, dsn = item
        env = {**os.environ, "NEXUS_TENANT_DSN": dsn, "NEXUS_BENCH_CLI": f"{marker}-{name}"}
        t0 = time.monotonic()
        proc = subprocess.run([exe, "run", "-namespace", name, "--confirm-writers-stopped", "-json",
                               "-poll-interval", f"{poll_s}s", "-stale-heartbeat", "20s", "-drain-timeout", "300s",
                               "-writers-stop-timeout", "120s", "-readiness-timeout", "120s",
                               "-host-command", f"{host} --namespace {name}"],
                              env=env, capture_output=True, text=True, timeout=900, check=False)
        took = time.monotonic() - t0
        left = pids_with_env("NEXUS_BENCH_CLI", f"{marker}-{name}")
        signal_all(left, 15)
        if proc.returncode != 0:
            say(f"cli floor: {name} exited {proc.returncode}: {proc.stderr[-400:]}")
        return proc.returncode, took, _json_pause(proc.stdout)

    started = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(one, dsns.items()))
    wall = time.monotonic() - started
    ok = sum(1 for code, _, _ in results if code == 0)
    say(f"rollout (CLI floor): {ok}/{len(dsns)} in {wall:.0f}s")
    return {"wall_s": round(wall, 1), "succeeded": ok,
            "wall_s_per_tenant": round(wall / len(dsns), 1) if ok == len(dsns) else None,
            "tenant_run_s_mean": round(sum(t for _, t, _ in results) / len(results), 1),
            "admission_pause": pause_summary(p for code, _, p in results if code == 0 and p is not None)}


def _json_pause(stdout: str) -> float | None:
    """The admission pause ``nexus-cutover run -json`` reports (its last JSON line), None without one."""
    for line in reversed(stdout.splitlines()):
        with contextlib.suppress(ValueError):
            found = json.loads(line)
            if isinstance(found, dict):
                value = found.get("admission_pause_s")
                return None if value is None else float(value)
    return None


# --------------------------------------------------------------------------- main


def verdicts(waiting: dict) -> dict[str, Any]:
    out = {}
    for name in ("one_triggerer", "survivor"):
        r = waiting["one_triggerer"] if name == "one_triggerer" else waiting["failover"]["survivor"]
        out[name] = {
            "mb_per_waiting_tenant": r["mb_per_waiting_tenant"] <= GOALS["mb_per_waiting_tenant"],
            "cpu_ms_per_tenant_minute": r["cpu_ms_per_tenant_minute"] <= GOALS["cpu_ms_per_tenant_minute"],
            "idle_connections": r["idle_connections"] <= GOALS["idle_connections"],
        }
    return out


def run(args, save) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="nexus-bench-stack-"))
    results: dict[str, Any] = {"mode": "quick" if args.quick else "full", "measured_at": benchlib.now_utc(),
                               "cores": os.cpu_count(), "goals": GOALS}
    try:
        if "preflight" in args.only:
            from bench_preflight import measure as measure_preflight

            results["preflight"] = measure_preflight(args.preflight_tenants, args.preflight_concurrency,
                                                     1 if args.quick else 3)
            save(results)
            if not set(args.only) - {"preflight"}:
                return results
        tenants_dir, conns = sqlite_tenants(root, args.tenants) if "waiting" in args.only else (root, {})
        extra = {"AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder(root)), "NEXUS_BENCH_WAITING_TENANTS": str(args.tenants),
                 "NEXUS_BENCH_POLL_INTERVAL_S": str(args.poll_interval),
                 "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"admin:admin,{APPROVER}:admin", **conns}
        if args.quiet_log_s is not None:
            extra["NEXUS_TRIGGER_QUIET_LOG_S"] = str(args.quiet_log_s)
        results["trigger_quiet_log_s"] = args.quiet_log_s  # None: the product's default
        stack = ProductionStack(root / "stack", extra_env=extra)
        t0 = time.monotonic()
        stack.start(timeout_s=300)
        results["stack_start_s"] = round(time.monotonic() - t0, 1)
        say(f"stack up in {results['stack_start_s']}s (logs: {stack.logs})")
        try:
            stack.wait_for_dag(WAIT_DAG, 180)
            if "waiting" in args.only:
                results["waiting"] = {"measured_at": benchlib.now_utc(), **measure_waiting(stack, args, tenants_dir)}
                results["verdicts"] = verdicts(results["waiting"])
                save(results)  # kept should the rollout fail
            if "rollout" in args.only:
                results["rollout"] = {"measured_at": benchlib.now_utc(), **measure_rollout(stack, args)}
                save(results)
            if "faults" in args.only:
                results["rollout_faults"] = {"measured_at": benchlib.now_utc(), **measure_rollout_faults(stack, args)}
        except BaseException:
            say("failed; stack logs:\n" + stack.log_tails(25))
            raise
        finally:
            stack.stop()
            if args.keep:
                shutil.copytree(stack.root, args.keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.db", "redis"))
                say(f"stack logs and task logs kept in {args.keep}")
            left = stack.leftovers()
            if left:
                raise RuntimeError(f"processes of the stack still alive after its stop: {left}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def save(key: str, results: dict[str, Any]) -> None:
    """Merge part by part: a run of one part (``--only``) keeps the other part's recorded figures."""
    path = benchlib.results_path()
    recorded = (json.loads(path.read_text()) if path.exists() and path.stat().st_size else {}).get(key) or {}
    for part in ("waiting", "rollout", "preflight"):  # each part keeps the date of the run that measured it
        if isinstance(recorded.get(part), dict):
            recorded[part].setdefault("measured_at", recorded.get("measured_at"))
    benchlib.merge_results({key: {**recorded, **results}})


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    parser.add_argument("--only", nargs="+", choices=("waiting", "rollout", "preflight", "faults"),
                        default=["waiting", "rollout", "preflight", "faults"])
    parser.add_argument("--preflight-tenants", type=int, help="preflight tenants (default 32, quick 6)")
    parser.add_argument("--preflight-concurrency", type=int, help="preflight concurrency (default 8, quick 3)")
    parser.add_argument("--tenants", type=int, help="waiting tenants (default 1000, quick 20)")
    parser.add_argument("--poll-interval", type=float, help="trigger poll interval, s (default 30, quick 5)")
    parser.add_argument("--window", type=float, help="measured window, s (default 90, quick 10)")
    parser.add_argument("--idle", type=float, help="idle baseline window, s (default 20, quick 5)")
    parser.add_argument("--quiet-log-s", type=float,
                        help="the triggerers' NEXUS_TRIGGER_QUIET_LOG_S (default: unset, the product's 300 s; 0 logs "
                             "every poll, as before the change-only log)")
    parser.add_argument("--ramp-limit", type=float, default=600.0)
    parser.add_argument("--rollout-tenants", type=int,
                        help="rollout tenants (default 11: the canary and one wave of 10, what fits ~15 minutes on "
                             "2 cores; issue 13 asks 100: --rollout-tenants 100 --rollout-limit 7200; quick 2)")
    parser.add_argument("--fault-tenants", type=int,
                        help="tenants of the rollout with three faults (--only faults; default 300, quick 8)")
    parser.add_argument("--keep", type=Path, help="copy the stack's process and task logs here before the cleanup")
    parser.add_argument("--rollout-limit", type=float, default=900.0, help="give the Airflow rollout up after, s")
    args = parser.parse_args()
    q = args.quick
    for name, full, quick in (("tenants", 1000, 20), ("poll_interval", 30.0, 5.0), ("window", 90.0, 10.0),
                              ("idle", 20.0, 5.0), ("rollout_tenants", 11, 2), ("preflight_tenants", 32, 6),
                              ("preflight_concurrency", 8, 3), ("fault_tenants", 300, 8)):
        if getattr(args, name) is None:
            setattr(args, name, quick if q else full)
    benchlib.server_url()
    key = "stack_quick" if q else "stack"  # a quick run never replaces the recorded full figures
    results = run(args, lambda partial: save(key, partial))
    save(key, results)
    print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

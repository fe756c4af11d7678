"""Tenants, DAG-run watching and tenant reads for the stack tests (every wait bounded)."""

from __future__ import annotations

import collections
import os
import pathlib
import random
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from sqlalchemy import text

from nexus_cutover.db import make_engine
from scripts.demo import Watcher
from scripts.stack import ProductionStack, build_demo_tenant, mariadb_tenant, wait_for  # noqa: F401 - for the tests

CUTOVER_DAG = "connector_projection_cutover"
CONFIRM = "Confirm: all old writers stopped"


def cutover_conf(tenant: str, **overrides: Any) -> dict[str, Any]:
    """The demo's conf (poll 10 s: the runbook's floor; the reference host started by the run). The tests answer
    as the user who triggered the run, so they allow self-approval where the form has that field."""
    from nexus_airflow.params import cutover_params

    # arm_when_drain_below 0: these runs exercise the fenced drain and its faults (the fence armed at once, as
    # before issue 36); the wait before arming has its own tests (tests/dags/test_pre_arm_wait.py).
    conf = {"tenant": tenant, "host_controller": "command", "poll_interval": 10, "stale_heartbeat": 20,
            "arm_when_drain_below": 0,
            "drain_timeout": 300, "writers_stop_timeout": 120, "confirm_timeout": 600, "readiness_timeout": 120,
            "lock_timeout": 60, **overrides}
    if "allow_self_approval" in cutover_params():
        conf["allow_self_approval"] = True
    return conf


def drained_tenant(packs: list[str], namespace: str):
    """A tenant whose old projection work is drained and whose old writers are gone: the run goes straight
    to the writer-stop confirmation."""

    def build(engine) -> None:
        from nexus_cutover.schema import create_legacy_schema
        from nexus_sim.scenario import TenantScenario, drained_pack_history

        create_legacy_schema(engine)
        sc = TenantScenario(namespace=namespace)
        rng = random.Random(11)
        for pack in packs:
            drained_pack_history(sc.pack(pack), rng, lanes=3, generations=4)
        sc.write(engine)

    return build


def new_tenant(stack: ProductionStack, server_url: str, prefix: str, *, packs: list[str] | None = None,
               demo: bool = False, build: Callable[[str], Callable] | None = None) -> dict[str, Any]:
    """A tenant database on MariaDB and its Airflow connection ``nexus_tenant_<tenant>`` (created over REST);
    ``build(namespace)`` returns the builder of its content (default: a drained tenant of ``packs``)."""
    tenant = f"{prefix}{uuid.uuid4().hex[:6]}"
    if build is None:
        build = build_demo_tenant if demo else (lambda ns: drained_tenant(packs or ["pk-one"], ns))
    made = mariadb_tenant(server_url, f"nx_stack_{tenant}", build(tenant))
    stack.put_connection(f"nexus_tenant_{tenant}", **made["conn"])
    return {"tenant": tenant, **made}


def checkpoints(dsn: str) -> dict[str, list[int]]:
    """Every protocol row of the tenant: pack -> [LegacyMaxOrdinal, ...] (one per pack expected)."""
    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT PackInstallId, LegacyMaxOrdinal FROM _System_ConnectorProjectionProtocol"))
            out: dict[str, list[int]] = {}
            for pack, cutoff in rows:
                out.setdefault(pack, []).append(int(cutoff))
            return out
    finally:
        engine.dispose()


class Run:
    """One DAG run (of the cutover unless ``dag_id`` says otherwise) on the stack, followed through the REST API."""

    def __init__(self, stack: ProductionStack, conf: dict[str, Any], *, confirm: bool = True, dag_id: str = CUTOVER_DAG):
        self.stack = stack
        self.dag_id = dag_id
        self.confirm = confirm  # answer the writer-stop confirmation (through PATCH .../hitlDetails)
        self.run_id = stack.trigger(dag_id, conf)["dag_run_id"]
        self.watcher = Watcher(stack, dag_id, self.run_id, answer=self._answer)
        self.states_seen: dict[str, set[str]] = {}

    def _answer(self, task_id: str, options: list[str]) -> str | None:
        return CONFIRM if self.confirm and task_id == "confirm_writers_stopped" and CONFIRM in options else None

    def poll(self) -> tuple[str, dict[str, str]]:
        state, states = self.watcher.poll()
        for key, s in states.items():
            self.states_seen.setdefault(key, set()).add(s)
        return state, states

    def until(self, what: str, cond: Callable[[str, dict[str, str]], bool], timeout_s: float, every_s: float = 2.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            state, states = self.poll()
            if cond(state, states):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"run {self.run_id}: not {what} within {timeout_s:.0f}s (run {state}, tasks {states})")
            if state in ("success", "failed") and what not in ("finished", "failed"):
                raise AssertionError(f"run {self.run_id} ended {state} before {what} (tasks {states})")
            time.sleep(every_s)

    def finish(self, timeout_s: float) -> str:
        self.until("finished", lambda s, _: s in ("success", "failed"), timeout_s, every_s=3.0)
        return self.stack.dag_run(self.dag_id, self.run_id)["state"]

    def xcom(self, task_id: str, map_index: int = -1) -> Any:
        return self.stack.xcom(self.dag_id, self.run_id, task_id, map_index=map_index)

    def ti(self, task_id: str, map_index: int = -1) -> dict:
        return next(t for t in self.stack.task_instances(self.dag_id, self.run_id)
                    if t["task_id"] == task_id and t.get("map_index", -1) == map_index)

    def clear(self, task_id: str) -> None:
        """Clear ``task_id`` (every map index) and everything downstream, as the UI's Clear does."""
        self.stack.request("POST", f"/api/v2/dags/{self.dag_id}/clearTaskInstances", {
            "dry_run": False, "dag_run_id": self.run_id, "task_ids": [task_id], "include_downstream": True,
            "only_failed": False, "reset_dag_runs": True})

    def asset_events(self) -> list[dict]:
        return self.stack.request(
            "GET", f"/api/v2/assets/events?source_dag_id={self.dag_id}&source_run_id={quote(self.run_id, safe='')}"
        )["asset_events"]


# -- tenants whose drain waits, and the old runtime that completes their work --------------------------------

OLD_WORKER = "old-worker-1"


def pending_drain_tenant(namespace: str):
    """A drained history plus one old WorkItem still ``processing``, leased to :data:`OLD_WORKER` for an hour:
    the drain waits on it (a live lease is no blocker) until the old runtime completes it."""

    def build(engine) -> None:
        import datetime as dt

        from nexus_cutover.clock import utcnow
        from nexus_cutover.schema import create_legacy_schema
        from nexus_sim.scenario import TenantScenario, drained_pack_history

        create_legacy_schema(engine)
        sc = TenantScenario(namespace=namespace)
        pack = sc.pack("pk-wait")
        drained_pack_history(pack, random.Random(13), lanes=2, generations=3)
        pack.lane("lane-live").generation(1, status="processing", lease_owner=OLD_WORKER,
                                          lease_expires_at=utcnow() + dt.timedelta(hours=1))
        sc.write(engine)

    return build


def complete_old_work(dsn: str, namespace: str, max_steps: int = 30) -> None:
    """What the old runtime would do (``nexus_sim``, never the pipeline): its worker resumes the items leased
    to it and completes them; then its processes are marked stopped. Bounded by ``max_steps``."""
    from nexus_sim.old_runtime import OldRuntimeSimulator

    engine = make_engine(dsn)
    sim = OldRuntimeSimulator(engine, namespace, worker_id=OLD_WORKER)
    try:
        for _ in range(max_steps):
            sim.step()
            if sim.drained():
                return
        raise AssertionError(f"{namespace}: the old runtime did not drain within {max_steps} steps")
    finally:
        sim.stop()
        engine.dispose()


# -- bulk reads of the metadata database (one statement for many runs) -----------------------------------------


def task_rows(stack: ProductionStack, dag_id: str, run_ids: list[str]) -> dict[str, dict[str, tuple[str | None, int]]]:
    """run_id -> task key (``task[i]`` when mapped) -> (state, try_number)."""
    rows = stack.metadata("SELECT run_id, task_id, map_index, state, try_number FROM task_instance "
                          "WHERE dag_id = %s AND run_id = ANY(%s)", (dag_id, list(run_ids)))
    out: dict[str, dict[str, tuple[str | None, int]]] = {r: {} for r in run_ids}
    for run_id, task_id, map_index, state, tries in rows:
        out[run_id][task_id + (f"[{map_index}]" if map_index >= 0 else "")] = (state, int(tries))
    return out


def run_states(stack: ProductionStack, dag_id: str, run_ids: list[str]) -> dict[str, str]:
    rows = stack.metadata("SELECT run_id, state FROM dag_run WHERE dag_id = %s AND run_id = ANY(%s)", (dag_id, list(run_ids)))
    return dict(rows)


def deferred_triggers(stack: ProductionStack, dag_id: str, task_id: str, run_ids: list[str]) -> dict[str, tuple[int, int | None]]:
    """run_id -> (trigger id, triggerer job id holding it) for the task instances deferred in ``task_id``."""
    rows = stack.metadata(
        "SELECT ti.run_id, tr.id, tr.triggerer_id FROM task_instance ti JOIN trigger tr ON tr.id = ti.trigger_id "
        "WHERE ti.dag_id = %s AND ti.task_id = %s AND ti.state = 'deferred' AND ti.run_id = ANY(%s)",
        (dag_id, task_id, list(run_ids)))
    return {run_id: (int(tid), None if job is None else int(job)) for run_id, tid, job in rows}


def live_triggerer_jobs(stack: ProductionStack) -> set[int]:
    rows = stack.metadata("SELECT id FROM job WHERE job_type = 'TriggererJob' AND state = 'running' "
                          "AND latest_heartbeat > now() - interval '30 seconds'")
    return {int(r[0]) for r in rows}


# -- trigger logs and triggerer processes ------------------------------------------------------------------------


def trigger_logs(stack: ProductionStack, dag_id: str, run_id: str, task_id: str) -> dict[int, str]:
    """triggerer job id -> the text of the log that job's triggerer wrote for the task's trigger
    (``<task log>.trigger.<job id>.log`` next to the task's attempt logs)."""
    folder = stack.home / "logs" / f"dag_id={dag_id}" / f"run_id={run_id}" / f"task_id={task_id}"
    out: dict[int, str] = {}
    for path in folder.glob("attempt=*.log.trigger.*.log"):
        job = int(path.name.rsplit(".trigger.", 1)[1].removesuffix(".log"))
        out[job] = out.get(job, "") + path.read_text(errors="replace")
    return out


def count_lines(text_: str, needle: str) -> int:
    return sum(1 for line in text_.splitlines() if needle in line)


def tree_rss_mb(pid: int) -> float:
    """Resident memory of ``pid`` and every descendant (VmRSS from /proc), in MB."""
    from scripts.stack import descendants

    total_kb = 0
    for p in [pid, *descendants(pid)]:
        try:
            status = pathlib.Path(f"/proc/{p}/status").read_text()
        except OSError:
            continue
        total_kb += sum(int(line.split()[1]) for line in status.splitlines() if line.startswith("VmRSS:"))
    return total_kb / 1024


def triggerer_jobs_of(stack: ProductionStack, name: str) -> collections.Counter:
    """Triggerer job ids whose trigger logs (``*.log.trigger.<job id>.log``) component ``name``'s processes hold
    open, with how many: which job of the metadata database that process runs (the job row has no pid)."""
    from scripts.stack import descendants

    logs = str(stack.home / "logs")
    found: collections.Counter = collections.Counter()
    pid = stack.components[name].pid
    for p in [pid, *descendants(pid)] if pid else []:
        try:
            targets = [os.readlink(f"/proc/{p}/fd/{fd}") for fd in os.listdir(f"/proc/{p}/fd")]
        except OSError:
            continue
        for target in targets:
            if target.startswith(logs) and ".log.trigger." in target:
                found[int(target.rsplit(".trigger.", 1)[1].removesuffix(".log"))] += 1
    return found


# -- a MariaDB of a test's own, to restart under a run (the session's test server is shared) ---------------------


class MariaDBServer:
    """A throwaway MariaDB as ``scripts/with-mariadb.sh`` starts one (``mariadb-install-db`` + ``mariadbd``, own
    datadir, socket and port). :meth:`stop` is SIGTERM and wait; :meth:`start` again reuses datadir and port."""

    def __init__(self, root: pathlib.Path):
        from scripts.demo_airflow import free_port

        self.dir = pathlib.Path(root)
        self.data, self.sock, self.pid_file = self.dir / "data", self.dir / "sock", self.dir / "pid"
        self.port = free_port()
        self.proc = None
        self.password = uuid.uuid4().hex

    @property
    def url(self) -> str:
        return f"mysql+pymysql://nexus:{self.password}@127.0.0.1:{self.port}/"

    def install(self) -> None:
        import subprocess

        self.dir.mkdir(parents=True, exist_ok=True)
        (self.dir / "tmp").mkdir(exist_ok=True)  # its own tmpdir: bootstraps sharing /tmp collide (with-mariadb.sh)
        subprocess.run(["mariadb-install-db", "--no-defaults", f"--datadir={self.data}", f"--tmpdir={self.dir / 'tmp'}",
                        "--user=root",
                        "--auth-root-authentication-method=normal", "--skip-test-db"],
                       check=True, capture_output=True, timeout=120)
        self.start()
        subprocess.run(["mariadb", "--no-defaults", f"--socket={self.sock}", "-uroot", "-e",
                        f"CREATE USER 'nexus'@'127.0.0.1' IDENTIFIED BY '{self.password}'; "
                        "GRANT ALL ON *.* TO 'nexus'@'127.0.0.1' WITH GRANT OPTION;"],
                       check=True, capture_output=True, timeout=30)

    def start(self, timeout_s: float = 30.0) -> None:
        import shutil
        import subprocess

        exe = shutil.which("mariadbd") or "/usr/sbin/mariadbd"
        self.proc = subprocess.Popen(
            [exe, "--no-defaults", f"--datadir={self.data}", f"--tmpdir={self.dir / 'tmp'}", f"--socket={self.sock}",
             f"--port={self.port}",
             "--bind-address=127.0.0.1", "--user=root", f"--pid-file={self.pid_file}",
             f"--log-error={self.dir / 'error.log'}", "--innodb-buffer-pool-size=64M", "--skip-name-resolve"],
            stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, start_new_session=True)
        wait_for(f"MariaDB answering on port {self.port}", self._answers, timeout_s, every_s=0.2)

    def _answers(self) -> bool:
        import subprocess

        assert self.proc is not None
        if self.proc.poll() is not None:
            raise AssertionError(f"mariadbd exited with {self.proc.returncode}; see {self.dir / 'error.log'}")
        return subprocess.run(["mariadb-admin", "--no-defaults", f"--socket={self.sock}", "-uroot", "ping"],
                              capture_output=True, timeout=10).returncode == 0

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGTERM (a clean shutdown: open transactions are rolled back) and wait for the process to end."""
        import subprocess

        if self.proc is None or self.proc.poll() is not None:
            return
        self.proc.terminate()
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(10)
            raise AssertionError(f"mariadbd did not stop within {timeout_s:.0f}s: killed") from None

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None


# -- Field History tenants -------------------------------------------------------------------------------------------

FH_DAG = "field_history_eligibility"
FH_STAGE1, FH_CUTOVER = "4.12.0", "4.13.0"


def field_history_tenant(namespace: str, seed: int = 29, rows: int = 120):
    """A pre-stage-1 Field History tenant ready for stage 2: ``rows`` legacy audit changes (all NULL, FieldIds
    of an open interval, of two intervals and of an untracked field, sequences drawn from ``seed``), producers
    and the outbox worker at the producer-cutover release, no outbox work. The same seed builds the same table
    (ChangeIds included)."""

    def build(engine) -> None:
        from nexus_cutover import catalog
        from nexus_cutover.schema import create_legacy_schema
        from nexus_sim.scenario import TenantScenario

        create_legacy_schema(engine)
        rng = random.Random(seed)
        sc = TenantScenario(namespace=namespace)
        sc.field(1, intervals=[(10, None)])
        sc.field(2, intervals=[(10, 20), (30, None)])
        sc.field(3, track_history=False)
        for _ in range(rows):
            sc.audit_change(rng.choice((1, 2, 3)), history_sequence=rng.randint(1, 120))
        sc.audit_change(1, history_sequence=None)  # no sequence: never materialized
        for row in sc.audit_changes:
            row.pop("FieldHistoryEligible", None)
        for role, pid in ((catalog.ROLE_RUNTIME_API, "api-1"), (catalog.ROLE_SERVICE_MANAGER, "sm-1"),
                          (catalog.ROLE_AUDIT_OUTBOX_WORKER, "outbox-1")):
            sc.process(role, version=FH_CUTOVER, process_id=pid)
        sc.write(engine)

    return build


def fh_conf(tenant: str, batch_size: int) -> dict[str, Any]:
    return {"tenant": tenant, "stage1_release": FH_STAGE1, "producer_release": FH_CUTOVER, "target_stage": 2,
            "batch_size": batch_size, "poll_interval": 10}


def clean_reference_table(server_url: str, batch_size: int) -> dict[int, tuple]:
    """The table a clean stage 1 + stage 2 leaves on a tenant of :func:`field_history_tenant` (same seed), run
    straight through the gates: ChangeId -> (FieldId, HistorySequence, FieldHistoryEligible)."""
    from nexus_cutover.field_history.gates import stage_1, stage_2_materialize
    from tests.field_history.helpers import audit_table

    namespace = f"fhref{uuid.uuid4().hex[:6]}"
    made = mariadb_tenant(server_url, f"nx_stack_{namespace}", field_history_tenant(namespace))
    engine = make_engine(made["dsn"])
    try:
        assert stage_1(engine, stage1_release=FH_STAGE1, namespace=namespace).passed
        assert stage_2_materialize(engine, batch_size=batch_size).passed
        return audit_table(engine)
    finally:
        engine.dispose()


def table_of(dsn: str) -> dict[int, tuple]:
    from tests.field_history.helpers import audit_table

    engine = make_engine(dsn)
    try:
        return audit_table(engine)
    finally:
        engine.dispose()

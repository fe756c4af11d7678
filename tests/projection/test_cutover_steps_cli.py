"""``nexus-cutover``: every step without Airflow, as an engineer runs it (real processes, MariaDB and SQLite)."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading

import pytest
from sqlalchemy import func, select, update

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.projection.cutover_fence import arm_fence
from nexus_cutover.projection.transition import CUTOVER
from nexus_sim.old_runtime import OldRuntimeSimulator
from nexus_sim.scenario import TenantScenario, drained_pack_history
from tests.support import make_cutover_ready

NS = "acme"
FAST = ["-poll-interval", "200ms", "-stale-heartbeat", "5s"]


def cli(dsn: str, *args: str, timeout: float = 180, stdin: str | None = None,
        env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEXUS_TENANT_DSN": dsn, "NEXUS_HOST_HEARTBEAT_S": "0.5", "NEXUS_HOST_POLL_S": "0.2",
           **(env or {})}
    return subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", *args], env=env, capture_output=True,
                          text=True, timeout=timeout, input=stdin)


def as_json(proc: subprocess.CompletedProcess) -> dict:
    assert proc.stdout.strip(), proc.stderr
    return json.loads(proc.stdout.strip().splitlines()[-1])


def drained_tenant_at(url: str):
    """Drained legacy history of two packs, old writers registered and stopped; Part A only: its engine."""
    import random

    from nexus_cutover.schema import create_legacy_schema

    engine = make_engine(url)
    create_legacy_schema(engine)
    sc = TenantScenario(namespace=NS)
    rng = random.Random(5)
    for pack in ("pk-a", "pk-b"):
        drained_pack_history(sc.pack(pack), rng, lanes=2, generations=3)
    for role in catalog.OLD_WRITER_ROLES:
        sc.process(role, process_id=f"old-{role}", stopped=True)
    sc.write(engine)
    return engine


@pytest.fixture
def tenant(tenant_url):
    """:func:`drained_tenant_at` on each backend."""
    engine = drained_tenant_at(tenant_url)
    yield engine, tenant_url
    engine.dispose()


def _kill(pid: int | None) -> None:
    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)


def test_run_end_to_end_with_the_old_runtime_draining_then_the_reference_host(tenant):
    """Live old work drains through the old runtime (which then stops); confirmed by flag; the host takes over."""
    engine, url = tenant
    with engine.begin() as conn:  # live old work of pk-a: one pending generation above the drained history
        top = conn.execute(select(catalog.Event.c.EventId).order_by(catalog.Event.c.EventId.desc()).limit(1)).scalar()
    sc = TenantScenario(namespace=NS, event_id_start=top + 1000, work_id_start=top + 1000)
    sc.pack("pk-c").lane("live").generation(2, status="pending")
    sc.write(engine)
    sim = OldRuntimeSimulator(engine, NS, process_id="old-rt", retry_delay_s=0.0)
    old = threading.Thread(target=sim.run, kwargs={"poll_s": 0.05, "exit_when_drained": True}, daemon=True)
    old.start()
    host = f"{sys.executable} -m nexus_cutover.cli.host --namespace {NS}"
    saved = tenant_digest_path(url)
    proc = cli(url, "run", "-namespace", NS, *FAST, "--confirm-writers-stopped", "-host-command", host,
               "-digest-out", saved, "-json")
    out = as_json(proc)
    _kill(out.get("host_pid"))
    old.join(timeout=30)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out["outcome"] == "cut_over" and out["confirmation"]["came_back"] == []
    assert out["steps"] == CUTOVER.names  # run follows the one declaration, every step in its order
    assert out["history"]["ok"] and out["history"]["hash"] == out["history_digest"]["hash"]
    with engine.connect() as conn:
        history_rows = conn.execute(select(func.count()).select_from(catalog.WorkItem)).scalar()
    assert out["history_digest"]["rows"]["_System_WorkItem"] == history_rows  # the host made no range work: no receipt
    later = cli(url, "verify", "-namespace", NS, "-expect", saved, "-json")
    assert later.returncode == 0, later.stderr
    assert as_json(later)["history"]["ok"] and as_json(later)["old_writers_after_release"] == []
    assert sorted(c["pack_install_id"] for c in out["checkpoints"]) == ["pk-a", "pk-b", "pk-c"]
    assert all(c["outcome"] == "written" for c in out["checkpoints"])
    assert out["release"]["outcome"] == "released" and out["old_writers_after_release"] == []
    with engine.connect() as conn:
        fences = conn.execute(select(catalog.AdmissionFence.c.ReleasedAt, catalog.AdmissionFence.c.ArmedBy)).all()
    assert len(fences) == 1 and fences[0].ReleasedAt is not None
    _assert_admission_pause_reported(engine, url, out)
    again = cli(url, "run", "-namespace", NS, *FAST, "-json")  # complete: nothing to do, no confirmation asked
    assert again.returncode == 0, again.stderr
    assert as_json(again)["outcome"] == "nothing_to_do"
    assert as_json(again)["steps"] == CUTOVER.names[: CUTOVER.names.index("arm_fence") + 1]  # its verdict: done
    planned = cli(url, "plan", "-namespace", NS)  # one verdict for a cut-over tenant, everywhere (issue 34, item 6)
    assert planned.returncode == 0, planned.stderr
    assert planned.stdout.strip().splitlines()[-1].startswith("VERDICT: done: already cut over"), planned.stdout
    assert "proceed" not in planned.stdout.strip().splitlines()[-1]


def _assert_admission_pause_reported(engine, url: str, out: dict) -> None:
    """The run's admission pause is the fence row's ReleasedAt - ArmedAt, in its JSON, and in the text of a
    release (already released: the same pause) and of status."""
    f = catalog.AdmissionFence
    with engine.connect() as conn:
        armed, released = conn.execute(select(f.c.ArmedAt, f.c.ReleasedAt)).one()
    pause = (released - armed).total_seconds()
    assert pause > 0 and out["admission_pause_s"] == out["release"]["admission_pause_s"]
    assert abs(out["admission_pause_s"] - pause) < 1e-6, (out["release"], pause)
    again = cli(url, "release-fence", "-namespace", NS, "-fence-id", str(out["release"]["fence_id"]),
                "-holder", out["holder"])
    assert again.returncode == 0, again.stderr
    assert f"already_released (admission paused {pause:.3f} s: armed {armed.isoformat()}" in again.stdout
    status = cli(url, "status", "-namespace", NS)
    assert f"last admission pause {pause:.1f} s" in status.stdout, status.stdout


def tenant_digest_path(url: str) -> str:
    import tempfile

    return os.path.join(tempfile.mkdtemp(prefix="nexus-digest-"), "digest.json")


def test_digest_saved_then_verified_names_a_row_changed_since(tenant):
    engine, url = tenant
    saved = tenant_digest_path(url)
    assert cli(url, "apply-schema", "-json").returncode == 0
    refused = cli(url, "digest", "-namespace", NS, "-digest-connections", "17")
    assert refused.returncode == 2 and "-digest-connections: must be from 1 to 16, got 17" in refused.stderr
    taken = cli(url, "digest", "-namespace", NS, "-out", saved, "-chunk-rows", "3", "-digest-connections", "2", "-json")
    assert taken.returncode == 0, taken.stderr
    summary = as_json(taken)["digest"]
    assert summary["chunks"]["_System_Event"] > 1 and len(summary["hash"]) == 16
    same = cli(url, "verify", "-namespace", NS, "-expect", saved)
    assert same.returncode == 0, same.stderr
    assert "verified" in same.stdout and "no released cutover fence yet" in same.stdout
    with engine.begin() as conn:
        work_id = conn.execute(select(func.min(catalog.WorkItem.c.WorkId))).scalar()
        conn.execute(update(catalog.WorkItem).where(catalog.WorkItem.c.WorkId == work_id).values(Status="pending"))
    changed = cli(url, "verify", "-namespace", NS, "-expect", saved, "-json")
    assert changed.returncode == 3
    assert f"_System_WorkItem WorkId {work_id} changed: column(s) Status differ" in changed.stderr
    assert cli(url, "verify", "-namespace", "other", "-expect", saved).returncode == 2
    assert cli(url, "digest", "-namespace", NS, "-chunk-rows", "0").returncode == 2


def test_run_without_a_person_refuses_to_confirm_and_writes_no_checkpoint(tenant):
    engine, url = tenant
    proc = cli(url, "run", "-namespace", NS, *FAST, "-json", stdin="")
    assert proc.returncode == 2, proc.stderr
    assert "--confirm-writers-stopped" in proc.stderr
    with engine.connect() as conn:
        assert conn.execute(select(catalog.ConnectorProjectionProtocol)).all() == []
        assert conn.execute(select(catalog.AdmissionFence.c.ReleasedAt)).scalars().all() == [None]  # fence kept


def test_each_step_on_its_own_with_its_exit_codes(tenant):
    engine, url = tenant
    plan = cli(url, "plan", "-namespace", NS, *FAST, "-json")
    assert plan.returncode == 0, plan.stderr
    assert as_json(plan)["verdict"] == "proceed" and as_json(plan)["steps"] == CUTOVER.names
    assert "VERDICT" not in plan.stdout  # -json: one object only
    text = cli(url, "plan", "-namespace", NS, *FAST)
    assert text.stdout.strip().splitlines()[-1] == "VERDICT: the run would proceed"
    assert cli(url, "apply-schema", "-json").returncode == 0
    armed = as_json(cli(url, "arm-fence", "-namespace", NS, "-holder", "eng-1", "-json"))
    assert armed["outcome"] == "armed"
    held = cli(url, "arm-fence", "-namespace", NS, "-holder", "eng-2", "-json")
    assert held.returncode == 3 and "'eng-1'" in held.stderr
    assert cli(url, "drain", "-namespace", NS, "-json").returncode == 0
    assert cli(url, "writers", "-namespace", NS, "-json").returncode == 0
    ready = cli(url, "readiness", "-namespace", NS, "-json")
    assert ready.returncode == 3 and as_json(ready)["ready"] is False
    for pack in ("pk-a", "pk-b"):
        cp = as_json(cli(url, "checkpoint", "-pack-install-id", pack, "-holder", "eng-1", "-json"))
        assert cp["outcome"] == "written" and set(cp) >= {"pack_install_id", "outcome", "legacy_max_ordinal", "findings"}
    not_ready = cli(url, "release-fence", "-namespace", NS, "-holder", "eng-1", "-json")
    assert not_ready.returncode == 3 and "not ready" in not_ready.stderr
    with engine.connect() as conn:
        assert conn.execute(select(catalog.AdmissionFence.c.ReleasedAt)).scalar() is None
    status = as_json(cli(url, "status", "-namespace", NS, "-json"))
    assert status["phase"] == "checkpointed" and all(p["checkpoint"] for p in status["packs"])
    no_release = cli(url, "verify", "-namespace", NS, "-json")
    assert no_release.returncode == 2 and "no released cutover fence" in no_release.stderr


def test_drain_and_writers_report_what_stops_them(tenant):
    engine, url = tenant
    sc = TenantScenario(namespace=NS, event_id_start=9000, work_id_start=9000)
    sc.pack("pk-z").lane("stuck").generation(1, status="pending")  # pending, and no live old worker
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id="old-writer-live")
    sc.write(engine)
    drain = cli(url, "drain", "-namespace", NS, "-json")
    assert drain.returncode == 3 and "cannot finish on its own" in drain.stderr
    assert json.loads(drain.stdout.strip().splitlines()[-1])["report"]["blocker_totals"] == {"no_live_old_worker": 1}
    writers = cli(url, "writers", "-namespace", NS, "-json")
    assert writers.returncode == 3 and "old-writer-live" in writers.stderr
    plan = cli(url, "plan", "-namespace", NS, *FAST)
    assert plan.returncode == 3 and plan.stdout.strip().splitlines()[-1].startswith("VERDICT: the run would stop: the drain is stuck")


def test_plan_says_wait_while_old_writers_run_and_verify_finds_a_writer_after_the_release(tenant):
    engine, url = tenant
    sc = TenantScenario(namespace=NS)
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-live")
    sc.write(engine)
    plan = cli(url, "plan", "-namespace", NS, *FAST, "-json")
    assert plan.returncode == 0 and as_json(plan)["verdict"].startswith("wait: 1 live old writer")
    make_cutover_ready(engine)
    armed = arm_fence(engine, NS, armed_by="eng", timeout_s=10)
    with engine.begin() as conn:
        conn.execute(update(catalog.AdmissionFence).values(ReleasedAt=dt.datetime(2026, 1, 1), ReleasedBy="eng"))
    found = cli(url, "verify", "-namespace", NS, "-json")
    assert found.returncode == 3 and "old-worker-live" in found.stderr
    since = cli(url, "verify", "-namespace", NS, "-since", "2999-01-01T00:00:00", "-json")
    assert since.returncode == 0, since.stderr
    assert armed.outcome == "armed"


def test_usage_errors_exit_2(sqlite_url):
    for args in (["plan"], ["nope"], ["checkpoint"], ["drain", "-namespace", NS, "-poll-interval", "soon"]):
        proc = cli(sqlite_url, *args)
        assert proc.returncode == 2, (args, proc.stderr)


def test_status_of_a_namespace_the_database_does_not_have_exits_2_naming_the_ones_it_has(tenant):
    """Issue 34, item 9: a mistyped namespace is bad input, not "not started" with another tenant's Field History."""
    _engine, url = tenant
    ghost = cli(url, "status", "-namespace", "ghost")
    assert ghost.returncode == 2, ghost.stdout + ghost.stderr
    assert "namespace 'ghost' has no pack and no admission fence" in ghost.stderr and f"'{NS}'" in ghost.stderr
    assert "not started" not in ghost.stdout
    assert cli(url, "status", "-namespace", NS).returncode == 0  # the namespace it has: read as before


def test_status_of_an_unreachable_database_exits_1_and_says_so_in_words(tmp_path):
    """Not "not started" with driver reprs and exit 0: the database is named unreachable, exit 1 (also in -json)."""
    nowhere = "mysql+pymysql://cutover:s3cret@127.0.0.1:1/tenant_gone"  # nothing listens on port 1
    text = cli(nowhere, "status", "-namespace", NS)
    assert text.returncode == 1, text.stdout + text.stderr
    assert "cannot reach the tenant database" in text.stderr and "not started" not in text.stdout
    assert "OperationalError" not in text.stdout + text.stderr and "s3cret" not in text.stdout + text.stderr
    as_json_out = as_json(cli(nowhere, "status", "-namespace", NS, "-json"))
    assert as_json_out["exit_code"] == 1 and "cannot reach the tenant database" in as_json_out["error"]
    missing = cli(f"sqlite:///{tmp_path / 'no-such-dir' / 'tenant.db'}", "status", "-namespace", NS)
    assert missing.returncode == 2 and "does not exist" in missing.stderr, missing.stderr  # bad input: fix the DSN


def test_plan_prints_one_line_per_step_and_keeps_the_ddl_in_json(tenant):
    _engine, url = tenant
    proc = cli(url, "plan", "-namespace", NS, *FAST)
    schema_lines = [line for line in proc.stdout.splitlines() if line.startswith("1. schema:")]
    assert len(schema_lines) == 1 and "would create" in schema_lines[0], proc.stdout
    assert "CREATE" not in proc.stdout and "ALTER" not in proc.stdout  # the DDL is in -json only
    assert all(line.strip() == line or line.startswith("  ") for line in proc.stdout.splitlines())
    ddl = as_json(cli(url, "plan", "-namespace", NS, *FAST, "-json"))["schema"]["plan"]
    assert any("CREATE TABLE" in line for line in ddl)

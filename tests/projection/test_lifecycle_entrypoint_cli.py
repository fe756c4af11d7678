"""``connector-projection-cutover`` as a delivery engineer runs it: exit codes, -json, errors, locks, concurrency."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import select, text

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.projection.checkpoint import run_checkpoint
from nexus_cutover.schema import create_legacy_schema
from nexus_sim.scenario import TenantScenario
from tests.support import history_checksum, make_cutover_ready


def run_cli(dsn, *args, env_name="CONNECTOR_CUTOVER_DSN", timeout=120):
    env = {k: v for k, v in os.environ.items() if k not in ("CONNECTOR_CUTOVER_DSN", "NEXUS_TENANT_DSN")}
    if dsn is not None:
        env[env_name] = dsn
    return subprocess.run(
        [sys.executable, "-m", "nexus_cutover.cli.lifecycle_entrypoint", *args],
        env=env, capture_output=True, text=True, timeout=timeout,
    )


def seeded(url, *, refused=False):
    engine = make_engine(url)
    make_cutover_ready(engine)
    sc = TenantScenario()
    lane = sc.pack("pk-7f3a").lane("a")
    lane.generation(3)
    if refused:
        lane.event(status="pending")  # an input nobody owns
    sc.fence()  # cutover step 1: the non-expiring '*' fence the checkpoint requires
    sc.write(engine)
    return engine


def test_written_then_already_written_with_json(tenant_url):
    engine = seeded(tenant_url)
    first = run_cli(tenant_url, "-pack-install-id", "pk-7f3a", "-timeout", "1m", "-json")
    assert first.returncode == 0, first.stderr
    out = json.loads(first.stdout)
    assert (out["pack_install_id"], out["outcome"], out["legacy_max_ordinal"], out["findings"]) == ("pk-7f3a", "written", 3, [])
    second = run_cli(tenant_url, "--pack-install-id", "pk-7f3a", "--timeout", "30s", "--json")
    assert second.returncode == 0
    assert json.loads(second.stdout)["outcome"] == "already_written"
    engine.dispose()


def test_refusal_exits_3_names_offenders_and_writes_nothing(tenant_url):
    engine = seeded(tenant_url, refused=True)
    before = history_checksum(engine)
    proc = run_cli(tenant_url, "-pack-install-id", "pk-7f3a", "-json")
    assert proc.returncode == 3, proc.stderr
    out = json.loads(proc.stdout)
    assert out["outcome"] == "refused" and out["legacy_max_ordinal"] is None
    assert [(f["finding"], f["event_ids"]) for f in out["findings"]] == [("missing_owner", [4])]
    human = run_cli(tenant_url, "-pack-install-id", "pk-7f3a")
    assert human.returncode == 3 and "missing_owner" in human.stdout and "EventIds [4]" in human.stdout
    with engine.connect() as conn:
        assert conn.execute(select(catalog.ConnectorProjectionProtocol)).all() == []
    assert history_checksum(engine) == before
    engine.dispose()


def test_a_greenfield_pack_is_refused_over_a_live_old_runtime_and_written_once_it_stopped_or_under_the_fence(tenant_url):
    """Contract, "Audit": the entrypoint writes a greenfield pack's cutoff 0 under ``activate-pack``'s rule."""
    from nexus_cutover.projection.cutover_fence import arm_fence

    engine = make_engine(tenant_url)
    make_cutover_ready(engine)
    sc = TenantScenario()
    sc.pack("pk-old").lane("a").generation(2)  # the namespace's old runtime still serves its other pack
    sc.pack("pk-green")
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-1")
    for stopped in range(3):  # a long-lived registry: stopped rows beside the live one
        sc.process(catalog.ROLE_INGRESS_WRITER, process_id=f"old-writer-{stopped}", stopped=True)
    sc.write(engine)
    refused = run_cli(tenant_url, "-pack-install-id", "pk-green", "-json")
    assert refused.returncode == 3, refused.stderr
    out = json.loads(refused.stdout)
    assert out["outcome"] == "refused" and out["legacy_max_ordinal"] is None
    (finding,) = out["findings"]
    assert finding["finding"] == "old_runtime_live" and "old-worker-1" in json.dumps(finding)
    with engine.connect() as conn:
        assert conn.execute(select(catalog.ConnectorProjectionProtocol)).all() == []
    fence = arm_fence(engine, sc.namespace, armed_by="eng", timeout_s=10)  # under the cutover fence: written
    fenced = run_cli(tenant_url, "-pack-install-id", "pk-green", "-json")
    assert fenced.returncode == 0, fenced.stderr
    assert (json.loads(fenced.stdout)["outcome"], json.loads(fenced.stdout)["legacy_max_ordinal"]) == ("written", 0)
    assert fence.outcome == "armed"
    engine.dispose()


def test_a_greenfield_pack_is_written_once_the_old_runtime_stopped(tenant_url):
    engine = make_engine(tenant_url)
    make_cutover_ready(engine)
    sc = TenantScenario()
    sc.pack("pk-green")
    sc.process(catalog.ROLE_RECEIPT_MATERIALIZER, process_id="old-materializer", stopped=True)
    sc.write(engine)
    done = run_cli(tenant_url, "-pack-install-id", "pk-green", "-json")
    assert done.returncode == 0, done.stderr
    assert (json.loads(done.stdout)["outcome"], json.loads(done.stdout)["legacy_max_ordinal"]) == ("written", 0)
    engine.dispose()


def test_falls_back_to_nexus_tenant_dsn(sqlite_url):
    seeded(sqlite_url).dispose()
    proc = run_cli(sqlite_url, "-pack-install-id", "pk-7f3a", env_name="NEXUS_TENANT_DSN")
    assert proc.returncode == 0, proc.stderr
    assert "LegacyMaxOrdinal=3 written" in proc.stdout


@pytest.mark.parametrize(
    "args, message",
    [
        ((), "required"),
        (("-pack-install-id", "pk-1", "-timeout", "soon"), "invalid duration"),
        (("-pack-install-id", "pk-1", "-force"), "unrecognized arguments: -force"),
    ],
)
def test_usage_errors_exit_2(sqlite_url, args, message):
    proc = run_cli(sqlite_url, *args)
    assert proc.returncode == 2 and message in proc.stderr


def test_unknown_pack_exits_2(tenant_url):
    seeded(tenant_url).dispose()
    proc = run_cli(tenant_url, "-pack-install-id", "pk-nope", "-json")
    assert proc.returncode == 2
    assert "unknown pack" in json.loads(proc.stdout)["error"]


@pytest.mark.parametrize(
    "dsn, message",
    [
        (None, "set CONNECTOR_CUTOVER_DSN or NEXUS_TENANT_DSN"),
        ("not a url", "malformed DSN"),
        ("postgresql://u:secretpw@h/db", "unsupported scheme"),
        ("mysql+pymysql://u:secretpw@/tenant", "has no host"),
        ("sqlite:////nonexistent/dir/tenant.db", "does not exist"),
    ],
)
def test_malformed_dsn_exits_2_without_echoing_the_password(dsn, message):
    proc = run_cli(dsn, "-pack-install-id", "pk-1")
    assert proc.returncode == 2, proc.stderr
    assert message in proc.stderr
    assert "secretpw" not in proc.stderr + proc.stdout


def test_unreachable_server_exits_1_quickly():
    started = time.monotonic()
    proc = run_cli("mysql+pymysql://u:secretpw@127.0.0.1:1/tenant", "-pack-install-id", "pk-1", "-timeout", "5s")
    assert proc.returncode == 1
    assert "cannot reach the tenant database" in proc.stderr and "secretpw" not in proc.stderr
    assert time.monotonic() - started < 60


def test_unknown_database_is_bad_input(mysql_url):
    bad = mysql_url.rsplit("/", 1)[0] + "/no_such_tenant_db"
    proc = run_cli(bad, "-pack-install-id", "pk-1")
    assert proc.returncode == 2 and "Unknown database" in proc.stderr


@pytest.mark.parametrize("missing", ["InputStartOrdinal", "protocol_table", "ReplayOfWorkId"])
def test_missing_prerequisite_schema_exits_2_naming_it(mysql_url, missing):
    engine = make_engine(mysql_url)
    if missing == "InputStartOrdinal":
        create_legacy_schema(engine)  # step 1 never applied
        expected = "_System_WorkItem.InputStartOrdinal"
    else:
        make_cutover_ready(engine)
        with engine.begin() as conn:
            if missing == "protocol_table":
                conn.execute(text("DROP TABLE _System_ConnectorProjectionProtocol"))
                expected = "_System_ConnectorProjectionProtocol"
            else:
                conn.execute(text("ALTER TABLE _System_WorkItem DROP COLUMN ReplayOfWorkId"))
                expected = "_System_WorkItem.ReplayOfWorkId"
    sc = TenantScenario()
    sc.pack("pk-1")
    sc.write(engine)
    proc = run_cli(mysql_url, "-pack-install-id", "pk-1")
    assert proc.returncode == 2
    assert "missing prerequisite schema" in proc.stderr and expected in proc.stderr
    with engine.connect() as conn:
        assert conn.execute(text("SELECT COUNT(*) FROM _System_Lock")).scalar() == 0  # nothing written, not even locks
    engine.dispose()


def test_lock_held_by_another_session_exits_4_within_the_timeout(tenant_url):
    engine = seeded(tenant_url)
    holder = make_engine(tenant_url)
    held = threading.Event()
    release = threading.Event()

    def hold():
        with holder.connect() as conn:
            if holder.dialect.name == "sqlite":
                conn = conn.execution_options(sqlite_begin="IMMEDIATE")
            with conn.begin():
                conn.execute(text("INSERT INTO _System_Lock (LockName) VALUES ('namespace/acme')"))
                if holder.dialect.name != "sqlite":
                    conn.execute(text("SELECT LockName FROM _System_Lock WHERE LockName = 'namespace/acme' FOR UPDATE"))
                held.set()
                release.wait(60)

    thread = threading.Thread(target=hold)
    thread.start()
    assert held.wait(10)
    try:
        started = time.monotonic()
        proc = run_cli(tenant_url, "-pack-install-id", "pk-7f3a", "-timeout", "2s", "-json")
        elapsed = time.monotonic() - started
    finally:
        release.set()
        thread.join()
    assert proc.returncode == 4, proc.stderr
    assert json.loads(proc.stdout)["exit_code"] == 4
    assert elapsed < 30
    with engine.connect() as conn:
        assert conn.execute(select(catalog.ConnectorProjectionProtocol)).all() == []
    engine.dispose()
    holder.dispose()


def test_eight_concurrent_invocations_write_exactly_one_row(tenant_url):
    engine = seeded(tenant_url)

    def call(i):
        eng = make_engine(tenant_url)
        try:
            return run_checkpoint(eng, "pk-7f3a", timeout_s=60, written_by=f"caller-{i}")
        finally:
            eng.dispose()

    with ThreadPoolExecutor(8) as pool:
        results = list(pool.map(call, range(8)))
    assert sorted(r.outcome for r in results) == ["already_written"] * 7 + ["written"]
    assert {r.legacy_max_ordinal for r in results} == {3}
    with engine.connect() as conn:
        rows = conn.execute(select(catalog.ConnectorProjectionProtocol)).all()
    assert len(rows) == 1 and rows[0].LegacyMaxOrdinal == 3
    assert {r.written_by for r in results} == {rows[0].WrittenBy}
    engine.dispose()


def test_eight_concurrent_processes_agree(mysql_url):
    engine = seeded(mysql_url)
    procs = [
        subprocess.Popen(
            [sys.executable, "-m", "nexus_cutover.cli.lifecycle_entrypoint", "-pack-install-id", "pk-7f3a", "-json"],
            env={**os.environ, "CONNECTOR_CUTOVER_DSN": mysql_url}, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        )
        for _ in range(8)
    ]
    outs = [json.loads(p.communicate(timeout=120)[0]) for p in procs]
    assert all(p.returncode == 0 for p in procs)
    assert sorted(o["outcome"] for o in outs) == ["already_written"] * 7 + ["written"]
    assert {o["legacy_max_ordinal"] for o in outs} == {3}
    engine.dispose()


def test_console_script_is_installed():
    exe = os.path.join(os.path.dirname(sys.executable), "connector-projection-cutover")
    proc = subprocess.run([exe, "--help"], capture_output=True, text=True)
    assert proc.returncode == 0 and "-pack-install-id" in proc.stdout

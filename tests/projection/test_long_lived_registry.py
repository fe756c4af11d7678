"""A long-lived process registry (contract, "Process registry"): thousands of stopped rows never hide a live one.

Every restart of a runtime adds a registry row; a tenant of some years holds thousands of stopped ones. The writer
evidence, its re-check when the confirmation arrives, readiness (also inside the releasing transaction) and the
old-writer verification after the release must find a live process wherever its row sorts, on MariaDB and SQLite;
and each of their statements is a range of ``ix_ProcessRegistry_Role`` (EXPLAIN, MariaDB).
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import text

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.projection import steps, writers
from nexus_cutover.projection.cutover_fence import arm_fence, fence_row
from nexus_sim.scenario import TenantScenario, utcnow
from tests.support import make_cutover_ready

NS = "acme"
STALE = dt.timedelta(seconds=60)
STOPPED_ROWS = 1_200  # more than the old cap of 1,000 rows of every state
#: Ids that sort after every stopped row, in each of the old orders (by role, then id): hostile text.
LATE_IDS = {
    catalog.ROLE_INGRESS_WRITER: "zz-ingress-Ä ",
    catalog.ROLE_RECEIPT_MATERIALIZER: "ZZ-materializer",
    catalog.ROLE_PROJECTION_WORKER: "zz-worker-ü",
    catalog.ROLE_DEPENDENCY_RESOLVER: "zz-resolver ",
}


def long_lived(now: dt.datetime, *, host: bool = True) -> TenantScenario:
    """1,200 stopped old writers (every restart of years), ids sorting before the live ones; an activated new host."""
    sc = TenantScenario(namespace=NS, now=now)
    for i in range(STOPPED_ROWS):
        role = catalog.OLD_WRITER_ROLES[i % len(catalog.OLD_WRITER_ROLES)]
        sc.process(role, process_id=f"a-{role}-restart-{i:05d}", stopped=True, heartbeat_age_s=3600 + i)
    if host:
        sc.process(catalog.ROLE_INTEGRATION_HOST, protocol=catalog.PROTOCOL_RANGES, process_id="host-1", activated=True)
    return sc


@pytest.mark.parametrize("role", catalog.OLD_WRITER_ROLES)
def test_a_live_old_writer_behind_1200_stopped_rows_is_found_by_every_read(engine, role):
    now = utcnow()
    sc = long_lived(now)
    live_id = LATE_IDS[role]
    sc.process(role, process_id=live_id)
    sc.write(engine)

    evidence = writers.old_writer_evidence(engine, NS, stale_heartbeat=STALE, now=now)
    assert [p["process_id"] for p in evidence.live] == [live_id] and not evidence.all_stopped_or_silent
    assert evidence.stopped_total == STOPPED_ROWS and evidence.stopped_not_shown == STOPPED_ROWS - 4 * writers.STOPPED_SHOWN
    assert f"| `{live_id}` | {role} |" in evidence.as_markdown()
    assert f"{STOPPED_ROWS - 4 * writers.STOPPED_SHOWN} older stopped process(es) not listed" in evidence.as_markdown()

    check = steps.recheck_writers(engine, NS, evidence_taken_at=now - dt.timedelta(minutes=5), stale_heartbeat=STALE)
    assert not check.holds and live_id in check.came_back

    ready = writers.readiness(engine, NS, stale_heartbeat=STALE, now=now)
    assert not ready.ready and any(live_id in reason for reason in ready.reasons), ready.reasons

    since = writers.old_processes_since(engine, NS, now - dt.timedelta(seconds=30), now=now)
    assert [p["process_id"] for p in since] == [live_id]


def test_the_writers_command_exits_3_naming_it(engine, tenant_url):
    import os
    import subprocess
    import sys

    now = utcnow()
    sc = long_lived(now)
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id=LATE_IDS[catalog.ROLE_PROJECTION_WORKER])
    sc.write(engine)
    exe = os.path.join(os.path.dirname(sys.executable), "nexus-cutover")
    proc = subprocess.run([exe, "writers", "-namespace", NS], env={**os.environ, "NEXUS_TENANT_DSN": tenant_url},
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert LATE_IDS[catalog.ROLE_PROJECTION_WORKER] in proc.stderr


def test_readiness_inside_the_releasing_transaction_refuses_and_releases_nothing(engine):
    now = utcnow()
    sc = long_lived(now)
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id=LATE_IDS[catalog.ROLE_INGRESS_WRITER])
    sc.write(engine)
    armed = arm_fence(engine, NS, armed_by="eng", timeout_s=30)
    with pytest.raises(steps.NotReady, match="zz-ingress"):
        steps.release_fence(engine, NS, armed.fence_id, holder="eng", stale_heartbeat=STALE, timeout_s=30)
    with engine.connect() as conn:
        assert fence_row(conn, armed.fence_id)["ReleasedAt"] is None


def test_every_stopped_registry_without_a_live_writer_is_ready_and_all_stopped(engine):
    now = utcnow()
    long_lived(now).write(engine)
    evidence = writers.old_writer_evidence(engine, NS, stale_heartbeat=STALE, now=now)
    assert evidence.all_stopped_or_silent and evidence.live == []
    shown = [p for p in evidence.processes if p["state"] == "stopped"]
    assert len(shown) == 4 * writers.STOPPED_SHOWN  # the most recently stopped of each role, the rest counted
    assert writers.readiness(engine, NS, stale_heartbeat=STALE, now=now).ready


def test_a_silent_process_is_listed_wherever_it_sorts(engine):
    now = utcnow()
    sc = long_lived(now)
    sc.process(catalog.ROLE_RECEIPT_MATERIALIZER, process_id="zz-silent", heartbeat_age_s=600)
    sc.write(engine)
    evidence = writers.old_writer_evidence(engine, NS, stale_heartbeat=STALE, now=now)
    assert {p["process_id"]: p["state"] for p in evidence.processes if p["state"] != "stopped"} == {"zz-silent": "silent"}


def test_every_registry_read_is_a_range_of_the_role_index(mysql_url):
    """EXPLAIN of every statement that decides liveness, on a registry of many namespaces and 1,200 stopped rows."""
    eng = make_engine(mysql_url)
    now = utcnow()
    try:
        make_cutover_ready(eng)
        long_lived(now).write(eng)
        for ns in range(30):
            other = TenantScenario(namespace=f"ns-{ns}", now=now)
            for role in (*catalog.OLD_WRITER_ROLES, catalog.ROLE_INTEGRATION_HOST):
                for i in range(10):
                    other.process(role, process_id=f"{ns}-{role}-{i}", stopped=i > 0)
            other.write(eng)
        old, host = (catalog.OLD_WRITER_ROLES, catalog.PROTOCOL_OLD), ([catalog.ROLE_INTEGRATION_HOST], catalog.PROTOCOL_RANGES)
        statements = {
            "live old writers": writers.live_statement(NS, *old, now, STALE),
            "live hosts": writers.live_statement(NS, *host, now, STALE),
            "silent old writers": writers.silent_statement(NS, *old, now, STALE),
            "stopped counts": writers.stopped_counts_statement(NS, *old),
            "recently stopped": writers.recently_stopped_statement(NS, catalog.ROLE_INGRESS_WRITER, catalog.PROTOCOL_OLD),
            "since the release": writers.processes_since_statement(NS, now - dt.timedelta(minutes=1)),
        }
        with eng.connect() as conn:
            conn.execute(text("ANALYZE TABLE `_System_ProcessRegistry`"))
            for what, stmt in statements.items():
                sql = stmt.compile(eng, compile_kwargs={"literal_binds": True})
                plan = conn.execute(text(f"EXPLAIN {sql}")).mappings().all()
                assert plan[0]["key"] == "ix_ProcessRegistry_Role" and plan[0]["type"] in ("range", "ref"), (what, plan)
    finally:
        eng.dispose()


def test_a_stopped_old_writer_that_heartbeats_after_the_release_is_seen(engine):
    """An old binary that resumes may heartbeat without registering again: its StoppedAt stays set."""
    now = utcnow()
    sc = long_lived(now)
    row = sc.process(catalog.ROLE_INGRESS_WRITER, process_id="zz-resumed", stopped=True, heartbeat_age_s=3600)
    row["LastHeartbeatAt"] = now + dt.timedelta(minutes=5)  # it heartbeat again after the release
    sc.write(engine)
    since = writers.old_processes_since(engine, NS, now - dt.timedelta(seconds=30), now=now)
    assert [p["process_id"] for p in since] == ["zz-resumed"]

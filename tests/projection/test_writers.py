"""Old-writer evidence and new-host readiness from _System_ProcessRegistry, on MariaDB and SQLite."""

from __future__ import annotations

import datetime as dt

import pytest

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.projection import writers
from nexus_sim.scenario import TenantScenario, utcnow
from tests.support import make_cutover_ready

STALE = dt.timedelta(seconds=60)


def test_evidence_classifies_every_old_writer(engine):
    now = utcnow()
    sc = TenantScenario(namespace="acme", now=now)
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id="in-live")
    sc.process(catalog.ROLE_RECEIPT_MATERIALIZER, process_id="mat-silent", heartbeat_age_s=300)
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="pw-stopped", stopped=True)
    sc.process(catalog.ROLE_DEPENDENCY_RESOLVER, process_id="dr-live", heartbeat_age_s=5)
    sc.process(catalog.ROLE_RUNTIME_API, process_id="api")  # not a projection writer
    sc.process(catalog.ROLE_INTEGRATION_HOST, protocol=catalog.PROTOCOL_RANGES, process_id="host")
    TenantScenario(namespace="other").process(catalog.ROLE_INGRESS_WRITER, process_id="x")
    sc.write(engine)
    ev = writers.old_writer_evidence(engine, "acme", stale_heartbeat=STALE, now=now)
    states = {p["process_id"]: p["state"] for p in ev.processes}
    assert states == {"in-live": "live", "mat-silent": "silent", "pw-stopped": "stopped", "dr-live": "live"}
    assert not ev.all_stopped_or_silent
    assert [p["process_id"] for p in ev.live] == ["dr-live", "in-live"]
    md = ev.as_markdown()
    assert "| `in-live` | ingress_writer | 4.11.0 | **live**" in md
    text = ev.as_text()  # what a task log and a terminal show: plain aligned columns, no markdown (issue 34)
    assert "|" not in text and "**" not in text and "`" not in text
    row = next(line for line in text.splitlines() if line.strip().startswith("in-live"))
    assert row.split()[:4] == ["in-live", "ingress_writer", "4.11.0", "live"]
    header, *rows = [line for line in text.splitlines()[1:]]
    assert all(r.index(r.split()[1]) == header.index("role") for r in rows if len(r.split()) > 1)  # columns aligned


def test_all_stopped_or_silent(engine):
    now = utcnow()
    sc = TenantScenario(namespace="acme", now=now)
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id="a", stopped=True)
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="b", heartbeat_age_s=61)
    sc.write(engine)
    ev = writers.old_writer_evidence(engine, "acme", stale_heartbeat=STALE, now=now)
    assert ev.all_stopped_or_silent and ev.as_json()["live"] == []
    assert "No old-protocol" in writers.old_writer_evidence(engine, "none", stale_heartbeat=STALE).as_markdown()


@pytest.mark.parametrize(
    ("host_kwargs", "old_live", "reason"),
    [
        ({"activated": True}, False, None),
        ({"activated": False}, False, "has not activated"),
        ({"activated": True, "heartbeat_age_s": 600}, False, "no live ProjectionProtocol=1"),
        ({"activated": True, "stopped": True}, False, "no live ProjectionProtocol=1"),
        ({"activated": True}, True, "live old-protocol writer(s): old-in"),
        (None, False, "no live ProjectionProtocol=1"),
    ],
)
def test_readiness(engine, host_kwargs, old_live, reason):
    now = utcnow()
    sc = TenantScenario(namespace="acme", now=now)
    if host_kwargs is not None:
        sc.process(catalog.ROLE_INTEGRATION_HOST, protocol=catalog.PROTOCOL_RANGES, process_id="host-1", **host_kwargs)
    sc.process(catalog.ROLE_INTEGRATION_HOST, protocol=catalog.PROTOCOL_OLD, process_id="old-host", activated=True)
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id="old-in", stopped=not old_live)
    sc.write(engine)
    r = writers.readiness(engine, "acme", stale_heartbeat=STALE, now=now)
    if reason is None:
        assert r.ready and r.as_json()["ready_hosts"] == ["host-1"]
    else:
        assert not r.ready and any(reason in x for x in r.reasons), r.reasons


def test_old_processes_since(engine):
    now = utcnow()
    sc = TenantScenario(namespace="acme", now=now)
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id="restarted")
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="long-gone", heartbeat_age_s=3600, stopped=True)
    sc.process(catalog.ROLE_INTEGRATION_HOST, protocol=catalog.PROTOCOL_RANGES, process_id="host")
    sc.write(engine)
    seen = writers.old_processes_since(engine, "acme", now - dt.timedelta(seconds=30), now=now)
    assert [p["process_id"] for p in seen] == ["restarted"]


def test_registry_queries_use_the_role_index(mysql_url):
    from sqlalchemy import select, text

    from nexus_cutover.catalog import ProcessRegistry

    eng = make_engine(mysql_url)
    try:
        make_cutover_ready(eng)
        for ns in range(40):
            sc = TenantScenario(namespace=f"ns-{ns}")
            for role in catalog.OLD_WRITER_ROLES:
                sc.process(role, process_id=f"{ns}-{role}")
            sc.write(eng)
        stmt = select(ProcessRegistry).where(
            ProcessRegistry.c.Namespace == "ns-3",
            ProcessRegistry.c.Role.in_(list(catalog.OLD_WRITER_ROLES)),
            ProcessRegistry.c.ProjectionProtocol == catalog.PROTOCOL_OLD,
        )
        with eng.connect() as conn:
            conn.execute(text("ANALYZE TABLE `_System_ProcessRegistry`"))
            plan = conn.execute(text(f"EXPLAIN {stmt.compile(eng, compile_kwargs={'literal_binds': True})}")).mappings().all()
        assert plan[0]["key"] == "ix_ProcessRegistry_Role", plan
    finally:
        eng.dispose()

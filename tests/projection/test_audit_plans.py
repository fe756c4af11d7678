"""Every audit query runs on an index (EXPLAIN on MariaDB); the one exception is said where it is tested."""

from __future__ import annotations

import random

import pytest
from sqlalchemy import text

from nexus_cutover.db import make_engine
from nexus_cutover.identity import ProjectionIdentity
from nexus_cutover.projection import audit
from nexus_sim.scenario import TenantScenario, drained_pack_history
from tests.support import make_cutover_ready

IDENT = ProjectionIdentity("pk-1", "contact.changed", 1, "1.0.0", "connector.projection", "lane-003")


@pytest.fixture
def engine(mysql_url):
    eng = make_engine(mysql_url)
    make_cutover_ready(eng)
    sc = TenantScenario()
    for p in range(3):
        pack = sc.pack(f"pk-{p}")
        drained_pack_history(pack, random.Random(p), lanes=20, generations=30)
        pack.lane("live").generation(2, status="pending")
    drained_pack_history(sc.pack("pk-small"), random.Random(9), lanes=1, generations=2)  # a small share of the table
    sc.ordinary_work(sc.events[0], status="retry")
    sc.write(eng)
    with eng.connect() as conn:
        conn.execute(text("ANALYZE TABLE _System_Event, _System_WorkItem"))
    yield eng
    eng.dispose()


def explain(engine, stmt):
    sql = str(stmt.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text("EXPLAIN " + sql))]


@pytest.mark.parametrize(
    "name, build, table, key",
    [
        ("live projection work", lambda: audit.live_projection_work_statement("pk-1", "acme"), "_System_WorkItem", "ix_WorkItem_State"),
        ("walking an identity's WorkItems down", lambda: audit.walk_down_statement(IDENT, (40, 7), 1000), "_System_WorkItem",
         "ix_WorkItem_ProjectionOrder"),
        ("the top of an identity's WorkItems", lambda: audit.walk_down_statement(IDENT, None, 1000), "_System_WorkItem",
         "ix_WorkItem_ProjectionOrder"),
        ("per-identity ordinals", lambda: audit.event_ordinals_statement("pk-1"), "_System_Event", "ix_Event_SourceLane"),
        ("indirect inputs", lambda: audit.indirect_events_statement(IDENT, 40, (41, 7), 100), "_System_Event", "ix_Event_SourceLane"),
        ("indirect inputs, first batch", lambda: audit.indirect_events_statement(IDENT, None, None, 100), "_System_Event",
         "ix_Event_SourceLane"),
    ],
)
def test_audit_query_uses_its_index(engine, name, build, table, key):
    plan = explain(engine, build())
    rows = {r["table"]: r for r in plan}
    assert rows[table]["key"] == key, (name, plan)
    assert all(r["type"] != "ALL" for r in plan), (name, plan)


def test_top_work_of_every_identity_is_a_loose_index_scan_then_one_dive_each(engine):
    plan = explain(engine, audit.top_work_statement("pk-1"))
    reads = [r for r in plan if r["table"] == "_System_WorkItem"]
    assert len(reads) == 2 and all(r["key"] == "ix_WorkItem_ProjectionOrder" for r in reads), plan
    assert any("Using index for group-by" in (r["Extra"] or "") for r in reads), plan
    assert any(r["type"] == "ref" for r in reads), plan


def test_native_work_of_a_small_pack_is_read_through_its_index(engine):
    """A pack that is a small share of the WorkItem table is read through its projection-order range.

    (When the pack is most of the table the server reads the table once instead: every row of the pack
    is needed for ``InputStartOrdinal`` anyway, and one pass is cheaper than a lookup per row;
    docs/performance.md, round six.)
    """
    plan = explain(engine, audit.native_work_statement("pk-small"))
    assert plan[0]["key"] == "ix_WorkItem_ProjectionOrder" and plan[0]["type"] != "ALL", plan


def test_direct_task_probe_is_an_index_lookup(engine):
    plan = explain(engine, audit.indirect_events_statement(IDENT, None, None, 100))
    probe = [r for r in plan if r["table"] == "_System_WorkItem"]
    assert probe and probe[0]["key"] == "ix_WorkItem_Selected", plan


def test_per_identity_ordinals_is_a_loose_index_scan_on_mariadb(engine):
    plan = explain(engine, audit.event_ordinals_statement("pk-1"))
    assert "Using index for group-by" in plan[0]["Extra"], plan


def test_live_direct_work_of_other_classes_starts_from_live_rows(engine):
    plan = explain(engine, audit.live_direct_work_statement("pk-1", "acme"))
    work = [r for r in plan if r["table"] == "_System_WorkItem"][0]
    event = [r for r in plan if r["table"] == "_System_Event"][0]
    assert work["key"] == "ix_WorkItem_State" and event["key"] == "PRIMARY", plan

"""Query plans on MariaDB: the runtime's hot reads are index ranges, never full scans.

A tenant with many lanes and retained generations is built, ANALYZEd, and each
query the runtime issues per batch / claim / payload read is EXPLAINed with
its real shape (compiled by the MariaDB dialect).
"""

from __future__ import annotations

import json

import pytest
from sqlalchemy import text

from nexus_cutover.identity import ProjectionIdentity
from nexus_cutover.runtime.admission import admit_batch
from nexus_cutover.runtime.claim import claim_candidates_query
from nexus_cutover.runtime.duplicates import existing_events_query
from nexus_cutover.runtime.generations import (
    covering_generation_query,
    latest_generation_query,
    latest_generations_query,
    previous_generation_query,
)
from nexus_cutover.runtime.model import Input
from nexus_cutover.runtime.payload import payload_query
from nexus_cutover.runtime.tx import next_ids_query

from .support import NS, range_tenant

pytestmark = pytest.mark.mysql

LANES, GENERATIONS, INPUTS = 20, 60, 3


def _history(sc):
    pack = sc.packs[0]
    for i in range(LANES):
        lane = pack.lane(f"lane-{i:03d}")
        for g in range(GENERATIONS):
            evs = [lane.event(status="processed") for _ in range(INPUTS)]
            status = "completed" if g < GENERATIONS - 1 else "pending"
            lane.work_item(evs[-1], status=status, input_start_ordinal=evs[0]["EnqueueOrdinal"])


def _explain(engine, query):
    sql = str(query.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(text("EXPLAIN " + sql))]


def test_hot_queries_use_the_source_lane_and_projection_order_indexes(mysql_range_engine):
    engine = mysql_range_engine
    range_tenant(engine, build=_history)
    with engine.begin() as conn:
        for table in ("_System_Event", "_System_WorkItem"):
            conn.execute(text(f"ANALYZE TABLE `{table}`"))
    ident = ProjectionIdentity("pk-1", "contact.changed", 1, "1.0.0", "connector.projection", "lane-007")
    mid = 7 * GENERATIONS * INPUTS + GENERATIONS * INPUTS // 2 + 1  # a generation start inside lane-007
    cases = {
        "payload read": (payload_query(ident, mid, mid + 2), "ix_Event_SourceLane"),
        "latest generation (successor lookup)": (latest_generation_query(ident), "ix_WorkItem_ProjectionOrder"),
        "covering generation (duplicate coverage)": (covering_generation_query(ident, mid), "ix_WorkItem_ProjectionOrder"),
        "previous generation (claim order)": (previous_generation_query(ident, mid), "ix_WorkItem_ProjectionOrder"),
        "duplicate detection": (existing_events_query("pk-1", {"lane-007": {"r-1", "r-2"}, "lane-008": {"r-3"}}), "ux_Event_Receipt"),
    }
    for name, (query, index) in cases.items():
        (row,) = _explain(engine, query)
        assert row["key"] == index, f"{name}: {row}"
        assert row["type"] in ("range", "ref"), f"{name} scans: {row}"
        assert int(row["rows"]) <= GENERATIONS * INPUTS, f"{name} reads too many rows: {row}"
    other = ProjectionIdentity("pk-1", "contact.changed", 1, "1.0.0", "connector.projection", "lane-008")
    union = _explain(engine, latest_generations_query([ident, other]))
    derived = [r for r in union if r["table"] == "_System_WorkItem"]
    assert len(derived) == 2 and all(r["key"] == "ix_WorkItem_ProjectionOrder" and r["type"] == "range" for r in derived), union
    # The id shard's next ids: MAX over a primary-key range, answered by one index dive at plan time.
    dives = ("Select tables optimized away", "No matching min/max row")
    for _ in ("an empty shard", "a used shard"):
        id_reads = [r for r in _explain(engine, next_ids_query("pk-1")) if r["select_type"] == "SUBQUERY"]
        assert len(id_reads) == 2 and all(r["Extra"] in dives for r in id_reads), id_reads
        admit_batch(engine, "pk-1", [Input("lane-000", "fresh", "{}")])
    (payload,) = _explain(engine, payload_query(ident, mid, mid + INPUTS - 1))
    assert int(payload["rows"]) <= 2 * INPUTS, payload  # the generation's inputs, not the lane's history


def test_claim_candidates_test_the_predecessor_in_sql_on_one_index_row(mysql_range_engine):
    """The candidate read is a range on ix_WorkItem_State; the predecessor test a dependent subquery on
    ix_WorkItem_ProjectionOrder (equality on the identity, LaneOrdinal bound, LIMIT 1): no scan, no per-row round trip."""
    engine = mysql_range_engine
    range_tenant(engine, build=_history)
    with engine.begin() as conn:
        conn.execute(text("ANALYZE TABLE `_System_WorkItem`"))
    plan = _explain(engine, claim_candidates_query(NS))
    assert len(plan) == 2, plan
    outer, sub = plan
    assert outer["table"] == "_System_WorkItem" and outer["key"] == "ix_WorkItem_State", plan
    assert outer["type"] in ("range", "ref"), plan
    assert int(outer["rows"]) <= GENERATIONS * INPUTS, plan
    assert sub["select_type"] == "DEPENDENT SUBQUERY" and sub["table"] == "prev", plan
    assert sub["key"] == "ix_WorkItem_ProjectionOrder" and sub["type"] in ("range", "ref"), plan
    assert int(sub["rows"]) <= GENERATIONS, plan  # an estimate over one identity; LIMIT 1 stops early, see below
    with engine.connect() as conn:
        if "mariadb" not in conn.exec_driver_sql("SELECT VERSION()").scalar().lower():
            return  # ANALYZE FORMAT=JSON is MariaDB's
        sql = str(claim_candidates_query(NS).compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
        analyzed = json.loads(conn.execute(text("ANALYZE FORMAT=JSON " + sql)).scalar())
    (subquery,) = analyzed["query_block"]["subqueries"]
    block = subquery.get("expression_cache", subquery)["query_block"]
    (prev,) = [step["table"] for step in block["nested_loop"]]
    assert prev["key"] == "ix_WorkItem_ProjectionOrder" and prev["r_loops"] == LANES, prev
    # Read backward from the top of the identity: the candidate itself, then its predecessor. The 58 completed
    # generations below are never read, whatever the history depth.
    assert prev["r_rows"] <= 2, prev


def test_equality_keys_are_computed_without_reading_a_table(mysql_range_engine):
    """The weight-string statement of identity / receipt keys takes the column's collation from an empty SELECT of it
    (an impossible WHERE): the server reads no row of the table, however large."""
    from nexus_cutover.catalog import Event
    from nexus_cutover.identity import _collation_statement, _weights_statement

    engine = mysql_range_engine
    range_tenant(engine, build=_history)
    for statement in (_weights_statement(Event.c.SourceLane, 3), _collation_statement(Event.c.ReceiptId)):
        sql = str(statement.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
        with engine.connect() as conn:
            plan = [dict(r._mapping) for r in conn.execute(text("EXPLAIN " + sql), {"v0": "a", "v1": "b", "v2": "c"})]
        outer, empty_select, *values = plan
        assert outer["table"].startswith("<derived") and int(outer["rows"]) <= 4, plan  # the values themselves
        assert empty_select["table"] is None and empty_select["Extra"] == "Impossible WHERE", plan
        assert values and all(r["table"] is None and r["Extra"] == "No tables used" for r in values), plan

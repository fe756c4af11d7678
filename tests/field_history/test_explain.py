"""The materializer's batch queries run on indexes (EXPLAIN on MariaDB)."""

from __future__ import annotations

from sqlalchemy import text

from nexus_cutover.field_history.materialize import batch_upper_bound, stamp_statement
from nexus_sim.scenario import TenantScenario

AUDIT = "_System_AuditFieldChange"
INTERVAL = "_System_FieldHistoryTrackingInterval"


def explain(engine, stmt) -> dict[str, dict]:
    sql = str(stmt.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        return {r["table"]: dict(r) for r in conn.execute(text("EXPLAIN " + sql)).mappings()}


def populate(engine) -> None:
    sc = TenantScenario()
    for f in range(1, 21):
        sc.field(f, intervals=[(f, f + 50), (f + 100, None)])
    for i in range(5000):
        sc.audit_change(i % 25 + 1, history_sequence=i % 200)
    sc.write(engine)
    with engine.begin() as conn:
        conn.execute(text(f"ANALYZE TABLE {AUDIT}, {INTERVAL}"))


def test_batch_bound_is_a_primary_key_range_scan(mysql_fh_engine):
    populate(mysql_fh_engine)
    plan = explain(mysql_fh_engine, batch_upper_bound(100, 2000))
    assert plan[AUDIT]["key"] == "PRIMARY" and plan[AUDIT]["type"] == "range", plan


def test_stamp_updates_use_the_primary_key_range_and_the_interval_index(mysql_fh_engine):
    populate(mysql_fh_engine)
    for value in (True, False):
        plan = explain(mysql_fh_engine, stamp_statement(value, 100, 2100))
        assert plan[AUDIT]["key"] == "PRIMARY" and plan[AUDIT]["type"] == "range", plan
        assert plan[INTERVAL]["key"] == "ix_TrackingInterval_Field" and plan[INTERVAL]["type"] == "ref", plan

"""The materializer's batch queries, its proof, the stage-3 read comparison and stage 3's outbox reads run on indexes
(EXPLAIN on MariaDB)."""

from __future__ import annotations

from sqlalchemy import text

from nexus_cutover.field_history.materialize import batch_bounds, batch_rows, boolean_accepted, compat_accepted, decide_statement
from nexus_cutover.field_history.status import chunk_counts, differing_rows
from nexus_cutover.field_history.switch import failed_outbox_statement, open_outbox_statement
from nexus_sim.scenario import TenantScenario

AUDIT = "_System_AuditFieldChange"
INTERVAL = "_System_FieldHistoryTrackingInterval"
PROBES = ("ref", "index_subquery")  # a per-row lookup on the interval index (MariaDB names the EXISTS form index_subquery)


def explain(engine, stmt) -> list[dict]:
    sql = str(stmt.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        return [dict(r) for r in conn.exec_driver_sql("EXPLAIN " + sql).mappings()]  # as compiled: % stays escaped


def by_table(plan: list[dict]) -> dict[str, dict]:
    return {r["table"]: r for r in plan}


def populate(engine) -> None:
    sc = TenantScenario()
    for f in range(1, 21):
        sc.field(f, intervals=[(f, f + 50), (f + 100, None)])
    for i in range(5000):
        sc.audit_change(i % 25 + 1, history_sequence=i % 200)
    sc.write(engine)
    with engine.begin() as conn:
        conn.execute(text(f"ANALYZE TABLE {AUDIT}, {INTERVAL}"))


def assert_pk_range_with_interval_probe(plan: dict[str, dict]) -> None:
    assert plan[AUDIT]["key"] == "PRIMARY" and plan[AUDIT]["type"] == "range", plan
    assert plan[INTERVAL]["key"] == "ix_TrackingInterval_Field" and plan[INTERVAL]["type"] in PROBES, plan


def test_the_batch_bounds_and_the_locked_batch_read_are_primary_key_range_scans(mysql_fh_engine):
    populate(mysql_fh_engine)
    for stmt in (batch_bounds(100, 2000), batch_rows(100, 2000)):
        audit = [r for r in explain(mysql_fh_engine, stmt) if r["table"] == AUDIT]
        assert len(audit) == 1 and audit[0]["key"] == "PRIMARY" and audit[0]["type"] == "range", audit


def test_the_deciding_update_uses_the_primary_key_range_and_the_interval_index(mysql_fh_engine):
    populate(mysql_fh_engine)
    assert_pk_range_with_interval_probe(by_table(explain(mysql_fh_engine, decide_statement(100, 2100))))


def test_the_batch_proof_reads_are_primary_key_ranges(mysql_fh_engine):
    populate(mysql_fh_engine)
    assert_pk_range_with_interval_probe(by_table(explain(mysql_fh_engine, compat_accepted(100, 2100))))
    plan = by_table(explain(mysql_fh_engine, boolean_accepted(100, 2100)))
    assert plan[AUDIT]["key"] == "PRIMARY" and plan[AUDIT]["type"] == "range" and INTERVAL not in plan, plan


def test_each_stage_3_chunk_is_one_primary_key_range_with_the_interval_probe(mysql_fh_engine):
    populate(mysql_fh_engine)
    for stmt in (chunk_counts(2500, 7500), differing_rows(100, 5100, 10)):
        plan = explain(mysql_fh_engine, stmt)
        audit = [r for r in plan if r["table"] == AUDIT]
        assert len(audit) == 1 and audit[0]["key"] == "PRIMARY" and audit[0]["type"] == "range", plan
        interval = [r for r in plan if r["table"] == INTERVAL]
        assert interval and all(r["key"] == "ix_TrackingInterval_Field" and r["type"] in PROBES for r in interval), plan


def test_stage_3_reads_its_failed_and_open_outbox_rows_on_the_status_index(mysql_fh_engine):
    """Every stage-3 poll and its locked transaction read the failed outbox rows: a range of ix_AuditOutbox_Status, not a
    scan of a long-lived outbox's delivered rows."""
    sc = TenantScenario()
    for i in range(3000):
        sc.outbox_row(producer_version="4.13.0", status="failed" if i % 1000 == 0 else "pending" if i % 700 == 0 else "delivered")
    sc.write(mysql_fh_engine)
    with mysql_fh_engine.begin() as conn:
        conn.execute(text("ANALYZE TABLE _System_AuditOutbox"))
    for stmt in (failed_outbox_statement(), open_outbox_statement()):
        [plan] = explain(mysql_fh_engine, stmt)
        assert plan["key"] == "ix_AuditOutbox_Status" and plan["type"] in ("ref", "range"), plan

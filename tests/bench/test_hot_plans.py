"""Every statement of one drain poke -- the query 1,000 waiting tenants repeat -- runs on an index.

tests/projection/test_drain.py checks the per-status counts; this captures
*every* statement a real poke sends (column probe, counts, worker lookup,
blocker classification and samples) on the bench's walking workload with live
old work, and EXPLAINs each one that reads a tenant table on MariaDB: no full
table scan anywhere. Plans, not timings, so CI catches a regression.
"""

from __future__ import annotations

import sys
from pathlib import Path

import pytest
from sqlalchemy import event, text

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_sim.scenario import TenantScenario

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import bench_drain  # noqa: E402
import workload  # noqa: E402

LANES, GENERATIONS = 60, 20


@pytest.fixture
def walking_engine(mysql_url):
    eng = make_engine(mysql_url)
    workload.build(eng, lanes=LANES, generations=GENERATIONS, inputs=5)
    bench_drain.add_live_old_work(eng, lanes=LANES, generations=GENERATIONS, inputs=5, live_lanes=40)
    others = TenantScenario(namespace="other")  # registry rows of other tenants and roles, as on a shared server
    for i in range(200):
        others.process(catalog.ROLE_PROJECTION_WORKER if i % 2 else catalog.ROLE_INTEGRATION_HOST, process_id=f"p-{i}")
    others.write(eng)
    with eng.connect() as conn:
        conn.execute(text("ANALYZE TABLE _System_WorkItem, _System_ProcessRegistry"))
    yield eng
    eng.dispose()


def test_every_statement_of_a_drain_poke_uses_an_index(walking_engine):
    statements: list[tuple[str, object]] = []

    def capture(conn, cursor, statement, parameters, context, executemany):
        statements.append((statement, parameters))

    event.listen(walking_engine, "before_cursor_execute", capture)
    try:
        report = bench_drain.poke(walking_engine)
    finally:
        event.remove(walking_engine, "before_cursor_execute", capture)
    assert report.state == "draining" and report.remaining == 40, report.report_text()
    tenant_reads = [(s, p) for s, p in statements if s.lstrip().upper().startswith("SELECT") and "_System_" in s]
    tables = {t for s, _ in tenant_reads for t in ("_System_WorkItem", "_System_ProcessRegistry") if t in s}
    assert tables == {"_System_WorkItem", "_System_ProcessRegistry"}, statements
    with walking_engine.connect() as conn:
        for statement, parameters in tenant_reads:
            plan = conn.exec_driver_sql("EXPLAIN " + statement, parameters).mappings().all()
            for row in plan:
                assert row["type"] != "ALL" and row["key"], (statement, parameters, [dict(r) for r in plan])
                if row["table"] == "_System_WorkItem":
                    assert row["key"] == "ix_WorkItem_State", (statement, dict(row))

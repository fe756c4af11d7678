"""Every chunk statement of the history digest and its verification reads a primary-key range (EXPLAIN, MariaDB).

The digest reads all of history once per cutover run; a chunk that fell back
to a full scan would make it quadratic. Plans, not timings.
"""

from __future__ import annotations

import sys
from pathlib import Path

from sqlalchemy import event, text

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.projection.digest import compute_digest, verify_digest

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "bench"))
import workload  # noqa: E402

HISTORY = (catalog.Event.name, catalog.WorkItem.name)


def test_every_digest_and_verification_chunk_reads_a_primary_key_range(mysql_url):
    eng = make_engine(mysql_url)
    try:
        workload.build(eng, lanes=40, generations=10, inputs=5)
        with eng.connect() as conn:
            conn.execute(text("ANALYZE TABLE _System_Event, _System_WorkItem"))
        statements: list[tuple[str, object]] = []

        def capture(conn, cursor, statement, parameters, context, executemany):
            if statement.lstrip().upper().startswith("SELECT") and any(t in statement for t in HISTORY):
                statements.append((statement, parameters))

        event.listen(eng, "before_cursor_execute", capture)
        try:
            digest = compute_digest(eng, workload.NAMESPACE, chunk_rows=500)
            assert verify_digest(eng, digest).ok
        finally:
            event.remove(eng, "before_cursor_execute", capture)
        assert digest.chunk_count[catalog.Event.name] == 4 and len(statements) >= 8
        with eng.connect() as conn:
            for statement, parameters in statements:
                plan = conn.exec_driver_sql("EXPLAIN " + statement, parameters).mappings().all()
                base = [r for r in plan if r["table"] in HISTORY]
                assert base, (statement, [dict(r) for r in plan])
                for row in base:
                    assert row["key"] == "PRIMARY" and row["type"] in ("range", "index"), (statement, dict(row))
    finally:
        eng.dispose()

"""Benchmark: batched stage-2 materialization vs one set-based UPDATE ... JOIN, same MariaDB, one run.

    bash scripts/with-mariadb.sh .venv/bin/python bench/bench_materialize.py [--rows 1000000] [--batch-size 2000]

Builds two identical copies of an audit table (``--rows`` rows: most NULL with a
FieldId and a sequence, some stamped, some without sequence or FieldId) in two
fresh databases of the server named by ``NEXUS_TEST_MYSQL_URL``. Then:

1. baseline: one ``UPDATE a LEFT JOIN interval ... SET FieldHistoryEligible = (match)``
   over copy A, a single transaction of every row;
2. :func:`nexus_cutover.field_history.materialize.materialize` over copy B, keyset
   batches of ``--batch-size`` rows, each its own transaction.

Prints rows/s of both, the ratio (goal >= 0.5), the largest batch, that both
copies end identical, and the Python peak memory (tracemalloc) of the batched
run at --rows and at --rows/10 (it must not grow with the table). The data is
generated server-side (MariaDB ``INSERT ... SELECT``); nothing is written into
tests. The databases are dropped at the end.
"""

from __future__ import annotations

import argparse
import os
import sys
import time
import tracemalloc
import uuid

from sqlalchemy import insert, text
from sqlalchemy.engine import make_url

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.field_history.materialize import materialize
from nexus_cutover.schema import apply_steps, create_legacy_schema, field_history_steps

FIELDS = 1000
AUDIT = catalog.AuditFieldChange.name
INTERVAL = catalog.FieldHistoryTrackingInterval.name

SET_BASED = f"""
UPDATE `{AUDIT}` a
LEFT JOIN `{INTERVAL}` i
  ON i.FieldId = a.FieldId AND i.StartedSequence < a.HistorySequence
 AND (i.EndedSequence IS NULL OR a.HistorySequence < i.EndedSequence)
SET a.FieldHistoryEligible = (i.IntervalId IS NOT NULL)
WHERE a.FieldHistoryEligible IS NULL AND a.FieldId IS NOT NULL AND a.HistorySequence IS NOT NULL
"""

GENERATE = f"""
INSERT INTO `{AUDIT}` (ChangeId, AuditId, ObjectName, RecordId, FieldId, OldValue, NewValue,
                      HistorySequence, ProducerVersion, CreatedAt, FieldHistoryEligible)
SELECT n, n, 'Contact', CONCAT('rec-', n % 10000),
       CASE WHEN n % 50 = 0 THEN NULL ELSE n % {FIELDS} + 1 END,
       'old', 'new',
       CASE WHEN n % 37 = 0 THEN NULL ELSE n % 5000 END,
       '4.11.0', '2026-01-01 00:00:00',
       CASE WHEN n % 23 = 0 THEN n % 2 ELSE NULL END
FROM (SELECT :base + a.d + 10*b.d + 100*c.d + 1000*d.d + 10000*e.d + 1 AS n
      FROM bench_digits a, bench_digits b, bench_digits c, bench_digits d, bench_digits e) g
WHERE n <= :rows
"""


def intervals() -> list[dict]:
    rows = []
    for f in range(1, FIELDS + 1):
        if f % 3 == 0:
            continue  # never tracked
        rows.append({"FieldId": f, "StartedSequence": f, "EndedSequence": f + 2000})
        if f % 2 == 0:
            rows.append({"FieldId": f, "StartedSequence": f + 3000, "EndedSequence": None})
    return rows


def build(server_url, name: str, rows: int):
    admin = make_engine(server_url.set(database="mysql"))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}`"))
    admin.dispose()
    engine = make_engine(server_url.set(database=name))
    create_legacy_schema(engine)
    apply_steps(engine, field_history_steps(engine))
    with engine.begin() as conn:
        conn.execute(insert(catalog.FieldHistoryTrackingInterval), intervals())
        conn.execute(text("CREATE TABLE bench_digits (d INT PRIMARY KEY)"))
        conn.execute(text("INSERT INTO bench_digits VALUES (0),(1),(2),(3),(4),(5),(6),(7),(8),(9)"))
    for base in range(0, rows, 100_000):
        with engine.begin() as conn:
            conn.execute(text(GENERATE), {"base": base, "rows": rows})
    with engine.begin() as conn:
        conn.execute(text(f"ANALYZE TABLE `{AUDIT}`, `{INTERVAL}`"))
    return engine


def value_counts(engine) -> list[tuple]:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT FieldHistoryEligible, COUNT(*), SUM(ChangeId) FROM `{AUDIT}` GROUP BY 1 ORDER BY 1")).all()


def batched(engine, batch_size: int):
    largest = {"rows": 0, "prev": 0}

    def on_batch(p):
        largest["rows"] = max(largest["rows"], p.rows_done - largest["prev"])
        largest["prev"] = p.rows_done

    tracemalloc.start()
    started = time.perf_counter()
    result = materialize(engine, batch_size=batch_size, on_batch=on_batch, progress_every_s=3600)
    seconds = time.perf_counter() - started
    peak = tracemalloc.get_traced_memory()[1]
    tracemalloc.stop()
    return result, seconds, peak, largest["rows"]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--rows", type=int, default=1_000_000)
    parser.add_argument("--batch-size", type=int, default=2000)
    args = parser.parse_args()
    server = os.environ.get("NEXUS_TEST_MYSQL_URL")
    if not server:
        print("set NEXUS_TEST_MYSQL_URL (run through scripts/with-mariadb.sh)", file=sys.stderr)
        return 2
    server_url = make_url(server)
    tag = uuid.uuid4().hex[:8]
    names = [f"bench_fh_{tag}_{s}" for s in ("setbased", "batched", "small")]
    engines = []
    try:
        t0 = time.perf_counter()
        a = build(server_url, names[0], args.rows)
        b = build(server_url, names[1], args.rows)
        small = build(server_url, names[2], args.rows // 10)
        engines = [a, b, small]
        print(f"built 2 x {args.rows} rows (+ {args.rows // 10}) in {time.perf_counter() - t0:.1f}s")

        with a.begin() as conn:
            started = time.perf_counter()
            set_rows = conn.execute(text(SET_BASED)).rowcount
        set_s = time.perf_counter() - started

        result, batch_s, peak_big, largest = batched(b, args.batch_size)
        small_result, _, peak_small, _ = batched(small, args.batch_size)

        set_rate, batch_rate = set_rows / set_s, result.rows / batch_s
        same = value_counts(a) == value_counts(b)
        print(f"set-based UPDATE ... JOIN : {set_rows} rows in {set_s:.2f}s = {set_rate:,.0f} rows/s (one transaction)")
        print(
            f"batched materialize       : {result.rows} rows in {batch_s:.2f}s = {batch_rate:,.0f} rows/s "
            f"({result.batches} transactions, largest {largest} rows, batch size {args.batch_size})"
        )
        print(f"ratio batched / set-based : {batch_rate / set_rate:.2f} (goal >= 0.5)")
        print(f"identical final tables    : {same}")
        print(
            f"python peak memory        : {peak_big / 1024:.0f} KiB at {result.rows} rows, "
            f"{peak_small / 1024:.0f} KiB at {small_result.rows} rows"
        )
        if same:  # figures for bench/run_all.py (NEXUS_BENCH_RESULTS or bench/results.json)
            import benchlib  # bench/ is on sys.path when this runs as a script

            benchlib.merge_results(
                {
                    "materialize_vs_setbased": round(batch_rate / set_rate, 3),
                    "materialize_rows_per_s": round(batch_rate),
                    "materialize_setbased_rows_per_s": round(set_rate),
                    "materialize_run": {
                        "rows": result.rows,
                        "batches": result.batches,
                        "largest_batch": largest,
                        "batch_s": batch_s,
                        "setbased_s": set_s,
                        "peak_kib": peak_big / 1024,
                        "peak_kib_tenth": peak_small / 1024,
                    },
                }
            )
        return 0 if same else 1
    finally:
        for e in engines:
            e.dispose()
        admin = make_engine(server_url.set(database="mysql"))
        with admin.begin() as conn:
            for name in names:
                conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()


if __name__ == "__main__":
    sys.exit(main())

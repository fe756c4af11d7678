"""Range runtime benchmarks (issue 3), printed as ratios measured in one run on one database.

1. Payload read: one generation of a fixed input count, read by WorkId through
   the range reader, with 10 vs 10,000 retained generations of its identity.
   Target: ratio (10,000 / 10) at most 1.3.
2. Admission throughput: batched fresh ingress through ``admit_batch`` vs plain
   multi-row INSERTs of the same Event rows in the same batch size, each batch
   its own transaction. Target: ratio (admission / plain) at least 0.5.

Usage (a throwaway MariaDB):
    bash scripts/with-mariadb.sh .venv/bin/python bench/bench_runtime.py [--json]
or point ``NEXUS_BENCH_DSN`` at an existing empty database (sqlite:///... works too).
Nothing here is asserted; the numbers go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time
import uuid

from sqlalchemy import func, insert, select, text
from sqlalchemy.engine import make_url

sys.path.insert(0, os.path.join(os.path.dirname(__file__), "..", "include"))

from nexus_cutover import catalog  # noqa: E402
from nexus_cutover.clock import utcnow  # noqa: E402
from nexus_cutover.db import make_engine  # noqa: E402
from nexus_cutover.runtime.admission import admit_batch  # noqa: E402
from nexus_cutover.runtime.model import Input  # noqa: E402
from nexus_cutover.runtime.payload import load_payloads  # noqa: E402
from nexus_cutover.schema import apply_steps, create_legacy_schema, projection_steps  # noqa: E402
from nexus_sim.scenario import TenantScenario  # noqa: E402


def _database():
    dsn = os.environ.get("NEXUS_BENCH_DSN")
    if dsn:
        return make_engine(dsn), None
    server = os.environ.get("NEXUS_TEST_MYSQL_URL")
    if not server:
        sys.exit("set NEXUS_BENCH_DSN, or run under scripts/with-mariadb.sh (NEXUS_TEST_MYSQL_URL)")
    name = f"nx_bench_{uuid.uuid4().hex[:8]}"
    admin = make_engine(make_url(server).set(database="mysql"))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}`"))
    return make_engine(make_url(server).set(database=name)), (admin, name)


def _median_call(fn, repeats: int) -> float:
    samples = []
    for _ in range(repeats):
        t0 = time.perf_counter()
        fn()
        samples.append(time.perf_counter() - t0)
    return statistics.median(samples)


def bench_payload_read(engine, *, inputs: int = 20, small: int = 10, large: int = 10_000, repeats: int = 500) -> dict:
    sc = TenantScenario(namespace="bench")
    pack = sc.pack("pk-read")
    sc.protocol_row("pk-read", 0)
    measured = {}
    for name, retained in (("small", small), ("large", large)):
        lane = pack.lane(f"lane-{name}")
        for _ in range(retained):
            ev = lane.event(status="processed")
            lane.work_item(ev, status="completed", input_start_ordinal=ev["EnqueueOrdinal"])
        evs = [lane.event(status="pending") for _ in range(inputs)]
        work = lane.work_item(evs[-1], status="pending", input_start_ordinal=evs[0]["EnqueueOrdinal"])
        measured[name] = work["WorkId"]
    t0 = time.perf_counter()
    sc.write(engine)
    build_s = time.perf_counter() - t0
    if engine.dialect.name in ("mysql", "mariadb"):
        with engine.begin() as conn:
            conn.execute(text("ANALYZE TABLE `_System_Event`, `_System_WorkItem`"))
    with engine.connect() as conn:
        for wid in measured.values():
            assert len(load_payloads(conn, wid)) == inputs
        times = {name: [] for name in measured}
        for _ in range(repeats):  # interleaved, so drift affects both sides alike
            for name, wid in measured.items():
                t = time.perf_counter()
                load_payloads(conn, wid)
                times[name].append(time.perf_counter() - t)
    small_s, large_s = statistics.median(times["small"]), statistics.median(times["large"])
    return {
        "inputs_per_generation": inputs,
        "retained_small": small,
        "retained_large": large,
        "median_ms_small": round(small_s * 1000, 3),
        "median_ms_large": round(large_s * 1000, 3),
        "ratio_large_over_small": round(large_s / small_s, 3),
        "target": "<= 1.3",
        "build_s": round(build_s, 1),
    }


def bench_admission(engine, *, batch: int = 500, lanes: int = 10, batches: int = 40, rounds: int = 3) -> dict:
    sc = TenantScenario(namespace="bench")
    sc.pack("pk-admit")
    sc.pack("pk-plain")
    sc.protocol_row("pk-admit", 0)
    sc.write(engine)
    counter = iter(range(10**9))

    def inputs():
        return [Input(f"lane-{i % lanes:03d}", f"r-{next(counter)}", '{"p": 1}') for i in range(batch)]

    def plain_rows(items):
        with engine.connect() as conn:
            first = (conn.execute(select(func.max(catalog.Event.c.EventId))).scalar() or 0) + 1
        now = utcnow()
        return [
            {
                "EventId": first + k,
                "Namespace": "bench",
                **it.identity("pk-plain").as_values(),
                "EnqueueOrdinal": first + k,
                "ReceiptId": it.receipt_id,
                "ReplayOfWorkId": None,
                "Status": "pending",
                "Payload": it.payload,
                "ReceivedAt": now,
            }
            for k, it in enumerate(items)
        ]

    admit_s = plain_s = 0.0
    for _ in range(rounds):
        for _ in range(batches):
            rows = plain_rows(inputs())
            t = time.perf_counter()
            with engine.begin() as conn:
                conn.execute(insert(catalog.Event), rows)
            plain_s += time.perf_counter() - t
        for _ in range(batches):
            items = inputs()
            t = time.perf_counter()
            admit_batch(engine, "pk-admit", items)
            admit_s += time.perf_counter() - t
    n = batch * batches * rounds
    return {
        "batch_size": batch,
        "lanes_per_batch": lanes,
        "inputs_each_side": n,
        "plain_insert_rows_per_s": round(n / plain_s),
        "admission_rows_per_s": round(n / admit_s),
        "ratio_admission_over_plain": round((n / admit_s) / (n / plain_s), 3),
        "target": ">= 0.5",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--large", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500, help="admission batch size (inputs per transaction)")
    args = parser.parse_args()
    engine, cleanup = _database()
    try:
        create_legacy_schema(engine)
        apply_steps(engine, projection_steps(engine))
        with engine.connect() as conn:
            version = conn.execute(text("SELECT VERSION()" if engine.dialect.name != "sqlite" else "SELECT sqlite_version()")).scalar()
        results = {
            "database": f"{engine.dialect.name} {version}",
            "payload_read": bench_payload_read(engine, large=args.large),
            "admission": bench_admission(engine, batch=args.batch),
        }
    finally:
        engine.dispose()
        if cleanup:
            admin, name = cleanup
            with admin.begin() as conn:
                conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
            admin.dispose()
    if args.json:
        print(json.dumps(results, indent=2))
    else:
        print(f"database: {results['database']}")
        p, a = results["payload_read"], results["admission"]
        print(
            f"payload read ({p['inputs_per_generation']} inputs): {p['retained_small']} retained generations "
            f"{p['median_ms_small']} ms, {p['retained_large']} retained {p['median_ms_large']} ms -> "
            f"ratio {p['ratio_large_over_small']} (target {p['target']})"
        )
        print(
            f"admission (batch {a['batch_size']}, {a['lanes_per_batch']} lanes): {a['admission_rows_per_s']} rows/s vs plain "
            f"INSERT {a['plain_insert_rows_per_s']} rows/s -> ratio {a['ratio_admission_over_plain']} (target {a['target']})"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

"""Range runtime benchmarks (issue 3), printed as ratios measured in one run on one database.

1. Payload read: one generation of a fixed input count, read by WorkId through
   the range reader, with 10 vs 10,000 retained generations of its identity.
   Target: ratio (10,000 / 10) at most 1.3.
2. Admission throughput: batched fresh ingress through ``admit_batch`` vs plain
   multi-row INSERTs of the same Event rows in the same batch size, each batch
   its own transaction. Target: ratio (admission / plain) at least 0.7.
3. Concurrent admission: 8 packs of one namespace admitting at once (one
   process and connection each) vs the first pack alone: total events/s over
   events/s alone (target >= 2.0 on 2 cores) and conflict retries per batch
   (target <= 0.05), from the transaction policy's retry log.

Every figure is the median of three repetitions (thirds of the interleaved
reads; admission rounds), each repetition printed under ``ratio_samples`` etc.

Usage (a throwaway MariaDB):
    bash scripts/with-mariadb.sh .venv/bin/python bench/bench_runtime.py [--json]
or point ``NEXUS_BENCH_DSN`` at an existing empty database (sqlite:///... works too).
Nothing here is asserted; the numbers go to docs/performance.md.
"""

from __future__ import annotations

import argparse
import json
import logging
import multiprocessing
import os
import re
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
from nexus_cutover.errors import LockTimeout  # noqa: E402
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
    third = repeats // 3  # each third of the interleaved reads is one repetition of the figure
    samples = [round(statistics.median(times["large"][i * third:(i + 1) * third])
                     / statistics.median(times["small"][i * third:(i + 1) * third]), 3) for i in range(3)]
    return {
        "ratio_samples": samples,
        "inputs_per_generation": inputs,
        "retained_small": small,
        "retained_large": large,
        "median_ms_small": round(small_s * 1000, 3),
        "median_ms_large": round(large_s * 1000, 3),
        "ratio_large_over_small": round(statistics.median(samples), 3),
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
    samples = []
    for _ in range(rounds):  # each round is one repetition: its admission rate over its INSERT rate
        round_plain = round_admit = 0.0
        for _ in range(batches):
            rows = plain_rows(inputs())
            t = time.perf_counter()
            with engine.begin() as conn:
                conn.execute(insert(catalog.Event), rows)
            round_plain += time.perf_counter() - t
        for _ in range(batches):
            items = inputs()
            t = time.perf_counter()
            admit_batch(engine, "pk-admit", items)
            round_admit += time.perf_counter() - t
        samples.append(round(round_plain / round_admit, 3))
        admit_s, plain_s = admit_s + round_admit, plain_s + round_plain
    n = batch * batches * rounds
    return {
        "batch_size": batch,
        "lanes_per_batch": lanes,
        "inputs_each_side": n,
        "plain_insert_rows_per_s": round(n / plain_s),
        "admission_rows_per_s": round(n / admit_s),
        "ratio_admission_over_plain": round(statistics.median(samples), 3),
        "ratio_samples": samples,
        "target": ">= 0.7",
    }


class RetryCounter(logging.Handler):
    """Counts the policy's retry log lines of admission transactions (``nexus_cutover.tx``: "...; retrying")."""

    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.count = 0
        self.reasons: dict[str, int] = {}

    def emit(self, record: logging.LogRecord) -> None:
        message = record.getMessage()
        if "admitting into pack" in message and message.endswith("retrying"):
            self.count += 1
            reason = re.sub(r"'[^']*'", "'...'", message.rsplit(" hit ", 1)[-1].removesuffix("; retrying"))[:80]
            self.reasons[reason] = self.reasons.get(reason, 0) + 1


def _admit_worker(url: str, name: str, batches: int, batch: int, lanes: int, prefix: str, ready, go, results) -> None:
    """One admitting process (one pack, one connection): connects, says ``ready``, waits for ``go``, admits, and
    reports (admitted, retries, timeouts, seconds, retry reasons)."""
    engine = make_engine(url)
    counter_log = RetryCounter()
    tx_log = logging.getLogger("nexus_cutover.tx")
    tx_log.setLevel(logging.DEBUG)
    tx_log.addHandler(counter_log)
    engine.connect().close()  # connected before the start signal
    admitted = timeouts = 0
    ready.put(name)
    go.wait()
    t, cpu = time.perf_counter(), time.process_time()
    for b in range(batches):
        items = [Input(f"lane-{i % lanes:03d}", f"{prefix}-{b}-{i}", '{"p": 1}') for i in range(batch)]
        try:  # the policy's default deadline: a batch that cannot commit within it is a finding, not a crash
            admitted += len(admit_batch(engine, name, items).admitted)
        except LockTimeout:
            timeouts += 1
    results.put((admitted, counter_log.count, timeouts, time.perf_counter() - t, time.process_time() - cpu,
                 dict(counter_log.reasons)))
    engine.dispose()


def _admit_at_once(engine, names: list[str], *, batches: int, batch: int, lanes: int, prefix: str) -> dict:
    """Every pack of ``names`` admitting ``batches`` batches in its own process, started together; totals."""
    ctx = multiprocessing.get_context("spawn")
    ready, go, results = ctx.Queue(), ctx.Event(), ctx.Queue()
    url = engine.url.render_as_string(hide_password=False)
    procs = [ctx.Process(target=_admit_worker, args=(url, n, batches, batch, lanes, f"{prefix}-{n}", ready, go, results))
             for n in names]
    for proc in procs:
        proc.start()
    for _ in procs:  # every process imported and connected (spawn), so the window times admission only
        ready.get(timeout=120)
    server_cpu = _server_cpu_s(engine)
    go.set()
    t = time.perf_counter()
    done = [results.get(timeout=600) for _ in procs]
    elapsed = time.perf_counter() - t
    server_cpu = _server_cpu_s(engine) - server_cpu if server_cpu is not None else None
    for proc in procs:
        proc.join(60)
    reasons: dict[str, int] = {}
    for *_, r in done:
        for k, v in r.items():
            reasons[k] = reasons.get(k, 0) + v
    client_cpu = sum(d[4] for d in done)
    return {"events_per_s": sum(d[0] for d in done) / elapsed, "retries": sum(d[1] for d in done),
            "timeouts": sum(d[2] for d in done), "reasons": reasons,
            "cores_used": round((client_cpu + server_cpu) / elapsed, 2) if server_cpu is not None else None}


def _server_cpu_s(engine) -> float | None:
    """CPU seconds the local database server has used (``/proc``), or None if it is not a local mariadbd/mysqld."""
    port = engine.url.port
    for pid in (p for p in os.listdir("/proc") if p.isdigit()):
        try:
            with open(f"/proc/{pid}/cmdline", "rb") as f:
                cmd = f.read().split(b"\0")
            if not any(c.endswith((b"mariadbd", b"mysqld")) for c in cmd[:1]) or f"--port={port}".encode() not in cmd:
                continue
            with open(f"/proc/{pid}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
            return (int(fields[11]) + int(fields[12])) / os.sysconf("SC_CLK_TCK")
        except OSError:
            continue
    return None


def bench_concurrent_admission(engine, *, packs: int = 8, batch: int = 500, lanes: int = 10, batches: int = 40,
                               rounds: int = 3) -> dict:
    """``packs`` packs of one namespace admitting at once, one process and connection each, vs the first pack alone.

    Per round (one repetition): the first pack admits ``batches`` batches alone (in one process), then every pack
    admits ``batches`` batches at the same time, each in its own process, as separate host processes would; the
    figure is total events/s together over events/s alone. Processes, not threads: threads of one Python process
    share its interpreter lock, and admission is mostly client-side work (parameter escaping), so threads measure
    the lock, not the database (1.14 with 8 threads once ids stopped colliding). Conflict retries (lost id races,
    deadlocks) are counted from each process's policy retry log, per batch admitted together; a batch that still
    conflicts at the policy's default deadline (``LockTimeout``) admits nothing and is counted.

    The window ends when the last process finishes, so the processes that finished first leave cores idle at
    its end: 40 batches per pack keep that tail to a few percent of the window (at 10 the 8 packs kept 1.74-1.79
    of the 2 cores busy, at 40 1.88-1.91).
    """
    sc = TenantScenario(namespace="bench")
    names = [f"pk-conc-{i}" for i in range(packs)]
    for name in names:
        sc.pack(name)
        sc.protocol_row(name, 0)
    sc.write(engine)
    reps, reasons = [], {}
    for r in range(rounds):
        alone = _admit_at_once(engine, names[:1], batches=batches, batch=batch, lanes=lanes, prefix=f"alone{r}")
        together = _admit_at_once(engine, names, batches=batches, batch=batch, lanes=lanes, prefix=f"all{r}")
        for k, v in together["reasons"].items():
            reasons[k] = reasons.get(k, 0) + v
        reps.append({"alone_events_per_s": round(alone["events_per_s"]), "together_events_per_s": round(together["events_per_s"]),
                     "speedup": round(together["events_per_s"] / alone["events_per_s"], 3), "retries": together["retries"],
                     "retries_per_batch": round(together["retries"] / (packs * batches), 4),
                     "batches_timed_out": together["timeouts"],
                     # CPU (client processes + server) per wall second: one pack alone keeps about one core busy,
                     # so on 2 cores the speedup's ceiling is about cores / alone_cores_used.
                     "alone_cores_used": alone["cores_used"], "together_cores_used": together["cores_used"]})
    return {
        "packs": packs, "batch_size": batch, "lanes_per_batch": lanes, "batches_per_pack": batches, "mode": "one process per pack",
        "speedup": round(statistics.median(r["speedup"] for r in reps), 3),
        "speedup_samples": [r["speedup"] for r in reps],
        "retries_per_batch": round(statistics.median(r["retries_per_batch"] for r in reps), 4),
        "retries_per_batch_samples": [r["retries_per_batch"] for r in reps],
        "alone_cores_used": statistics.median(r["alone_cores_used"] or 0 for r in reps),
        "cores": os.cpu_count(),
        "retry_reasons": reasons, "batches_timed_out": sum(r["batches_timed_out"] for r in reps), "repetitions": reps,
        "target": "speedup >= 2.0 on 2 cores, <= 0.05 retries per batch",
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", action="store_true")
    parser.add_argument("--large", type=int, default=10_000)
    parser.add_argument("--batch", type=int, default=500, help="admission batch size (inputs per transaction)")
    parser.add_argument("--concurrent-batches", type=int, default=40, help="batches per pack in the concurrent admission")
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
            "concurrent_admission": bench_concurrent_admission(engine, batch=args.batch, batches=args.concurrent_batches),
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
        c = results["concurrent_admission"]
        print(
            f"concurrent admission ({c['packs']} packs of one namespace, a process each): {c['speedup']} x one pack alone, "
            f"{c['retries_per_batch']} conflict retries per batch (target {c['target']}); one pack alone kept "
            f"{c['alone_cores_used']} of {c['cores']} cores busy"
        )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

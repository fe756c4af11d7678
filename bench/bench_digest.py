"""The history digest and its verification against the server floor, and the digest process's memory.

    bash scripts/with-mariadb.sh .venv/bin/python bench/bench_digest.py [--generations 10 100 1000] [--lanes 400]

For each history depth H: build the walking workload (bench/workload.py, the
audit's), then in the same run on the same server measure

* the server floor of the audit bench (every index entry of the pack's Event and
  WorkItem ranges read once, nothing shipped to the client);
* the one-statement checksum: the digest's own row hash, ``BIT_XOR(CRC32(...))``
  over each whole table in a single statement (no chunks, no locator, no
  column fingerprints): the cheapest in-server checksum of every column;
* the digest (keyset chunks of ``--chunk-rows``) on the step's default number of
  connections (``DEFAULT_DIGEST_CONNECTIONS``) and its verification, in a child
  process that reports its peak RSS; and the digest on one connection (one
  keyset walk, chunk after chunk), which must cover the same rows.

``--repeat`` repetitions, alternating (one child process per digest repetition); each figure is the
median of its repetitions (all kept under ``samples``); printed as ratios and merged into ``bench/results.json``. The
database is utf8mb4, as on TiDB (the test server's own default is latin1, whose text the digest
converts to UTF-8 before hashing, which costs more).
"""

from __future__ import annotations

import argparse
import json
import subprocess
import sys
import time
from pathlib import Path

from sqlalchemy import func, select

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import workload  # noqa: E402

from nexus_cutover.db import make_engine  # noqa: E402
from nexus_cutover.projection import digest as digests  # noqa: E402
from nexus_cutover.projection.digest_limits import DEFAULT_DIGEST_CONNECTIONS  # noqa: E402

CHILD = r"""
import json, resource, sys, time
from nexus_cutover.db import make_engine
from nexus_cutover.projection.digest import compute_digest, verify_digest
engine = make_engine(sys.argv[1])
takes, checks = [], []
connections, verify = int(sys.argv[4]), sys.argv[5] == "verify"
started = time.perf_counter()
digest = compute_digest(engine, sys.argv[2], chunk_rows=int(sys.argv[3]), connections=connections)
takes.append(time.perf_counter() - started)
if verify:
    started = time.perf_counter()
    result = verify_digest(engine, digest)
    checks.append(time.perf_counter() - started)
    assert result.ok, result.summary()
print(json.dumps({"digest_s": takes[0], "verify_s": checks[0] if checks else None, "hash": digest.short_hash,
                  "rows": digest.rows, "chunks": digest.chunk_count,
                  "xcom_bytes": len(json.dumps(digest.as_json())),
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def one_statement_checksum_seconds(engine) -> float:
    """The digest's row hash folded over each whole history table in one statement per table."""
    started = time.perf_counter()
    with engine.connect() as conn:
        for table in digests.HISTORY_TABLES:
            where = digests.history_rows(table, workload.NAMESPACE, {})
            conn.execute(select(func.count(), func.bit_xor(digests.row_hash(table))).where(*where)).one()
    return time.perf_counter() - started


def _child(url: str, chunk_rows: int, connections: int, *, verify: bool) -> dict:
    """One digest (and with ``verify`` its verification) in a fresh process: its times, hash and peak RSS."""
    child = subprocess.run([sys.executable, "-c", CHILD, url, workload.NAMESPACE, str(chunk_rows), str(connections),
                            "verify" if verify else "-"], capture_output=True, text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


def measure(lanes: int, generations: int, inputs: int, repeat: int, chunk_rows: int) -> dict:
    with benchlib.fresh_database("bench_digest", charset="utf8mb4") as url:  # as TiDB stores text
        engine = make_engine(url)
        try:
            build_s = workload.build(engine, lanes=lanes, generations=generations, inputs=inputs)
            expected = workload.expected_counts(lanes, generations, inputs)
            reps = []
            for _ in range(repeat):  # floor, one statement and digest alternate, so drift hits all alike
                floor = workload.server_floor_seconds(engine)
                one_statement = one_statement_checksum_seconds(engine)
                run = _child(url, chunk_rows, DEFAULT_DIGEST_CONNECTIONS, verify=True)
                serial = _child(url, chunk_rows, 1, verify=False)
                assert serial["rows"] == run["rows"], (serial, run)  # the same history rows on one connection
                reps.append({"floor_s": floor, "one_statement_s": one_statement, **run, "serial_s": serial["digest_s"],
                             "digest_vs_floor": run["digest_s"] / floor, "verify_vs_floor": run["verify_s"] / floor,
                             "digest_vs_one_statement": run["digest_s"] / one_statement,
                             "serial_vs_one_statement": serial["digest_s"] / one_statement,
                             "parallel_speedup": serial["digest_s"] / run["digest_s"]})
        finally:
            engine.dispose()
    assert run["rows"] == {"_System_Event": expected["events"], "_System_WorkItem": expected["work_items"]}, run
    middle = {k: benchlib.median(r[k] for r in reps) for k in (
        "floor_s", "one_statement_s", "digest_s", "serial_s", "verify_s", "digest_vs_floor", "verify_vs_floor",
        "digest_vs_one_statement", "serial_vs_one_statement", "parallel_speedup")}
    return {
        "generations": generations, "events": expected["events"], "work_items": expected["work_items"],
        "build_s": build_s, **run, **middle, "peak_rss_mb": max(r["peak_rss_mb"] for r in reps), "repetitions": reps,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generations", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--lanes", type=int, default=400)
    parser.add_argument("--inputs", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    parser.add_argument("--chunk-rows", type=int, default=digests.DEFAULT_CHUNK_ROWS)
    args = parser.parse_args()
    benchlib.server_url()  # exits with a hint when no server is named
    rows = []
    print(f"digest on {DEFAULT_DIGEST_CONNECTIONS} connections (serial: on one)")
    print(f"{'H':>6} {'rows':>9} {'floor s':>8} {'1-stmt s':>8} {'digest s':>8} {'serial s':>8} {'verify s':>8} "
          f"{'d/floor':>7} {'v/floor':>7} {'d/1-stmt':>8} {'s/1-stmt':>8} {'rss MB':>7} {'XCom kB':>8}")
    for h in args.generations:
        r = measure(args.lanes, h, args.inputs, args.repeat, args.chunk_rows)
        rows.append(r)
        print(f"{h:>6} {r['events'] + r['work_items']:>9} {r['floor_s']:>8.3f} {r['one_statement_s']:>8.3f} "
              f"{r['digest_s']:>8.3f} {r['serial_s']:>8.3f} {r['verify_s']:>8.3f} {r['digest_vs_floor']:>7.2f} "
              f"{r['verify_vs_floor']:>7.2f} {r['digest_vs_one_statement']:>8.2f} {r['serial_vs_one_statement']:>8.2f} "
              f"{r['peak_rss_mb']:>7.1f} {r['xcom_bytes'] / 1024:>8.1f}", flush=True)
    top, bottom = rows[-1], rows[0]
    pairs = list(zip(top["repetitions"], bottom["repetitions"], strict=True))
    figures = {
        **benchlib.figures(
            digest_vs_server_floor=[t["digest_vs_floor"] for t, _ in pairs],
            digest_verify_vs_server_floor=[t["verify_vs_floor"] for t, _ in pairs],
            digest_vs_one_statement_checksum=[t["digest_vs_one_statement"] for t, _ in pairs],
            digest_serial_vs_one_statement_checksum=[t["serial_vs_one_statement"] for t, _ in pairs],
            digest_parallel_speedup=[t["parallel_speedup"] for t, _ in pairs],
            digest_peak_rss_mb=([t["peak_rss_mb"] for t, _ in pairs], 1),
            digest_rss_growth_mb=([t["peak_rss_mb"] - b["peak_rss_mb"] for t, b in pairs], 1),
        ),
        "digest_runs": rows,
        "digest_measured_at": benchlib.now_utc(),
    }
    benchlib.merge_results(figures)
    print(json.dumps({k: v for k, v in figures.items() if k not in ("digest_runs", "samples")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

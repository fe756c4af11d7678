"""Audit + checkpoint time against the server floor, and the audit process's memory.

    bash scripts/with-mariadb.sh .venv/bin/python bench/bench_audit.py [--generations 10 100 1000] [--lanes 400]

For each history depth H: build the walking workload (bench/workload.py),
measure the server floor (COUNT/SUM over the pack's Event and WorkItem index
ranges, nothing shipped to the client) and the audit (a dry run, then the real
write) in a child process that reports its peak RSS. Best of ``--repeat`` runs
of each, in the same run on the same server; printed as ratios and merged into
``bench/results.json``.
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
import uuid
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))
import workload  # noqa: E402

from nexus_cutover.db import make_engine  # noqa: E402

RESULTS = Path(os.environ.get("NEXUS_BENCH_RESULTS") or Path(__file__).resolve().parent / "results.json")  # run_all sets it

CHILD = r"""
import json, resource, sys, time
from nexus_cutover.db import make_engine
from nexus_cutover.projection.checkpoint import run_checkpoint
engine = make_engine(sys.argv[1])
times = []
for dry in [True] * int(sys.argv[3]) + [False]:
    started = time.perf_counter()
    result = run_checkpoint(engine, sys.argv[2], timeout_s=600, written_by="bench", dry_run=dry)
    times.append(time.perf_counter() - started)
    assert result.ok, result.summary()
print(json.dumps({"best_s": min(times), "write_s": times[-1], "cutoff": result.legacy_max_ordinal,
                  "outcome": result.outcome, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def measure(server_url: str, lanes: int, generations: int, inputs: int, repeat: int) -> dict:
    name = f"bench_{uuid.uuid4().hex[:8]}"
    server = make_url(server_url)
    admin = make_engine(server.set(database="mysql"))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}`"))
    url = server.set(database=name).render_as_string(hide_password=False)
    engine = make_engine(url)
    try:
        build_s = workload.build(engine, lanes=lanes, generations=generations, inputs=inputs)
        expected = workload.expected_counts(lanes, generations, inputs)
        with engine.connect() as conn:
            events = conn.execute(text("SELECT COUNT(*) FROM _System_Event")).scalar()
            works = conn.execute(text("SELECT COUNT(*) FROM _System_WorkItem")).scalar()
        assert (events, works) == (expected["events"], expected["work_items"]), (events, works, expected)
        floor = min(workload.server_floor_seconds(engine) for _ in range(repeat))
        child = subprocess.run(
            [sys.executable, "-c", CHILD, url, workload.PACK, str(repeat)], capture_output=True, text=True, check=True
        )
        audit = json.loads(child.stdout.strip().splitlines()[-1])
        assert audit["cutoff"] == expected["events"], audit  # ordinals 1..N: the cutoff is the last one
        return {
            "generations": generations, "events": events, "work_items": works, "build_s": build_s,
            "floor_s": floor, "audit_s": audit["best_s"], "audit_write_s": audit["write_s"],
            "ratio": audit["best_s"] / floor, "peak_rss_mb": audit["peak_rss_mb"],
        }
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generations", type=int, nargs="+", default=[10, 100, 1000])
    parser.add_argument("--lanes", type=int, default=400)
    parser.add_argument("--inputs", type=int, default=5)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    server_url = os.environ.get("NEXUS_TEST_MYSQL_URL")
    if not server_url:
        sys.exit("set NEXUS_TEST_MYSQL_URL (or run through scripts/with-mariadb.sh)")
    rows = []
    print(f"{'H':>6} {'events':>9} {'works':>8} {'build s':>8} {'floor s':>8} {'audit s':>8} {'ratio':>6} {'rss MB':>7}")
    for h in args.generations:
        r = measure(server_url, args.lanes, h, args.inputs, args.repeat)
        rows.append(r)
        print(f"{h:>6} {r['events']:>9} {r['work_items']:>8} {r['build_s']:>8.1f} {r['floor_s']:>8.3f} "
              f"{r['audit_s']:>8.3f} {r['ratio']:>6.2f} {r['peak_rss_mb']:>7.1f}", flush=True)
    top, bottom = rows[-1], rows[0]
    figures = {
        "audit_vs_server_floor": round(top["ratio"], 3),
        "audit_peak_rss_mb": round(top["peak_rss_mb"], 1),
        "audit_rss_growth_mb": round(top["peak_rss_mb"] - bottom["peak_rss_mb"], 1),
        "audit_runs": rows,
        "audit_measured_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
    }
    merged = json.loads(RESULTS.read_text()) if RESULTS.exists() else {}
    merged.update(figures)
    RESULTS.write_text(json.dumps(merged, indent=2, sort_keys=True) + "\n")
    print(json.dumps({k: v for k, v in figures.items() if k != "audit_runs"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

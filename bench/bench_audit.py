"""Audit + checkpoint time against the server floor, and the audit process's memory.

    bash scripts/with-mariadb.sh .venv/bin/python bench/bench_audit.py [--generations 10 100 1000] [--lanes 400]

For each history depth H: build the walking workload (bench/workload.py),
measure the server floor (COUNT/SUM over the pack's Event and WorkItem index
ranges, nothing shipped to the client) and the audit (a dry run; the last
repetition also the real write) in a fresh child process per repetition that
reports its peak RSS. ``--repeat`` repetitions
alternating, in the same run on the same server; each figure is the median of
the repetitions (all kept under ``samples``), merged into ``bench/results.json``.
``audit_growth_vs_floor_growth`` is the audit's growth over the floor's from
the last-but-one depth to the deepest (<= 1: it grows no faster than the floor).
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import uuid
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import workload  # noqa: E402

from nexus_cutover.db import make_engine  # noqa: E402

CHILD = r"""
import json, resource, sys, time
from nexus_cutover.db import make_engine
from nexus_cutover.projection.checkpoint import run_checkpoint
engine = make_engine(sys.argv[1])
started = time.perf_counter()
result = run_checkpoint(engine, sys.argv[2], timeout_s=600, written_by="bench", dry_run=True)
audit_s = time.perf_counter() - started
assert result.ok, result.summary()
write_s = None
if sys.argv[3] == "write":
    started = time.perf_counter()
    result = run_checkpoint(engine, sys.argv[2], timeout_s=600, written_by="bench", dry_run=False)
    write_s = time.perf_counter() - started
    assert result.ok, result.summary()
print(json.dumps({"audit_s": audit_s, "write_s": write_s, "cutoff": result.legacy_max_ordinal,
                  "outcome": result.outcome, "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""


def one_repetition(url: str, write: bool) -> dict:
    """One dry-run audit (and, if ``write``, the real checkpoint after it) in a fresh child process."""
    child = subprocess.run([sys.executable, "-c", CHILD, url, workload.PACK, "write" if write else "dry"],
                           capture_output=True, text=True, check=True)
    return json.loads(child.stdout.strip().splitlines()[-1])


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
        reps = []
        for i in range(repeat):  # floor and audit alternate, so drift hits both alike
            floor_s = workload.server_floor_seconds(engine)
            audit = one_repetition(url, write=i == repeat - 1)
            assert audit["cutoff"] == expected["events"], audit  # ordinals 1..N: the cutoff is the last one
            reps.append({"floor_s": floor_s, "audit_s": audit["audit_s"], "ratio": audit["audit_s"] / floor_s,
                         "peak_rss_mb": audit["peak_rss_mb"], "write_s": audit["write_s"]})
        return {
            "generations": generations, "events": events, "work_items": works, "build_s": build_s,
            "floor_s": benchlib.median(r["floor_s"] for r in reps), "audit_s": benchlib.median(r["audit_s"] for r in reps),
            "audit_write_s": reps[-1]["write_s"], "ratio": benchlib.median(r["ratio"] for r in reps),
            "peak_rss_mb": max(r["peak_rss_mb"] for r in reps), "repetitions": reps,
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
    top, bottom, previous = rows[-1], rows[0], rows[-2] if len(rows) > 1 else rows[-1]
    pairs = list(zip(top["repetitions"], bottom["repetitions"], previous["repetitions"], strict=True))
    figures = {
        **benchlib.figures(
            audit_vs_server_floor=[t["ratio"] for t, _, _ in pairs],
            audit_peak_rss_mb=([t["peak_rss_mb"] for t, _, _ in pairs], 1),
            audit_rss_growth_mb=([t["peak_rss_mb"] - b["peak_rss_mb"] for t, b, _ in pairs], 1),
            # (audit growth) / (floor growth) from the last-but-one depth to the deepest: <= 1 grows no faster than the floor
            audit_growth_vs_floor_growth=[(t["audit_s"] / p["audit_s"]) / (t["floor_s"] / p["floor_s"]) for t, _, p in pairs],
        ),
        "audit_runs": rows,
        "audit_measured_at": benchlib.now_utc(),
    }
    benchlib.merge_results(figures)
    print(json.dumps({k: v for k, v in figures.items() if k not in ("audit_runs", "samples")}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

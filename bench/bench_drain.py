"""One drain poke (a sensor/trigger check) at deep vs shallow history, and its query plans.

    bash scripts/with-mariadb.sh .venv/bin/python bench/bench_drain.py [--generations 10 1000] [--lanes 400]

A poke is exactly what the cutover DAG's ``wait_for_drain`` trigger calls per
check: :func:`nexus_cutover.projection.drain.drain_report` on the tenant engine
(one count per live status, the live old-worker lookup, the blocker
classification), with the schema known as it is after the poller's first poll;
the first poll (plus the column probe) is timed beside it. For each history depth H the
walking workload (bench/workload.py) is built in a fresh database, then
``--live-lanes`` lanes get one more generation that is still live (pending,
retry due, processing with a valid lease, blocked with no external dependency)
and one old-protocol projection_worker heartbeats: the drain is ``draining``,
as during a real wait. The figure ``drain_poke_ratio`` is the median poke at
the deepest H over the median at the shallowest, per third of the rounds (three
repetitions; the figure is their median): both tenants are built first,
then their pokes are interleaved (after InnoDB has flushed the load), in the
same run on the same server. Correctness: the live counts equal what was
added, and EXPLAIN of every per-status count names ``ix_WorkItem_State`` with
no full scan (asserted by tests/projection/test_drain.py; every statement of a
poke by tests/bench/test_hot_plans.py).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import json
import statistics
import sys
import time
from pathlib import Path

from sqlalchemy import func, select, text

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402
import workload  # noqa: E402

from nexus_cutover import catalog  # noqa: E402
from nexus_cutover.db import make_engine  # noqa: E402
from nexus_cutover.projection import drain  # noqa: E402
from nexus_sim.scenario import TenantScenario  # noqa: E402
from nexus_sim.scenario.builder import PackBuilder  # noqa: E402

#: Far enough that no retry is "not due" and no heartbeat goes stale while the bench runs.
WINDOW = dt.timedelta(days=1)
LIVE_CYCLE = ("pending", "retry", "processing", "blocked")


def add_live_old_work(engine, *, lanes: int, generations: int, inputs: int, live_lanes: int) -> dict[str, int]:
    """One more, still live, old-protocol generation on each of the first ``live_lanes`` walking lanes.

    Plus a live old projection_worker, so the drain is ``draining`` (not stuck).
    Returns the expected live count per status.
    """
    sc = TenantScenario(
        namespace=workload.NAMESPACE,
        event_id_start=lanes * generations * inputs + 1,
        work_id_start=lanes * generations + 1,
    )
    pack = PackBuilder(sc, workload.PACK, last_ordinal=lanes * generations * inputs)  # the pack row exists already
    now = drain.utcnow()
    expected = dict.fromkeys(catalog.WORK_LIVE_STATUSES, 0)
    for i in range(min(live_lanes, lanes)):
        status = LIVE_CYCLE[i % len(LIVE_CYCLE)]
        extra = {
            "retry": {"attempt": 1, "next_attempt_at": now + dt.timedelta(minutes=1)},
            "processing": {"lease_owner": "old-worker-1", "lease_expires_at": now + WINDOW},
        }.get(status, {})
        pack.lane(f"lane-{i:04d}").generation(inputs, status=status, **extra)
        expected[status] += 1
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-1")
    sc.write(engine)
    return expected


def poke(engine, range_column: bool | None = None) -> drain.DrainReport:
    """One sensor check as nexus_airflow.pollers.DrainPoller.poll makes it.

    The poller probes ``InputStartOrdinal`` on its first poll and passes
    ``range_column=True`` from then on; ``None`` here is that first poll.
    """
    return drain.drain_report(
        engine, workload.NAMESPACE, deadline=drain.utcnow() + WINDOW, stale_heartbeat=WINDOW, sample_limit=200,
        range_column=range_column,
    )


def explain_counts(engine) -> list[dict]:
    """EXPLAIN of each per-status count of a poke; raises if one is not an ix_WorkItem_State range/ref."""
    plans = []
    with engine.connect() as conn:
        for status in catalog.WORK_LIVE_STATUSES:
            stmt = select(func.count()).select_from(catalog.WorkItem).where(drain._old_work(workload.NAMESPACE, status, True))
            compiled = stmt.compile(engine, compile_kwargs={"literal_binds": True})
            row = dict(conn.execute(text(f"EXPLAIN {compiled}")).mappings().one())
            plans.append({"status": status, "key": row["key"], "type": row["type"], "rows": row["rows"]})
            if row["key"] != "ix_WorkItem_State" or row["type"] == "ALL":
                raise AssertionError(f"drain count for {status!r} does not use ix_WorkItem_State: {row}")
    return plans


def prepare(engine, lanes: int, generations: int, inputs: int, live_lanes: int) -> dict:
    """Build one tenant of depth ``generations`` with live old work; check its counts and plans."""
    build_s = workload.build(engine, lanes=lanes, generations=generations, inputs=inputs)
    expected = add_live_old_work(engine, lanes=lanes, generations=generations, inputs=inputs, live_lanes=live_lanes)
    with engine.begin() as conn:
        conn.execute(text(f"ANALYZE TABLE {catalog.WorkItem.name}"))
        works = conn.execute(select(func.count()).select_from(catalog.WorkItem)).scalar_one()
    assert works == lanes * generations + sum(expected.values()), works
    report = poke(engine)
    assert report.state == "draining", report.report_text()
    assert report.counts == expected, (report.counts, expected)
    return {"generations": generations, "work_items": works, "live": sum(expected.values()), "build_s": build_s,
            "explain": explain_counts(engine)}


def measure(engines: list, pokes: int) -> list[dict]:
    """Pokes interleaved across the tenants, so drift hits all alike.

    Per tenant and round: a steady-state poke (schema known, as the poller's
    every poll after its first) and a first poke (with the column probe).
    """
    for engine in engines:
        for _ in range(5):  # warm the pool and the buffer pool
            poke(engine)
    times: list[list[float]] = [[] for _ in engines]
    first: list[list[float]] = [[] for _ in engines]
    for _ in range(pokes):
        for i, engine in enumerate(engines):
            started = time.perf_counter()
            poke(engine, range_column=True)
            times[i].append(time.perf_counter() - started)
            started = time.perf_counter()
            poke(engine)
            first[i].append(time.perf_counter() - started)
    return [{"poke_median_s": statistics.median(t), "poke_min_s": min(t), "pokes": pokes,
             "first_poke_median_s": statistics.median(f), "poke_s": t} for t, f in zip(times, first, strict=True)]


def thirds(values: list[float], parts: int = 3) -> list[list[float]]:
    """``values`` cut into ``parts`` consecutive runs of rounds (the repetitions of the figure)."""
    size = max(1, len(values) // parts)
    return [values[i * size:(i + 1) * size] for i in range(parts) if values[i * size:(i + 1) * size]]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--generations", type=int, nargs=2, default=[10, 1000], metavar=("SHALLOW", "DEEP"))
    parser.add_argument("--lanes", type=int, default=400)
    parser.add_argument("--inputs", type=int, default=5)
    parser.add_argument("--live-lanes", type=int, default=40)
    parser.add_argument("--pokes", type=int, default=60)
    args = parser.parse_args()
    rows = []
    with contextlib.ExitStack() as stack:
        engines = []
        for h in args.generations:
            engine = make_engine(stack.enter_context(benchlib.fresh_database("bench_drain")))
            stack.callback(engine.dispose)
            rows.append(prepare(engine, args.lanes, h, args.inputs, args.live_lanes))
            engines.append(engine)
        settled_s = benchlib.settle(engines[0], limit_s=60.0, below=100)
        for row, timing in zip(rows, measure(engines, args.pokes), strict=True):
            row.update(timing, settled_s=settled_s)
    print(f"{'H':>6} {'works':>8} {'live':>5} {'build s':>8} {'poke ms':>8} {'min ms':>7} {'1st poke ms':>11}  plan")
    for r in rows:
        keys = ",".join(sorted({p["key"] for p in r["explain"]}))
        print(f"{r['generations']:>6} {r['work_items']:>8} {r['live']:>5} {r['build_s']:>8.1f} {r['poke_median_s'] * 1000:>8.2f} "
              f"{r['poke_min_s'] * 1000:>7.2f} {r['first_poke_median_s'] * 1000:>11.2f}  {keys}", flush=True)
    shallow, deep = rows
    # each third of the interleaved rounds is one repetition: the ratio of its medians
    samples = [statistics.median(d) / statistics.median(s)
               for s, d in zip(thirds(shallow.pop("poke_s")), thirds(deep.pop("poke_s")), strict=True)]
    figures = {
        **benchlib.figures(drain_poke_ratio=samples),
        "drain_runs": rows,
        "drain_measured_at": benchlib.now_utc(),
    }
    benchlib.merge_results(figures)
    print(json.dumps({"drain_poke_ratio": figures["drain_poke_ratio"]}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

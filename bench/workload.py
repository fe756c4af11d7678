"""The history-scaling walking workload, generated inside the server.

One tenant, ``lanes`` source lanes of one pack, each with ``generations``
retained old-protocol generations of ``inputs`` coalesced inputs: every
generation is a WorkItem selecting its last input; every 10th generation
failed once and was followed by a completed retry generation, so the history
is drained and the audit accepts it. Rows are produced by ``INSERT ... SELECT``
over a numbers table (multi-row, bounded batches per statement), so building
2M Events takes seconds, not minutes. MySQL dialect that TiDB speaks.

Correctness counts: :func:`expected_counts` says what must be there.
"""

from __future__ import annotations

import time
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine, text

from nexus_cutover import catalog
from nexus_cutover.schema import apply_steps, create_legacy_schema, projection_steps
from nexus_sim.scenario import TenantScenario

PACK = "pk-walk"
NAMESPACE = "bench"


def expected_counts(lanes: int, generations: int, inputs: int) -> dict[str, int]:
    return {"events": lanes * generations * inputs, "work_items": lanes * generations}


def build(
    engine: Engine, *, lanes: int = 400, generations: int = 100, inputs: int = 5, batch_lanes: int = 4, connections: int = 2
) -> float:
    """Create the schema and the walking workload; returns seconds spent."""
    started = time.perf_counter()
    create_legacy_schema(engine)
    apply_steps(engine, projection_steps(engine))
    sc = TenantScenario(namespace=NAMESPACE)
    sc.pack(PACK, name="walking")
    sc.packs[0].last_ordinal = lanes * generations * inputs
    sc.fence()  # cutover step 1 done: the checkpoint's fence precondition holds
    sc.write(engine)
    ev, wi = catalog.Event.name, catalog.WorkItem.name
    per_lane = generations * inputs
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE IF EXISTS bench_n"))
        conn.execute(text("CREATE TABLE bench_n (n BIGINT NOT NULL PRIMARY KEY)"))
        conn.execute(text("INSERT INTO bench_n (n) VALUES " + ",".join(f"({i})" for i in range(1000))))
        # only as many numbers as the largest of lanes and generations * inputs needs (small runs stay small)
        conn.execute(
            text("INSERT INTO bench_n (n) SELECT a.n + 1000 * b.n FROM bench_n a, bench_n b WHERE b.n BETWEEN 1 AND :hi"),
            {"hi": min(999, (max(lanes, per_lane) - 1) // 1000)},
        )
    # one statement per few lanes: bounded transactions (batch_lanes * generations * inputs rows); the server
    # builds each on one core, so `connections` chunks run at once (disjoint lanes: no two touch one key)
    with ThreadPoolExecutor(max_workers=connections) as pool:
        chunks = [(first, min(lanes, first + batch_lanes) - 1) for first in range(0, lanes, batch_lanes)]
        list(pool.map(lambda chunk: _insert_lanes(engine, *chunk, generations, inputs), chunks))  # re-raises a failure
    with engine.begin() as conn:
        conn.execute(text("DROP TABLE bench_n"))
        conn.execute(text(f"ANALYZE TABLE {ev}, {wi}"))
    return time.perf_counter() - started


def _insert_lanes(engine: Engine, first: int, last: int, generations: int, inputs: int) -> None:
    """Events and WorkItems of lanes ``first``..``last`` in one transaction."""
    ev, wi = catalog.Event.name, catalog.WorkItem.name
    per_lane = generations * inputs
    with engine.begin() as conn:
        conn.execute(
            text(
                f"INSERT INTO {ev} (EventId, Namespace, PackInstallId, EventKind, RouteVersion, FlowVersion, WorkType,"
                " SourceLane, EnqueueOrdinal, ReceiptId, ReplayOfWorkId, Status, Payload, ReceivedAt)"
                " SELECT l.n * :per_lane + i.n + 1, :ns, :pack, 'contact.changed', 1, '1.0.0', :work_type,"
                " CONCAT('lane-', LPAD(l.n, 4, '0')), l.n * :per_lane + i.n + 1, CONCAT('r-', l.n, '-', i.n), NULL,"
                " CASE WHEN MOD(i.n, :inputs) = :inputs - 1 THEN 'processed' ELSE 'pending' END,"
                " '{}', TIMESTAMP('2026-01-01')"
                " FROM bench_n l JOIN bench_n i ON i.n < :per_lane WHERE l.n BETWEEN :first AND :last"
            ),
            {"per_lane": per_lane, "ns": NAMESPACE, "pack": PACK, "inputs": inputs, "first": first, "last": last,
             "work_type": catalog.PROJECTION_WORK_TYPE},
        )
        conn.execute(
            text(
                f"INSERT INTO {wi} (WorkId, Namespace, WorkClass, PackInstallId, EventKind, RouteVersion, FlowVersion,"
                " WorkType, SourceLane, SelectedEventId, LaneOrdinal, ReplayOfWorkId, Attempt, Status, CreatedAt, UpdatedAt)"
                " SELECT l.n * :gens + g.n + 1, :ns, 'projection', :pack, 'contact.changed', 1, '1.0.0', :work_type,"
                " CONCAT('lane-', LPAD(l.n, 4, '0')), l.n * :per_lane + g.n * :inputs + :inputs,"
                " l.n * :per_lane + g.n * :inputs + :inputs, NULL, 0,"
                " CASE WHEN MOD(g.n, 10) = 3 THEN 'failed' ELSE 'completed' END,"
                " TIMESTAMP('2026-01-01'), TIMESTAMP('2026-01-01')"
                " FROM bench_n l JOIN bench_n g ON g.n < :gens WHERE l.n BETWEEN :first AND :last"
            ),
            {"gens": generations, "per_lane": per_lane, "ns": NAMESPACE, "pack": PACK, "inputs": inputs,
             "work_type": catalog.PROJECTION_WORK_TYPE,
             "first": first, "last": last},
        )


def server_floor_seconds(engine: Engine) -> float:
    """Every index entry of the pack's Event and WorkItem ranges read once inside the server."""
    ev, wi = catalog.Event.name, catalog.WorkItem.name
    started = time.perf_counter()
    with engine.connect() as conn:
        conn.execute(
            text(f"SELECT COUNT(*), SUM(EnqueueOrdinal) FROM {ev} FORCE INDEX (ix_Event_SourceLane) WHERE PackInstallId = :p"),
            {"p": PACK},
        ).one()
        conn.execute(
            text(f"SELECT COUNT(*), SUM(LaneOrdinal) FROM {wi} FORCE INDEX (ix_WorkItem_ProjectionOrder) WHERE PackInstallId = :p"),
            {"p": PACK},
        ).one()
    return time.perf_counter() - started

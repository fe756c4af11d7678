"""The history digest on several connections: the same rows as on one, chunks in key order, the same verification.

On the production-shaped tenant (hostile lanes, ordinary work beside projection work, retention-trimmed rows) on
SQLite (which reads on one connection) and on MariaDB with a case-insensitive and a binary collation; chunk sizes
that divide the history rows exactly and that do not."""

from __future__ import annotations

import threading

import pytest
from sqlalchemy import event, select, update

from nexus_cutover import catalog
from nexus_cutover.db import Deadline
from nexus_cutover.errors import BadInput, LockTimeout
from nexus_cutover.projection.digest import compute_digest, key_ranges, verify_digest
from nexus_sim.scenario.production import build_production_tenant
from tests.support import make_cutover_ready, prepared_engine

NS = "Prod-Tenant "  # a trailing space: a namespace as a person may have typed it
SIZES = {"active_packs": 2, "plain_lanes": 3, "generations": 3, "registry_stopped_rows": 50}


@pytest.fixture
def tenant(collated_tenant_url):
    with prepared_engine(collated_tenant_url, make_cutover_ready) as engine:
        build_production_tenant(engine, namespace=NS, seed=27, **SIZES)
        yield engine


def _ranges_of(digest) -> dict[str, list[tuple[int, int]]]:
    return {name: [(c.rows, c.hi) for c in t.chunks] for name, t in digest.tables.items()}


def test_several_connections_cover_the_same_rows_in_key_order_and_verify_for_every_chunk_size(tenant):
    one = compute_digest(tenant, NS, chunk_rows=7)
    total = sum(one.rows.values())
    assert total > 40 and one.rows[catalog.Event.name] > 7  # several chunks per table
    sizes = {7, 3, one.rows[catalog.Event.name], one.rows[catalog.WorkItem.name], total + 1}
    for chunk_rows in sorted(sizes):
        serial = compute_digest(tenant, NS, chunk_rows=chunk_rows)
        for connections in (2, 4):
            parallel = compute_digest(tenant, NS, chunk_rows=chunk_rows, connections=connections)
            assert parallel.rows == serial.rows, (chunk_rows, connections)
            for t in parallel.tables.values():
                his = [c.hi for c in t.chunks]
                assert his == sorted(set(his)) and all(0 < c.rows <= chunk_rows for c in t.chunks)
                assert his[-1] == serial.tables[t.table].chunks[-1].hi  # the same last history key
            assert verify_digest(tenant, parallel).ok
            again = compute_digest(tenant, NS, chunk_rows=chunk_rows, connections=connections)
            assert again.short_hash == parallel.short_hash and _ranges_of(again) == _ranges_of(parallel)
            if tenant.dialect.name == "sqlite":  # read on its one connection: the serial walk itself
                assert parallel.short_hash == serial.short_hash


def test_chunks_are_read_on_the_pool_and_reach_on_chunk_in_key_order_on_the_callers_thread(tenant):
    seen, callback_threads, reading_threads = [], set(), set()

    def on_chunk(table, chunk):
        seen.append((table, chunk.hi))
        callback_threads.add(threading.current_thread().name)

    def statement(*_args):
        reading_threads.add(threading.current_thread().name)

    event.listen(tenant, "before_cursor_execute", statement)
    try:
        digest = compute_digest(tenant, NS, chunk_rows=5, connections=3, on_chunk=on_chunk)
    finally:
        event.remove(tenant, "before_cursor_execute", statement)
    for table, t in digest.tables.items():
        his = [hi for name, hi in seen if name == table]
        assert his == sorted(his) == [c.hi for c in t.chunks]
    assert callback_threads == {threading.current_thread().name}
    pool = {name for name in reading_threads if name.startswith("digest")}
    if tenant.dialect.name == "sqlite":  # the embedded default reads on its one connection
        assert not pool
    else:
        assert 1 < len(pool) <= 3, reading_threads


def test_a_changed_history_row_is_found_by_a_digest_taken_on_several_connections(tenant):
    digest = compute_digest(tenant, NS, chunk_rows=6, connections=3)
    WorkItem = catalog.WorkItem
    with tenant.begin() as conn:  # the test's own edit: the pipeline never UPDATEs a WorkItem
        key = conn.execute(select(WorkItem.c.WorkId).where(
            WorkItem.c.Namespace == NS, WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION)
            .order_by(WorkItem.c.WorkId).limit(1).offset(8)).scalar_one()
        conn.execute(update(WorkItem).where(WorkItem.c.WorkId == key).values(Attempt=WorkItem.c.Attempt + 1))
    result = verify_digest(tenant, digest)
    assert [(d.table, d.kind, d.key) for d in result.differences] == [(WorkItem.name, "changed", key)]
    assert "Attempt" in result.differences[0].columns


def test_a_digest_past_its_deadline_stops_in_words_and_reads_no_further_table(tenant):
    seen = []
    deadline = Deadline(3600)

    def expire(table, chunk):
        seen.append(table)
        deadline.seconds = 0  # the bound runs out while the first table's chunks are read

    clean = compute_digest(tenant, NS, chunk_rows=4, connections=2)
    with pytest.raises(LockTimeout, match="timed out after 0s while (digesting|reading the key span)"):
        compute_digest(tenant, NS, chunk_rows=4, connections=2, deadline=deadline, on_chunk=expire)
    assert seen and set(seen) == {catalog.Event.name}  # read only; a rerun takes the same digest
    assert compute_digest(tenant, NS, chunk_rows=4, connections=2).short_hash == clean.short_hash


@pytest.mark.parametrize("connections", [0, -1, 17])
def test_connections_out_of_bounds_are_refused_in_words(tenant, connections):
    with pytest.raises(BadInput, match=f"digest connections must be between 1 and 16, got {connections}"):
        compute_digest(tenant, NS, connections=connections)


@pytest.mark.parametrize("lowest, highest, parts", [(1, 1, 1), (1, 100, 4), (7, 9, 3), (-5, 5, 2), (10, 10**15, 16)])
def test_key_ranges_cover_every_key_once_in_order(lowest, highest, parts):
    ranges = key_ranges(lowest, highest, parts)
    assert len(ranges) == parts and ranges[0][0] is None and ranges[-1][1] is None
    edges = [hi for _, hi in ranges[:-1]]
    assert edges == sorted(set(edges)) and all(lowest <= e < highest for e in edges)
    assert [lo for lo, _ in ranges[1:]] == edges  # each range starts where the one before ends
    probe = {lowest, highest, *edges, *(e + 1 for e in edges)}
    for key in probe:  # every key in exactly one (lo, hi]
        assert sum((lo is None or key > lo) and (hi is None or key <= hi) for lo, hi in ranges) == 1, key

"""Duplicates: no membership change, cutoff acknowledgement, durable coverage, explicit missing coverage."""

from __future__ import annotations

import datetime as dt

import pymysql.cursors
import pytest
from sqlalchemy import event, select, update

from nexus_cutover.catalog import EnqueueOrdinal, Event
from nexus_cutover.runtime.admission import admit_batch
from nexus_cutover.runtime.claim import claim_work, complete
from nexus_cutover.runtime.errors import MissingCoverage

from ..support import history_checksum
from .support import PACK, all_events, assert_membership, inp, range_tenant


def _legacy_and_orphan(sc):
    """Legacy history (ordinals 1..3, cutoff 3) and one post-cutoff Event (ordinal 4) that no range covers."""
    lane = sc.packs[0].lane("a")
    lane.generation(2, status="completed")  # receipts r-1, r-2
    lane.event(status="pending", receipt_id="legacy-orphan")  # ordinal 3, no owner: below the cutoff


def test_duplicate_at_or_below_cutoff_is_acknowledged_without_interpreting_history(range_engine):
    range_tenant(range_engine, build=_legacy_and_orphan)
    before = history_checksum(range_engine)
    result = admit_batch(range_engine, PACK, [inp("a", "legacy-orphan"), inp("a", "r-1")])
    assert {d.reason for d in result.duplicates} == {"at_or_below_cutoff"}
    assert not result.admitted and not result.created_work_ids
    assert history_checksum(range_engine) == before


def test_duplicate_above_cutoff_with_coverage_is_acknowledged_even_when_skipped_or_terminal(range_engine, tenant):
    (work_id,) = admit_batch(range_engine, PACK, [inp("a", "1"), inp("a", "2")]).created_work_ids
    claimed = claim_work(range_engine, work_id, "w")
    assert complete(range_engine, claimed)
    with range_engine.begin() as conn:  # the test (not the runtime) marks a member skipped
        conn.execute(update(Event).where(Event.c.ReceiptId == "1").values(Status="skipped"))
    before = history_checksum(range_engine)
    result = admit_batch(range_engine, PACK, [inp("a", "1"), inp("a", "2")])
    assert [(d.reason, d.work_id) for d in result.duplicates] == [("covered", work_id), ("covered", work_id)]
    assert history_checksum(range_engine) == before


def test_duplicate_above_cutoff_without_coverage_is_an_explicit_error_and_nothing_is_written(range_engine):
    def history(sc):
        _legacy_and_orphan(sc)

    range_tenant(range_engine, build=history)  # cutoff 3
    with range_engine.begin() as conn:  # a post-cutoff Event whose generation is gone
        conn.execute(
            Event.insert().values(
                EventId=99,
                Namespace="acme",
                PackInstallId=PACK,
                EventKind="contact.changed",
                RouteVersion=1,
                FlowVersion="1.0.0",
                WorkType="connector.projection",
                SourceLane="a",
                EnqueueOrdinal=4,
                ReceiptId="lost",
                Status="processed",
                Payload="{}",
                ReceivedAt=dt.datetime(2026, 1, 1),
            )
        )
    before = history_checksum(range_engine)
    with pytest.raises(MissingCoverage, match="missing coverage") as info:
        admit_batch(range_engine, PACK, [inp("a", "fresh"), inp("a", "lost"), inp("a", "r-1")])
    assert info.value.receipts == [("a", "lost", 4)]
    assert history_checksum(range_engine) == before  # not acknowledged, not replayed, fresh input not admitted


def test_mixed_duplicates_in_one_batch(range_engine):
    range_tenant(range_engine, build=_legacy_and_orphan)
    created = admit_batch(range_engine, PACK, [inp("a", "new-1"), inp("b", "new-2")])
    lane_a = next(a.work_id for a in created.admitted if a.source_lane == "a")
    assert claim_work(range_engine, lane_a, "w")  # generation of a, claimed: its inputs stay covered
    result = admit_batch(range_engine, PACK, [inp("a", "r-2"), inp("a", "new-1"), inp("a", "new-3"), inp("b", "new-2"), inp("a", "new-3")])
    reasons = sorted((d.receipt_id, d.reason) for d in result.duplicates)
    assert reasons == [("new-1", "covered"), ("new-2", "covered"), ("new-3", "covered"), ("r-2", "at_or_below_cutoff")]
    assert [(a.receipt_id, a.ordinal) for a in result.admitted] == [("new-3", 6)]
    assert_membership(range_engine, {PACK: 3})


def test_retrying_an_admitted_receipt_is_idempotent(range_engine, tenant):
    admit_batch(range_engine, PACK, [inp("a", "1")])
    before = history_checksum(range_engine)
    for _ in range(3):
        result = admit_batch(range_engine, PACK, [inp("a", "1")])
        assert not result.admitted and result.duplicates[0].reason == "covered"
    assert history_checksum(range_engine) == before


def _statements(engine):
    """The SQL text of every statement ``engine`` sends from now on, unquoted (an executemany counts once)."""
    sent: list[str] = []

    def record(_conn, _cursor, statement, *_):
        sent.append(" ".join(statement.replace("`", "").replace('"', "").split()))

    event.listen(engine, "before_cursor_execute", record)
    return sent


def test_a_batch_of_fresh_receipts_is_admitted_without_probing_its_receipts(range_engine, tenant):
    sent = _statements(range_engine)
    result = admit_batch(range_engine, PACK, [inp("a", f"r-{k}") for k in range(20)] + [inp("b", "r-0")])
    assert len(result.admitted) == 21 and not result.duplicates
    event_reads = [s for s in sent if s.startswith("SELECT") and "ReceiptId" in s]
    assert event_reads == [], event_reads  # the INSERT's unique key found no duplicate: no probe was needed
    assert sum(s.startswith("INSERT INTO _System_Event ") for s in sent) == 1


def test_a_duplicate_late_in_a_batch_the_driver_sends_in_parts_rolls_the_whole_attempt_back(range_engine, tenant):
    """pymysql sends an executemany INSERT in statements of at most ~1 MB, SQLite row by row: a duplicate in the
    last part comes after rows already inserted. The attempt is rolled back whole; the rerun, probing first,
    admits every fresh input once, with consecutive ordinals and no gap."""
    (dup,) = admit_batch(range_engine, PACK, [inp("b", "seen")]).admitted
    big = "x" * 8000
    batch = [inp("a", f"r-{k:03d}", f'{{"k": {k}, "pad": "{big}"}}') for k in range(299)] + [inp("b", "seen")]
    assert sum(len(i.payload) for i in batch) > 2 * pymysql.cursors.Cursor.max_stmt_length  # sent in 3 parts or more
    result = admit_batch(range_engine, PACK, batch)
    assert [(d.receipt_id, d.reason, d.event_id) for d in result.duplicates] == [("seen", "covered", dup.event_id)]
    assert [a.ordinal for a in result.admitted] == list(range(dup.ordinal + 1, dup.ordinal + 300))
    events = all_events(range_engine, PACK)
    assert len(events) == 300 and sorted(e.ReceiptId for e in events) == sorted({i.receipt_id for i in batch})
    with range_engine.connect() as conn:
        assert conn.scalar(select(EnqueueOrdinal.c.LastOrdinal).where(EnqueueOrdinal.c.PackInstallId == PACK)) == dup.ordinal + 299
    assert_membership(range_engine)

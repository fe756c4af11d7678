"""Admission: one pack transaction, ordinals, generations (extend / successor), refusals. Both backends."""

from __future__ import annotations

import pytest
from sqlalchemy import select

from nexus_cutover.catalog import EnqueueOrdinal, Event, WorkItem
from nexus_cutover.errors import BadInput
from nexus_cutover.runtime.admission import admit_batch
from nexus_cutover.runtime.claim import claim_work, complete, retry_or_fail
from nexus_cutover.runtime.errors import NotActivated

from ..support import history_checksum
from .support import PACK, assert_membership, inp, payload_receipts, range_generations, range_tenant


def test_fresh_batch_one_generation_per_identity_with_its_minimum_ordinal(range_engine, tenant):
    result = admit_batch(range_engine, PACK, [inp("a", "1"), inp("b", "1"), inp("a", "2"), inp("a", "3")])
    assert sorted(a.ordinal for a in result.admitted) == [1, 2, 3, 4]
    gens = {g.SourceLane: g for g in range_generations(range_engine)}
    assert (gens["a"].InputStartOrdinal, gens["a"].LaneOrdinal) == (1, 4)
    assert (gens["b"].InputStartOrdinal, gens["b"].LaneOrdinal) == (2, 2)
    assert gens["a"].Status == "pending" and gens["a"].Attempt == 0
    assert payload_receipts(range_engine, gens["a"].WorkId) == ["1", "2", "3"]
    assert len(result.created_work_ids) == 2 and not result.extended_work_ids
    assert_membership(range_engine)


def test_unclaimed_attempt_zero_generation_extends_its_upper_bound(range_engine, tenant):
    first = admit_batch(range_engine, PACK, [inp("a", "1")])
    second = admit_batch(range_engine, PACK, [inp("a", "2"), inp("a", "3")])
    (gen,) = range_generations(range_engine)
    assert second.extended_work_ids == [gen.WorkId] == first.created_work_ids
    assert (gen.InputStartOrdinal, gen.LaneOrdinal) == (1, 3)
    with range_engine.connect() as conn:
        selected = conn.execute(select(Event.c.ReceiptId).where(Event.c.EventId == gen.SelectedEventId)).scalar()
    assert selected == "3"
    assert payload_receipts(range_engine, gen.WorkId) == ["1", "2", "3"]


def test_claimed_generation_keeps_both_bounds_and_later_inputs_extend_a_queued_successor(range_engine, tenant):
    admit_batch(range_engine, PACK, [inp("a", "1"), inp("a", "2")])
    (gen,) = range_generations(range_engine)
    claimed = claim_work(range_engine, gen.WorkId, "w1")
    assert (claimed.input_start_ordinal, claimed.lane_ordinal) == (1, 2)
    admit_batch(range_engine, PACK, [inp("a", "3")])
    admit_batch(range_engine, PACK, [inp("a", "4"), inp("a", "5")])
    first, successor = range_generations(range_engine)
    assert (first.InputStartOrdinal, first.LaneOrdinal, first.Status) == (1, 2, "processing")
    assert (successor.InputStartOrdinal, successor.LaneOrdinal, successor.Status) == (3, 5, "pending")
    assert payload_receipts(range_engine, first.WorkId) == ["1", "2"]
    assert payload_receipts(range_engine, successor.WorkId) == ["3", "4", "5"]
    assert complete(range_engine, claimed)
    assert_membership(range_engine)


def test_retried_generation_keeps_both_bounds(range_engine, tenant):
    admit_batch(range_engine, PACK, [inp("a", "1")])
    (gen,) = range_generations(range_engine)
    claimed = claim_work(range_engine, gen.WorkId, "w1")
    assert retry_or_fail(range_engine, claimed, retry_in_s=0) == "retry"
    admit_batch(range_engine, PACK, [inp("a", "2")])
    retried, successor = range_generations(range_engine)
    assert (retried.Status, retried.Attempt, retried.InputStartOrdinal, retried.LaneOrdinal) == ("retry", 1, 1, 1)
    assert (successor.InputStartOrdinal, successor.LaneOrdinal) == (2, 2)
    again = claim_work(range_engine, retried.WorkId, "w2")
    assert (again.input_start_ordinal, again.lane_ordinal, again.attempt) == (1, 1, 1)
    assert payload_receipts(range_engine, retried.WorkId) == ["1"]
    assert_membership(range_engine)


def test_ordinals_are_above_the_cutoff_and_the_allocator(range_engine):
    def history(sc):
        lane = sc.packs[0].lane("a")
        lane.generation(3, status="completed")  # ordinals 1..3

    range_tenant(range_engine, legacy_max=10, build=history)
    result = admit_batch(range_engine, PACK, [inp("a", "new-1"), inp("a", "new-2")])
    assert [a.ordinal for a in result.admitted] == [11, 12]
    with range_engine.connect() as conn:
        assert conn.execute(select(EnqueueOrdinal.c.LastOrdinal)).scalar() == 12
    again = admit_batch(range_engine, PACK, [inp("b", "new-3")])
    assert [a.ordinal for a in again.admitted] == [13]
    assert_membership(range_engine, {PACK: 10})


def test_legacy_pending_work_is_never_extended_by_range_admission(range_engine):
    def history(sc):
        lane = sc.packs[0].lane("a")
        lane.generation(2, status="pending")  # an old generation, InputStartOrdinal NULL

    range_tenant(range_engine, build=history)
    admit_batch(range_engine, PACK, [inp("a", "x")])
    with range_engine.connect() as conn:
        rows = conn.execute(select(WorkItem.c.InputStartOrdinal, WorkItem.c.LaneOrdinal).order_by(WorkItem.c.WorkId)).all()
    assert [tuple(r) for r in rows] == [(None, 2), (3, 3)]


def test_refuses_a_pack_without_protocol_row_and_writes_nothing(range_engine):
    range_tenant(range_engine, legacy_max=None)
    before = history_checksum(range_engine)
    with pytest.raises(NotActivated, match="no connector projection protocol row"):
        admit_batch(range_engine, PACK, [inp("a", "1")])
    assert history_checksum(range_engine) == before


def test_unknown_pack_and_oversized_batch_are_bad_input(range_engine, tenant):
    with pytest.raises(BadInput, match="unknown pack"):
        admit_batch(range_engine, "pk-nope", [inp("a", "1")])
    with pytest.raises(BadInput, match="at most"):
        admit_batch(range_engine, PACK, [inp("a", str(i)) for i in range(2001)])


def test_ordinary_work_is_unchanged(range_engine):
    def history(sc):
        ev = sc.packs[0].lane("a").event(status="pending")
        sc.ordinary_work(ev, status="pending")

    range_tenant(range_engine, build=history)
    with range_engine.connect() as conn:
        before = conn.execute(select(WorkItem).where(WorkItem.c.WorkClass == "ordinary")).all()
    admit_batch(range_engine, PACK, [inp("a", "2")])
    with range_engine.connect() as conn:
        after = conn.execute(select(WorkItem).where(WorkItem.c.WorkClass == "ordinary")).all()
    assert before == after

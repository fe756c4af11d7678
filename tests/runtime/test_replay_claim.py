"""Replay (new Event + generation, absorbs inputs until claimed) and claim/complete/retry rules."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select, update

from nexus_cutover.catalog import Event, WorkItem
from nexus_cutover.runtime.admission import admit_batch
from nexus_cutover.runtime.claim import claim_next, claim_work, complete, retry_or_fail
from nexus_cutover.runtime.errors import ReplayRefused
from nexus_cutover.runtime.replay import replay

from .support import PACK, all_events, assert_membership, inp, payload_receipts, range_generations, range_tenant


def _event_status(engine, event_id):
    with engine.connect() as conn:
        return conn.execute(select(Event.c.Status).where(Event.c.EventId == event_id)).scalar()


def test_replay_starts_at_its_new_event_and_absorbs_later_inputs_until_claimed(range_engine, tenant):
    (first,) = admit_batch(range_engine, PACK, [inp("a", "1"), inp("a", "2")]).created_work_ids
    claimed = claim_work(range_engine, first, "w")
    with pytest.raises(ReplayRefused, match="only terminal work"):
        replay(range_engine, first)
    assert complete(range_engine, claimed)
    result = replay(range_engine, first)
    assert result.ordinal == 3
    admit_batch(range_engine, PACK, [inp("a", "3"), inp("b", "x")])
    admit_batch(range_engine, PACK, [inp("a", "4")])
    gens = {g.WorkId: g for g in range_generations(range_engine)}
    rg = gens[result.work_id]
    assert (rg.InputStartOrdinal, rg.LaneOrdinal, rg.ReplayOfWorkId) == (3, 6, first)
    assert payload_receipts(range_engine, result.work_id) == [f"replay:{first}:3", "3", "4"]
    replay_event = [e for e in all_events(range_engine) if e.EventId == result.event_id][0]
    assert replay_event.ReplayOfWorkId == first and replay_event.EnqueueOrdinal == 3
    claim_work(range_engine, result.work_id, "w")
    admit_batch(range_engine, PACK, [inp("a", "5")])
    assert payload_receipts(range_engine, result.work_id) == [f"replay:{first}:3", "3", "4"]
    assert payload_receipts(range_engine, first) == ["1", "2"]  # the replayed generation is untouched
    assert_membership(range_engine)


def test_replay_refuses_ordinary_work(range_engine):
    def history(sc):
        sc.ordinary_work(sc.packs[0].lane("a").event(), status="completed")

    range_tenant(range_engine, build=history)
    with pytest.raises(ReplayRefused, match="not a projection generation"):
        replay(range_engine, 1)


def test_claim_sets_processing_on_the_selected_event_and_is_exclusive(range_engine, tenant):
    admit_batch(range_engine, PACK, [inp("a", "1"), inp("a", "2")])
    (gen,) = range_generations(range_engine)
    claimed = claim_work(range_engine, gen.WorkId, "w1")
    assert claimed.work_id == gen.WorkId and claimed.lease_owner == "w1"
    assert _event_status(range_engine, gen.SelectedEventId) == "processing"
    assert claim_work(range_engine, gen.WorkId, "w2") is None
    assert complete(range_engine, claimed)
    assert _event_status(range_engine, gen.SelectedEventId) == "processed"
    assert claim_work(range_engine, gen.WorkId, "w2") is None
    assert not complete(range_engine, claimed)  # already completed: nothing changes


def test_expired_lease_is_reclaimed_as_a_retry(range_engine, tenant):
    (work_id,) = admit_batch(range_engine, PACK, [inp("a", "1")]).created_work_ids
    first = claim_work(range_engine, work_id, "w1")
    with range_engine.begin() as conn:
        conn.execute(update(WorkItem).values(LeaseExpiresAt=dt.datetime(2000, 1, 1)))
    second = claim_work(range_engine, work_id, "w2")
    assert second.attempt == 1 and second.lease_owner == "w2"
    assert not complete(range_engine, first)  # the old lease holder cannot complete
    admit_batch(range_engine, PACK, [inp("a", "2")])
    assert [g.LaneOrdinal for g in range_generations(range_engine)] == [1, 2]


def test_retry_until_max_attempts_then_failed(range_engine, tenant):
    (work_id,) = admit_batch(range_engine, PACK, [inp("a", "1")]).created_work_ids
    statuses = []
    for _ in range(3):
        claimed = claim_work(range_engine, work_id, "w")
        statuses.append(retry_or_fail(range_engine, claimed, retry_in_s=0, max_attempts=3))
    assert statuses == ["retry", "retry", "failed"]
    assert claim_work(range_engine, work_id, "w") is None
    (gen,) = range_generations(range_engine)
    assert (gen.Status, gen.Attempt) == ("failed", 3)


def test_retry_not_due_is_not_claimed(range_engine, tenant):
    (work_id,) = admit_batch(range_engine, PACK, [inp("a", "1")]).created_work_ids
    claimed = claim_work(range_engine, work_id, "w")
    assert retry_or_fail(range_engine, claimed, retry_in_s=3600) == "retry"
    assert claim_work(range_engine, work_id, "w") is None


def test_claim_next_keeps_per_identity_order_and_skips_old_work(range_engine):
    def history(sc):
        sc.packs[0].lane("old").generation(1, status="pending")  # old protocol: never claimed here

    range_tenant(range_engine, build=history)
    admit_batch(range_engine, PACK, [inp("a", "1")])
    first = claim_next(range_engine, "acme", "w")
    admit_batch(range_engine, PACK, [inp("a", "2")])  # successor of a, must wait for the first
    assert claim_next(range_engine, "acme", "w") is None
    assert complete(range_engine, first)
    second = claim_next(range_engine, "acme", "w")
    assert second is not None and second.input_start_ordinal == 3 and second.work_id != first.work_id
    assert claim_next(range_engine, "acme", "w") is None

"""The two PR #329 regressions, and membership never inferred from clock, order, status or history.

PR #329 inferred a generation's inputs from history. Regression 1: membership
followed ReceivedAt / delivery order, so an input received "late" but admitted
early (or the reverse) landed in the wrong generation or in none. Regression 2:
a duplicate of an input whose generation was gone reconstructed a task.
Under ranges, payloads are exactly ``InputStartOrdinal..LaneOrdinal`` of the
identity, and a duplicate without coverage is an explicit error.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import delete, func, select, update

from nexus_cutover.catalog import Event, WorkItem
from nexus_cutover.runtime.admission import admit_batch
from nexus_cutover.runtime.claim import claim_work, complete, retry_or_fail
from nexus_cutover.runtime.errors import MissingCoverage, MissingMembership
from nexus_cutover.runtime.payload import load_payloads

from .support import PACK, assert_membership, inp, payload_receipts, range_generations, range_tenant

T0 = dt.datetime(2026, 3, 1, 12, 0, 0)


def test_regression_1_clock_order_disagreeing_with_ordinal_order(range_engine, tenant):
    # Received in the reverse order of admission: the clock says r3 < r2 < r1.
    admit_batch(range_engine, PACK, [inp("a", f"r{i}", received_at=T0 - dt.timedelta(minutes=i)) for i in (1, 2, 3)])
    (first,) = range_generations(range_engine)
    claimed = claim_work(range_engine, first.WorkId, "w1")
    # Admitted after the claim, but received *before* every input of the claimed generation.
    admit_batch(range_engine, PACK, [inp("a", f"s{i}", received_at=T0 - dt.timedelta(hours=i)) for i in (1, 2)])
    _, successor = range_generations(range_engine)
    assert payload_receipts(range_engine, first.WorkId) == ["r1", "r2", "r3"]
    assert payload_receipts(range_engine, successor.WorkId) == ["s1", "s2"]
    with range_engine.connect() as conn:
        by_clock = [r for (r,) in conn.execute(select(Event.c.ReceiptId).order_by(Event.c.ReceivedAt))]
    assert by_clock == ["s2", "s1", "r3", "r2", "r1"]  # what a clock-based reader would have consumed
    assert complete(range_engine, claimed)
    assert_membership(range_engine)


def test_regression_1_scenario_built_ranges_with_shuffled_clock(range_engine):
    """Ranges persisted by a scenario (no runtime admission), ReceivedAt deliberately shuffled."""

    def history(sc):
        lane = sc.packs[0].lane("a")
        clocks = [5, 1, 4, 2, 3, 0]
        evs = [lane.event(status="pending", received_at=T0 + dt.timedelta(seconds=c)) for c in clocks]
        lane.work_item(evs[2], status="completed", input_start_ordinal=1)  # ordinals 1..3
        lane.work_item(evs[5], status="pending", input_start_ordinal=4)  # ordinals 4..6

    range_tenant(range_engine, build=history)
    gens = range_generations(range_engine)
    with range_engine.connect() as conn:
        assert [p.ordinal for p in load_payloads(conn, gens[0].WorkId)] == [1, 2, 3]
        assert [p.ordinal for p in load_payloads(conn, gens[1].WorkId)] == [4, 5, 6]


def test_membership_ignores_event_status_and_retained_terminal_history(range_engine, tenant):
    (old_id,) = admit_batch(range_engine, PACK, [inp("a", "1"), inp("a", "2")]).created_work_ids
    old = claim_work(range_engine, old_id, "w1")
    assert complete(range_engine, old)
    (new_id,) = admit_batch(range_engine, PACK, [inp("a", "3"), inp("a", "4")]).created_work_ids
    new = claim_work(range_engine, new_id, "w1")
    assert retry_or_fail(range_engine, new, retry_in_s=0) == "retry"
    with range_engine.begin() as conn:  # statuses that a status-based reader would have misread
        conn.execute(update(Event).where(Event.c.ReceiptId == "2").values(Status="pending"))
        conn.execute(update(Event).where(Event.c.ReceiptId == "3").values(Status="skipped"))
        conn.execute(update(Event).where(Event.c.ReceiptId == "4").values(Status="processed"))
    assert payload_receipts(range_engine, old_id) == ["1", "2"]
    assert payload_receipts(range_engine, new_id) == ["3", "4"]


def test_regression_2_duplicate_of_a_lost_generation_reconstructs_no_task(range_engine, tenant):
    admit_batch(range_engine, PACK, [inp("a", "1"), inp("a", "2")])
    with range_engine.begin() as conn:  # simulate a retention bug that deleted the live generation
        conn.execute(delete(WorkItem))
    with pytest.raises(MissingCoverage) as info:
        admit_batch(range_engine, PACK, [inp("a", "2")])
    assert info.value.receipts == [("a", "2", 2)]
    with range_engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(WorkItem)).scalar() == 0


def test_missing_membership_is_an_error_without_selected_payload_fallback(range_engine):
    def history(sc):
        lane = sc.packs[0].lane("a")
        evs = [lane.event(status="pending") for _ in range(3)]
        lane.work_item(evs[2], status="pending", input_start_ordinal=1)  # range 1..3
        lane.generation(1, status="pending")  # an old item: no InputStartOrdinal
        sc.ordinary_work(evs[0], status="pending")

    range_tenant(range_engine, build=history)
    with range_engine.connect() as conn:
        assert [p.ordinal for p in load_payloads(conn, 1)] == [1, 2, 3]
        with pytest.raises(MissingMembership, match="no persisted input range"):
            load_payloads(conn, 2)
        with pytest.raises(MissingMembership, match="no persisted input range"):
            load_payloads(conn, 3)
        with pytest.raises(MissingMembership, match="does not exist"):
            load_payloads(conn, 404)
    with range_engine.begin() as conn:  # first member lost: an error, not the rest of the range
        conn.execute(delete(Event).where(Event.c.EnqueueOrdinal == 1))
    with range_engine.connect() as conn, pytest.raises(MissingMembership, match="first or last member"):
        load_payloads(conn, 1)

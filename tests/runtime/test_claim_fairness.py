"""Claim selects only claimable candidates in SQL: queued successors never starve another identity (both backends)."""

from __future__ import annotations

import datetime as dt

from nexus_cutover.clock import utcnow
from nexus_cutover.runtime.claim import claim_candidates, claim_next, complete

from .support import NS, range_tenant

BLOCKED_SUCCESSORS = 60  # per busy identity: more than the candidate LIMIT (50)


def _generation(lane, status: str = "pending", **kw) -> dict:
    ev = lane.event(status="processed" if status == "completed" else "pending")
    return lane.work_item(ev, status=status, input_start_ordinal=ev["EnqueueOrdinal"], **kw)


def _busy_then_free(sc) -> None:
    """Two identities whose first generation is live but not claimable (retry not due; processing under a valid
    lease), each with 60 queued successors; created last (highest WorkIds), one identity with a claimable generation."""
    later = utcnow() + dt.timedelta(hours=1)
    pack = sc.packs[0]
    retrying, processing = pack.lane("busy-retry"), pack.lane("busy-processing")
    _generation(retrying, "retry", attempt=1, next_attempt_at=later)
    _generation(processing, "processing", lease_owner="other-worker", lease_expires_at=later)
    for _ in range(BLOCKED_SUCCESSORS):
        _generation(retrying)
        _generation(processing)
    free = pack.lane("free")
    _generation(free, "completed")
    sc.free_work_id = _generation(free)["WorkId"]


def test_queued_successors_do_not_starve_another_identity(range_engine):
    sc = range_tenant(range_engine, build=_busy_then_free)
    with range_engine.connect() as conn:
        assert claim_candidates(conn, NS) == [sc.free_work_id]
    claimed = claim_next(range_engine, NS, "w")
    assert claimed is not None and claimed.work_id == sc.free_work_id
    assert claimed.identity.source_lane == "free"
    assert claim_next(range_engine, NS, "w") is None  # everything else waits behind a live predecessor
    assert complete(range_engine, claimed)
    assert claim_next(range_engine, NS, "w") is None


def test_predecessor_rule_in_sql(range_engine):
    """Offered: no predecessor, or a terminal one (completed, failed, cancelled). Not offered: a live predecessor
    (pending, blocked, retry, processing), also an old-protocol one of the same identity."""
    offered, held = [], []

    def build(sc):
        pack = sc.packs[0]
        offered.append(_generation(pack.lane("first"))["WorkId"])
        for status in ("completed", "failed", "cancelled"):
            lane = pack.lane(f"after-{status}")
            _generation(lane, status)
            offered.append(_generation(lane)["WorkId"])
        for status in ("pending", "blocked", "retry", "processing"):
            lane = pack.lane(f"behind-{status}")
            extra = {"lease_owner": "x", "lease_expires_at": utcnow() + dt.timedelta(hours=1)} if status == "processing" else {}
            _generation(lane, status, **extra)
            held.append(_generation(lane)["WorkId"])
        legacy = pack.lane("behind-old-protocol")
        legacy.work_item(legacy.event(status="pending"), status="pending")  # InputStartOrdinal NULL
        held.append(_generation(legacy)["WorkId"])

    range_tenant(range_engine, build=build)
    with range_engine.connect() as conn:
        candidates = claim_candidates(conn, NS)
    # the behind-pending and behind-retry (due) heads are claimable themselves; only their successors are held
    assert set(offered) <= set(candidates)
    assert not set(held) & set(candidates)
    assert len(candidates) == len(set(candidates)) == len(offered) + 2


def test_limit_counts_claimable_rows_only(range_engine):
    sc = range_tenant(range_engine, build=_busy_then_free)
    with range_engine.connect() as conn:
        assert claim_candidates(conn, NS, limit=1) == [sc.free_work_id]

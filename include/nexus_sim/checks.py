"""What ``make demo`` and every end-to-end test on the production-shaped tenant check after the release (issues 24, 25).

Shared by ``scripts/demo.py`` (its step 5), the in-process DAG test (tests/dags), the stack test (tests/stack), the
rollout test (tests/rollout) and the cutover steps on the production tenant (tests/sim). Read only. Each check
reads the tenant with the server's own comparisons (joins on the identity columns), never Python string equality:

* :func:`projection_owners_after_cutoff` -- every projection Event above its pack's cutoff lies in exactly one
  range generation of its identity, as the server's join sees it (case-variant and trailing-space lanes included);
  ordinary Events above the cutoff are no projection input and belong to no generation;
* :func:`live_ordinary_work` -- the planted ordinary work that was live before the cutover (blocked, retry due next
  week, processing under a lease) is live after it with the same Status: nothing waited for it or changed it;
* :func:`receipt_outcomes` -- per planted future receipt the live traffic stored: confirmed or not.
"""

from __future__ import annotations

from collections import defaultdict
from typing import Any

from sqlalchemy import Engine, and_, select

from nexus_cutover import catalog
from nexus_cutover.catalog import Event, IngressReceipt, WorkItem
from nexus_cutover.identity import COLUMN_NAMES, is_projection_input

#: Ordinary statuses no worker of the tests completes (the live traffic's ordinary worker completes only pending ones).
HELD_ORDINARY_STATUSES = ("blocked", "retry", "processing")


def range_membership():
    """The server's join of an Event to the range generations owning it: the six identity columns equal in the
    columns' own collation, ``InputStartOrdinal <= EnqueueOrdinal <= LaneOrdinal`` (the contract's membership)."""
    e, w = Event, WorkItem
    return and_(
        *(w.c[name] == e.c[name] for name in COLUMN_NAMES),
        w.c.WorkClass == catalog.WORK_CLASS_PROJECTION,
        w.c.InputStartOrdinal.is_not(None),
        e.c.EnqueueOrdinal >= w.c.InputStartOrdinal,
        e.c.EnqueueOrdinal <= w.c.LaneOrdinal,
    )


def projection_owners_after_cutoff(engine: Engine, cutoffs: dict[str, int]) -> dict[str, Any]:
    """``{"checked": n, "not_exactly_one": [(EventId, pack, lane, owners)], "ordinary_above_cutoff": m}`` for the
    projection Events above the cutoffs of ``cutoffs``' packs (the server's join on the six identity columns)."""
    e, w = Event, WorkItem
    on = range_membership()
    owners: dict[int, list[int]] = defaultdict(list)
    where: dict[int, tuple[str, str]] = {}
    ordinary = 0
    with engine.connect() as conn:
        for pack, cutoff in cutoffs.items():
            above = and_(e.c.PackInstallId == pack, e.c.EnqueueOrdinal > cutoff)
            stmt = select(e.c.EventId, e.c.SourceLane, w.c.WorkId).select_from(e.outerjoin(w, on)).where(
                above, is_projection_input(e))
            for event_id, lane, work_id in conn.execute(stmt):
                where[event_id] = (pack, lane)
                owners[event_id] += [] if work_id is None else [work_id]
            ordinary += len(conn.execute(select(e.c.EventId).where(above, ~is_projection_input(e))).all())
    bad = [(event_id, *where[event_id], ids) for event_id, ids in sorted(owners.items()) if len(ids) != 1]
    return {"checked": len(owners), "not_exactly_one": bad, "ordinary_above_cutoff": ordinary}


def live_ordinary_work(engine: Engine, work_items: list[dict[str, Any]]) -> dict[int, tuple[str, str]]:
    """WorkId -> (Status planted, Status now) of the planted ordinary work in :data:`HELD_ORDINARY_STATUSES`."""
    planted = {w["WorkId"]: w["Status"] for w in work_items
               if w["WorkClass"] == catalog.WORK_CLASS_ORDINARY and w["Status"] in HELD_ORDINARY_STATUSES}
    with engine.connect() as conn:
        now = dict(conn.execute(select(WorkItem.c.WorkId, WorkItem.c.Status).where(WorkItem.c.WorkId.in_(planted))).all())
    return {work_id: (status, now.get(work_id)) for work_id, status in planted.items()}


def receipt_outcomes(engine: Engine, keys: list[tuple[str, str, str]]) -> dict[tuple[str, str, str], bool | None]:
    """(pack, lane, receipt id) -> whether its receipt row is confirmed (None: no row with these exact bytes)."""
    r = IngressReceipt
    out: dict[tuple[str, str, str], bool | None] = {}
    with engine.connect() as conn:
        for pack, lane, rid in keys:
            rows = conn.execute(select(r.c.SourceLane, r.c.ReceiptId, r.c.ConfirmedAt).where(
                r.c.PackInstallId == pack, r.c.SourceLane == lane, r.c.ReceiptId == rid)).all()
            exact = [row for row in rows if (row.SourceLane, row.ReceiptId) == (lane, rid)]  # bytes, not the collation
            out[(pack, lane, rid)] = None if not exact else exact[0].ConfirmedAt is not None
    return out

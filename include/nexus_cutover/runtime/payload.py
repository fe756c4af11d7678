"""The range reader: :func:`load_payloads` (seed 000, "The worker adapter passes the WorkId").

Invariants:

* Input is the WorkId remembered at claim. Membership is exactly the Events of
  the WorkItem's persisted identity with ``InputStartOrdinal <= EnqueueOrdinal
  <= LaneOrdinal``, ordered by ordinal: one index range on
  ``ix_Event_SourceLane`` (identity equality prefix + ordinal BETWEEN), so the
  cost follows the generation's input count, not the retained history.
* Timestamps, Event status, delivery sequence and terminal history play no part.
* Missing membership is :class:`~.errors.MissingMembership`: a WorkId that is
  not a range generation, an empty range, a first member other than
  ``InputStartOrdinal`` or a last member other than the selected Event. There is
  no selected-payload-only fallback.
"""

from __future__ import annotations

from sqlalchemy import Connection, Select, select

from .. import catalog
from ..catalog import Event, WorkItem
from ..identity import ProjectionIdentity, columns, matches, of_row
from .errors import MissingMembership
from .model import Payload


def payload_query(identity: ProjectionIdentity, input_start_ordinal: int, lane_ordinal: int) -> Select:
    return (
        select(Event.c.EventId, Event.c.EnqueueOrdinal, Event.c.ReceiptId, Event.c.Payload, Event.c.ReplayOfWorkId)
        .where(matches(Event, identity), Event.c.EnqueueOrdinal.between(input_start_ordinal, lane_ordinal))
        .order_by(Event.c.EnqueueOrdinal)
    )


def load_payloads(conn: Connection, work_id: int) -> list[Payload]:
    """Every member Event of generation ``work_id``, by ordinal; :class:`MissingMembership` if incomplete."""
    work = conn.execute(
        select(
            WorkItem.c.WorkClass,
            WorkItem.c.InputStartOrdinal,
            WorkItem.c.LaneOrdinal,
            WorkItem.c.SelectedEventId,
            *columns(WorkItem),
        ).where(WorkItem.c.WorkId == work_id)
    ).first()
    if work is None:
        raise MissingMembership(f"WorkItem {work_id} does not exist: no membership to load")
    if work.WorkClass != catalog.WORK_CLASS_PROJECTION or work.InputStartOrdinal is None or work.LaneOrdinal is None:
        raise MissingMembership(
            f"WorkItem {work_id} has no persisted input range (InputStartOrdinal/LaneOrdinal): it is not range work "
            "and its membership is not inferred"
        )
    start, end = work.InputStartOrdinal, work.LaneOrdinal
    rows = conn.execute(payload_query(of_row(work), start, end)).all()
    if not rows or rows[0].EnqueueOrdinal != start or rows[-1].EnqueueOrdinal != end:
        found = f"{len(rows)} Event(s)" + (f" {rows[0].EnqueueOrdinal}..{rows[-1].EnqueueOrdinal}" if rows else "")
        raise MissingMembership(
            f"WorkItem {work_id}: range [{start}, {end}] yields {found}; its first or last member is missing "
            "(retention must not delete live range members)"
        )
    if rows[-1].EventId != work.SelectedEventId:
        raise MissingMembership(
            f"WorkItem {work_id}: the Event at LaneOrdinal {end} is {rows[-1].EventId}, not the selected Event {work.SelectedEventId}"
        )
    return [Payload(r.EventId, r.EnqueueOrdinal, r.ReceiptId, r.Payload, r.ReplayOfWorkId) for r in rows]

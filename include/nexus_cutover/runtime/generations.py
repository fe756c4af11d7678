"""Generations of one projection identity, on ``ix_WorkItem_ProjectionOrder``.

A generation is a projection WorkItem with a persisted input range
``[InputStartOrdinal, LaneOrdinal]`` over the Events of its identity.

Invariants (seed 000, "Ownership and invariant"):

* ``InputStartOrdinal`` is written once, when the generation is created, and
  never changed. ``LaneOrdinal`` (with ``SelectedEventId``) moves up only while
  the generation is unclaimed and attempt zero (``Status = 'pending' AND
  Attempt = 0``); the conditional UPDATE re-checks that against the latest
  committed row, so a claim that committed first wins and the inputs go to a
  successor instead.
* Only the latest generation of an identity (greatest ``LaneOrdinal``) can be
  extended, and new ordinals are above every existing one, so ranges of one
  identity never overlap and leave no admitted input outside a range.
* Every lookup here is an equality prefix on the six identity columns plus a
  bound on ``LaneOrdinal`` with ``LIMIT 1``: one index row, whatever the number
  of retained generations.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Connection, Select, insert, select, update

from .. import catalog
from ..catalog import WorkItem
from ..identity import ProjectionIdentity, matches


@dataclass(frozen=True)
class Generation:
    work_id: int
    status: str
    attempt: int
    input_start_ordinal: int | None
    lane_ordinal: int
    selected_event_id: int | None

    @property
    def extendable(self) -> bool:
        """Unclaimed, attempt zero and a range generation: may absorb later inputs."""
        return self.status == "pending" and self.attempt == 0 and self.input_start_ordinal is not None

    def contains(self, ordinal: int) -> bool:
        return self.input_start_ordinal is not None and self.input_start_ordinal <= ordinal <= self.lane_ordinal


_COLUMNS = (
    WorkItem.c.WorkId,
    WorkItem.c.Status,
    WorkItem.c.Attempt,
    WorkItem.c.InputStartOrdinal,
    WorkItem.c.LaneOrdinal,
    WorkItem.c.SelectedEventId,
)


def latest_generation_query(identity: ProjectionIdentity) -> Select:
    """The generation with the greatest ``LaneOrdinal`` of ``identity`` (the one admission may extend)."""
    return (
        select(*_COLUMNS)
        .where(matches(WorkItem, identity), WorkItem.c.LaneOrdinal.is_not(None))
        .order_by(WorkItem.c.LaneOrdinal.desc())
        .limit(1)
    )


def covering_generation_query(identity: ProjectionIdentity, ordinal: int) -> Select:
    """The first generation of ``identity`` whose upper bound is at or above ``ordinal``.

    Ranges never overlap, so this is the only generation that can contain ``ordinal``.
    """
    return (
        select(*_COLUMNS)
        .where(matches(WorkItem, identity), WorkItem.c.LaneOrdinal >= ordinal)
        .order_by(WorkItem.c.LaneOrdinal.asc())
        .limit(1)
    )


def previous_generation_query(identity: ProjectionIdentity, lane_ordinal: int) -> Select:
    """The generation of ``identity`` just below ``lane_ordinal`` (per-identity execution order)."""
    return (
        select(*_COLUMNS)
        .where(matches(WorkItem, identity), WorkItem.c.LaneOrdinal < lane_ordinal)
        .order_by(WorkItem.c.LaneOrdinal.desc())
        .limit(1)
    )


def _one(conn: Connection, query: Select) -> Generation | None:
    row = conn.execute(query).first()
    return Generation(*row) if row is not None else None


def latest_generation(conn: Connection, identity: ProjectionIdentity) -> Generation | None:
    """The latest generation, read with a locking (current) read.

    Under the pack lock no other admission or replay runs, but TiDB's plain reads
    use the snapshot taken before the lock was granted; a stale "latest" could
    be extended past a successor created meanwhile. The locking read sees the
    committed latest and holds it until commit.
    """
    return _one(conn, latest_generation_query(identity).with_for_update())


def covering_generation(conn: Connection, identity: ProjectionIdentity, ordinal: int) -> Generation | None:
    """The generation whose range contains ``ordinal``, or None (no durable coverage)."""
    gen = _one(conn, covering_generation_query(identity, ordinal))
    return gen if gen is not None and gen.contains(ordinal) else None


def previous_generation(conn: Connection, identity: ProjectionIdentity, lane_ordinal: int) -> Generation | None:
    return _one(conn, previous_generation_query(identity, lane_ordinal))


def try_extend(conn: Connection, gen: Generation, lane_ordinal: int, selected_event_id: int, now: dt.datetime) -> bool:
    """Move ``gen``'s upper bound to ``lane_ordinal`` if it is still unclaimed and attempt zero."""
    result = conn.execute(
        update(WorkItem)
        .where(
            WorkItem.c.WorkId == gen.work_id,
            WorkItem.c.Status == "pending",
            WorkItem.c.Attempt == 0,
            WorkItem.c.InputStartOrdinal.is_not(None),
            WorkItem.c.LaneOrdinal == gen.lane_ordinal,
        )
        .values(LaneOrdinal=lane_ordinal, SelectedEventId=selected_event_id, UpdatedAt=now)
    )
    return result.rowcount == 1


def create_generation(
    conn: Connection,
    *,
    work_id: int,
    namespace: str,
    identity: ProjectionIdentity,
    input_start_ordinal: int,
    lane_ordinal: int,
    selected_event_id: int,
    now: dt.datetime,
    replay_of_work_id: int | None = None,
) -> None:
    """A new queued generation ``[input_start_ordinal, lane_ordinal]`` (pending, attempt zero)."""
    conn.execute(
        insert(WorkItem).values(
            WorkId=work_id,
            Namespace=namespace,
            WorkClass=catalog.WORK_CLASS_PROJECTION,
            **identity.as_values(),
            SelectedEventId=selected_event_id,
            LaneOrdinal=lane_ordinal,
            InputStartOrdinal=input_start_ordinal,
            ReplayOfWorkId=replay_of_work_id,
            Attempt=0,
            Status="pending",
            CreatedAt=now,
            UpdatedAt=now,
        )
    )

"""Claim, complete and retry range generations (seed 000, "claim changes the selected Event's status").

Invariants:

* Only range work is touched: ``WorkClass = 'projection'`` and
  ``InputStartOrdinal IS NOT NULL``. Old-protocol and ordinary WorkItems are never claimed here.
* :func:`claim_work` is one conditional UPDATE (pending; retry that is due; or
  processing whose lease expired), evaluated against the latest committed row,
  so two claimers and a concurrent admission can never both win. A claim sets
  ``processing`` and the lease, then the selected Event's status; the interval
  read back in the same transaction is what :class:`~.model.ClaimedWork`
  remembers. From then on the generation's bounds never move (admission only
  extends ``pending`` attempt-zero work).
* ``Attempt`` counts retries: :func:`retry_or_fail` and the reclaim of an
  expired lease raise it, so a generation that was ever claimed is never again
  "unclaimed attempt zero".
* :func:`claim_next` keeps per-identity order: a generation is offered only
  when the generation just below it (one index row) is terminal or absent,
  tested in the candidate query itself so its ``LIMIT`` counts claimable rows only.
* Lease and retry times schedule work; they never decide membership.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import ColumnElement, Connection, Engine, Select, and_, case, func, or_, select, update

from .. import catalog, tx
from ..catalog import Event, WorkItem
from ..clock import utcnow
from ..db import Deadline
from ..holders import stored_holder
from ..identity import ProjectionIdentity, columns, matches, of_row
from .model import ClaimedWork
from .tx import run_transaction

DEFAULT_LEASE_S = 60.0


def _range_work():
    return and_(WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION, WorkItem.c.InputStartOrdinal.is_not(None))


def _claimable(now: dt.datetime):
    return or_(
        WorkItem.c.Status == "pending",
        and_(WorkItem.c.Status == "retry", or_(WorkItem.c.NextAttemptAt.is_(None), WorkItem.c.NextAttemptAt <= now)),
        and_(WorkItem.c.Status == "processing", WorkItem.c.LeaseExpiresAt < now),
    )


def _set_event_status(conn: Connection, event_id: int | None, status: str) -> None:
    if event_id is not None:
        conn.execute(update(Event).where(Event.c.EventId == event_id).values(Status=status))


def claim_in(conn: Connection, work_id: int, owner: str, lease_s: float = DEFAULT_LEASE_S) -> ClaimedWork | None:
    """Claim ``work_id`` inside the caller's transaction; None when it is not claimable."""
    now = utcnow()
    stmt = (
        update(WorkItem)
        .where(WorkItem.c.WorkId == work_id, _range_work(), _claimable(now))
        # Attempt first: MySQL evaluates SET left to right, so it must see the old Status.
        .ordered_values(
            (WorkItem.c.Attempt, case((WorkItem.c.Status == "processing", WorkItem.c.Attempt + 1), else_=WorkItem.c.Attempt)),
            (WorkItem.c.Status, "processing"),
            (WorkItem.c.LeaseOwner, stored_holder(owner)),
            (WorkItem.c.LeaseExpiresAt, now + dt.timedelta(seconds=lease_s)),
            (WorkItem.c.NextAttemptAt, None),
            (WorkItem.c.UpdatedAt, now),
        )
    )
    if conn.execute(stmt).rowcount != 1:
        return None
    row = conn.execute(
        select(
            WorkItem.c.InputStartOrdinal,
            WorkItem.c.LaneOrdinal,
            WorkItem.c.SelectedEventId,
            WorkItem.c.Attempt,
            WorkItem.c.ReplayOfWorkId,
            *columns(WorkItem),
        ).where(WorkItem.c.WorkId == work_id)
    ).one()
    _set_event_status(conn, row.SelectedEventId, "processing")
    return ClaimedWork(
        work_id=work_id,
        identity=of_row(row),
        input_start_ordinal=row.InputStartOrdinal,
        lane_ordinal=row.LaneOrdinal,
        selected_event_id=row.SelectedEventId,
        attempt=row.Attempt,
        lease_owner=stored_holder(owner),
        replay_of_work_id=row.ReplayOfWorkId,
    )


def claim_work(
    engine: Engine, work_id: int, owner: str, *, lease_s: float = DEFAULT_LEASE_S, deadline: Deadline | None = None
) -> ClaimedWork | None:
    """Claim one range generation by WorkId in its own transaction; None when not claimable."""
    return run_transaction(
        engine, lambda conn: claim_in(conn, work_id, owner, lease_s), what=f"claiming WorkItem {work_id}", deadline=deadline
    )


def _predecessor_status():
    """Status of the generation just below the outer row of the same identity (NULL when there is none).

    A correlated scalar subquery: an equality prefix of ``ix_WorkItem_ProjectionOrder``
    on the six identity columns, ``LaneOrdinal <`` the outer row's, ``ORDER BY
    LaneOrdinal DESC LIMIT 1``. MariaDB reads it as a ``ref`` on the identity,
    backward from its top, and stops at the first row below the candidate: it
    passes the generations queued above the candidate (normally none or one:
    admission extends the latest pending generation) and never reads the
    retained history below, whatever its depth.
    """
    prev = WorkItem.alias("prev")
    return (
        select(prev.c.Status)
        .where(matches(prev, ProjectionIdentity(*columns(WorkItem))), prev.c.LaneOrdinal < WorkItem.c.LaneOrdinal)
        .order_by(prev.c.LaneOrdinal.desc())
        .limit(1)
        .correlate(WorkItem)
        .scalar_subquery()
    )


#: What :func:`_predecessor_status` reads as when the identity has no generation below (never a Status).
_NO_PREDECESSOR = "-"


def claim_candidates_query(namespace: str, now: dt.datetime | None = None, limit: int = 50) -> Select:
    """Claimable range generations of ``namespace`` whose predecessor is terminal or absent, at most ``limit``.

    The outer read is a range on ``ix_WorkItem_State``; the predecessor test is in
    the SQL (:func:`_predecessor_status`), so ``LIMIT`` counts only generations
    that can be claimed now: queued successors behind live predecessors never
    crowd out other identities. Normally one generation per identity qualifies
    at most (its lowest live one). Oldest generation first; ``WorkId`` only breaks ties
    deterministically (ids carry no order across TiDB servers).
    """
    ready = func.coalesce(_predecessor_status(), _NO_PREDECESSOR).in_((_NO_PREDECESSOR, *catalog.WORK_TERMINAL_STATUSES))
    return (
        select(WorkItem.c.WorkId, WorkItem.c.LaneOrdinal, *columns(WorkItem))
        .where(
            WorkItem.c.Namespace == namespace,
            WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION,
            WorkItem.c.Status.in_(("pending", "retry", "processing")),
            WorkItem.c.InputStartOrdinal.is_not(None),
            _claimable(now or utcnow()),
            ready,
        )
        .order_by(WorkItem.c.CreatedAt, WorkItem.c.WorkId)
        .limit(limit)
    )


def claim_candidates(conn: Connection, namespace: str, limit: int = 50) -> list[int]:
    """WorkIds of claimable range generations of ``namespace`` whose predecessor is terminal or absent (one statement)."""
    return [row.WorkId for row in conn.execute(claim_candidates_query(namespace, limit=limit))]


def claim_next(
    engine: Engine, namespace: str, owner: str, *, lease_s: float = DEFAULT_LEASE_S, deadline: Deadline | None = None
) -> ClaimedWork | None:
    """Claim the next ready range generation of ``namespace``, or None when there is none."""
    with tx.reading(engine, f"listing claimable work of namespace {namespace!r}") as conn:
        candidates = claim_candidates(conn, namespace)
    return claim_first(engine, candidates, owner, lease_s=lease_s, deadline=deadline)


def claim_first(
    engine: Engine, candidates: list[int], owner: str, *, lease_s: float = DEFAULT_LEASE_S, deadline: Deadline | None = None
) -> ClaimedWork | None:
    """Claim the first of ``candidates`` (WorkIds, in their order) that is still claimable, each try its own transaction."""
    for work_id in candidates:
        claimed = claim_work(engine, work_id, owner, lease_s=lease_s, deadline=deadline)
        if claimed is not None:
            return claimed
    return None


def _lease_held(claimed: ClaimedWork) -> tuple[ColumnElement[bool], ...]:
    """The claimed generation, still ``processing`` under its claimer's lease: what completing or failing it requires."""
    return (
        WorkItem.c.WorkId == claimed.work_id,
        WorkItem.c.Status == "processing",
        WorkItem.c.LeaseOwner == claimed.lease_owner,
    )


def complete(engine: Engine, claimed: ClaimedWork, *, deadline: Deadline | None = None) -> bool:
    """Mark the claimed generation completed (and its selected Event processed); False if the lease was lost."""

    def body(conn: Connection) -> bool:
        now = utcnow()
        done = conn.execute(
            update(WorkItem)
            .where(*_lease_held(claimed))
            .values(Status="completed", LeaseOwner=None, LeaseExpiresAt=None, UpdatedAt=now)
        ).rowcount
        if done == 1:
            _set_event_status(conn, claimed.selected_event_id, "processed")
        return done == 1

    return run_transaction(engine, body, what=f"completing WorkItem {claimed.work_id}", deadline=deadline)


def retry_or_fail(
    engine: Engine,
    claimed: ClaimedWork,
    *,
    retry_in_s: float = 5.0,
    max_attempts: int = 5,
    permanent: bool = False,
    deadline: Deadline | None = None,
) -> str | None:
    """After a failed execution: ``retry`` (Attempt+1, due in ``retry_in_s``) or ``failed``.

    ``failed`` once ``max_attempts`` executions failed, or at once when
    ``permanent``. Returns the new status, or None if the lease was lost.
    """

    def body(conn: Connection) -> str | None:
        now = utcnow()
        final = permanent or claimed.attempt + 1 >= max_attempts
        status = "failed" if final else "retry"
        done = conn.execute(
            update(WorkItem)
            .where(*_lease_held(claimed))
            .values(
                Status=status,
                Attempt=WorkItem.c.Attempt + 1,
                NextAttemptAt=None if final else now + dt.timedelta(seconds=retry_in_s),
                LeaseOwner=None,
                LeaseExpiresAt=None,
                UpdatedAt=now,
            )
        ).rowcount
        if done != 1:
            return None
        _set_event_status(conn, claimed.selected_event_id, "failed" if final else "pending")
        return status

    return run_transaction(engine, body, what=f"recording the failure of WorkItem {claimed.work_id}", deadline=deadline)


def live_range_work(conn: Connection, namespace: str, *criteria: ColumnElement[bool]) -> int:
    """How many range generations of ``namespace`` are live (pending, blocked, retry, processing).

    ``criteria`` narrow the count (the host: only packs with a version-1
    protocol row); the read is an equality prefix of ``ix_WorkItem_State``.
    """
    return conn.execute(
        select(func.count())
        .select_from(WorkItem)
        .where(
            WorkItem.c.Namespace == namespace,
            WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION,
            WorkItem.c.Status.in_(catalog.WORK_LIVE_STATUSES),
            WorkItem.c.InputStartOrdinal.is_not(None),
            *criteria,
        )
    ).scalar_one()

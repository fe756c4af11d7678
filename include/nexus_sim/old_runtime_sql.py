"""The old runtime's statements (``ProjectionProtocol = 0``): which WorkItems are its work, which it may claim and in
what order, and how it admits an input, as :mod:`nexus_sim.old_runtime`'s simulator runs them.

Split out of :mod:`nexus_sim.old_runtime`, which re-exports :func:`allocate_table_id` (importers may keep
``from nexus_sim.old_runtime import allocate_table_id``).

Invariants (the old runtime as the contract describes it):

* Old projection work is ``WorkClass = 'projection'`` of the namespace and, on a schema with range work
  (``InputStartOrdinal``), only rows without it (:func:`old_work`): range work is never the old runtime's.
* Claimable is pending, retry that is due, or processing whose lease expired or is the worker's own
  (:func:`claimable`); items left processing are claimed before new work (:func:`reclaim_first`).
* Admission (:func:`old_admit`) runs under the pack lock (its caller's transaction): an input whose
  (pack, lane, receipt) already has an Event is skipped; each new Event takes the next pack ordinal and a
  table-wide ``MAX()+1`` EventId (:func:`allocate_table_id`), and coalesces by identity the old way: the latest
  old WorkItem of the identity, if still pending at attempt zero, moves its ``SelectedEventId``/``LaneOrdinal``
  to the new Event; otherwise a new WorkItem is created, never with ``InputStartOrdinal``. The receipts read are
  marked materialized and confirmed in the same transaction.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable

from sqlalchemy import Column, Connection, and_, case, func, insert, or_, select, update

from nexus_cutover import catalog
from nexus_cutover.catalog import Event, IngressReceipt, WorkItem
from nexus_cutover.clock import utcnow
from nexus_cutover.identity import ProjectionIdentity, matches
from nexus_cutover.runtime.model import Input
from nexus_cutover.runtime.tx import allocate_ordinals


def old_work(namespace: str, ranged: bool):
    cond = [WorkItem.c.Namespace == namespace, WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION]
    if ranged:
        cond.append(WorkItem.c.InputStartOrdinal.is_(None))
    return and_(*cond)


def claimable(now: dt.datetime, worker_id: str):
    """Pending; retry that is due; processing whose lease expired or is the worker's own (a restart resumes it)."""
    return or_(
        WorkItem.c.Status == "pending",
        and_(WorkItem.c.Status == "retry", or_(WorkItem.c.NextAttemptAt.is_(None), WorkItem.c.NextAttemptAt <= now)),
        and_(WorkItem.c.Status == "processing", or_(WorkItem.c.LeaseExpiresAt < now, WorkItem.c.LeaseOwner == worker_id)),
    )


def reclaim_first():
    """Claim order: items left ``processing`` (a crashed worker's expired lease, or this worker's own after a restart)
    before new work, as an old runtime's lease reaper does; a drain that looks at the tenant meanwhile would report an
    expired lease as stuck (contract, "Drain"), however early its WorkId."""
    return case((WorkItem.c.Status == "processing", 0), else_=1)


def allocate_table_id(conn: Connection, key: Column) -> int:
    """``MAX()+1`` of the whole table: how the old runtime allocates ids (the new one uses per-pack id shards)."""
    return (conn.execute(select(func.max(key))).scalar() or 0) + 1


def old_admit(conn: Connection, namespace: str, pack: str, inputs: list[Input], receipt_keys: Iterable[tuple[str, str]]) -> int:
    """Old-style admission of ``inputs`` under the pack lock; returns how many Events were created."""
    now = utcnow()
    t = IngressReceipt
    admitted = 0
    for item in inputs:
        exists = conn.execute(
            select(Event.c.EventId).where(
                Event.c.PackInstallId == pack, Event.c.SourceLane == item.source_lane, Event.c.ReceiptId == item.receipt_id
            )
        ).first()
        if exists is not None:
            continue
        identity = item.identity(pack)
        ordinal = allocate_ordinals(conn, pack, 0, 1)
        event_id = allocate_table_id(conn, Event.c.EventId)
        conn.execute(
            insert(Event).values(
                EventId=event_id,
                Namespace=namespace,
                **identity.as_values(),
                EnqueueOrdinal=ordinal,
                ReceiptId=item.receipt_id,
                ReplayOfWorkId=None,
                Status="pending",
                Payload=item.payload,
                ReceivedAt=item.received_at or now,
            )
        )
        _old_coalesce(conn, namespace, identity, ordinal, event_id, now)
        admitted += 1
    for lane, receipt in receipt_keys:
        conn.execute(
            update(t)
            .where(t.c.PackInstallId == pack, t.c.SourceLane == lane, t.c.ReceiptId == receipt, t.c.MaterializedAt.is_(None))
            .values(MaterializedAt=now, ConfirmedAt=now)
        )
    return admitted


def _old_coalesce(conn: Connection, namespace: str, identity: ProjectionIdentity, ordinal: int, event_id: int, now: dt.datetime) -> None:
    latest = conn.execute(
        select(WorkItem.c.WorkId, WorkItem.c.Status, WorkItem.c.Attempt, WorkItem.c.LaneOrdinal)
        .where(matches(WorkItem, identity), WorkItem.c.LaneOrdinal.is_not(None))
        .order_by(WorkItem.c.LaneOrdinal.desc())
        .limit(1)
        .with_for_update()
    ).first()
    if latest is not None and latest.Status == "pending" and latest.Attempt == 0:
        moved = conn.execute(
            update(WorkItem)
            .where(
                WorkItem.c.WorkId == latest.WorkId,
                WorkItem.c.Status == "pending",
                WorkItem.c.Attempt == 0,
            )
            .values(SelectedEventId=event_id, LaneOrdinal=ordinal, UpdatedAt=now)
        ).rowcount
        if moved == 1:
            return
    conn.execute(
        insert(WorkItem).values(
            WorkId=allocate_table_id(conn, WorkItem.c.WorkId),
            Namespace=namespace,
            WorkClass=catalog.WORK_CLASS_PROJECTION,
            **identity.as_values(),
            SelectedEventId=event_id,
            LaneOrdinal=ordinal,
            ReplayOfWorkId=None,
            Attempt=0,
            Status="pending",
            CreatedAt=now,
            UpdatedAt=now,
        )
    )

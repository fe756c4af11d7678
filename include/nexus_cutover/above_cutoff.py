"""Old-protocol work above a pack's cutoff: what an old runtime admitted after the checkpoint (contract, reference
host's activation gate).

A pack *holds old-protocol work above its cutoff* when a projection Event with ``EnqueueOrdinal`` above the pack's
``LegacyMaxOrdinal`` is selected by, or within the reach of, an old-protocol projection WorkItem
(``WorkClass = 'projection'``, ``InputStartOrdinal IS NULL``): such a WorkItem reaches the Events of its identity
up to its ``LaneOrdinal``, so the offenders are the old projection WorkItems of the pack with ``LaneOrdinal`` above
the cutoff, and the Events of their identities in ``(cutoff, greatest such LaneOrdinal]``. It comes from an old
runtime that ran after the checkpoint: a rollback (old writers restarted after the checkpoint), or a greenfield
activation over a live old runtime. No audit ever reads it and the new runtime never works it: it would stay
pending forever. It needs a separately reviewed recovery decision (the runbook's "Rollback stance"); this module
only finds and names it (read only). The reference host's gate refuses to serve while any active pack holds
some; the status view, ``plan`` and the rollout's standing show it as a stop.

Decision where the contract is silent: only the pack's own old *projection* WorkItems count as "selecting" an
Event (another class or pack selecting a projection input of this pack is an ordinary-work anomaly the audit
names, not what an old projection runtime admits).

Cost, on indexes only: per pack one statement with the greatest ``LaneOrdinal`` of each identity
(``ix_WorkItem_ProjectionOrder``, MAX per group: a loose index scan where the server has one); then, only for the
identities whose top is above the cutoff, their WorkItems above it (a range of the same index; the row is read for
``InputStartOrdinal`` and ``WorkClass``, which no index holds) and the Events in reach (``ix_Event_SourceLane``).
The cost grows with the rows above the cutoff, never with history below it.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, func, select

from . import catalog, identity
from .catalog import ConnectorProjectionProtocol, Event, PackInstall, WorkItem
from .identity import ProjectionIdentity

#: WorkIds and EventIds named per pack (the counts are exact).
SHOWN = 20


@dataclass
class AboveCutoff:
    """One pack's old-protocol work above its cutoff: counts and the first ids of each kind."""

    pack_install_id: str
    legacy_max_ordinal: int
    work_ids: list[int] = field(default_factory=list)
    event_ids: list[int] = field(default_factory=list)
    work_items: int = 0
    events: int = 0

    def describe(self) -> str:
        def ids(shown: list[int], total: int) -> str:
            return ", ".join(map(str, shown)) + (f" and {total - len(shown)} more" if total > len(shown) else "")

        return (f"pack {self.pack_install_id!r} holds old-protocol work above its cutoff LegacyMaxOrdinal="
                f"{self.legacy_max_ordinal}: {self.work_items} old projection WorkItem(s) (WorkIds "
                f"{ids(self.work_ids, self.work_items)}) reaching {self.events} Event(s) above it (EventIds "
                f"{ids(self.event_ids, self.events) or 'none retained'}). An old runtime admitted it after the checkpoint "
                "(a rollback, or an activation over a live old runtime); the new runtime never works it. It needs a "
                "separately reviewed recovery decision (runbook: Rollback stance); nothing was admitted")

    def as_json(self) -> dict[str, Any]:
        return {"pack_install_id": self.pack_install_id, "legacy_max_ordinal": self.legacy_max_ordinal,
                "work_items": self.work_items, "work_ids": self.work_ids, "events": self.events,
                "event_ids": self.event_ids, "text": self.describe()}


def identity_tops_statement(pack_install_id: str, cutoff: int):
    """Each identity of the pack's WorkItems whose greatest LaneOrdinal is above ``cutoff`` (exposed for EXPLAIN)."""
    idents = identity.columns(WorkItem)
    return (
        select(*idents, func.max(WorkItem.c.LaneOrdinal).label("top"))
        .where(WorkItem.c.PackInstallId == pack_install_id)
        .group_by(*idents)
        .having(func.max(WorkItem.c.LaneOrdinal) > cutoff)
    )


def old_work_statement(ident: ProjectionIdentity, cutoff: int):
    """The identity's old-protocol projection WorkItems above ``cutoff``, by LaneOrdinal (exposed for EXPLAIN)."""
    return (
        select(WorkItem.c.WorkId, WorkItem.c.LaneOrdinal)
        .where(identity.matches(WorkItem, ident), WorkItem.c.LaneOrdinal > cutoff,
               WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION, WorkItem.c.InputStartOrdinal.is_(None))
        .order_by(WorkItem.c.LaneOrdinal, WorkItem.c.WorkId)
    )


def reached_events_statement(ident: ProjectionIdentity, cutoff: int, reach: int):
    """The identity's Events in ``(cutoff, reach]`` (exposed for EXPLAIN)."""
    return (
        select(Event.c.EventId)
        .where(identity.matches(Event, ident), Event.c.EnqueueOrdinal > cutoff, Event.c.EnqueueOrdinal <= reach)
        .order_by(Event.c.EnqueueOrdinal, Event.c.EventId)
    )


def pack_above_cutoff(conn: Connection, pack_install_id: str, cutoff: int) -> AboveCutoff | None:
    """The pack's old-protocol work above ``cutoff``, or None when it holds none (module docstring)."""
    found = AboveCutoff(pack_install_id, cutoff)
    for row in conn.execute(identity_tops_statement(pack_install_id, cutoff)).all():
        ident = identity.of_row(row)
        old = conn.execute(old_work_statement(ident, cutoff)).all()
        if not old:
            continue  # only range work above the cutoff: the new runtime's own
        found.work_items += len(old)
        found.work_ids += [int(work_id) for work_id, _ in old][: max(0, SHOWN - len(found.work_ids))]
        reached = reached_events_statement(ident, cutoff, max(int(lane) for _, lane in old))
        found.events += conn.execute(select(func.count()).select_from(reached.order_by(None).subquery())).scalar_one()
        if len(found.event_ids) < SHOWN:
            found.event_ids += [int(e) for e in conn.execute(reached.limit(SHOWN - len(found.event_ids))).scalars()]
    if not found.work_items:
        return None
    found.work_ids.sort()
    found.event_ids.sort()
    return found


def checkpointed_active_packs(conn: Connection, namespace: str) -> list[tuple[str, int]]:
    """(PackInstallId, LegacyMaxOrdinal) of every active pack of ``namespace`` with a protocol row, by id."""
    rows = conn.execute(
        select(PackInstall.c.PackInstallId, ConnectorProjectionProtocol.c.LegacyMaxOrdinal)
        .join(ConnectorProjectionProtocol, ConnectorProjectionProtocol.c.PackInstallId == PackInstall.c.PackInstallId)
        .where(PackInstall.c.Namespace == namespace, PackInstall.c.Status == catalog.PACK_ACTIVE)
        .order_by(PackInstall.c.PackInstallId)
    )
    return [(pack, int(cutoff)) for pack, cutoff in rows]


def namespace_above_cutoff(conn: Connection, namespace: str) -> list[AboveCutoff]:
    """Every active, checkpointed pack of ``namespace`` holding old-protocol work above its cutoff (read only)."""
    return [found for pack, cutoff in checkpointed_active_packs(conn, namespace)
            if (found := pack_above_cutoff(conn, pack, cutoff)) is not None]

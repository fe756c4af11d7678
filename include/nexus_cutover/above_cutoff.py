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
The cost grows with the rows above the cutoff, never with history below it. Each of these reads runs for 100 packs
or identities per statement (:func:`packs_above_cutoff`, :mod:`nexus_cutover.batched`): a namespace of thousands of
checkpointed packs, each with the new runtime's range work above its cutoff on every lane, is read in a few dozen
statements of one transaction, not a statement per pack and per lane.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Select, func, select

from . import batched, catalog, identity
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


def _tops_member(k: int, _shape: None) -> Select:
    return identity_tops_statement(batched.param("pack", k), batched.param("cutoff", k))


def _old_work_member(k: int, _shape: None) -> Select:
    return old_work_statement(batched.identity_slot(k), batched.param("cutoff", k))


def _reached(k: int) -> Select:
    return reached_events_statement(batched.identity_slot(k), batched.param("cutoff", k), batched.param("reach", k))


def _reached_count_member(k: int, _shape: None) -> Select:
    return select(func.count()).select_from(_reached(k).order_by(None).subquery())


def _reached_sample_member(k: int, _shape: None) -> Select:
    return _reached(k).add_columns(Event.c.EnqueueOrdinal).limit(SHOWN)


def pack_above_cutoff(conn: Connection, pack_install_id: str, cutoff: int) -> AboveCutoff | None:
    """The pack's old-protocol work above ``cutoff``, or None when it holds none (module docstring)."""
    found = packs_above_cutoff(conn, [(pack_install_id, cutoff)])
    return found[0] if found else None


def packs_above_cutoff(conn: Connection, packs: Sequence[tuple[str, int]]) -> list[AboveCutoff]:
    """Each of ``packs`` (PackInstallId, cutoff) holding old-protocol work above its cutoff, in ``packs``' order.

    The reads of the module docstring, each run for a chunk of packs or identities per statement
    (:mod:`nexus_cutover.batched`): the identity tops of every pack, the old work above the cutoff of every identity
    whose top is above it, then the Events in reach of the identities that have some (counted, and the first
    :data:`SHOWN` named): statements grow with packs / 100, never a statement per pack or per lane.
    """
    tops: list[tuple[int, ProjectionIdentity]] = []  # (index into packs, identity whose top is above its cutoff)
    for chunk in batched.chunks(range(len(packs))):
        found = batched.rows_by_key(conn, _tops_member, [(None, {"pack": packs[i][0], "cutoff": packs[i][1]}) for i in chunk])
        tops += [(i, ProjectionIdentity(*row[: len(identity.COLUMN_NAMES)])) for i, rows in zip(chunk, found, strict=True)
                 for row in rows]
    old: list[tuple[int, ProjectionIdentity, list[tuple[int, int]]]] = []  # ... its old work above the cutoff, by lane
    for chunk in batched.chunks(tops):
        found = batched.rows_by_key(conn, _old_work_member, [
            (None, {**batched.identity_values(ident), "cutoff": packs[i][1]}) for i, ident in chunk])
        old += [(i, ident, sorted((int(lane), int(w)) for w, lane in rows)) for (i, ident), rows in zip(chunk, found, strict=True)
                if rows]  # an identity with only range work above the cutoff: the new runtime's own
    counts: list[int] = []
    samples: list[list[int]] = []
    for chunk in batched.chunks(old):
        members = [(None, {**batched.identity_values(ident), "cutoff": packs[i][1], "reach": work[-1][0]})
                   for i, ident, work in chunk]
        counts += [int(rows[0][0]) for rows in batched.rows_by_key(conn, _reached_count_member, members)]
        samples += [[int(e) for e, _ in sorted(rows, key=lambda row: (row[1], row[0]))]
                    for rows in batched.rows_by_key(conn, _reached_sample_member, members)]
    by_pack: dict[int, AboveCutoff] = {}
    for (i, _, work), events, sample in zip(old, counts, samples, strict=True):
        found = by_pack.setdefault(i, AboveCutoff(*packs[i]))
        found.work_items += len(work)
        found.work_ids += [w for _, w in work][: max(0, SHOWN - len(found.work_ids))]
        found.events += events
        found.event_ids += sample[: max(0, SHOWN - len(found.event_ids))]
    for found in by_pack.values():
        found.work_ids.sort()
        found.event_ids.sort()
    return [by_pack[i] for i in sorted(by_pack)]


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
    return packs_above_cutoff(conn, checkpointed_active_packs(conn, namespace))

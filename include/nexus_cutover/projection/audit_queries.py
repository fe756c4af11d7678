"""The bounded reads of the cutover audit (:mod:`.audit`): each statement, and the batched readers over them.

Split out of :mod:`.audit`, which re-exports every name here (importers and the EXPLAIN tests may keep
``audit.walk_down_statement`` and the like). The underscored readers are the audit's own: :mod:`.audit` is their
one importer. What each read is for, and why it is bounded, is :mod:`.audit`'s module docstring (points 1-6).

Invariants:

* Nothing here writes; timestamps decide nothing.
* Every ``*_statement`` is one index read (exposed for the EXPLAIN tests, ``tests/projection/test_audit_plans.py``):
  live work through ``ix_WorkItem_State``, the per-identity ordinals through ``ix_Event_SourceLane``, the tops and
  walks of an identity's WorkItems through ``ix_WorkItem_ProjectionOrder``, the probes for a direct task as an
  anti-join on ``ix_WorkItem_Selected``; the range-protocol rows come back offenders only.
* Reads per identity are batched (:mod:`nexus_cutover.batched`): a UNION ALL of the same per-identity read for a
  chunk of identities, in keyset rounds that return at most a batch of rows per statement, so the statements of
  one audit grow with lanes / 100, never a statement per lane (TiDB bounds a transaction).
* A walk down stops reading an identity at its first completed row (:class:`_WorkReach`): its cost does not grow
  with the identity's depth below that row.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

from sqlalchemy import Connection, Select, and_, exists, func, or_, select

from .. import batched, catalog, identity
from ..catalog import Event, WorkItem
from ..db import Deadline
from ..identity import ProjectionIdentity

#: Most rows per read of the identities walked down because their top row is not a completed projection WorkItem.
REACH_WALK_BATCH = 1000
#: Rows per identity of the first walk-down round (a failed or live top has its completed generation right below
#: it, as a rule), and the factor by which each further round reads more.
FIRST_WALK_ROWS = 4
WALK_GROWTH = 8


@dataclass
class _WorkReach:
    """What an identity's projection WorkItems reach, read from the top of its LaneOrdinal range down."""

    completed_boundary: int | None = None  # B(I)
    terminal_reach: int | None = None  # greatest LaneOrdinal of a terminal WorkItem of I
    any_reach: int | None = None  # greatest LaneOrdinal of any WorkItem of I

    def take(self, lane_ordinal: int, status: str) -> None:
        """One more row, in descending (LaneOrdinal, WorkId) order: the first of each kind is its greatest."""
        if self.any_reach is None:
            self.any_reach = lane_ordinal
        if self.terminal_reach is None and status in catalog.WORK_TERMINAL_STATUSES:
            self.terminal_reach = lane_ordinal
        if status == catalog.WORK_COMPLETED:
            self.completed_boundary = lane_ordinal

    @property
    def known(self) -> bool:
        """A completed row was seen: every reach is at hand (completed is terminal, terminal is any)."""
        return self.completed_boundary is not None


def live_projection_work_statement(pack_install_id: str, namespace: str):
    """Live projection WorkItems of the pack, through ``ix_WorkItem_State`` (exposed for EXPLAIN tests)."""
    return (
        select(*identity.columns(WorkItem), WorkItem.c.WorkId)
        .where(
            WorkItem.c.Namespace == namespace,
            WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION,
            WorkItem.c.Status.in_(catalog.WORK_LIVE_STATUSES),
            WorkItem.c.PackInstallId == pack_install_id,
        )
        .order_by(WorkItem.c.WorkId)
    )


def _live_projection_work(conn: Connection, pack_install_id: str, namespace: str) -> Iterator[tuple]:
    for row in conn.execute(live_projection_work_statement(pack_install_id, namespace)):
        yield identity.of_row(row), row.WorkId


def live_direct_work_statement(pack_install_id: str, namespace: str):
    """Live WorkItems, other than the pack's projection work, directly selecting one of its projection inputs.

    An ordinary WorkItem selecting its ordinary Event is ordinary work, never ``live_work``.
    """
    return (
        select(WorkItem.c.WorkId, WorkItem.c.SelectedEventId)
        .join(Event, Event.c.EventId == WorkItem.c.SelectedEventId)
        .where(
            WorkItem.c.Namespace == namespace,
            WorkItem.c.WorkClass.in_((catalog.WORK_CLASS_PROJECTION, catalog.WORK_CLASS_ORDINARY)),
            WorkItem.c.Status.in_(catalog.WORK_LIVE_STATUSES),
            Event.c.PackInstallId == pack_install_id,
            identity.is_projection_input(Event),
            or_(
                WorkItem.c.WorkClass != catalog.WORK_CLASS_PROJECTION,
                WorkItem.c.PackInstallId.is_(None),
                WorkItem.c.PackInstallId != pack_install_id,
            ),
        )
        .order_by(WorkItem.c.WorkId)
    )


def _live_direct_work_of_other_classes(conn: Connection, pack_install_id: str, namespace: str) -> Iterator[tuple]:
    yield from conn.execute(live_direct_work_statement(pack_install_id, namespace))


def native_work_statement(pack_install_id: str):
    """The pack's projection WorkItems that carry ``InputStartOrdinal``: offenders only (exposed for EXPLAIN)."""
    return (
        select(*identity.columns(WorkItem), WorkItem.c.WorkId)
        .where(
            WorkItem.c.PackInstallId == pack_install_id,
            WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION,
            WorkItem.c.InputStartOrdinal.is_not(None),
        )
        .order_by(WorkItem.c.WorkId)
    )


def _native_work(conn: Connection, pack_install_id: str) -> Iterator[tuple[ProjectionIdentity, int]]:
    for row in conn.execute(native_work_statement(pack_install_id)):
        yield identity.of_row(row), int(row.WorkId)


def walk_down_statement(ident: ProjectionIdentity, below: tuple[int, int] | None, limit: int = REACH_WALK_BATCH):
    """(LaneOrdinal, Status, WorkId) of ``ident``'s next ``limit`` projection WorkItems, greatest first, below keyset
    ``below`` (exposed for EXPLAIN tests)."""
    lane, work_id = WorkItem.c.LaneOrdinal, WorkItem.c.WorkId
    conditions = [identity.matches(WorkItem, ident), WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION, lane.is_not(None)]
    if below is not None:
        last_lane, last_work = below
        conditions.append(or_(lane < last_lane, and_(lane == last_lane, work_id < last_work)))
    return select(lane, WorkItem.c.Status, work_id).where(*conditions).order_by(lane.desc(), work_id.desc()).limit(limit)


def top_work_statement(pack_install_id: str):
    """Every WorkItem at its identity's greatest LaneOrdinal, for each identity of the pack (exposed for EXPLAIN).

    The greatest LaneOrdinal per identity is taken over every row of the index range (any WorkClass): filtering on a
    column outside the index would cost the loose index scan. The caller checks class and status of what it gets.
    """
    idents = identity.columns(WorkItem)
    tops = (
        select(*idents, func.max(WorkItem.c.LaneOrdinal).label("top"))
        .where(WorkItem.c.PackInstallId == pack_install_id)
        .group_by(*idents)
        .subquery("tops")
    )
    at_top = [WorkItem.c[name] == tops.c[name] for name in identity.COLUMN_NAMES]
    return select(*idents, WorkItem.c.LaneOrdinal, WorkItem.c.Status, WorkItem.c.WorkClass).join_from(
        tops, WorkItem, and_(*at_top, WorkItem.c.LaneOrdinal == tops.c.top)
    )


def _walk_down_member(k: int, shape: tuple[bool, int]) -> Select:
    """Member ``k`` of a batched walk down (:mod:`nexus_cutover.batched`): :func:`walk_down_statement`, shape
    (keyset set, limit)."""
    keyset, limit = shape
    below = (batched.param("lane", k), batched.param("work", k)) if keyset else None
    return walk_down_statement(batched.identity_slot(k), below, limit)


def _walk_down(conn: Connection, idents: list[ProjectionIdentity], deadline: Deadline) -> dict[ProjectionIdentity, _WorkReach]:
    """Read each of ``idents``' projection WorkItems from the top down until a completed row or the end: in rounds,
    each a statement per chunk of identities (:mod:`nexus_cutover.batched`) reading the next rows of every identity
    not known yet. A round reads :data:`FIRST_WALK_ROWS` rows per identity, the next ones :data:`WALK_GROWTH` times
    more (up to :data:`REACH_WALK_BATCH`, the chunk shrinking so a statement returns at most that many rows): an
    identity stops being read at its first completed row, as when walked alone."""
    reach = {ident: _WorkReach() for ident in idents}
    below: dict[ProjectionIdentity, tuple[int, int] | None] = dict.fromkeys(idents)
    pending, rows_each = list(idents), FIRST_WALK_ROWS
    while pending:
        still: list[ProjectionIdentity] = []
        for chunk in batched.chunks(pending, max(1, min(batched.UNION_CHUNK, REACH_WALK_BATCH // rows_each))):
            deadline.check(f"walking down the WorkItems of {len(chunk)} identities ({chunk[0].label()}, ...)")
            found = batched.rows_by_key(conn, _walk_down_member, [
                ((below[ident] is not None, rows_each),
                 {**batched.identity_values(ident), **dict(zip(("lane", "work"), below[ident] or (), strict=False))})
                for ident in chunk])
            for ident, rows in zip(chunk, found, strict=True):
                rows.sort(key=lambda row: (row[0], row[2]), reverse=True)  # (LaneOrdinal, WorkId) descending
                r = reach[ident]
                for lane_ordinal, status, _ in rows:
                    r.take(int(lane_ordinal), status)
                    if r.known:
                        break
                if not r.known and len(rows) == rows_each:
                    below[ident] = (int(rows[-1][0]), int(rows[-1][2]))
                    still.append(ident)
        pending, rows_each = still, min(REACH_WALK_BATCH, rows_each * WALK_GROWTH)
    return reach


def event_ordinals_statement(pack_install_id: str):
    """Per-identity MIN/MAX EnqueueOrdinal of the pack's Events (exposed for EXPLAIN tests)."""
    return (
        select(
            *identity.columns(Event),
            func.min(Event.c.EnqueueOrdinal).label("min_ordinal"),
            func.max(Event.c.EnqueueOrdinal).label("max_ordinal"),
        )
        .where(Event.c.PackInstallId == pack_install_id)
        .group_by(*identity.columns(Event))
    )


def _event_ordinals_by_identity(conn: Connection, pack_install_id: str) -> list[tuple[ProjectionIdentity, int, int]]:
    rows = conn.execute(event_ordinals_statement(pack_install_id)).all()
    return [(identity.of_row(row), int(row.min_ordinal), int(row.max_ordinal)) for row in rows]


def indirect_events_statement(ident: ProjectionIdentity, above: int | None, after: tuple[int, int] | None, limit: int):
    """Events of ``ident`` with no direct task, above ``above``, after keyset ``after`` (exposed for EXPLAIN)."""
    direct = exists().where(WorkItem.c.SelectedEventId == Event.c.EventId)
    conditions = [identity.matches(Event, ident), ~direct]
    if above is not None:
        conditions.append(Event.c.EnqueueOrdinal > above)
    if after is not None:
        last_ordinal, last_event = after
        conditions.append(
            or_(
                Event.c.EnqueueOrdinal > last_ordinal,
                and_(Event.c.EnqueueOrdinal == last_ordinal, Event.c.EventId > last_event),
            )
        )
    return (
        select(Event.c.EventId, Event.c.EnqueueOrdinal)
        .where(*conditions)
        .order_by(Event.c.EnqueueOrdinal, Event.c.EventId)
        .limit(limit)
    )


#: The ``above`` of a batched probe of an identity without a boundary: every EnqueueOrdinal (0 or more) is above it,
#: so every member of a probe has one form whatever its boundary.
BELOW_EVERY_ORDINAL = -1


def _indirect_events_member(k: int, shape: tuple[bool, int]) -> Select:
    """Member ``k`` of a batched probe (:mod:`nexus_cutover.batched`): :func:`indirect_events_statement` above the
    parameter ``above`` (:data:`BELOW_EVERY_ORDINAL` for none), shape (keyset set, limit)."""
    keyset, limit = shape
    after = (batched.param("ordinal", k), batched.param("event", k)) if keyset else None
    return indirect_events_statement(batched.identity_slot(k), batched.param("above", k), after, limit)


def _indirect_events(
    conn: Connection, probes: list[tuple[ProjectionIdentity, int | None]], deadline: Deadline, batch_size: int
) -> Iterator[tuple[ProjectionIdentity, int, int]]:
    """(identity, EventId, EnqueueOrdinal) of each probe's Events without a direct task above its ``above``, each
    identity's in ordinal order: keyset batches of a chunk of identities per statement (:mod:`nexus_cutover.batched`),
    at most ``batch_size`` rows per statement; an identity whose batch came back full is read on in the next round."""
    after: dict[int, tuple[int, int] | None] = dict.fromkeys(range(len(probes)))
    pending = list(range(len(probes)))
    while pending:
        still: list[int] = []
        for chunk in batched.chunks(pending):
            limit = max(1, batch_size // len(chunk))
            deadline.check(f"auditing the inputs of {len(chunk)} identities ({probes[chunk[0]][0].label()}, ...)")
            found = batched.rows_by_key(conn, _indirect_events_member, [
                ((after[i] is not None, limit),
                 {**batched.identity_values(probes[i][0]), "above": BELOW_EVERY_ORDINAL if probes[i][1] is None else probes[i][1],
                  **dict(zip(("ordinal", "event"), after[i] or (), strict=False))})
                for i in chunk])
            for i, rows in zip(chunk, found, strict=True):
                rows.sort(key=lambda row: (row[1], row[0]))  # (EnqueueOrdinal, EventId)
                for event_id, ordinal in rows:
                    yield probes[i][0], int(event_id), int(ordinal)
                if len(rows) == limit:
                    after[i] = (int(rows[-1][1]), int(rows[-1][0]))
                    still.append(i)
        pending = still

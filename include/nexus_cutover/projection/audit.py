"""The one-time cutover audit of retained projection responsibility (contract, "Audit").

For one pack incarnation, evaluated inside the caller's locked transaction:

| finding | rule |
|---|---|
| ``fence_not_in_force`` / ``fence_override_active`` | the precondition, checked by the caller (:mod:`.checkpoint`) |
| ``live_work`` | a projection WorkItem of the pack, or any WorkItem selecting one of its projection inputs, is live |
| ``native_work_before_checkpoint`` | a projection WorkItem of the pack has ``InputStartOrdinal`` while no protocol row exists |
| ``mixed_history_indirect`` | an Event without a direct task whose identity has both ordinal-0 and positive-ordinal Events |
| ``beyond_completed_boundary`` | an Event without a direct task above B(I) (or B(I) absent) that a terminal WorkItem of I reaches |
| ``missing_owner`` | an Event without a direct task that no WorkItem of I reaches |

Only projection inputs are audited (contract, "Ordinary work"): an Event whose
``WorkType`` is not a projection work type (:func:`~nexus_cutover.identity.is_projection_input`)
is ordinary input, owned by the one ordinary WorkItem created with it (which
retention may have deleted); it is never ``missing_owner``,
``beyond_completed_boundary`` or ``mixed_history_indirect``, and live ordinary
work is never ``live_work``: ordinary work runs before, during and after the
cutover. ``LegacyMaxOrdinal`` is still the greatest EnqueueOrdinal among *all*
the pack's Events: ordinals are allocated per pack whatever the work type.

B(I), the retained completed boundary, is the greatest LaneOrdinal of a
completed projection WorkItem of identity I. An Event at or below B(I) without a
direct task is a completed coalesced input and is permitted whatever its own
Status; an Event with a direct task is permitted (a live one is ``live_work``).

How it stays bounded (memory does not grow with history depth):

1. live work comes from ``ix_WorkItem_State`` (only live rows are read);
2. range-protocol rows (``native_work_before_checkpoint``) are looked for in
   one statement that returns offenders only. ``InputStartOrdinal`` is in no
   index, so every projection WorkItem row of the pack is read once whatever
   the plan; the server picks it: ``ix_WorkItem_ProjectionOrder`` when the
   pack is a small share of the table, one pass over the table when the pack
   is most of it (cheaper than a primary-key lookup per row);
3. one aggregate per identity over the pack's Events (``ix_Event_SourceLane``,
   MIN/MAX per group: a loose index scan where the server has one);
4. B(I) and the reaches come from the top of each identity's
   ``ix_WorkItem_ProjectionOrder`` range: one statement reads the rows at
   every identity's greatest LaneOrdinal (MAX per group: a loose index scan
   where the server has one, then one index dive per identity); where that
   row is a completed projection WorkItem, all three are its LaneOrdinal (the
   drained case), else the identity is walked down until a completed row, so
   the cost does not grow with depth;
5. per identity, only Events *above* B(I) -- or, for mixed identities, all of
   them -- are probed for a direct task, with an anti-join on
   ``ix_WorkItem_Selected``, in keyset batches that return offenders only;
6. the walks (4) and the probes (5) of many identities share a statement: a
   UNION ALL of the same per-identity index reads, a chunk of identities each
   (:mod:`nexus_cutover.batched`), so the statements of one audit grow with
   lanes / 100, never a statement per lane (TiDB bounds a transaction);
7. a pack-wide refusal (``live_work``, ``native_work_before_checkpoint``) is
   decided before any per-identity read: a pack with more than
   :data:`PER_IDENTITY_AFTER_PACK_WIDE_REFUSAL` identities is refused on it
   alone (the run after the drain audits the identities); a smaller one is
   audited in full, every finding named.

Nothing here writes; timestamps decide nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Select, and_, exists, func, or_, select

from .. import batched, catalog, identity
from ..catalog import Event, WorkItem
from ..db import Deadline
from ..identity import ProjectionIdentity

log = logging.getLogger(__name__)

FENCE_NOT_IN_FORCE = "fence_not_in_force"
FENCE_OVERRIDE_ACTIVE = "fence_override_active"
#: More than one cutover fence in force (contract, "One cutover per tenant at a time"): a refusal naming every one.
SEVERAL_CUTOVER_FENCES = "several_cutover_fences"
LIVE_WORK = "live_work"
NATIVE_WORK_BEFORE_CHECKPOINT = "native_work_before_checkpoint"
MIXED_HISTORY_INDIRECT = "mixed_history_indirect"
BEYOND_COMPLETED_BOUNDARY = "beyond_completed_boundary"
MISSING_OWNER = "missing_owner"
#: Refusals of greenfield activation (:mod:`.greenfield`), not of the audit: the pack has history; an old
#: runtime of the namespace is live while no cutover fence is in force.
NOT_GREENFIELD = "not_greenfield"
OLD_RUNTIME_LIVE = "old_runtime_live"

REFUSALS = (
    FENCE_NOT_IN_FORCE,
    SEVERAL_CUTOVER_FENCES,
    FENCE_OVERRIDE_ACTIVE,
    LIVE_WORK,
    NATIVE_WORK_BEFORE_CHECKPOINT,
    MIXED_HISTORY_INDIRECT,
    BEYOND_COMPLETED_BOUNDARY,
    MISSING_OWNER,
)

_EXPLANATIONS = {
    FENCE_NOT_IN_FORCE: "the pack has history but its namespace has no non-expiring '*' admission fence in force: "
    "arm it (cutover step 1) and let the drain finish before the checkpoint",
    FENCE_OVERRIDE_ACTIVE: "an active admission fence override lets sources through the fence: have L2 revoke it "
    "(this tool revokes nothing), then rerun",
    SEVERAL_CUTOVER_FENCES: "more than one non-expiring '*' fence is in force: which one holds the tenant is not clear; "
    "have L2 release all but the one of the cutover in progress (this tool releases none of them), then rerun",
    LIVE_WORK: "projection work is still pending/blocked/retry/processing: let the old runtime drain it (cutover step 2)",
    NATIVE_WORK_BEFORE_CHECKPOINT: "range-protocol WorkItems exist although no checkpoint was written: a new writer ran early",
    MIXED_HISTORY_INDIRECT: "coalesced input in an identity mixing pre-ordinal (0) and ordinal history: ownership is ambiguous",
    BEYOND_COMPLETED_BOUNDARY: "input above the last completed generation is owned only by failed/cancelled work",
    MISSING_OWNER: "no retained WorkItem of the identity reaches this input",
    NOT_GREENFIELD: "the pack has Events or WorkItems, so it is not greenfield: activate it through the cutover "
    "(drain, then `connector-projection-cutover -pack-install-id <id>`), which audits that history",
    OLD_RUNTIME_LIVE: "an old-protocol runtime of the namespace is live and no cutover fence is in force: it would admit "
    "old-protocol work above cutoff 0 that no audit ever reads. Stop it (or arm the cutover fence), then rerun",
}

DEFAULT_BATCH = 5000
#: Most rows per read of the identities walked down because their top row is not a completed projection WorkItem.
REACH_WALK_BATCH = 1000
#: Rows per identity of the first walk-down round (a failed or live top has its completed generation right below
#: it, as a rule), and the factor by which each further round reads more.
FIRST_WALK_ROWS = 4
WALK_GROWTH = 8
#: With a pack-wide refusal (``live_work``, ``native_work_before_checkpoint``) decided, the per-identity audit runs
#: only for a pack of at most this many identities (a few statements, every finding named); a larger pack is refused
#: on the pack-wide findings alone, its identities audited by the run after the drain.
PER_IDENTITY_AFTER_PACK_WIDE_REFUSAL = 100


@dataclass
class Finding:
    """One refusal class for one identity (or pack-wide), naming every offending row."""

    finding: str
    identity: ProjectionIdentity | None
    event_ids: list[int] = field(default_factory=list)
    work_ids: list[int] = field(default_factory=list)
    override_ids: list[int] = field(default_factory=list)
    fence_ids: list[int] = field(default_factory=list)
    process_ids: list[str] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out = {
            "finding": self.finding,
            "identity": self.identity._asdict() if self.identity else None,
            "event_ids": self.event_ids,
            "work_ids": self.work_ids,
            "explanation": _EXPLANATIONS[self.finding],
        }
        if self.finding in (FENCE_NOT_IN_FORCE, FENCE_OVERRIDE_ACTIVE, SEVERAL_CUTOVER_FENCES):
            out.update(override_ids=self.override_ids, fence_ids=self.fence_ids)
        if self.process_ids:
            out["process_ids"] = self.process_ids
        return out

    def describe(self) -> str:
        where = self.identity.label() if self.identity else "pack-wide"
        parts = []
        if self.work_ids:
            parts.append(f"WorkIds {self.work_ids}")
        if self.event_ids:
            parts.append(f"EventIds {self.event_ids}")
        if self.override_ids:
            parts.append(f"OverrideIds {self.override_ids}")
        if self.fence_ids:
            parts.append(f"FenceIds {self.fence_ids}")
        if self.process_ids:
            parts.append(f"live processes {self.process_ids}")
        return f"{self.finding} [{where}]: {'; '.join(parts)} -- {_EXPLANATIONS[self.finding]}"


@dataclass
class AuditReport:
    pack_install_id: str
    findings: list[Finding]
    legacy_max_ordinal: int
    identities: int
    events_probed: int

    @property
    def refused(self) -> bool:
        return bool(self.findings)


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


def audit_pack(
    conn: Connection, pack_install_id: str, namespace: str, deadline: Deadline, *, batch_size: int = DEFAULT_BATCH
) -> AuditReport:
    """Every finding of the contract's audit table for ``pack_install_id`` (no writes).

    Findings are one per refusal class and identity *as the server equates identities*
    (:func:`~nexus_cutover.identity.identity_keys`): rows spelled ``Lane-A`` and ``lane-a`` on a case-folding
    collation, or ``a`` and ``a `` on a PAD SPACE one, are one identity and one finding, named by the spelling
    the server's GROUP BY of the pack's Events returns (else the first row's). With a pack-wide refusal and more than
    :data:`PER_IDENTITY_AFTER_PACK_WIDE_REFUSAL` identities, only the pack-wide findings are named (module docstring, 7).
    """
    deadline.check("auditing live work")
    live = list(_live_projection_work(conn, pack_install_id, namespace))
    other_live = list(_live_direct_work_of_other_classes(conn, pack_install_id, namespace))
    deadline.check("looking for range-protocol WorkItems")
    native = list(_native_work(conn, pack_install_id))
    deadline.check("aggregating Events per identity")
    every_identity = _event_ordinals_by_identity(conn, pack_install_id)
    legacy_max = max((max_ordinal for _, _, max_ordinal in every_identity), default=0)  # ordinary Events count here
    projection = identity.projection_identities(conn, Event, [ident for ident, _, _ in every_identity])
    event_identities = [row for row in every_identity if row[0] in projection]
    findings = _Findings(conn, [ident for ident, _, _ in every_identity] + [i for i, _ in live] + [i for i, _ in native])

    for ident, work_id in live:
        findings.add(LIVE_WORK, ident, work_id=work_id)
    for work_id, event_id in other_live:
        findings.add(LIVE_WORK, None, work_id=work_id, event_id=event_id)
    for ident, work_id in native:
        findings.add(NATIVE_WORK_BEFORE_CHECKPOINT, ident, work_id=work_id)

    if (live or other_live or native) and len(event_identities) > PER_IDENTITY_AFTER_PACK_WIDE_REFUSAL:
        log.info("audit of %s: refused pack-wide (%d live, %d range-protocol WorkItems); its %d identities are audited "
                 "by the run after the drain", pack_install_id, len(live) + len(other_live), len(native),
                 len(event_identities))
        return AuditReport(pack_install_id, findings.ordered(), legacy_max, 0, 0)

    reach = _work_reach_by_identity(conn, pack_install_id, [ident for ident, _, _ in event_identities], deadline)
    mixed: set[ProjectionIdentity] = set()
    probes: list[tuple[ProjectionIdentity, int | None]] = []
    for ident, min_ordinal, max_ordinal in event_identities:
        r = reach[ident]
        if min_ordinal == 0 and max_ordinal > 0:
            mixed.add(ident)
            above = None  # every indirect Event of a mixed identity is refused, below B(I) too
        elif r.completed_boundary is not None:
            if max_ordinal <= r.completed_boundary:
                continue  # all coalesced or direct inputs at/below the boundary: permitted
            above = r.completed_boundary
        else:
            above = None
        probes.append((ident, above))
    identities = len(event_identities)
    probed = 0
    for ident, event_id, ordinal in _indirect_events(conn, probes, deadline, batch_size):
        probed += 1
        r = reach[ident]
        if ident in mixed:
            findings.add(MIXED_HISTORY_INDIRECT, ident, event_id=event_id)
        elif r.terminal_reach is not None and r.terminal_reach >= ordinal:
            findings.add(BEYOND_COMPLETED_BOUNDARY, ident, event_id=event_id)
        elif r.any_reach is not None and r.any_reach >= ordinal:
            pass  # reached only by live work, which is already a live_work finding
        else:
            findings.add(MISSING_OWNER, ident, event_id=event_id)
    log.info("audit of %s: %d identities checked, %d probed for indirect inputs, %d inputs found", pack_install_id,
             identities, len(probes), probed)

    return AuditReport(pack_install_id, findings.ordered(), legacy_max, identities, probed)


class _Findings:
    """Findings keyed by (refusal, the server's key of the identity); each names its identity by one spelling.

    ``spellings`` (the pack's Event identities first) are keyed up front, so the spelling a finding is named by is
    the first of ``spellings`` the server equates with it, whichever row's spelling the finding met first.
    """

    def __init__(self, conn: Connection, spellings: list[ProjectionIdentity]):
        self.conn = conn
        self.keys = identity.identity_keys(conn, spellings)
        self.named: dict[Hashable, ProjectionIdentity] = {}
        for ident in spellings:
            self.named.setdefault(self.keys[ident], ident)
        self.by_key: dict[tuple[str, Hashable], Finding] = {}

    def add(self, kind: str, ident: ProjectionIdentity | None, *, event_id: int | None = None,
            work_id: int | None = None) -> None:
        key = None if ident is None else self._key(ident)
        f = self.by_key.get((kind, key))
        if f is None:
            f = self.by_key[(kind, key)] = Finding(kind, None if key is None else self.named[key])
        if event_id is not None:
            f.event_ids.append(event_id)
        if work_id is not None:
            f.work_ids.append(work_id)

    def _key(self, ident: ProjectionIdentity) -> Hashable:
        if ident not in self.keys:  # a spelling not met up front (none today): asked of the server now
            self.keys.update(identity.identity_keys(self.conn, [ident]))
            self.named.setdefault(self.keys[ident], ident)
        return self.keys[ident]

    def ordered(self) -> list[Finding]:
        return sorted(self.by_key.values(), key=lambda f: (REFUSALS.index(f.finding), f.identity or ()))


# -- the bounded queries ------------------------------------------------------


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


def _work_reach_by_identity(
    conn: Connection, pack_install_id: str, idents: list[ProjectionIdentity], deadline: Deadline
) -> dict[ProjectionIdentity, _WorkReach]:
    """B(I), the terminal reach and the total reach of each of ``idents``, from the top of its WorkItem range.

    A top row belongs to the identity the server equates it with (:func:`~nexus_cutover.identity.identity_keys`),
    whatever its spelling: a completed top spelled ``lane-a`` is the boundary of the Events' ``Lane-A`` on a
    case-folding collation, read once, not walked down for.
    """
    deadline.check("reading the top WorkItem of each identity")
    completed_tops: list[tuple[ProjectionIdentity, int]] = [
        (identity.of_row(row), int(row.LaneOrdinal))
        for row in conn.execute(top_work_statement(pack_install_id))
        if row.WorkClass == catalog.WORK_CLASS_PROJECTION and row.Status == catalog.WORK_COMPLETED
    ]
    keys = identity.identity_keys(conn, [ident for ident, _ in completed_tops] + list(idents))
    completed_at_top = {keys[ident]: lane_ordinal for ident, lane_ordinal in completed_tops}
    reach: dict[ProjectionIdentity, _WorkReach] = {}
    walked: list[ProjectionIdentity] = []
    for ident in idents:
        top = completed_at_top.get(keys[ident])
        if top is not None:  # the greatest row of the identity is completed projection work: it is every reach
            reach[ident] = _WorkReach(top, top, top)
        else:  # no WorkItem, or the top is live, failed, cancelled or of another class
            walked.append(ident)
    if walked:
        reach.update(_walk_down(conn, walked, deadline))
        log.info("audit of %s: %d of %d identities walked down below their top WorkItem", pack_install_id, len(walked),
                 len(idents))
    return reach


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

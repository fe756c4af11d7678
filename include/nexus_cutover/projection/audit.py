"""The one-time cutover audit of retained projection responsibility (contract, "Audit").

For one pack incarnation, evaluated inside the caller's locked transaction:

| finding | rule |
|---|---|
| ``fence_not_in_force`` / ``fence_override_active`` | the precondition, checked by the caller (:mod:`.checkpoint`) |
| ``live_work`` | a projection WorkItem of the pack, or any WorkItem selecting one of its Events, is live |
| ``native_work_before_checkpoint`` | a projection WorkItem of the pack has ``InputStartOrdinal`` while no protocol row exists |
| ``mixed_history_indirect`` | an Event without a direct task whose identity has both ordinal-0 and positive-ordinal Events |
| ``beyond_completed_boundary`` | an Event without a direct task above B(I) (or B(I) absent) that a terminal WorkItem of I reaches |
| ``missing_owner`` | an Event without a direct task that no WorkItem of I reaches |

B(I), the retained completed boundary, is the greatest LaneOrdinal of a
completed projection WorkItem of identity I. An Event at or below B(I) without a
direct task is a completed coalesced input and is permitted whatever its own
Status; an Event with a direct task is permitted (a live one is ``live_work``).

How it stays bounded (memory does not grow with history depth):

1. live work comes from ``ix_WorkItem_State`` (only live rows are read);
2. one aggregate per identity over the pack's WorkItems
   (``ix_WorkItem_ProjectionOrder``): B, the terminal reach, the total reach,
   and a count of native rows;
3. one aggregate per identity over the pack's Events (``ix_Event_SourceLane``,
   MIN/MAX per group: a loose index scan where the server has one);
4. per identity, only Events *above* B(I) -- or, for mixed identities, all of
   them -- are probed for a direct task, with an anti-join on
   ``ix_WorkItem_Selected``, in keyset batches that return offenders only.

Nothing here writes; timestamps decide nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, and_, case, exists, func, or_, select

from .. import catalog, identity
from ..catalog import Event, WorkItem
from ..db import Deadline
from ..identity import ProjectionIdentity

log = logging.getLogger(__name__)

FENCE_NOT_IN_FORCE = "fence_not_in_force"
FENCE_OVERRIDE_ACTIVE = "fence_override_active"
LIVE_WORK = "live_work"
NATIVE_WORK_BEFORE_CHECKPOINT = "native_work_before_checkpoint"
MIXED_HISTORY_INDIRECT = "mixed_history_indirect"
BEYOND_COMPLETED_BOUNDARY = "beyond_completed_boundary"
MISSING_OWNER = "missing_owner"
#: Refusal of greenfield activation (:mod:`.greenfield`), not of the audit: the pack has history.
NOT_GREENFIELD = "not_greenfield"

REFUSALS = (
    FENCE_NOT_IN_FORCE,
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
    LIVE_WORK: "projection work is still pending/blocked/retry/processing: let the old runtime drain it (cutover step 2)",
    NATIVE_WORK_BEFORE_CHECKPOINT: "range-protocol WorkItems exist although no checkpoint was written: a new writer ran early",
    MIXED_HISTORY_INDIRECT: "coalesced input in an identity mixing pre-ordinal (0) and ordinal history: ownership is ambiguous",
    BEYOND_COMPLETED_BOUNDARY: "input above the last completed generation is owned only by failed/cancelled work",
    MISSING_OWNER: "no retained WorkItem of the identity reaches this input",
    NOT_GREENFIELD: "the pack has Events or WorkItems, so it is not greenfield: activate it through the cutover "
    "(drain, then `connector-projection-cutover -pack-install-id <id>`), which audits that history",
}

DEFAULT_BATCH = 5000


@dataclass
class Finding:
    """One refusal class for one identity (or pack-wide), naming every offending row."""

    finding: str
    identity: ProjectionIdentity | None
    event_ids: list[int] = field(default_factory=list)
    work_ids: list[int] = field(default_factory=list)
    override_ids: list[int] = field(default_factory=list)
    fence_ids: list[int] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        out = {
            "finding": self.finding,
            "identity": self.identity._asdict() if self.identity else None,
            "event_ids": self.event_ids,
            "work_ids": self.work_ids,
            "explanation": _EXPLANATIONS[self.finding],
        }
        if self.finding in (FENCE_NOT_IN_FORCE, FENCE_OVERRIDE_ACTIVE):
            out.update(override_ids=self.override_ids, fence_ids=self.fence_ids)
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
    completed_boundary: int | None  # B(I)
    terminal_reach: int | None  # greatest LaneOrdinal of a terminal WorkItem of I
    any_reach: int | None  # greatest LaneOrdinal of any WorkItem of I
    native: int


def audit_pack(
    conn: Connection, pack_install_id: str, namespace: str, deadline: Deadline, *, batch_size: int = DEFAULT_BATCH
) -> AuditReport:
    """Every finding of the contract's audit table for ``pack_install_id`` (no writes)."""
    findings: dict[tuple[str, ProjectionIdentity | None], Finding] = {}

    def add(kind: str, ident: ProjectionIdentity | None, *, event_id: int | None = None, work_id: int | None = None):
        f = findings.setdefault((kind, ident), Finding(kind, ident))
        if event_id is not None:
            f.event_ids.append(event_id)
        if work_id is not None:
            f.work_ids.append(work_id)

    deadline.check("auditing live work")
    for ident, work_id in _live_projection_work(conn, pack_install_id, namespace):
        add(LIVE_WORK, ident, work_id=work_id)
    for work_id, event_id in _live_direct_work_of_other_classes(conn, pack_install_id, namespace):
        add(LIVE_WORK, None, work_id=work_id, event_id=event_id)

    deadline.check("aggregating WorkItems per identity")
    reach = _work_reach_by_identity(conn, pack_install_id)
    for ident, r in reach.items():
        if r.native:
            for work_id in _native_work_ids(conn, ident):
                add(NATIVE_WORK_BEFORE_CHECKPOINT, ident, work_id=work_id)

    deadline.check("aggregating Events per identity")
    legacy_max = 0
    identities = 0
    probed = 0
    for ident, min_ordinal, max_ordinal in _event_ordinals_by_identity(conn, pack_install_id):
        identities += 1
        legacy_max = max(legacy_max, max_ordinal)
        r = reach.get(ident, _WorkReach(None, None, None, 0))
        mixed = min_ordinal == 0 and max_ordinal > 0
        if mixed:
            above = None  # every indirect Event of a mixed identity is refused, below B(I) too
        elif r.completed_boundary is not None:
            if max_ordinal <= r.completed_boundary:
                continue  # all coalesced or direct inputs at/below the boundary: permitted
            above = r.completed_boundary
        else:
            above = None
        for event_id, ordinal in _indirect_events(conn, ident, above, deadline, batch_size):
            probed += 1
            if mixed:
                add(MIXED_HISTORY_INDIRECT, ident, event_id=event_id)
            elif r.terminal_reach is not None and r.terminal_reach >= ordinal:
                add(BEYOND_COMPLETED_BOUNDARY, ident, event_id=event_id)
            elif r.any_reach is not None and r.any_reach >= ordinal:
                pass  # reached only by live work, which is already a live_work finding
            else:
                add(MISSING_OWNER, ident, event_id=event_id)
        if identities % 100 == 0:
            log.info("audit of %s: %d identities checked, %d inputs probed", pack_install_id, identities, probed)

    ordered = sorted(findings.values(), key=lambda f: (REFUSALS.index(f.finding), f.identity or ()))
    return AuditReport(pack_install_id, ordered, legacy_max, identities, probed)


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
    """Live WorkItems, other than the pack's projection work, directly selecting one of its Events."""
    return (
        select(WorkItem.c.WorkId, WorkItem.c.SelectedEventId)
        .join(Event, Event.c.EventId == WorkItem.c.SelectedEventId)
        .where(
            WorkItem.c.Namespace == namespace,
            WorkItem.c.WorkClass.in_((catalog.WORK_CLASS_PROJECTION, catalog.WORK_CLASS_ORDINARY)),
            WorkItem.c.Status.in_(catalog.WORK_LIVE_STATUSES),
            Event.c.PackInstallId == pack_install_id,
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


def work_reach_statement(pack_install_id: str):
    """Per-identity B(I), terminal reach, total reach and native count (exposed for EXPLAIN tests)."""
    lane = WorkItem.c.LaneOrdinal
    status = WorkItem.c.Status
    return (
        select(
            *identity.columns(WorkItem),
            func.max(case((status == "completed", lane))).label("completed_boundary"),
            func.max(case((status.in_(catalog.WORK_TERMINAL_STATUSES), lane))).label("terminal_reach"),
            func.max(lane).label("any_reach"),
            func.sum(case((WorkItem.c.InputStartOrdinal.is_not(None), 1), else_=0)).label("native"),
        )
        .where(WorkItem.c.PackInstallId == pack_install_id, WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION)
        .group_by(*identity.columns(WorkItem))
    )


def _work_reach_by_identity(conn: Connection, pack_install_id: str) -> dict[ProjectionIdentity, _WorkReach]:
    reach = {}
    for row in conn.execute(work_reach_statement(pack_install_id)):
        reach[identity.of_row(row)] = _WorkReach(
            row.completed_boundary, row.terminal_reach, row.any_reach, int(row.native or 0)
        )
    return reach


def _native_work_ids(conn: Connection, ident: ProjectionIdentity) -> list[int]:
    stmt = (
        select(WorkItem.c.WorkId)
        .where(identity.matches(WorkItem, ident), WorkItem.c.InputStartOrdinal.is_not(None))
        .order_by(WorkItem.c.WorkId)
    )
    return list(conn.scalars(stmt))


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


def _event_ordinals_by_identity(conn: Connection, pack_install_id: str) -> Iterator[tuple]:
    for row in conn.execute(event_ordinals_statement(pack_install_id)).all():
        yield identity.of_row(row), int(row.min_ordinal), int(row.max_ordinal)


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


def _indirect_events(
    conn: Connection, ident: ProjectionIdentity, above: int | None, deadline: Deadline, batch_size: int
) -> Iterator[tuple[int, int]]:
    """Keyset batches of (EventId, EnqueueOrdinal) without a direct task, in ordinal order."""
    after = None
    while True:
        deadline.check(f"auditing identity {ident.label()}")
        rows = conn.execute(indirect_events_statement(ident, above, after, batch_size)).all()
        for event_id, ordinal in rows:
            yield int(event_id), int(ordinal)
        if len(rows) < batch_size:
            return
        after = (int(rows[-1][1]), int(rows[-1][0]))

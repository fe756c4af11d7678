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

The bounded reads (1-6) are :mod:`.audit_queries`, re-exported here; this module holds the rules, the findings and
the report, and decides B(I) and the reaches from the reads (:func:`_work_reach_by_identity`).

Nothing here writes; timestamps decide nothing.
"""

from __future__ import annotations

import logging
from collections.abc import Hashable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from .. import catalog, identity
from ..catalog import Event
from ..db import Deadline
from ..identity import ProjectionIdentity
from .audit_queries import (  # noqa: F401 - re-exported: importers and the plan tests know these as the audit's
    BELOW_EVERY_ORDINAL,
    FIRST_WALK_ROWS,
    REACH_WALK_BATCH,
    WALK_GROWTH,
    _event_ordinals_by_identity,
    _indirect_events,
    _indirect_events_member,
    _live_direct_work_of_other_classes,
    _live_projection_work,
    _native_work,
    _walk_down,
    _walk_down_member,
    _WorkReach,
    event_ordinals_statement,
    indirect_events_statement,
    live_direct_work_statement,
    live_projection_work_statement,
    native_work_statement,
    top_work_statement,
    walk_down_statement,
)

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
    FENCE_OVERRIDE_ACTIVE: "an active admission fence override lets sources through the fence: have the tenant's delivery owner revoke it "
    "(this tool revokes nothing), then rerun",
    SEVERAL_CUTOVER_FENCES: "more than one non-expiring '*' fence is in force: which one holds the tenant is not clear; "
    "have the tenant's delivery owner release all but the one of the cutover in progress (this tool releases none of them), then rerun",
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


# -- B(I) and the reaches, from the top of each identity's WorkItems ----------


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

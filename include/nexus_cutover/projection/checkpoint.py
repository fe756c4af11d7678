"""The lifecycle entrypoint: audit + one-time ``LegacyMaxOrdinal`` checkpoint (cutover step 4).

:func:`run_checkpoint` is the single implementation behind the
``connector-projection-cutover`` command and the Airflow task.

Invariants:

* The check and the write happen in one transaction of the policy
  (:func:`nexus_cutover.tx.run`) holding the namespace lock then the pack lock
  (``_System_Lock`` point locks; BEGIN IMMEDIATE on SQLite), so concurrent or
  repeated calls can never write two different cutoffs.
* Every read of that transaction sees what a previous lock holder committed:
  it runs at READ COMMITTED (TiDB fixes a REPEATABLE READ snapshot at the first
  statement, before the lock wait), and the protocol row is a locking read.
* Fence precondition (contract, "Audit"), checked in the same transaction
  before the audit rows: a pack with any Event or WorkItem is checkpointed only
  while its namespace has exactly one non-expiring ``*`` fence in force and no
  active override (``fence_not_in_force`` / ``several_cutover_fences`` /
  ``fence_override_active``). The fence rows are read ``FOR UPDATE`` (a release
  by hand waits for this transaction), and the precondition is checked again
  after the protocol row is written: an override committed in between (L2's
  process takes no lock of ours) is seen and the write rolled back, the call
  refused with that finding. A greenfield pack needs no fence, but its cutoff 0
  is written under the rule of ``activate-pack`` (contract, "Audit" and
  "Greenfield activation"; :func:`old_runtime_finding`, one rule for both
  paths): without the namespace's cutover fence in force, it refuses
  (``old_runtime_live``, the processes named) while an old-protocol runtime of
  the namespace is live, checked before the write and again after it. An
  existing protocol row is returned whatever the fence.
* An existing version-1 row is returned unchanged without re-auditing; a row
  with another version is an error; a refusal writes nothing; there is no
  option that skips a refusal.
* Only ``_System_ConnectorProjectionProtocol`` is ever written (and lock rows
  created); Events and WorkItems are only read.
* Every wait is bounded by ``timeout_s`` (lock waits and statement time).
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, exists, select

from .. import catalog, tx
from ..admission_fences import cutover_fences, fences_in_force
from ..catalog import Event, PackInstall, WorkItem
from ..clock import utcnow
from ..db import Deadline
from ..errors import BadInput
from ..liveness import DEFAULT_STALE_HEARTBEAT_S
from ..locks import lifecycle_lock_names
from ..protocol_row import ProtocolRow, insert_protocol_row, read_protocol_row, require_version_1
from ..schema import require_projection_schema
from .audit import (
    FENCE_NOT_IN_FORCE,
    FENCE_OVERRIDE_ACTIVE,
    OLD_RUNTIME_LIVE,
    SEVERAL_CUTOVER_FENCES,
    AuditReport,
    Finding,
    audit_pack,
)
from .cutover_fence import Seam, active_overrides
from .writers import live_statement

log = logging.getLogger(__name__)

WRITTEN = "written"
ALREADY_WRITTEN = "already_written"
REFUSED = "refused"
WOULD_WRITE = "would_write"  # dry run only


@dataclass
class CheckpointResult:
    pack_install_id: str
    namespace: str
    outcome: str
    legacy_max_ordinal: int | None
    findings: list[Finding] = field(default_factory=list)
    protocol_version: int | None = None
    written_by: str | None = None

    @property
    def ok(self) -> bool:
        return self.outcome in (WRITTEN, ALREADY_WRITTEN, WOULD_WRITE)

    def as_json(self) -> dict[str, Any]:
        return {
            "pack_install_id": self.pack_install_id,
            "namespace": self.namespace,
            "outcome": self.outcome,
            "legacy_max_ordinal": self.legacy_max_ordinal,
            "protocol_version": self.protocol_version,
            "written_by": self.written_by,
            "findings": [f.as_json() for f in self.findings],
        }

    def summary(self) -> str:
        if self.outcome == REFUSED:
            counts: dict[str, int] = {}
            for f in self.findings:
                counts[f.finding] = counts.get(f.finding, 0) + max(1, len(f.event_ids) + len(f.work_ids) + len(f.override_ids))
            detail = ", ".join(f"{k}: {v}" for k, v in counts.items())
            return f"pack {self.pack_install_id}: REFUSED, nothing written ({detail})"
        verb = {WRITTEN: "written", ALREADY_WRITTEN: "already present, unchanged", WOULD_WRITE: "would be written"}
        return f"pack {self.pack_install_id}: LegacyMaxOrdinal={self.legacy_max_ordinal} {verb[self.outcome]}"


@dataclass(frozen=True)
class Pack:
    pack_install_id: str
    namespace: str
    status: str


def read_pack(conn: Connection, pack_install_id: str) -> Pack:
    row = conn.execute(
        select(PackInstall.c.PackInstallId, PackInstall.c.Namespace, PackInstall.c.Status).where(
            PackInstall.c.PackInstallId == pack_install_id
        )
    ).first()
    if row is None:
        raise BadInput(f"unknown pack: no _System_PackInstall row has PackInstallId {pack_install_id!r}")
    pack = Pack(*row)
    if pack.status != catalog.PACK_ACTIVE:
        raise BadInput(f"pack {pack_install_id!r} is {pack.status!r}, not active: the checkpoint is per active incarnation")
    return pack


def pack_namespace(engine: Engine, pack_install_id: str) -> str | None:
    """The namespace of the pack ``pack_install_id`` whatever its status, None when it is unknown or unreadable:
    whose record a command about one pack writes to (read only, never under a lock)."""
    try:
        with tx.reading(engine, "reading the pack's namespace") as conn:
            return conn.execute(select(PackInstall.c.Namespace)
                                .where(PackInstall.c.PackInstallId == pack_install_id)).scalar()
    except Exception:  # noqa: BLE001 - no tenant to record under: the command itself says what is wrong
        return None


def prerequisite_namespace(engine: Engine, pack_install_id: str, deadline: Deadline) -> str:
    """The namespace of the active pack ``pack_install_id``, read once the Part B schema is known complete.

    The prerequisites of both lifecycle writers (:func:`run_checkpoint` and
    :func:`~.greenfield.activate_pack`), in one read-only transaction before any
    lock: :class:`~nexus_cutover.errors.BadInput` without an id or for an unknown
    or inactive pack, :class:`~nexus_cutover.errors.MissingSchema` without the schema.
    """
    if not pack_install_id:
        raise BadInput("a pack install id is required (-pack-install-id)")

    def prerequisites(conn: Connection) -> str:
        require_projection_schema(conn)
        return read_pack(conn, pack_install_id).namespace

    return tx.read(engine, prerequisites, what="checking the prerequisite schema", deadline=deadline)


def reread_pack(conn: Connection, pack_install_id: str, namespace: str) -> Pack:
    """The pack re-read inside the locked transaction; BadInput when it moved to another namespace while waiting."""
    pack = read_pack(conn, pack_install_id)
    if pack.namespace != namespace:
        raise BadInput(f"pack {pack_install_id!r} moved to namespace {pack.namespace!r} while waiting; rerun")
    return pack


def result_already_written(existing: ProtocolRow, namespace: str) -> CheckpointResult:
    """``already_written``: the existing version-1 row, returned unchanged (another version is an error)."""
    require_version_1(existing)
    log.info("pack %s: checkpoint already present (LegacyMaxOrdinal=%d)", existing.pack_install_id, existing.legacy_max_ordinal)
    return _of_row(existing, namespace, ALREADY_WRITTEN)


def result_written(row: ProtocolRow, namespace: str) -> CheckpointResult:
    """``written``: the protocol row just inserted."""
    return _of_row(row, namespace, WRITTEN)


def _of_row(row: ProtocolRow, namespace: str, outcome: str) -> CheckpointResult:
    return CheckpointResult(
        row.pack_install_id, namespace, outcome, row.legacy_max_ordinal,
        protocol_version=row.protocol_version, written_by=row.written_by,
    )


def is_greenfield(conn: Connection, pack_install_id: str) -> bool:
    """The pack has no Event and no WorkItem (two index probes: ux_Event_Receipt, ix_WorkItem_ProjectionOrder)."""
    has_event = conn.execute(select(exists().where(Event.c.PackInstallId == pack_install_id))).scalar()
    has_work = conn.execute(select(exists().where(WorkItem.c.PackInstallId == pack_install_id))).scalar()
    return not has_event and not has_work


def fence_findings(conn: Connection, namespace: str, *, for_update: bool = False) -> list[Finding]:
    """The contract's fence precondition: one cutover fence in force and no active override (empty when it holds).

    ``for_update``: the fence rows in force are locked (the real run; a dry run only reads).
    """
    now = utcnow()
    findings = []
    in_force = fences_in_force(conn, namespace, now, for_update=for_update)
    cutover = cutover_fences(in_force)
    if not cutover:
        findings.append(Finding(FENCE_NOT_IN_FORCE, None, fence_ids=[f["FenceId"] for f in in_force]))
    elif len(cutover) > 1:
        findings.append(Finding(SEVERAL_CUTOVER_FENCES, None, fence_ids=[f["FenceId"] for f in cutover]))
    overrides = active_overrides(conn, namespace, now)
    if overrides:
        findings.append(Finding(FENCE_OVERRIDE_ACTIVE, None, override_ids=[o["OverrideId"] for o in overrides],
                                fence_ids=sorted({o["FenceId"] for o in overrides})))
    return findings


#: The old-protocol processes that could admit or serve work of the pack (contract, "Greenfield activation").
OLD_RUNTIME_ROLES = (catalog.ROLE_INGRESS_WRITER, catalog.ROLE_RECEIPT_MATERIALIZER, catalog.ROLE_PROJECTION_WORKER)
DEFAULT_STALE_HEARTBEAT = dt.timedelta(seconds=DEFAULT_STALE_HEARTBEAT_S)


def old_runtime_finding(conn: Connection, namespace: str, stale_heartbeat: dt.timedelta, *, for_update: bool = True
                        ) -> Finding | None:
    """``old_runtime_live`` naming the live old-protocol processes of :data:`OLD_RUNTIME_ROLES`, unless none is live
    or the namespace's cutover fence is in force (``for_update``: its rows locked, a release by hand waits for the
    caller). The one rule of every path that writes cutoff 0 (``activate-pack``, the lifecycle entrypoint)."""
    if cutover_fences(fences_in_force(conn, namespace, utcnow(), for_update=for_update)):
        return None
    live = conn.execute(live_statement(namespace, OLD_RUNTIME_ROLES, catalog.PROTOCOL_OLD, utcnow(), stale_heartbeat)).all()
    if not live:
        return None
    return Finding(OLD_RUNTIME_LIVE, None, process_ids=[r.ProcessId for r in live])


def precondition_findings(conn: Connection, pack_install_id: str, namespace: str, stale_heartbeat: dt.timedelta, *,
                          for_update: bool) -> list[Finding]:
    """What must hold before (and again after) the checkpoint's write: the fence precondition for a pack with
    history, the old-runtime rule for a greenfield one (module invariants). Empty when it holds."""
    if is_greenfield(conn, pack_install_id):
        live = old_runtime_finding(conn, namespace, stale_heartbeat, for_update=for_update)
        return [live] if live is not None else []
    return fence_findings(conn, namespace, for_update=for_update)


def _audit_under(
    conn: Connection, pack_install_id: str, namespace: str, deadline: Deadline, batch_size: int, *, check_fence: bool = True,
    lock_fence: bool = False, stale_heartbeat: dt.timedelta = DEFAULT_STALE_HEARTBEAT,
) -> AuditReport:
    reread_pack(conn, pack_install_id, namespace)
    if check_fence:
        precondition = precondition_findings(conn, pack_install_id, namespace, stale_heartbeat, for_update=lock_fence)
        if precondition:
            log.info("pack %s: fence precondition not met: %s", pack_install_id, [f.describe() for f in precondition])
            return AuditReport(pack_install_id, precondition, 0, 0, 0)
    report = audit_pack(conn, pack_install_id, namespace, deadline, batch_size=batch_size)
    log.info(
        "pack %s: audited %d identities, probed %d inputs, %d finding groups",
        pack_install_id, report.identities, report.events_probed, len(report.findings),
    )
    return report


def _decide(conn: Connection, pack_install_id: str, namespace: str, deadline: Deadline, batch_size: int,
            *, for_update: bool, check_fence: bool = True, stale_heartbeat: dt.timedelta = DEFAULT_STALE_HEARTBEAT,
            ) -> tuple[ProtocolRow | None, AuditReport | None]:
    """(the existing protocol row, None) or (None, the audit report) -- the reads of both runs."""
    existing = read_protocol_row(conn, pack_install_id, for_update=for_update)
    if existing is not None:
        return existing, None
    return None, _audit_under(conn, pack_install_id, namespace, deadline, batch_size, check_fence=check_fence,
                              lock_fence=for_update, stale_heartbeat=stale_heartbeat)


def _preview(
    engine: Engine, pack_install_id: str, namespace: str, deadline: Deadline, written_by: str, batch_size: int,
    fence_planned: bool,
) -> CheckpointResult:
    """The dry run: the same reads in one read-only transaction, taking no lock and creating no lock row.

    Without the locks a concurrent lifecycle writer may change the answer; the
    real run re-decides everything under the locks. ``fence_planned``: the
    caller's plan arms the fence first, so the fence precondition is not
    previewed (the real run checks it).
    """
    existing, report = tx.read(
        engine,
        lambda conn: _decide(conn, pack_install_id, namespace, deadline, batch_size, for_update=False,
                             check_fence=not fence_planned),
        what=f"previewing pack {pack_install_id!r}", deadline=deadline,
    )
    if existing is not None:
        return result_already_written(existing, namespace)
    if report.refused:
        return CheckpointResult(pack_install_id, namespace, REFUSED, None, report.findings)
    return CheckpointResult(
        pack_install_id, namespace, WOULD_WRITE, report.legacy_max_ordinal,
        protocol_version=catalog.PROTOCOL_RANGES, written_by=written_by,
    )


class Withdrawn(Exception):
    """Raised inside a locked lifecycle transaction after its write, when a condition checked again after the write
    no longer holds: the transaction rolls back and its caller returns ``result`` (a refusal) instead."""

    def __init__(self, result: CheckpointResult):
        super().__init__(result.summary())
        self.result = result


def run_checkpoint(
    engine: Engine,
    pack_install_id: str,
    *,
    timeout_s: float,
    written_by: str,
    dry_run: bool = False,
    batch_size: int = 5000,
    fence_planned: bool = False,
    stale_heartbeat: dt.timedelta = DEFAULT_STALE_HEARTBEAT,
    between_check_and_act: Seam | None = None,
) -> CheckpointResult:
    """Audit ``pack_install_id`` and write its one-time checkpoint (see the module invariants).

    Returns ``written``/``already_written`` (or ``would_write`` on a dry run,
    which takes no lock and writes nothing, not even a lock row; with
    ``fence_planned`` it assumes the plan's fence) or
    ``refused`` with every finding. Raises :class:`~nexus_cutover.errors.BadInput`
    (unknown pack, missing schema), :class:`~nexus_cutover.errors.LockTimeout`
    or another :class:`~nexus_cutover.errors.CutoverError`; nothing is written then.
    """
    deadline = Deadline(timeout_s)
    namespace = prerequisite_namespace(engine, pack_install_id, deadline)
    if dry_run:
        return _preview(engine, pack_install_id, namespace, deadline, written_by, batch_size, fence_planned)
    names = lifecycle_lock_names(namespace, [pack_install_id])
    log.info("pack %s: taking locks %s (timeout %.0fs)", pack_install_id, ", ".join(names), timeout_s)

    def decide_and_write(conn: Connection) -> CheckpointResult:
        existing, report = _decide(conn, pack_install_id, namespace, deadline, batch_size, for_update=True,
                                   stale_heartbeat=stale_heartbeat)
        if existing is not None:
            return result_already_written(existing, namespace)
        if report.refused:
            return CheckpointResult(pack_install_id, namespace, REFUSED, None, report.findings)
        deadline.check("writing the checkpoint")
        if between_check_and_act is not None:
            between_check_and_act(conn)
        row = insert_protocol_row(conn, pack_install_id, report.legacy_max_ordinal, written_by)
        late = precondition_findings(conn, pack_install_id, namespace, stale_heartbeat, for_update=True)  # again, after
        if late:  # the write (module invariants): what committed in between rolls it back
            log.info("pack %s: precondition broken during the checkpoint: %s", pack_install_id, [f.describe() for f in late])
            raise Withdrawn(CheckpointResult(pack_install_id, namespace, REFUSED, None, late))
        log.info("pack %s: checkpoint written (LegacyMaxOrdinal=%d)", pack_install_id, row.legacy_max_ordinal)
        return result_written(row, namespace)

    try:
        return tx.run(
            engine, decide_and_write, what=f"auditing pack {pack_install_id!r}", deadline=deadline, locks=names,
            bound_statements=True,
        )
    except Withdrawn as withdrawn:  # rolled back: nothing written
        return withdrawn.result

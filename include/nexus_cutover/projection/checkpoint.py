"""The lifecycle entrypoint: audit + one-time ``LegacyMaxOrdinal`` checkpoint (cutover step 4).

:func:`run_checkpoint` is the single implementation behind the
``connector-projection-cutover`` command and the Airflow task.

Invariants:

* The check and the write happen in one transaction holding the namespace lock
  then the pack lock (``_System_Lock`` point locks; BEGIN IMMEDIATE on SQLite),
  so concurrent or repeated calls can never write two different cutoffs.
* The protocol row is read with a locking read *after* the locks are granted:
  it sees what a previous holder committed, even where the transaction's
  snapshot was taken while waiting (TiDB takes it at the first statement).
* An existing version-1 row is returned unchanged without re-auditing; a row
  with another version is an error; a refusal writes nothing; there is no
  option that skips a refusal.
* Only ``_System_ConnectorProjectionProtocol`` is ever written (and lock rows
  created); Events and WorkItems are only read.
* Every wait is bounded by ``timeout_s`` (lock waits and statement time).
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, select
from sqlalchemy import exc as sa_exc

from .. import catalog
from ..catalog import PackInstall
from ..db import Deadline, bounded_session, classify, translate_errors
from ..errors import BadInput
from ..locks import lifecycle_lock_names, locked_transaction
from ..protocol_row import ProtocolRow, insert_protocol_row, read_protocol_row, require_version_1
from ..schema import require_projection_schema
from .audit import AuditReport, Finding, audit_pack

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
                counts[f.finding] = counts.get(f.finding, 0) + len(f.event_ids) + len(f.work_ids)
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


def _already_written(existing: ProtocolRow, namespace: str) -> CheckpointResult:
    require_version_1(existing)
    log.info("pack %s: checkpoint already present (LegacyMaxOrdinal=%d)", existing.pack_install_id, existing.legacy_max_ordinal)
    return CheckpointResult(
        existing.pack_install_id, namespace, ALREADY_WRITTEN, existing.legacy_max_ordinal,
        protocol_version=existing.protocol_version, written_by=existing.written_by,
    )


def _audit_under(conn: Connection, pack_install_id: str, namespace: str, deadline: Deadline, batch_size: int) -> AuditReport:
    pack = read_pack(conn, pack_install_id)  # re-read inside the transaction
    if pack.namespace != namespace:
        raise BadInput(f"pack {pack_install_id!r} moved to namespace {pack.namespace!r} while waiting; rerun")
    report = audit_pack(conn, pack_install_id, namespace, deadline, batch_size=batch_size)
    log.info(
        "pack %s: audited %d identities, probed %d inputs, %d finding groups",
        pack_install_id, report.identities, report.events_probed, len(report.findings),
    )
    return report


def _preview(
    engine: Engine, pack_install_id: str, namespace: str, deadline: Deadline, written_by: str, batch_size: int
) -> CheckpointResult:
    """The dry run: the same reads in one read-only transaction, taking no lock and creating no lock row.

    Without the locks a concurrent lifecycle writer may change the answer; the
    real run re-decides everything under the locks.
    """
    with translate_errors(f"previewing pack {pack_install_id!r}"), engine.connect() as conn:
        with bounded_session(conn, deadline, statements=True), conn.begin():
            existing = read_protocol_row(conn, pack_install_id)
            if existing is not None:
                return _already_written(existing, namespace)
            report = _audit_under(conn, pack_install_id, namespace, deadline, batch_size)
            conn.rollback()
    if report.refused:
        return CheckpointResult(pack_install_id, namespace, REFUSED, None, report.findings)
    return CheckpointResult(
        pack_install_id, namespace, WOULD_WRITE, report.legacy_max_ordinal,
        protocol_version=catalog.PROTOCOL_RANGES, written_by=written_by,
    )


def run_checkpoint(
    engine: Engine,
    pack_install_id: str,
    *,
    timeout_s: float,
    written_by: str,
    dry_run: bool = False,
    batch_size: int = 5000,
) -> CheckpointResult:
    """Audit ``pack_install_id`` and write its one-time checkpoint (see the module invariants).

    Returns ``written``/``already_written`` (or ``would_write`` on a dry run,
    which takes no lock and writes nothing, not even a lock row) or
    ``refused`` with every finding. Raises :class:`~nexus_cutover.errors.BadInput`
    (unknown pack, missing schema), :class:`~nexus_cutover.errors.LockTimeout`
    or another :class:`~nexus_cutover.errors.CutoverError`; nothing is written then.
    """
    if not pack_install_id:
        raise BadInput("a pack install id is required (-pack-install-id)")
    deadline = Deadline(timeout_s)
    with translate_errors("checking the prerequisite schema"), engine.connect() as conn:
        require_projection_schema(conn)
        namespace = read_pack(conn, pack_install_id).namespace
    if dry_run:
        return _preview(engine, pack_install_id, namespace, deadline, written_by, batch_size)
    names = lifecycle_lock_names(namespace, [pack_install_id])
    log.info("pack %s: taking locks %s (timeout %.0fs)", pack_install_id, names, timeout_s)
    with locked_transaction(engine, names, deadline) as conn:
        try:
            existing = read_protocol_row(conn, pack_install_id, for_update=True)
            if existing is not None:
                return _already_written(existing, namespace)
            report = _audit_under(conn, pack_install_id, namespace, deadline, batch_size)
            if report.refused:
                return CheckpointResult(pack_install_id, namespace, REFUSED, None, report.findings)
            deadline.check("writing the checkpoint")
            row = insert_protocol_row(conn, pack_install_id, report.legacy_max_ordinal, written_by)
        except sa_exc.DBAPIError as exc:
            raise classify(exc, f"auditing pack {pack_install_id!r}") from exc
    log.info("pack %s: checkpoint written (LegacyMaxOrdinal=%d)", pack_install_id, row.legacy_max_ordinal)
    return CheckpointResult(
        pack_install_id, namespace, WRITTEN, row.legacy_max_ordinal,
        protocol_version=row.protocol_version, written_by=row.written_by,
    )

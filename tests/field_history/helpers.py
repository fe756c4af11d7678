"""Helpers for Field History tests (plain functions; fixtures live in conftest.py)."""

from __future__ import annotations

from sqlalchemy import Engine, select, update

from nexus_cutover import catalog, tx
from nexus_cutover.db import Deadline
from nexus_cutover.field_history import readers
from nexus_sim.producers import AdmittedSchema, AuditTarget, AuditWrite, FieldDiff, record_audit_field_changes
from nexus_sim.scenario import TenantScenario

Audit = catalog.AuditFieldChange
ELIGIBLE = catalog.FIELD_HISTORY_ELIGIBLE.column_name


def audit_table(engine: Engine) -> dict[int, tuple]:
    """ChangeId -> (FieldId, HistorySequence, FieldHistoryEligible), the whole table."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(Audit.c.ChangeId, Audit.c.FieldId, Audit.c.HistorySequence, Audit.c[ELIGIBLE]).order_by(Audit.c.ChangeId)
        )
        return {r[0]: (r[1], r[2], None if r[3] is None else bool(r[3])) for r in rows}


def reader_set(engine: Engine, predicate) -> set[int]:
    with engine.connect() as conn:
        return set(conn.scalars(select(Audit.c.ChangeId).where(predicate)))


def compat_set(engine: Engine) -> set[int]:
    return reader_set(engine, readers.compat_reader())


def boolean_set(engine: Engine) -> set[int]:
    return reader_set(engine, readers.boolean_only_reader())


def mixed_history(sc: TenantScenario | None = None) -> TenantScenario:
    """Every kind of row the readers distinguish, with known expected outcomes.

    Field 1: one open interval from 10; field 2: closed (10, 20) and open from 30;
    field 3: never tracked (no interval).
    """
    sc = sc or TenantScenario()
    sc.field(1, intervals=[(10, None)])
    sc.field(2, intervals=[(10, 20), (30, None)])
    sc.field(3, track_history=False)
    for seq in (5, 10, 11, 15, 20, 25, 30, 31, 100):
        for fid in (1, 2, 3):
            sc.audit_change(fid, history_sequence=seq)
    sc.audit_change(1, history_sequence=None)  # no sequence: fail-closed, untouched
    sc.audit_change(None, history_sequence=None)  # generic audit only
    sc.audit_change(None, history_sequence=50)  # no FieldId: no interval can match
    sc.audit_change(1, history_sequence=50, eligible=False)  # stamped FALSE inside an interval
    sc.audit_change(3, history_sequence=50, eligible=True)  # stamped TRUE outside any interval
    sc.audit_change(2, history_sequence=None, eligible=True)
    return sc


def expected_after(fid, seq) -> bool:
    """What materialization must decide for the rows of :func:`mixed_history`."""
    if fid == 1:
        return seq > 10
    if fid == 2:
        return 10 < seq < 20 or seq > 30
    return False


def upgraded_outbox_row(
    engine: Engine, outbox_id: int, change_id: int, *, field_id: int = 1, status: str = "pending", producer_version: str = "4.13.0"
) -> AuditWrite:
    """An upgraded producer's mutation of unresolved field ``field_id`` while sequence reservation is on, through the
    outbox: its payload carries a reserved HistorySequence and FieldHistoryEligible NULL (an eligible NULL row once
    delivered). The outbox row is left at ``status`` (``failed``: as a worker that could not deliver it leaves it)."""
    target = AuditTarget(audit_id=change_id, object_name="Contact", record_id="r-1", producer_version=producer_version)

    def body(conn) -> AuditWrite:
        written = record_audit_field_changes(
            conn, AdmittedSchema({}, 1), [FieldDiff(field_id, "a", "b")], [change_id], target, via_outbox=outbox_id
        )
        assert written.reserved_sequences
        if status != "pending":
            outbox = catalog.AuditOutbox
            conn.execute(update(outbox).where(outbox.c.OutboxId == outbox_id).values(Status=status))
        return written

    return tx.run(engine, body, what=f"an upgraded producer's outbox row {outbox_id}", deadline=Deadline(60))

"""Reference producers of ``_System_AuditFieldChange`` rows: the executable form of seed 003 "Authority".

* :func:`record_audit_field_changes` is the single (post-cutover) producer. The
  caller passes the :class:`AdmittedSchema` its mutation was admitted with; each
  real diff with a stable FieldId gets ``FieldHistoryEligible`` = that schema's
  ``TrackHistory``. The producer never reads ``_System_Field`` itself.
* When every history-addressable diff (stable FieldId) carries the decision, no
  HistorySequence is reserved. A generic-audit-only diff (no FieldId) is written
  NULL/no-sequence and never forces its siblings onto the sequence path. If some
  stable diff has no decision (its field is absent from the admitted schema),
  the mutation falls back to sequence reservation for its stable diffs, exactly
  as before, unless the reservation switch is off (then it stays fail-closed).
* Create/Delete pseudo-history rows keep their existing semantics: no FieldId,
  no decision, no sequence.
* :func:`run_mutation` is the retry loop: the schema is captured once *before*
  the loop and reused by every attempt, and so are the ChangeIds, so a retry
  writes identical rows; a revision published between attempts changes nothing.
* :func:`record_legacy_audit_field_changes` is the pre-cutover binary: it
  reserves a HistorySequence for every stable diff under the legacy lock order
  (``_System_FieldHistorySequence`` rows by ascending FieldId) and writes no
  eligibility value (it does not know the column).

Rows go either straight to the audit table (the legacy synchronous writer) or,
``via_outbox``, into one ``_System_AuditOutbox`` row that
:mod:`nexus_sim.outbox_worker` delivers later, preserving what the payload carries.
ChangeIds are supplied by the caller (the real Core has an id service).
"""

from __future__ import annotations

import datetime as dt
import json
from collections.abc import Callable, Iterable, Mapping
from dataclasses import dataclass
from types import MappingProxyType
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update

from nexus_cutover import catalog, tx
from nexus_cutover.clock import utcnow
from nexus_cutover.db import Deadline
from nexus_cutover.field_history import provenance

Audit = catalog.AuditFieldChange
Sequence = catalog.FieldHistorySequence
ELIGIBLE = catalog.FIELD_HISTORY_ELIGIBLE.column_name
KIND_UPDATE = "update"
PSEUDO_KINDS = ("create", "delete")


@dataclass(frozen=True)
class AdmittedSchema:
    """The immutable Mutation view: FieldId -> TrackHistory as admitted, and its revision."""

    track_history: Mapping[int, bool]
    revision: int

    def decision(self, field_id: int) -> bool | None:
        return self.track_history.get(field_id)


def capture_schema(conn: Connection, field_ids: Iterable[int] | None = None) -> AdmittedSchema:
    """Read ``_System_Field`` once (at admission) into an immutable view."""
    f = catalog.Field
    stmt = select(f.c.FieldId, f.c.TrackHistory, f.c.Revision)
    if field_ids is not None:
        stmt = stmt.where(f.c.FieldId.in_(sorted(set(field_ids))))
    rows = conn.execute(stmt).all()
    return AdmittedSchema(MappingProxyType({fid: bool(track) for fid, track, _ in rows}), max((r for *_, r in rows), default=0))


@dataclass(frozen=True)
class FieldDiff:
    """One diff of a business mutation; ``field_id`` None = no stable FieldId (generic audit only)."""

    field_id: int | None
    old: str | None = None
    new: str | None = None
    kind: str = KIND_UPDATE

    @property
    def history_addressable(self) -> bool:
        return self.kind == KIND_UPDATE and self.field_id is not None


@dataclass(frozen=True)
class AuditTarget:
    audit_id: int
    object_name: str
    record_id: str
    producer_version: str


@dataclass
class AuditWrite:
    rows: list[dict[str, Any]]
    reserved_sequences: bool
    outbox_id: int | None = None


def reserve_sequences(conn: Connection, field_ids: Iterable[int]) -> dict[int, int]:
    """Legacy reservation: lock each field's sequence row in ascending FieldId order and take the next value."""
    reserved: dict[int, int] = {}
    for fid in sorted(set(field_ids)):
        current = conn.execute(select(Sequence.c.LastSequence).where(Sequence.c.FieldId == fid).with_for_update()).first()
        if current is None:
            conn.execute(insert(Sequence).values(FieldId=fid, LastSequence=1))
            reserved[fid] = 1
        else:
            conn.execute(update(Sequence).where(Sequence.c.FieldId == fid).values(LastSequence=Sequence.c.LastSequence + 1))
            reserved[fid] = current[0] + 1
    return reserved


def _base_row(change_id: int, target: AuditTarget, diff: FieldDiff, now: dt.datetime) -> dict[str, Any]:
    pseudo = diff.kind in PSEUDO_KINDS
    return {
        "ChangeId": change_id,
        "AuditId": target.audit_id,
        "ObjectName": target.object_name,
        "RecordId": target.record_id,
        "FieldId": None if pseudo else diff.field_id,
        "OldValue": None if pseudo else diff.old,
        "NewValue": f"<{diff.kind}d>" if pseudo else diff.new,
        "HistorySequence": None,
        "ProducerVersion": target.producer_version,
        "CreatedAt": now,
    }


def _emit(conn: Connection, rows: list[dict[str, Any]], target: AuditTarget, via_outbox: int | None) -> int | None:
    if via_outbox is None:
        conn.execute(insert(Audit), rows)
        return None
    conn.execute(
        insert(catalog.AuditOutbox).values(
            OutboxId=via_outbox,
            ProducerVersion=target.producer_version,
            Status="pending",
            Attempts=0,
            Payload=encode_payload(rows),
            CreatedAt=utcnow(),
        )
    )
    return via_outbox


def record_audit_field_changes(
    conn: Connection,
    admitted: AdmittedSchema,
    diffs: list[FieldDiff],
    change_ids: Iterable[int],
    target: AuditTarget,
    *,
    reservation_enabled: bool = True,
    via_outbox: int | None = None,
) -> AuditWrite:
    """The single producer (see the module invariants); runs inside the mutation's transaction."""
    ids = iter(change_ids)
    now = utcnow()
    rows = []
    for diff in diffs:
        row = _base_row(next(ids), target, diff, now)
        row[ELIGIBLE] = provenance.eligibility(diff.history_addressable, admitted.decision(diff.field_id))
        rows.append(row)
    decisions = [admitted.decision(d.field_id) for d in diffs if d.history_addressable]
    reserved = provenance.reserves_sequences(decisions, reservation_enabled=reservation_enabled)
    if reserved:
        sequences = reserve_sequences(conn, [d.field_id for d in diffs if d.history_addressable])
        for row in rows:
            if row["FieldId"] is not None:
                row["HistorySequence"] = sequences[row["FieldId"]]
    return AuditWrite(rows, reserved, _emit(conn, rows, target, via_outbox))


def record_legacy_audit_field_changes(
    conn: Connection,
    diffs: list[FieldDiff],
    change_ids: Iterable[int],
    target: AuditTarget,
    *,
    via_outbox: int | None = None,
) -> AuditWrite:
    """A pre-cutover binary: sequences for every stable diff, no eligibility key at all."""
    ids = iter(change_ids)
    now = utcnow()
    rows = [_base_row(next(ids), target, d, now) for d in diffs]
    sequences = reserve_sequences(conn, [d.field_id for d in diffs if d.history_addressable])
    for row, diff in zip(rows, diffs, strict=True):
        if diff.history_addressable:
            row["HistorySequence"] = sequences[diff.field_id]
    return AuditWrite(rows, True, _emit(conn, rows, target, via_outbox))


def encode_payload(rows: list[dict[str, Any]]) -> str:
    """JSON for the outbox; an eligibility value is carried only when the producer set the key."""
    return json.dumps({"rows": [{k: (v.isoformat() if isinstance(v, dt.datetime) else v) for k, v in r.items()} for r in rows]})


def decode_payload(payload: str) -> list[dict[str, Any]]:
    rows = json.loads(payload)["rows"]
    for row in rows:
        row["CreatedAt"] = dt.datetime.fromisoformat(row["CreatedAt"])
    return rows


class RetryableConflict(Exception):
    """An attempt that must be retried from the start (e.g. a deadlock victim)."""


def run_mutation(
    engine: Engine,
    diffs: list[FieldDiff],
    change_ids: Iterable[int],
    target: AuditTarget,
    *,
    attempts: int = 3,
    before_attempt: Callable[[int], None] | None = None,
    inside_attempt: Callable[[Connection, int], None] | None = None,
    via_outbox: int | None = None,
    reservation_enabled: bool = True,
) -> AuditWrite:
    """Admit once, then try up to ``attempts`` times with the same schema and ids.

    ``before_attempt`` / ``inside_attempt`` are test seams (publish a revision,
    fail an attempt after its writes); a :class:`RetryableConflict` rolls the
    attempt back and retries (a deadlock victim is retried by the transaction policy).
    """
    ids = list(change_ids)
    stable = [d.field_id for d in diffs if d.field_id is not None]
    with engine.connect() as conn:
        admitted = capture_schema(conn, stable)  # once, before the retry loop
    what = f"recording audit {target.audit_id}"
    attempt_loop = tx.attempts(what, deadline=Deadline(60.0), retry=tx.Retry.NONE, also=(RetryableConflict,), max_attempts=attempts)
    for attempt in attempt_loop:
        if before_attempt is not None:
            before_attempt(attempt.number)
        with attempt:

            def body(conn: Connection, number: int = attempt.number) -> AuditWrite:
                written = record_audit_field_changes(
                    conn, admitted, diffs, ids, target, reservation_enabled=reservation_enabled, via_outbox=via_outbox
                )
                if inside_attempt is not None:
                    inside_attempt(conn, number)
                return written

            return tx.run(engine, body, what=what)  # a deadlock victim is re-run by the policy itself
    raise AssertionError("attempts() returns or raises")  # pragma: no cover


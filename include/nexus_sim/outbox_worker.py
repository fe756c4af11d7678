"""Reference Audit V2 outbox worker: delivers outbox payloads into ``_System_AuditFieldChange``.

Invariants (seed 003 "Authority"):

* A value present in the payload (``FieldHistoryEligible`` TRUE/FALSE/NULL set by
  the producer) is written unchanged; an absent key (pre-cutover payload) is
  written as NULL. The worker never reads ``_System_Field``, so a delayed
  delivery keeps the decision of the schema the mutation was admitted with.
* Delivery is idempotent per ChangeId (insert-if-absent): duplicate delivery
  and redelivery after a restart write each row once and never change one.
* Two phases, each its own transaction: claim (``pending`` -> ``processing``,
  ``Attempts`` + 1), then deliver (insert rows, ``processing`` -> ``delivered``).
  A worker that dies between them leaves ``processing`` rows, which the next
  worker run (``recover=True``) delivers again; a payload that cannot be
  decoded is marked ``failed`` and left for an operator.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, insert, select, update

from nexus_cutover import catalog, tx

from .producers import decode_payload

Outbox = catalog.AuditOutbox
Audit = catalog.AuditFieldChange


@dataclass
class DeliveryResult:
    delivered: list[int] = field(default_factory=list)
    failed: list[int] = field(default_factory=list)
    rows_inserted: int = 0
    rows_already_present: int = 0


def _insert_if_absent(conn, rows: list[dict]) -> tuple[int, int]:
    inserted = present = 0
    for row in rows:  # per row: the key set differs between pre- and post-cutover payloads
        stmt = insert(Audit).values(**row)
        stmt = stmt.prefix_with("IGNORE", dialect="mysql").prefix_with("OR IGNORE", dialect="sqlite")
        if conn.execute(stmt).rowcount:
            inserted += 1
        else:
            present += 1
    return inserted, present


def claim(engine: Engine, limit: int, *, recover: bool) -> list[int]:
    """Move up to ``limit`` pending rows (and, with ``recover``, stranded processing rows) to processing."""
    statuses = ("pending", "processing") if recover else ("pending",)

    def body(conn: Connection) -> list[int]:
        ids = list(
            conn.scalars(
                select(Outbox.c.OutboxId).where(Outbox.c.Status.in_(statuses)).order_by(Outbox.c.OutboxId).limit(limit).with_for_update()
            )
        )
        if ids:
            conn.execute(update(Outbox).where(Outbox.c.OutboxId.in_(ids)).values(Status="processing", Attempts=Outbox.c.Attempts + 1))
        return ids

    return tx.run(engine, body, what="claiming outbox work")


def deliver(engine: Engine, outbox_id: int, result: DeliveryResult) -> None:
    def body(conn: Connection) -> tuple[str, int, int]:
        row = conn.execute(select(Outbox.c.Payload, Outbox.c.Status).where(Outbox.c.OutboxId == outbox_id).with_for_update()).first()
        if row is None or row.Status != "processing":
            return "gone", 0, 0  # another worker finished it meanwhile
        try:
            rows = decode_payload(row.Payload)
        except (ValueError, KeyError, TypeError):
            conn.execute(update(Outbox).where(Outbox.c.OutboxId == outbox_id).values(Status="failed"))
            return "failed", 0, 0
        inserted, present = _insert_if_absent(conn, rows)
        conn.execute(update(Outbox).where(Outbox.c.OutboxId == outbox_id).values(Status="delivered"))
        return "delivered", inserted, present

    outcome, inserted, present = tx.run(engine, body, what=f"delivering outbox row {outbox_id}")
    if outcome == "failed":
        result.failed.append(outbox_id)
    elif outcome == "delivered":
        result.delivered.append(outbox_id)
        result.rows_inserted += inserted
        result.rows_already_present += present


def run_once(
    engine: Engine,
    *,
    limit: int = 100,
    recover: bool = True,
    after_claim: Callable[[list[int]], None] | None = None,
) -> DeliveryResult:
    """One worker pass. ``after_claim`` is a test seam (a worker 'dying' between the two phases)."""
    result = DeliveryResult()
    ids = claim(engine, limit, recover=recover)
    if after_claim is not None:
        after_claim(ids)
    for outbox_id in ids:
        deliver(engine, outbox_id, result)
    return result


def redeliver(engine: Engine, outbox_id: int) -> DeliveryResult:
    """Deliver one row's payload again regardless of status (duplicate delivery, as a broker may do)."""
    result = DeliveryResult()

    def body(conn: Connection) -> tuple[int, int]:
        payload = conn.scalar(select(Outbox.c.Payload).where(Outbox.c.OutboxId == outbox_id))
        return _insert_if_absent(conn, decode_payload(payload))

    inserted, present = tx.run(engine, body, what=f"redelivering outbox row {outbox_id}")
    result.rows_inserted, result.rows_already_present = inserted, present
    result.delivered.append(outbox_id)
    return result

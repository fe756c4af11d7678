"""The new receipt materializer: durable ``_System_IngressReceipt`` rows -> range admission.

Invariants (contract, reference host; seed 000, "Recovery contract"):

* Unmaterialized receipts (``MaterializedAt IS NULL``, read on
  ``ix_IngressReceipt_Pending`` in primary-key order, never by timestamp) are
  admitted with :func:`~.admission.admit_batch`; ``MaterializedAt`` is set in
  that same transaction, ``ConfirmedAt`` in a later one.
* A crash between the two leaves the Event, its WorkItem change and
  ``MaterializedAt`` intact; :func:`recover_unconfirmed` re-offers such receipts,
  which take the duplicate path (no new Event, no new work) and are then
  confirmed. Retrying is idempotent.
* Route version, Flow version and work type come from the host's :class:`~.model.Routing`.
* A receipt that cannot be admitted for a reason retrying will not remove
  (:class:`~.errors.InadmissibleReceipts`: its Event exists above the cutoff
  without coverage, its key collides with another receipt's, it is invalid) is
  reported (``rejected``, each naming the receipt and, for a collision, both
  keys), logged as an error and left durable and unmaterialized for review; it
  is neither acknowledged, nor replayed, nor retried. The batch's other receipts
  are admitted without it (the batch is offered again without the rejected ones).
"""

from __future__ import annotations

import logging
from collections import defaultdict
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, and_, or_, select, update

from .. import tx
from ..catalog import IngressReceipt
from ..clock import utcnow
from ..db import Deadline
from .admission import admit_batch
from .errors import InadmissibleReceipts, MissingCoverage, Rejection
from .model import AdmissionResult, Input, Routing
from .tx import run_transaction

log = logging.getLogger(__name__)

DEFAULT_BATCH = 500

Key = tuple[str, str]


@dataclass
class MaterializeReport:
    admitted: int = 0
    duplicates: int = 0
    confirmed: int = 0
    #: (source lane, receipt id, ordinal) of receipts whose Event lies above the cutoff without coverage.
    uncovered: list[tuple[str, str, int]] = field(default_factory=list)
    #: Every receipt that cannot be admitted (uncovered ones included), each saying why.
    rejected: list[Rejection] = field(default_factory=list)

    @property
    def uncovered_keys(self) -> set[Key]:
        return {(lane, rid) for lane, rid, _ in self.uncovered}

    @property
    def rejected_keys(self) -> set[Key]:
        return {r.key for r in self.rejected}


def _keys_clause(pack_install_id: str, keys: Iterable[Key]):
    by_lane: dict[str, list[str]] = defaultdict(list)
    for lane, receipt in keys:
        by_lane[lane].append(receipt)
    t = IngressReceipt
    return and_(
        t.c.PackInstallId == pack_install_id,
        or_(*(and_(t.c.SourceLane == lane, t.c.ReceiptId.in_(sorted(ids))) for lane, ids in sorted(by_lane.items()))),
    )


def _receipts(conn: Connection, pack_install_id: str, *, materialized: bool, limit: int):
    t = IngressReceipt
    cond = [t.c.PackInstallId == pack_install_id]
    if materialized:
        cond += [t.c.MaterializedAt.is_not(None), t.c.ConfirmedAt.is_(None)]
    else:
        cond.append(t.c.MaterializedAt.is_(None))
    return conn.execute(
        select(t.c.SourceLane, t.c.ReceiptId, t.c.EventKind, t.c.Payload, t.c.ReceivedAt)
        .where(*cond)
        .order_by(t.c.SourceLane, t.c.ReceiptId)
        .limit(limit)
    ).all()


def unmaterialized_count(conn: Connection, pack_install_id: str, limit: int = 1) -> int:
    return len(_receipts(conn, pack_install_id, materialized=False, limit=limit))


def _confirm(engine: Engine, pack_install_id: str, keys: list[Key], deadline: Deadline | None) -> int:
    if not keys:
        return 0

    def body(conn: Connection) -> int:
        t = IngressReceipt
        return conn.execute(
            update(t).where(_keys_clause(pack_install_id, keys), t.c.ConfirmedAt.is_(None)).values(ConfirmedAt=utcnow())
        ).rowcount

    return run_transaction(engine, body, what=f"confirming receipts of pack {pack_install_id!r}", deadline=deadline)


def _admit(
    engine: Engine,
    pack_install_id: str,
    rows,
    routing: Routing,
    report: MaterializeReport,
    deadline: Deadline | None,
) -> tuple[AdmissionResult | None, list[Key]]:
    inputs = [Input.routed(r.SourceLane, r.ReceiptId, r.Payload, r.EventKind, routing, received_at=r.ReceivedAt) for r in rows]

    def mark(conn: Connection, _result: AdmissionResult) -> None:
        t = IngressReceipt
        keys = [(i.source_lane, i.receipt_id) for i in inputs]
        conn.execute(update(t).where(_keys_clause(pack_install_id, keys), t.c.MaterializedAt.is_(None)).values(MaterializedAt=utcnow()))

    while inputs:
        try:
            result = admit_batch(engine, pack_install_id, inputs, in_transaction=mark, deadline=deadline)
        except InadmissibleReceipts as exc:
            bad = exc.keys
            left = [i for i in inputs if (i.source_lane, i.receipt_id) not in bad]
            if len(left) == len(inputs):
                raise  # names no receipt of this batch: not a per-receipt refusal
            log.error("%s", exc)
            report.rejected.extend(exc.rejections)
            if isinstance(exc, MissingCoverage):
                report.uncovered.extend(sorted(exc.receipts))
            inputs = left
            continue
        report.admitted += len(result.admitted)
        report.duplicates += len(result.duplicates)
        return result, [(i.source_lane, i.receipt_id) for i in inputs]
    return None, []


def materialize(
    engine: Engine,
    pack_install_id: str,
    routing: Routing,
    *,
    limit: int = DEFAULT_BATCH,
    skip: set[Key] | None = None,
    after_commit: Callable[[AdmissionResult], None] | None = None,
    deadline: Deadline | None = None,
) -> MaterializeReport:
    """Admit up to ``limit`` unmaterialized receipts of the pack, then confirm them.

    ``skip``: receipts already reported as rejected (not offered again).
    ``after_commit`` runs between the admission commit and the confirmation (crash tests).
    """
    skip = skip or set()
    report = MaterializeReport()
    with tx.reading(engine, f"reading receipts of pack {pack_install_id!r}") as conn:
        rows = [
            r
            for r in _receipts(conn, pack_install_id, materialized=False, limit=limit + len(skip))
            if (r.SourceLane, r.ReceiptId) not in skip
        ][:limit]
    if not rows:
        return report
    result, keys = _admit(engine, pack_install_id, rows, routing, report, deadline)
    if result is not None and after_commit is not None:
        after_commit(result)
    report.confirmed = _confirm(engine, pack_install_id, keys, deadline)
    return report


def recover_unconfirmed(
    engine: Engine, pack_install_id: str, routing: Routing, *, limit: int = DEFAULT_BATCH, deadline: Deadline | None = None
) -> MaterializeReport:
    """Confirm receipts materialized before a crash: re-admitted as duplicates, then confirmed.

    Scans the pack's materialized-but-unconfirmed receipts (a startup sweep, not a hot path).
    """
    total = MaterializeReport()
    while True:
        with tx.reading(engine, f"reading unconfirmed receipts of pack {pack_install_id!r}") as conn:
            rows = [
                r
                for r in _receipts(conn, pack_install_id, materialized=True, limit=limit + len(total.rejected))
                if (r.SourceLane, r.ReceiptId) not in total.rejected_keys
            ][:limit]
        if not rows:
            return total
        _result, keys = _admit(engine, pack_install_id, rows, routing, total, deadline)
        total.confirmed += _confirm(engine, pack_install_id, keys, deadline)
        if not keys:
            return total

"""Stage 3's switch to boolean-only reads, safe against producers that keep writing (contract, "Field History eligibility").

Upgraded producers still write NULL rows with a HistorySequence for unresolved
fields while sequence reservation is on: such a row is an *eligible NULL row*
(the compatibility reader accepts it, the boolean-only one does not). The switch
happens only when none can exist at the moment of the switch, rows committed
while stage 3 compares included. What makes that provable is the producer rule of
:func:`.provenance.may_reserve`: a mutation that reserves locks its fields'
``_System_FieldHistorySequence`` rows first and reads the reservation switch
after, and commits its sequence increments with its rows (or its outbox row).

The steps (each a transaction of the one policy, READ COMMITTED on MySQL):

1. **Preconditions, then reservation off** (:func:`.gates.stage_3` with
   :func:`reservation_off_in`, under the namespace lock when given): no deployed producer older than the
   release, no pre-cutover outbox work; then
   ``FieldHistorySequenceReservationEnabled = false`` is committed. It stays off
   whatever follows (turning it on again would let new eligible NULL rows in and
   the next attempt would never converge); a refusal says so.
2. **Barrier** (:func:`barrier`): every sequence row locked FOR UPDATE, ascending
   FieldId, then released. It waits for every mutation holding a sequence lock
   (one that may have read the switch on before step 1 committed); any mutation
   that locks one afterwards reads it off. It records the sequence table
   (FieldId -> LastSequence) and the open outbox rows (any producer version: a
   reservation commits with its outbox row, so an outbox row may carry reserved
   sequences not yet delivered).
3. **Settle**: wait until none of those outbox rows is open (delivered: its rows
   are in the table; ``failed``: refused, they may carry history rows that would
   arrive after the switch).
4. **Compare and switch** (:func:`_compare_and_switch`, under the namespace lock):
   the switch rows locked; reservation still off; both readers over the whole
   table (:func:`.status.compare_readers`); then every sequence row locked again
   and the sequence table read: equal to the barrier's (else a reservation
   committed since, by a producer that does not follow the rule: back to step 2,
   within the deadline), no field without a sequence row whose first sequence
   (:data:`.provenance.FIRST_SEQUENCE`) an interval would prove (a first
   reservation creates its row: there is no row to lock, and no gap lock on TiDB),
   the step-2 outbox rows still closed. Only then is
   ``FieldHistoryReadMode = boolean_only`` written, in the same transaction.
   While it holds the sequence locks no reservation can commit, so no eligible
   NULL row can appear between the last check and the switch.

:func:`preview` is ``stage3 -check``: the same checks read-only, switching nothing.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, and_, exists, select

from .. import catalog, tx
from ..db import Deadline
from ..errors import LockTimeout
from ..locks import lifecycle_lock_names
from . import readers
from .inventory import OUTBOX_FAILED, OUTBOX_OPEN
from .provenance import FIRST_SEQUENCE
from .settings import read_settings, read_settings_for_update, set_setting_in
from .status import DEFAULT_CHUNK_ROWS, ReadComparison, compare_readers

log = logging.getLogger(__name__)

Sequence = catalog.FieldHistorySequence
Interval = catalog.FieldHistoryTrackingInterval
Outbox = catalog.AuditOutbox

RETRY = tx.Retry.DEADLOCK | tx.Retry.DUPLICATE_KEY  # a concurrent first insert of a switch row loses a race
DEFAULT_POLL_S = 0.5
_ID_CHUNK = 1000


@dataclass
class Hooks:
    """Test seams (no product caller passes them): where the interleaving tests let a producer in.

    ``during_comparison(n)`` runs inside the switch transaction after the n-th chunk;
    ``before_switch()`` after the final checks, the sequence rows locked, before the
    read mode is written; ``waiting_for_outbox(ids)`` before each pause of step 3.
    """

    after_reservation_off: Callable[[], None] | None = None
    after_barrier: Callable[[list[int]], None] | None = None
    waiting_for_outbox: Callable[[list[int]], None] | None = None
    during_comparison: Callable[[int], None] | None = None
    before_switch: Callable[[], None] | None = None


@dataclass(frozen=True)
class Barrier:
    """What step 2 saw: the sequence table, and the outbox rows open then."""

    sequences: dict[int, int]
    open_outbox: list[int]


@dataclass
class SwitchOutcome:
    """What the switch transaction found (``switched`` only when every check held)."""

    comparison: ReadComparison
    switched: bool = False
    changed: list[str] = field(default_factory=list)
    sequences_moved: list[int] = field(default_factory=list)  # FieldIds reserved (or created) since the barrier
    fields_at_risk: list[int] = field(default_factory=list)
    outbox_not_closed: dict[int, str] = field(default_factory=dict)
    reservation_on: bool = False


# -- the reads --------------------------------------------------------------------------


def sequence_table(conn: Connection, *, lock: bool) -> dict[int, int]:
    """FieldId -> LastSequence of every sequence row; with ``lock``, every row locked FOR UPDATE (ascending FieldId)."""
    stmt = select(Sequence.c.FieldId, Sequence.c.LastSequence).order_by(Sequence.c.FieldId)
    return {int(f): int(s) for f, s in conn.execute(stmt.with_for_update() if lock else stmt)}


def open_outbox_ids(conn: Connection) -> list[int]:
    """Outbox rows still open (pending / processing), of any producer version (``ix_AuditOutbox_Status``)."""
    return [int(i) for i in conn.scalars(select(Outbox.c.OutboxId).where(Outbox.c.Status.in_(OUTBOX_OPEN)).order_by(Outbox.c.OutboxId))]


def outbox_still_open(conn: Connection, ids: list[int]) -> dict[int, str]:
    """Those of ``ids`` not delivered yet: OutboxId -> status (open or failed). Primary-key reads, in chunks."""
    found: dict[int, str] = {}
    for start in range(0, len(ids), _ID_CHUNK):
        chunk = ids[start : start + _ID_CHUNK]
        not_delivered = Outbox.c.Status.in_(OUTBOX_OPEN + (OUTBOX_FAILED,))
        rows = conn.execute(select(Outbox.c.OutboxId, Outbox.c.Status).where(Outbox.c.OutboxId.in_(chunk), not_delivered))
        found.update({int(i): s for i, s in rows})
    return found


def fields_at_risk(conn: Connection) -> list[int]:
    """Fields with no sequence row whose first reservation an interval would prove: it would be an eligible NULL row."""
    iv = Interval.alias("first_iv")
    no_row = ~exists(select(Sequence.c.FieldId).where(Sequence.c.FieldId == iv.c.FieldId))
    stmt = (
        select(iv.c.FieldId)
        .where(and_(no_row, readers.interval_contains(iv.c.FieldId, FIRST_SEQUENCE)))
        .distinct()
        .order_by(iv.c.FieldId)
    )
    return [int(f) for f in conn.scalars(stmt)]


def moved(before: dict[int, int], after: dict[int, int]) -> list[int]:
    """FieldIds whose sequence row appeared or changed between two reads of the sequence table."""
    return sorted(f for f in set(before) | set(after) if before.get(f) != after.get(f))


# -- the steps --------------------------------------------------------------------------


def reservation_off_in(conn: Connection, updated_by: str) -> bool:
    """Step 1's write, inside the caller's transaction (after its checks): True when the switch changed."""
    return set_setting_in(conn, catalog.SETTING_SEQUENCE_RESERVATION, "false", updated_by)


def barrier(engine: Engine, deadline: Deadline) -> Barrier:
    """Step 2: wait for every mutation holding a sequence lock; the sequence table and the open outbox rows, then."""

    def body(conn: Connection) -> Barrier:
        sequences = sequence_table(conn, lock=True)
        return Barrier(sequences, open_outbox_ids(conn))

    return tx.run(engine, body, what="waiting for in-flight sequence reservations (stage 3 barrier)", deadline=deadline, retry=RETRY)


def settle_outbox(engine: Engine, ids: list[int], deadline: Deadline, *, poll_s: float, hooks: Hooks) -> dict[int, str]:
    """Step 3: wait until none of ``ids`` is open; returns the failed ones (OutboxId -> 'failed'), empty when all delivered.

    A person reads why it waits in the log; the deadline bounds it (:class:`LockTimeout`, nothing switched).
    """
    waiting = list(ids)
    logged = False
    while waiting:
        with tx.reading(engine, "reading the outbox rows stage 3 waits for") as conn:
            state = outbox_still_open(conn, waiting)
        failed = {i: s for i, s in state.items() if s == OUTBOX_FAILED}
        if failed:
            return failed
        waiting = sorted(state)
        if not waiting:
            return {}
        if not logged:
            log.info("stage 3 waits for %d outbox row(s) open when sequence reservation was turned off", len(waiting))
            logged = True
        if hooks.waiting_for_outbox is not None:
            hooks.waiting_for_outbox(waiting)
        if deadline.expired():
            raise LockTimeout(
                f"timed out after {deadline.seconds:g}s waiting for {len(waiting)} outbox row(s) (e.g. OutboxId "
                f"{waiting[:5]}) that were open when sequence reservation was turned off: they may carry rows with a "
                "HistorySequence; nothing switched to boolean-only reads (reservation stays off); rerun once the outbox "
                "worker delivered them"
            )
        time.sleep(min(poll_s, max(0.0, deadline.remaining())))
    return {}


def _compare_and_switch(conn: Connection, fence: Barrier, updated_by: str, hooks: Hooks, chunk_rows: int) -> SwitchOutcome:
    """Step 4, inside the switch transaction."""
    settings = read_settings_for_update(conn)
    out = SwitchOutcome(ReadComparison())
    if settings.sequence_reservation_enabled:
        out.reservation_on = True
        return out
    out.comparison = compare_readers(conn, chunk_rows=chunk_rows, on_chunk=hooks.during_comparison)
    after = sequence_table(conn, lock=True)  # from here to the commit no reservation on an existing row can commit
    out.sequences_moved = moved(fence.sequences, after)
    out.fields_at_risk = fields_at_risk(conn)
    out.outbox_not_closed = outbox_still_open(conn, fence.open_outbox)
    if out.sequences_moved or out.fields_at_risk or out.outbox_not_closed or not out.comparison.equal:
        return out
    if hooks.before_switch is not None:
        hooks.before_switch()
    if set_setting_in(conn, catalog.SETTING_READ_MODE, catalog.READ_MODE_BOOLEAN_ONLY, updated_by):
        out.changed.append(catalog.SETTING_READ_MODE)
    out.switched = True
    return out


def compare_and_switch(
    engine: Engine,
    namespace: str | None,
    updated_by: str,
    deadline: Deadline,
    *,
    poll_s: float = DEFAULT_POLL_S,
    hooks: Hooks | None = None,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
) -> tuple[SwitchOutcome, int]:
    """Steps 2 to 4, repeated while reservations are still committing (within ``deadline``): (outcome, barriers taken).

    Returns the first outcome that switched or that refuses for a reason waiting does
    not remove (rows that would flip, a failed outbox row, a field at risk, the
    reservation switch turned on again). Raises :class:`LockTimeout` when the deadline
    passes first.
    """
    hooks = hooks or Hooks()
    barriers = 0
    while True:
        fence = barrier(engine, deadline)
        barriers += 1
        if hooks.after_barrier is not None:
            hooks.after_barrier(fence.open_outbox)
        failed = settle_outbox(engine, fence.open_outbox, deadline, poll_s=poll_s, hooks=hooks)
        if failed:
            return SwitchOutcome(ReadComparison(), outbox_not_closed=failed), barriers
        outcome = tx.run(
            engine,
            lambda conn, fence=fence: _compare_and_switch(conn, fence, updated_by, hooks, chunk_rows),
            what="comparing the Field History readers and switching to boolean-only reads",
            deadline=deadline,
            locks=lifecycle_lock_names(namespace) if namespace else (),
            retry=RETRY,
        )
        if outcome.switched or not outcome.sequences_moved or outcome.fields_at_risk or outcome.reservation_on:
            return outcome, barriers
        log.warning(
            "stage 3: sequence reservations committed after the barrier (fields %s): a producer does not follow the "
            "reservation switch yet; settling again", outcome.sequences_moved[:10],
        )
        if deadline.expired():
            raise LockTimeout(
                f"timed out after {deadline.seconds:g}s: sequence reservations kept committing after "
                "FieldHistorySequenceReservationEnabled was turned off (fields "
                f"{outcome.sequences_moved[:10]}): a producer ignores the switch; nothing switched to boolean-only reads"
            )


@dataclass
class Preview:
    """``stage3 -check``: what stage 3 would find now (read-only)."""

    comparison: ReadComparison
    reservation_enabled: bool
    read_mode: str
    open_outbox: list[int]
    fields_at_risk: list[int]

    def as_dict(self) -> dict:
        return {
            "comparison": self.comparison.as_dict(),
            "sequence_reservation_enabled": self.reservation_enabled,
            "read_mode": self.read_mode,
            "open_outbox_rows": len(self.open_outbox),
            "open_outbox_examples": self.open_outbox[:10],
            "fields_at_risk": self.fields_at_risk,
        }

    def lines(self) -> list[str]:
        out = [self.comparison.render()]
        if self.reservation_enabled:
            out.append(
                "sequence reservation is on: stage 3 would turn it off first, wait for the mutations that saw it on, "
                "then compare (producers may still add eligible NULL rows until then)"
            )
        if self.open_outbox:
            out.append(f"{len(self.open_outbox)} outbox row(s) open now (e.g. {self.open_outbox[:5]}): stage 3 would wait "
                       "for those open at its barrier to be delivered")
        if self.fields_at_risk:
            out.append(f"fields {self.fields_at_risk[:10]} have no sequence row but an interval that proves their first "
                       "sequence: stage 3 refuses while they do")
        return out


def preview(engine: Engine) -> Preview:
    """The checks of stage 3 in one read-only transaction: nothing is written or switched."""

    def body(conn: Connection) -> Preview:
        settings = read_settings(conn)
        return Preview(compare_readers(conn), settings.sequence_reservation_enabled, settings.read_mode, open_outbox_ids(conn),
                       fields_at_risk(conn))

    return tx.read(engine, body, what="previewing Field History stage 3")

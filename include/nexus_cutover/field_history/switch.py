"""Stage 3's switch to boolean-only reads, safe against producers that keep writing (contract, "Field History eligibility").

Upgraded producers still write NULL rows with a HistorySequence for unresolved
fields while sequence reservation is on: such a row is an *eligible NULL row*
(the compatibility reader accepts it, the boolean-only one does not). The switch
happens only when none can exist at the moment of the switch, rows committed
while stage 3 compares included. What makes that provable is the producer rule of
:func:`.provenance.may_reserve`: a mutation that reserves locks its fields'
``_System_FieldHistorySequence`` rows first and reads the reservation switch
after, and commits its sequence increments with its rows (or its outbox row).

Outbox work is settled only when no ``_System_AuditOutbox`` row is pending,
processing or failed. A *failed* row of any producer version refuses stage 3
wherever it is seen (:func:`failed_outbox_ids`: step 1, each poll of step 3, and
step 4 under the locks), naming it: it can be redelivered, and an upgraded
producer's row then writes its NULL rows after the switch, where the
boolean-only reader never returns them. Stage 3 never changes an outbox row's
status (a failed row is redelivered or retired by a separately reviewed decision).

The steps (each a transaction of the one policy, READ COMMITTED on MySQL):

1. **Preconditions, then reservation off** (:func:`.stage3_gate.stage_3` with
   :func:`reservation_off_in`, under the namespace lock when given): no deployed producer older than the
   release, no pre-cutover outbox work, no failed outbox row; then
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
3. **Settle** (:func:`settle_outbox`): wait until none of those outbox rows is open
   (delivered: its rows are in the table); any failed outbox row refuses at once.
   Nothing but a live ``audit_outbox_worker`` delivers them: without one the wait
   ends at the deadline (:class:`~nexus_cutover.errors.LockTimeout`, exit 4), its
   message saying so (:class:`OutboxWait`).
4. **Compare and switch** (:func:`_compare_and_switch`, under the namespace lock;
   the rules are :func:`switch_checks`): the switch rows locked; reservation still
   off; both readers over the whole table (:func:`.status.compare_readers`); then
   every sequence row locked again and the sequence table read: equal to the
   barrier's (else a reservation committed since, by a producer that does not
   follow the rule: back to step 2, within the deadline), no field without a
   sequence row whose first sequence (:data:`.provenance.FIRST_SEQUENCE`) an
   interval would prove (a first reservation creates its row: there is no row to
   lock, and no gap lock on TiDB), no failed outbox row, the step-2 outbox rows
   still closed. Only then is ``FieldHistoryReadMode = boolean_only`` written, in
   the same transaction. While it holds the sequence locks no reservation can
   commit, so no eligible NULL row can appear between the last check and the switch.

:func:`preview_in` is what ``stage3 -check`` reads (:func:`.stage3_gate.stage_3_check` decides
on it with the switch's own rules): :func:`switch_checks` without a barrier, the open
outbox rows and the live outbox workers, read-only, switching nothing.
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
from .inventory import DEFAULT_HEARTBEAT_WINDOW_S, OUTBOX_FAILED, OUTBOX_OPEN, live_outbox_workers
from .provenance import FIRST_SEQUENCE
from .settings import FieldHistorySettings, read_settings, read_settings_for_update, set_setting_in
from .status import DEFAULT_CHUNK_ROWS, ReadComparison, compare_readers

log = logging.getLogger(__name__)

Sequence = catalog.FieldHistorySequence
Interval = catalog.FieldHistoryTrackingInterval
Outbox = catalog.AuditOutbox

RETRY = tx.Retry.DEADLOCK | tx.Retry.DUPLICATE_KEY  # a concurrent first insert of a switch row loses a race
DEFAULT_POLL_S = 0.5
_ID_CHUNK = 1000
_NAMED_IDS = 10  # OutboxIds a message names (the count is always given)


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
    """What the switch's rules found (``switched`` only when every check held and the read mode was written)."""

    comparison: ReadComparison
    switched: bool = False
    changed: list[str] = field(default_factory=list)
    sequences_moved: list[int] = field(default_factory=list)  # FieldIds reserved (or created) since the barrier
    fields_at_risk: list[int] = field(default_factory=list)
    outbox_failed: list[int] = field(default_factory=list)  # every failed outbox row (any producer version)
    outbox_reopened: list[int] = field(default_factory=list)  # outbox rows of the barrier open again
    reservation_on: bool = False

    @property
    def blocked(self) -> bool:
        """A rule refuses the switch."""
        return bool(
            self.reservation_on or self.sequences_moved or self.fields_at_risk or self.outbox_failed
            or self.outbox_reopened or not self.comparison.equal
        )


def named_ids(ids: list[int]) -> str:
    """``OutboxId 3, 7, 9`` (the first few, ``...`` when there are more)."""
    shown = ", ".join(map(str, ids[:_NAMED_IDS]))
    return f"OutboxId {shown}{', ...' if len(ids) > _NAMED_IDS else ''}"


@dataclass(frozen=True)
class OutboxWait:
    """Step 3's wait: the outbox rows it waits for, and how many live ``audit_outbox_worker`` processes can deliver them.

    Stage 3 never delivers an outbox row itself: with no live worker the wait lasts to the deadline (exit 4).
    """

    open_ids: list[int]
    live_workers: int

    @property
    def times_out(self) -> bool:
        """Rows to wait for and nothing live to deliver them: the switch waits to its deadline."""
        return bool(self.open_ids) and not self.live_workers

    def reason(self) -> str:
        rows = f"{len(self.open_ids)} pending/processing outbox row(s) ({named_ids(self.open_ids)})"
        if self.live_workers:
            return f"{rows}, which {self.live_workers} live audit_outbox_worker(s) deliver"
        return f"{rows} and no live audit_outbox_worker to deliver them"


# -- the reads --------------------------------------------------------------------------


def sequence_table(conn: Connection, *, lock: bool) -> dict[int, int]:
    """FieldId -> LastSequence of every sequence row; with ``lock``, every row locked FOR UPDATE (ascending FieldId)."""
    stmt = select(Sequence.c.FieldId, Sequence.c.LastSequence).order_by(Sequence.c.FieldId)
    return {int(f): int(s) for f, s in conn.execute(stmt.with_for_update() if lock else stmt)}


def open_outbox_statement():
    """The open (pending / processing) outbox rows of any producer version, ascending: a range of ``ix_AuditOutbox_Status``."""
    return select(Outbox.c.OutboxId).where(Outbox.c.Status.in_(OUTBOX_OPEN)).order_by(Outbox.c.OutboxId)


def failed_outbox_statement():
    """The failed outbox rows of any producer version, ascending: a range of ``ix_AuditOutbox_Status``."""
    return select(Outbox.c.OutboxId).where(Outbox.c.Status == OUTBOX_FAILED).order_by(Outbox.c.OutboxId)


def open_outbox_ids(conn: Connection) -> list[int]:
    """Outbox rows still open (pending / processing), of any producer version."""
    return [int(i) for i in conn.scalars(open_outbox_statement())]


def outbox_still_open(conn: Connection, ids: list[int]) -> list[int]:
    """Those of ``ids`` still open (pending / processing), ascending. Primary-key reads, in chunks."""
    found: list[int] = []
    for start in range(0, len(ids), _ID_CHUNK):
        chunk = ids[start : start + _ID_CHUNK]
        found += conn.scalars(select(Outbox.c.OutboxId).where(Outbox.c.OutboxId.in_(chunk), Outbox.c.Status.in_(OUTBOX_OPEN)))
    return sorted(int(i) for i in found)


def failed_outbox_ids(conn: Connection) -> list[int]:
    """Every failed outbox row, of any producer version, ascending: each refuses stage 3 (module docstring).

    A plain read, also under the switch's locks: a row that fails after it was not open at the barrier (a barrier's
    row is delivered by then, and delivered is final), so it was written with reservation off and carries no reserved
    sequence; no lock could hold a new failed row back anyway (no gap locks on TiDB).
    """
    return [int(i) for i in conn.scalars(failed_outbox_statement())]


def outbox_wait(
    conn: Connection, open_ids: list[int], namespace: str | None, heartbeat_window_s: float = DEFAULT_HEARTBEAT_WINDOW_S
) -> OutboxWait:
    """The rows ``open_ids`` and the live outbox workers (of ``namespace``, or all) that can deliver them."""
    return OutboxWait(list(open_ids), len(live_outbox_workers(conn, namespace, heartbeat_window_s)))


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


def settle_outbox(
    engine: Engine, ids: list[int], deadline: Deadline, *, namespace: str | None, poll_s: float, hooks: Hooks
) -> list[int]:
    """Step 3: wait until none of ``ids`` is open; returns the failed outbox rows (any, seen at a poll: each refuses at
    once), empty when ``ids`` are all delivered.

    A person reads why it waits in the log; the deadline bounds it (:class:`LockTimeout`, nothing switched, its
    message the :meth:`OutboxWait.reason`: with no live outbox worker nothing could have delivered them).
    """
    waiting = list(ids)
    logged = False
    while waiting:
        with tx.reading(engine, "reading the outbox rows stage 3 waits for") as conn:
            failed = failed_outbox_ids(conn)
            waiting = outbox_still_open(conn, waiting)
        if failed:
            return failed
        if not waiting:
            return []
        if not logged:
            log.info("stage 3 waits for %d outbox row(s) open when sequence reservation was turned off", len(waiting))
            logged = True
        if hooks.waiting_for_outbox is not None:
            hooks.waiting_for_outbox(waiting)
        if deadline.expired():
            with tx.reading(engine, "reading the outbox workers stage 3 waited for") as conn:
                wait = outbox_wait(conn, waiting, namespace)
            raise LockTimeout(
                f"timed out after {deadline.seconds:g}s waiting: {wait.reason()}; they were open when sequence "
                "reservation was turned off and may carry rows with a HistorySequence; nothing switched to boolean-only "
                "reads (reservation stays off); rerun once the outbox worker delivered them"
            )
        time.sleep(min(poll_s, max(0.0, deadline.remaining())))
    return []


def switch_checks(
    conn: Connection,
    fence: Barrier | None,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    on_chunk: Callable[[int], None] | None = None,
) -> SwitchOutcome:
    """The switch's rules of step 4 but the reservation switch (the one implementation: the switch runs them under its
    locks, ``stage3 -check`` read-only): the whole-table read comparison, fields at risk, failed outbox rows.

    With the barrier's ``fence`` (the switch) every sequence row is locked and compared with the barrier's, and the
    barrier's outbox rows must still be closed; without one (``-check``: no barrier taken) those two are not read.
    """
    out = SwitchOutcome(compare_readers(conn, chunk_rows=chunk_rows, on_chunk=on_chunk))
    if fence is not None:
        after = sequence_table(conn, lock=True)  # from here to the commit no reservation on an existing row can commit
        out.sequences_moved = moved(fence.sequences, after)
    out.fields_at_risk = fields_at_risk(conn)
    out.outbox_failed = failed_outbox_ids(conn)
    if fence is not None:
        out.outbox_reopened = outbox_still_open(conn, fence.open_outbox)
    return out


def _compare_and_switch(conn: Connection, fence: Barrier, updated_by: str, hooks: Hooks, chunk_rows: int) -> SwitchOutcome:
    """Step 4, inside the switch transaction."""
    settings = read_settings_for_update(conn)
    if settings.sequence_reservation_enabled:
        return SwitchOutcome(ReadComparison(), reservation_on=True)
    out = switch_checks(conn, fence, chunk_rows=chunk_rows, on_chunk=hooks.during_comparison)
    if out.blocked:
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
    reservation switch turned on again, a barrier's outbox row open again). Raises
    :class:`LockTimeout` when the deadline passes first.
    """
    hooks = hooks or Hooks()
    barriers = 0
    while True:
        fence = barrier(engine, deadline)
        barriers += 1
        if hooks.after_barrier is not None:
            hooks.after_barrier(fence.open_outbox)
        failed = settle_outbox(engine, fence.open_outbox, deadline, namespace=namespace, poll_s=poll_s, hooks=hooks)
        if failed:
            return SwitchOutcome(ReadComparison(), outbox_failed=failed), barriers
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
    """What ``stage3 -check`` reads (one read-only transaction): the rules of step 4 without a barrier, the switches,
    and the outbox rows open now (at least those a barrier would wait for) with the live workers that deliver them."""

    checks: SwitchOutcome
    settings: FieldHistorySettings
    wait: OutboxWait

    @property
    def comparison(self) -> ReadComparison:
        return self.checks.comparison

    def as_json(self) -> dict:
        return {
            "comparison": self.comparison.as_json(),
            "sequence_reservation_enabled": self.settings.sequence_reservation_enabled,
            "read_mode": self.settings.read_mode,
            "open_outbox_rows": len(self.wait.open_ids),
            "open_outbox_examples": self.wait.open_ids[:_NAMED_IDS],
            "live_outbox_workers": self.wait.live_workers,
            "failed_outbox_rows": len(self.checks.outbox_failed),
            "failed_outbox_examples": self.checks.outbox_failed[:_NAMED_IDS],
            "fields_at_risk": self.checks.fields_at_risk,
        }

    def lines(self) -> list[str]:
        out = [self.comparison.render()]
        if self.settings.sequence_reservation_enabled:
            out.append(
                "sequence reservation is on: stage 3 would turn it off first, wait for the mutations that saw it on, "
                "then compare (producers may still add eligible NULL rows until then)"
            )
        if self.wait.open_ids:
            out.append(f"outbox row(s) open now: {self.wait.reason()}: stage 3 would wait for those open at its barrier "
                       "to be delivered")
        if self.checks.outbox_failed:
            out.append(f"{len(self.checks.outbox_failed)} outbox row(s) failed ({named_ids(self.checks.outbox_failed)}): "
                       "stage 3 refuses while any is")
        if self.checks.fields_at_risk:
            out.append(f"fields {self.checks.fields_at_risk[:10]} have no sequence row but an interval that proves their "
                       "first sequence: stage 3 refuses while they do")
        return out


def preview_in(conn: Connection, namespace: str | None = None, heartbeat_window_s: float = DEFAULT_HEARTBEAT_WINDOW_S) -> Preview:
    """The reads of ``stage3 -check``, in the caller's read-only transaction: nothing is written or switched."""
    checks = switch_checks(conn, None)
    return Preview(checks, read_settings(conn), outbox_wait(conn, open_outbox_ids(conn), namespace, heartbeat_window_s))

"""Stage 2 materialization: decide legacy NULL rows from their existing sequence/interval facts.

Invariants (seed 003 "Cutover", contract "Field History eligibility"):

* Only *materializable* rows change: ``FieldHistoryEligible IS NULL`` with a
  FieldId and a HistorySequence (:func:`.readers.materializable`). They become
  TRUE when an interval proves eligibility, FALSE when none does. Non-NULL rows,
  rows without a sequence and rows without a FieldId are never touched.
* Keyset batches over the primary key ``ChangeId``: each batch covers the next
  ``batch_size`` materializable rows after the cursor, ``(lo, hi]``, and is its
  own short transaction (TiDB-safe: a few thousand rows at most, no RETURNING,
  no multi-table UPDATE, only a correlated EXISTS that every dialect speaks).
* Every UPDATE repeats the ``IS NULL`` guard, and an UPDATE evaluates it on the
  latest committed row (a locking read), so a value stamped concurrently by a
  producer is never overwritten.
* Resumable: the result is a function of each row's own facts only, so a run
  interrupted between batches and run again finishes the same rows with the same
  values; a run after a complete one finds nothing and changes nothing.
* Each batch is a transaction of the policy (:func:`nexus_cutover.tx.run`,
  READ COMMITTED): its lock waits are bounded, and a lock-wait timeout or a
  deadlock retries the batch (everything before it stays committed) until the
  call's deadline.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass

from sqlalchemy import Connection, Engine, func, select, update
from sqlalchemy.sql import Select, Update

from .. import catalog, tx
from ..db import Deadline
from ..errors import LockTimeout
from . import readers
from .prerequisites import require_eligibility_column

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 2000
MAX_BATCH_SIZE = 10_000  # TiDB: keep every transaction to a few thousand rows
BATCH_LOCK_WAIT_S = 20.0  # one batch never waits longer than this for a row lock
BATCH_RETRY = tx.Retry.DEADLOCK | tx.Retry.LOCK_WAIT

Audit = catalog.AuditFieldChange


@dataclass
class Progress:
    """Where a run stands after a batch (passed to ``on_batch`` and logged)."""

    batches: int
    rows_done: int
    total: int
    cursor: int
    elapsed_s: float

    @property
    def rate(self) -> float:
        return self.rows_done / self.elapsed_s if self.elapsed_s > 0 else 0.0

    @property
    def eta_s(self) -> float | None:
        if self.rate <= 0:
            return None
        return max(0, self.total - self.rows_done) / self.rate


@dataclass
class MaterializeResult:
    set_true: int
    set_false: int
    batches: int
    total_at_start: int
    remaining: int
    seconds: float
    batch_size: int

    @property
    def rows(self) -> int:
        return self.set_true + self.set_false

    def as_dict(self) -> dict:
        return {**asdict(self), "rows": self.rows}


def batch_upper_bound(lo: int | None, batch_size: int) -> Select:
    """The ChangeId closing the next batch: the ``batch_size``-th materializable row after ``lo``."""
    inner = select(Audit.c.ChangeId).where(readers.materializable())
    if lo is not None:
        inner = inner.where(Audit.c.ChangeId > lo)
    inner = inner.order_by(Audit.c.ChangeId).limit(batch_size).subquery("batch")
    return select(func.max(inner.c.ChangeId))


def stamp_statement(value: bool, lo: int | None, hi: int) -> Update:
    """Set the rows of ``(lo, hi]`` that ``value`` is proven for; guarded by ``IS NULL``."""
    proven = readers.proves_true() if value else readers.proves_false()
    stmt = update(Audit).where(Audit.c.ChangeId <= hi, proven)
    if lo is not None:
        stmt = stmt.where(Audit.c.ChangeId > lo)
    return stmt.values({catalog.FIELD_HISTORY_ELIGIBLE.column_name: value})


def count_materializable(engine: Engine) -> int:
    with engine.connect() as conn:
        return conn.scalar(select(func.count()).select_from(Audit).where(readers.materializable())) or 0


def _run_batch(engine: Engine, lo: int | None, batch_size: int, deadline: Deadline) -> tuple[int | None, int, int]:
    """One short transaction: find the batch's upper bound, stamp TRUE then FALSE. Returns (hi, true, false)."""

    def body(conn: Connection) -> tuple[int | None, int, int]:
        hi = conn.scalar(batch_upper_bound(lo, batch_size))
        if hi is None:
            return None, 0, 0
        set_true = conn.execute(stamp_statement(True, lo, hi)).rowcount
        set_false = conn.execute(stamp_statement(False, lo, hi)).rowcount
        return hi, set_true, set_false

    return tx.run(
        engine,
        body,
        what=f"materializing the batch after ChangeId {lo}",
        deadline=deadline,
        retry=BATCH_RETRY,
        lock_wait_s=BATCH_LOCK_WAIT_S,
    )


def materialize(
    engine: Engine,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    deadline: Deadline | None = None,
    on_batch: Callable[[Progress], None] | None = None,
    progress_every_s: float = 5.0,
) -> MaterializeResult:
    """Materialize every materializable row, batch by batch; see the module invariants.

    ``on_batch`` is called after each committed batch (tests use it to interrupt
    or interleave). On timeout, :class:`LockTimeout` says how far the run got;
    the committed batches stay and a rerun resumes.
    """
    if not 1 <= batch_size <= MAX_BATCH_SIZE:
        raise ValueError(f"batch size must be between 1 and {MAX_BATCH_SIZE}, got {batch_size}")
    deadline = deadline or Deadline(float("inf"))
    require_eligibility_column(engine)
    total = count_materializable(engine)
    log.info("materializing %d NULL rows with a FieldId and a HistorySequence, batches of %d", total, batch_size)
    run = _Run(total, progress_every_s)
    lo: int | None = None
    while True:
        hi, t, f = _batch_in_time(engine, lo, batch_size, deadline, run)
        if hi is None:
            break
        lo = hi
        progress = run.record(hi, t, f)
        if on_batch is not None:
            on_batch(progress)
    return run.result(engine, batch_size)


def _batch_in_time(engine: Engine, lo: int | None, batch_size: int, deadline: Deadline, run: _Run) -> tuple[int | None, int, int]:
    """:func:`_run_batch` while the deadline holds; a timeout says how far ``run`` got."""
    if deadline.expired():
        raise run.timed_out(deadline)
    try:
        return _run_batch(engine, lo, batch_size, deadline)
    except LockTimeout as exc:
        if deadline.expired():
            raise run.timed_out(deadline) from exc
        raise


class _Run:
    """The running totals of one :func:`materialize` call, and its log lines (progress every ``progress_every_s``)."""

    def __init__(self, total: int, progress_every_s: float):
        self.total = total
        self.progress_every_s = progress_every_s
        self.started = self.last_log = time.monotonic()
        self.set_true = self.set_false = self.batches = 0

    def record(self, hi: int, t: int, f: int) -> Progress:
        """Count the batch just committed (``ChangeId <= hi``, ``t`` TRUE, ``f`` FALSE) and log it."""
        self.batches += 1
        self.set_true, self.set_false = self.set_true + t, self.set_false + f
        now = time.monotonic()
        progress = Progress(self.batches, self.set_true + self.set_false, self.total, hi, now - self.started)
        if self.batches == 1 or now - self.last_log >= self.progress_every_s:
            self.last_log = now
            eta = progress.eta_s
            log.info(
                "materialized %d/%d rows (batch %d, ChangeId <= %d), %.0f rows/s, ETA %s",
                progress.rows_done,
                self.total,
                self.batches,
                hi,
                progress.rate,
                f"{eta:.0f}s" if eta is not None else "unknown",
            )
        else:
            log.debug("batch %d done: ChangeId <= %d, %d TRUE, %d FALSE", self.batches, hi, t, f)
        return progress

    def timed_out(self, deadline: Deadline) -> LockTimeout:
        return LockTimeout(
            f"timed out after {deadline.seconds:g}s with {self.set_true + self.set_false} of {self.total} rows materialized "
            f"(committed and kept); rerun materialize to finish the rest"
        )

    def result(self, engine: Engine, batch_size: int) -> MaterializeResult:
        """The run's result, with what is still materializable now (one count)."""
        seconds = time.monotonic() - self.started
        remaining = count_materializable(engine)
        log.info(
            "materialization done: %d TRUE, %d FALSE in %d batches, %.1fs; %d materializable rows remain",
            self.set_true,
            self.set_false,
            self.batches,
            seconds,
            remaining,
        )
        return MaterializeResult(self.set_true, self.set_false, self.batches, self.total, remaining, seconds, batch_size)

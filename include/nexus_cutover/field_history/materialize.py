"""Stage 2 materialization: decide legacy NULL rows from their existing sequence/interval facts.

Invariants (seed 003 "Cutover", contract "Field History eligibility"):

* Only *materializable* rows change: ``FieldHistoryEligible IS NULL`` with a
  FieldId and a HistorySequence (:func:`.readers.materializable`). They become
  TRUE when an interval proves eligibility, FALSE when none does. Non-NULL rows,
  rows without a sequence and rows without a FieldId are never touched.
* Keyset batches over the primary key ``ChangeId``: each batch is the next
  ``batch_size`` materializable rows after the cursor and the ChangeId range
  ``(lo, hi]`` from just below the first of them to the last (rows before the
  first are never touched, so a resumed run does not re-read what is decided);
  it is its own short transaction (TiDB-safe: a few thousand rows at most, no
  RETURNING, no multi-table UPDATE, only a correlated EXISTS that every dialect
  speaks) and decides its rows with one UPDATE.
* The UPDATE repeats the ``IS NULL`` guard, and an UPDATE evaluates it on the
  latest committed row (a locking read), so a value stamped concurrently by a
  producer is never overwritten.
* **Each batch proves its read-equivalence inside its transaction**: the rows of
  ``(lo, hi]`` (all of them, stamped ones included) that the compatibility reader
  accepts before the UPDATE are the rows that the boolean-only reader accepts
  after it, and the UPDATE decided as many rows as the batch holds. Both readers
  are those of :mod:`.readers`, not this module's own predicates. The proof is
  one aggregate read before and one after (the :class:`.status.Fingerprint` of
  each accepted set, primary-key ranges). When they differ, the batch is rolled
  back and run once more with its rows locked first (``FOR UPDATE``), proving
  row by row: that names every differing row and why, and ignores only rows
  others inserted into the range meanwhile (so a concurrent producer's insert
  or an uncommitted stamp the batch waited for costs a re-run, not a stop). A
  difference there rolls the batch back and stops the run with
  :class:`ReadEquivalenceBroken`; the batches before it stay committed.
* The run keeps a digest of its decisions (:class:`DecidedDigest` of the
  ``(ChangeId, eligible)`` pairs its batches decided, taken from the proof's
  reads, so no decided row is read again): it depends on those pairs only, not
  on batch size or order; it covers only the rows *this* run decided (a resumed
  run's digest covers the rest), and it is returned, logged and reported.
* Resumable: the result is a function of each row's own facts only, so a run
  interrupted between batches and run again finishes the same rows with the same
  values; a run after a complete one finds nothing and changes nothing.
* Each batch is a transaction of the policy (:func:`nexus_cutover.tx.run`,
  READ COMMITTED): its lock waits are bounded, and a lock-wait timeout or a
  deadlock retries the batch (everything before it stays committed) until the
  call's deadline.
"""

from __future__ import annotations

import hashlib
import logging
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field

from sqlalchemy import Connection, Engine, case, false, func, select, true, update
from sqlalchemy.sql import Select, Update

from .. import catalog, tx
from ..db import Deadline
from ..errors import LockTimeout, ReadEquivalenceBroken
from . import readers
from .prerequisites import require_eligibility_column
from .status import Fingerprint, as_flag, fingerprint_columns, fingerprint_of, in_range, value_text

log = logging.getLogger(__name__)

DEFAULT_BATCH_SIZE = 2000
MAX_BATCH_SIZE = 10_000  # TiDB: keep every transaction to a few thousand rows
BATCH_LOCK_WAIT_S = 20.0  # one batch never waits longer than this for a row lock
BATCH_RETRY = tx.Retry.DEADLOCK | tx.Retry.LOCK_WAIT

Audit = catalog.AuditFieldChange
ELIGIBLE = catalog.FIELD_HISTORY_ELIGIBLE.column_name

#: ``seam(conn, lo, hi)``: see ``between_read_and_write`` of :func:`materialize`.
Seam = Callable[[Connection, int, int], None]


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


class DecidedDigest:
    """A digest of the ``(ChangeId, eligible)`` decisions of a run, flat in memory, independent of batch order and size.

    It is the pair of :class:`.status.Fingerprint` of the ChangeIds decided and
    of those decided TRUE (the two determine every pair), accumulated batch by
    batch; :attr:`hex` is the first 16 hex digits of the SHA-256 of both. So two
    runs that decide the same rows the same way print the same digest; a
    resumed run's digest covers only the rows that run decided.
    """

    def __init__(self) -> None:
        self.decided = Fingerprint()
        self.decided_true = Fingerprint()

    def add(self, decided: Fingerprint, decided_true: Fingerprint) -> None:
        self.decided += decided
        self.decided_true += decided_true

    @property
    def rows(self) -> int:
        return self.decided.rows

    @property
    def hex(self) -> str:
        d, t = self.decided, self.decided_true
        text = f"decided {d.rows}:{d.sum_1}:{d.sum_2} true {t.rows}:{t.sum_1}:{t.sum_2}"
        return hashlib.sha256(text.encode()).hexdigest()[:16]


@dataclass
class MaterializeResult:
    set_true: int
    set_false: int
    batches: int
    total_at_start: int
    remaining: int
    seconds: float
    batch_size: int
    decided_rows: int = 0  # rows this run decided (= set_true + set_false), covered by decided_digest
    decided_digest: str = field(default_factory=lambda: DecidedDigest().hex)

    @property
    def rows(self) -> int:
        return self.set_true + self.set_false

    def as_json(self) -> dict:
        return {**asdict(self), "rows": self.rows}


# -- statements ----------------------------------------------------------------


def batch_bounds(lo: int | None, batch_size: int) -> Select:
    """The next batch, the first ``batch_size`` materializable rows after ``lo``: MIN and MAX ChangeId, and their fingerprint."""
    inner = select(Audit.c.ChangeId.label("change_id")).where(readers.materializable())
    if lo is not None:
        inner = inner.where(Audit.c.ChangeId > lo)
    batch = inner.order_by(Audit.c.ChangeId).limit(batch_size).subquery("batch")
    return select(func.min(batch.c.change_id), func.max(batch.c.change_id), *fingerprint_columns(batch.c.change_id))


def batch_rows(lo: int | None, batch_size: int) -> Select:
    """The same rows as :func:`batch_bounds`, listed and locked until the batch commits (the row-by-row proof)."""
    stmt = select(Audit.c.ChangeId).where(readers.materializable())
    if lo is not None:
        stmt = stmt.where(Audit.c.ChangeId > lo)
    return stmt.order_by(Audit.c.ChangeId).limit(batch_size).with_for_update()


def decide_statement(lo: int, hi: int) -> Update:
    """Decide the materializable rows of ``(lo, hi]``: TRUE where an interval proves eligibility, FALSE where none does.

    One UPDATE, guarded by ``IS NULL`` (in :func:`.readers.materializable`); the
    interval test is :func:`.readers.interval_proves`, probed once per row.
    """
    value = case((readers.interval_proves(), true()), else_=false())
    return update(Audit).where(in_range(lo, hi), readers.materializable()).values({ELIGIBLE: value})


def compat_accepted(lo: int, hi: int) -> Select:
    """The proof's read before the UPDATE: fingerprints of the rows of ``(lo, hi]`` the compatibility reader accepts,
    and of those among them the boolean-only reader accepts too (stamped TRUE already)."""
    both = as_flag(readers.boolean_only_reader())
    return select(*fingerprint_columns(Audit.c.ChangeId), *fingerprint_columns(Audit.c.ChangeId, both)).where(
        in_range(lo, hi), readers.compat_reader()
    )


def boolean_accepted(lo: int, hi: int) -> Select:
    """The proof's read after the UPDATE: fingerprint of the rows of ``(lo, hi]`` the boolean-only reader accepts."""
    return select(*fingerprint_columns(Audit.c.ChangeId)).where(in_range(lo, hi), readers.boolean_only_reader())


def _rows_before(lo: int, hi: int) -> Select:
    """Row-by-row proof, before: every row of ``(lo, hi]`` with the compatibility reader's verdict and its facts."""
    return select(
        Audit.c.ChangeId,
        Audit.c.FieldId,
        Audit.c.HistorySequence,
        readers.eligible_column(),
        as_flag(readers.compat_reader()),
        as_flag(readers.materializable()),
        as_flag(readers.interval_proves()),
    ).where(in_range(lo, hi))


def _rows_after(lo: int, hi: int) -> Select:
    """Row-by-row proof, after: every row of ``(lo, hi]`` with the boolean-only reader's verdict."""
    return select(
        Audit.c.ChangeId,
        readers.eligible_column(),
        as_flag(readers.boolean_only_reader()),
        as_flag(readers.interval_proves()),
    ).where(in_range(lo, hi))


def count_materializable(engine: Engine) -> int:
    with tx.reading(engine, "counting materializable Field History rows") as conn:
        return conn.scalar(select(func.count()).select_from(Audit).where(readers.materializable())) or 0


# -- one batch -----------------------------------------------------------------


@dataclass(frozen=True)
class _Batch:
    """A committed batch: its range ``(lo, hi]`` and the fingerprints of the rows it decided and decided TRUE."""

    lo: int
    hi: int
    decided: Fingerprint
    decided_true: Fingerprint

    @property
    def set_true(self) -> int:
        return self.decided_true.rows

    @property
    def set_false(self) -> int:
        return self.decided.rows - self.decided_true.rows


class _ProofDiffered(Exception):
    """The aggregate proof of a batch differed: the batch is rolled back and proven again row by row."""


def _proven_by_aggregates(conn: Connection, lo: int | None, batch_size: int, seam: Seam | None) -> _Batch | None:
    """The batch with its aggregate proof (one read before the UPDATE, one after); raises :class:`_ProofDiffered`.

    When the accepted sets are equal and the UPDATE decided as many rows as the
    batch holds, the rows set TRUE are those the compatibility reader accepted
    and that were not TRUE already, so their fingerprint is a difference of the
    two read before.
    """
    first, last, *batch = conn.execute(batch_bounds(lo, batch_size)).one()
    if first is None:
        return None
    lo, hi, decided = int(first) - 1, int(last), fingerprint_of(batch)
    before = conn.execute(compat_accepted(lo, hi)).one()
    accepted, stamped_true = fingerprint_of(before[:3]), fingerprint_of(before[3:])
    if seam is not None:
        seam(conn, lo, hi)
    changed = conn.execute(decide_statement(lo, hi)).rowcount
    after = fingerprint_of(conn.execute(boolean_accepted(lo, hi)).one())
    if after != accepted or changed != decided.rows:
        raise _ProofDiffered(f"accepted before {accepted.hex}, after {after.hex}; {changed} row(s) decided of {decided.rows}")
    return _Batch(lo, hi, decided, accepted - stamped_true)


def _proven_row_by_row(conn: Connection, lo: int | None, batch_size: int, seam: Seam | None) -> _Batch | None:
    """The batch, its rows locked first, with the row-by-row proof; raises :class:`ReadEquivalenceBroken` naming each differing row."""
    ids = [int(v) for v in conn.scalars(batch_rows(lo, batch_size))]
    if not ids:
        return None
    lo, hi = ids[0] - 1, ids[-1]
    before = {int(r[0]): r for r in conn.execute(_rows_before(lo, hi))}
    if seam is not None:
        seam(conn, lo, hi)
    changed = conn.execute(decide_statement(lo, hi)).rowcount
    after = {int(r[0]): r for r in conn.execute(_rows_after(lo, hi))}  # rows inserted meanwhile are not compared
    differing = [_why(b, after.get(cid)) for cid, b in before.items() if cid not in after or bool(b[4]) != bool(after[cid][2])]
    if differing:
        raise ReadEquivalenceBroken(_range_text(lo, hi) + "; ".join(d["why"] for d in differing), differing)
    decided = {cid: after[cid][1] for cid, b in before.items() if b[5]}
    if changed != len(decided) or any(v is None for v in decided.values()):
        raise ReadEquivalenceBroken(
            _range_text(lo, hi) + f"its UPDATE decided {changed} row(s) but {len(decided)} were read as materializable "
            f"before it ({sum(v is None for v in decided.values())} of those still NULL): rows of the range changed or "
            "were inserted while the batch ran"
        )
    return _Batch(lo, hi, Fingerprint.of_ids(decided), Fingerprint.of_ids(c for c, v in decided.items() if v))


def _range_text(lo: int, hi: int) -> str:
    return f"in the batch of ChangeIds {lo + 1}..{hi}: "


def _why(before, after) -> dict:
    """One differing row: what it was and what the compatibility reader said, what it is and what the boolean-only reader says."""
    cid, fid, seq, value, compat, materializable, proved = before
    if value is not None:
        was = f"stamped {value_text(value)} before"
    elif compat:
        was = f"NULL before, an interval of field {fid} proving sequence {seq}"
    elif seq is None:
        was = "NULL before without a HistorySequence (fail-closed)"
    elif fid is None:
        was = "NULL before without a FieldId"
    else:
        was = f"NULL before, no interval of field {fid} proving sequence {seq}"
    was += f" (compatibility reader: {'accepted' if compat else 'rejected'})"
    if after is None:
        return {"change_id": cid, "before": value_text(value), "after": "missing", "why": f"ChangeId {cid}: {was}, but gone after"}
    _, now, accepted, proves_now = after
    why = f"ChangeId {cid}: {was}, but {value_text(now)} after (boolean-only reader: {'accepted' if accepted else 'rejected'})"
    if value is not None and now != value:
        why += "; a stamped row was touched"
    elif value is None and not materializable and now is not None:
        why += "; a row materialization never decides was changed"
    if value is None and bool(proved) != bool(proves_now):
        why += f"; the intervals of field {fid} changed during the batch"
    return {"change_id": cid, "before": value_text(value), "after": value_text(now), "why": why}


def _run_batch(engine: Engine, lo: int | None, batch_size: int, deadline: Deadline, seam: Seam | None) -> _Batch | None:
    """One short transaction proving itself by aggregates; on a difference, once more proving row by row."""
    what = f"materializing the batch after ChangeId {lo}"
    options = {"what": what, "deadline": deadline, "retry": BATCH_RETRY, "lock_wait_s": BATCH_LOCK_WAIT_S}
    try:
        return tx.run(engine, lambda conn: _proven_by_aggregates(conn, lo, batch_size, seam), **options)
    except _ProofDiffered as exc:
        log.warning("%s: the aggregate read-equivalence proof differed (%s); rolled back, proving it again row by row", what, exc)
    return tx.run(engine, lambda conn: _proven_row_by_row(conn, lo, batch_size, seam), **options)


# -- the run ---------------------------------------------------------------------


def materialize(
    engine: Engine,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    deadline: Deadline | None = None,
    on_batch: Callable[[Progress], None] | None = None,
    progress_every_s: float = 5.0,
    between_read_and_write: Seam | None = None,
) -> MaterializeResult:
    """Materialize every materializable row, batch by batch, each proving its read-equivalence; see the module invariants.

    ``on_batch`` is called after each committed batch (tests use it to interrupt
    or interleave). On timeout, :class:`LockTimeout` says how far the run got;
    the committed batches stay and a rerun resumes. A broken proof raises
    :class:`ReadEquivalenceBroken` (exit 3): that batch rolled back, the earlier
    ones committed.

    ``between_read_and_write`` is a **test seam** (no product caller passes it):
    ``seam(conn, lo, hi)`` runs inside every attempt of each batch's transaction,
    on its connection, after the proof's read before the UPDATEs and before them;
    ``(lo, hi]`` is the range the UPDATEs and the proof cover. Tests plant a real
    change there with SQL (an interval changed, a stamped row edited) to show the
    proof catches it; what it writes is rolled back with the batch when the proof
    fails (and committed with the batch when it holds).
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
        try:
            batch = _batch_in_time(engine, lo, batch_size, deadline, run, between_read_and_write)
        except ReadEquivalenceBroken as exc:
            raise run.broken(exc) from exc
        if batch is None:
            break
        lo = batch.hi
        progress = run.record(batch)
        if on_batch is not None:
            on_batch(progress)
    return run.result(engine, batch_size)


def _batch_in_time(engine: Engine, lo: int | None, batch_size: int, deadline: Deadline, run: _Run, seam: Seam | None) -> _Batch | None:
    """:func:`_run_batch` while the deadline holds; a timeout says how far ``run`` got."""
    if deadline.expired():
        raise run.timed_out(deadline)
    try:
        return _run_batch(engine, lo, batch_size, deadline, seam)
    except LockTimeout as exc:
        if deadline.expired():
            raise run.timed_out(deadline) from exc
        raise


class _Run:
    """The running totals and decision digest of one :func:`materialize` call, and its log lines (progress every ``progress_every_s``)."""

    def __init__(self, total: int, progress_every_s: float):
        self.total = total
        self.progress_every_s = progress_every_s
        self.started = self.last_log = time.monotonic()
        self.set_true = self.set_false = self.batches = 0
        self.digest = DecidedDigest()

    def record(self, batch: _Batch) -> Progress:
        """Count the batch just committed and add its decisions to the digest; log it."""
        hi, t, f = batch.hi, batch.set_true, batch.set_false
        self.batches += 1
        self.set_true, self.set_false = self.set_true + t, self.set_false + f
        self.digest.add(batch.decided, batch.decided_true)
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
            log.debug("batch %d done: ChangeId %d..%d, %d TRUE, %d FALSE", self.batches, batch.lo + 1, hi, t, f)
        return progress

    def _so_far(self) -> str:
        return (
            f"{self.batches} earlier batch(es) committed and kept ({self.set_true + self.set_false} row(s) decided, "
            f"digest {self.digest.hex})"
        )

    def timed_out(self, deadline: Deadline) -> LockTimeout:
        return LockTimeout(
            f"timed out after {deadline.seconds:g}s with {self.set_true + self.set_false} of {self.total} rows materialized "
            f"(committed and kept); rerun materialize to finish the rest"
        )

    def broken(self, exc: ReadEquivalenceBroken) -> ReadEquivalenceBroken:
        """``exc`` with what the run committed before it and what to do."""
        broken = ReadEquivalenceBroken(
            f"read-equivalence broken {exc}. That batch was rolled back and the run stopped; {self._so_far()}. Find what "
            "changed these rows or intervals during materialization (nothing may edit stamped rows or intervals in stage 2), "
            "then rerun materialize",
            exc.rows,
        )
        broken.decided_rows, broken.decided_digest, broken.batches = self.digest.rows, self.digest.hex, self.batches
        return broken

    def result(self, engine: Engine, batch_size: int) -> MaterializeResult:
        """The run's result, with what is still materializable now (one count)."""
        seconds = time.monotonic() - self.started
        remaining = count_materializable(engine)
        log.info(
            "materialization done: %d TRUE, %d FALSE in %d batches, %.1fs; %d materializable rows remain; "
            "decided digest %s over %d row(s) (this run's decisions only)",
            self.set_true,
            self.set_false,
            self.batches,
            seconds,
            remaining,
            self.digest.hex,
            self.digest.rows,
        )
        return MaterializeResult(
            self.set_true,
            self.set_false,
            self.batches,
            self.total,
            remaining,
            seconds,
            batch_size,
            self.digest.rows,
            self.digest.hex,
        )

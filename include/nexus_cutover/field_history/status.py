"""``status``: where a tenant stands on Field History eligibility (read-only).

Counts come from one scan of ``_System_AuditFieldChange`` with the predicates of
:mod:`.readers` (no second copy of the rule); switches from
:mod:`.settings`; producers from :mod:`.inventory`.

The read comparison (:func:`compare_readers`) is the evidence stage 3 switches
on: the whole table, in chunks of consecutive ``ChangeId`` values (keyset), one
aggregate statement per chunk over the rows either reader accepts, counting
those the boolean-only reader accepts and those the compatibility reader
rejects. From the three counts follow both readers' accepted counts and the
rows only one of them accepts, exactly: the comparison is equal exactly when no
row's read result would flip. :class:`Fingerprint` is the one set fingerprint,
shared with the per-batch proof of :mod:`.materialize`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, Connection, Engine, and_, case, func, literal, not_, or_, select
from sqlalchemy.sql import Select

from .. import catalog, tx
from ..db import translate_errors
from . import readers
from .inventory import OutboxCount, ProducerProcess, outbox_counts, producer_processes
from .prerequisites import require_eligibility_column
from .settings import FieldHistorySettings, read_settings

Audit = catalog.AuditFieldChange


@dataclass(frozen=True)
class RowCounts:
    total: int
    null_rows: int
    eligible_null_rows: int
    materializable_rows: int
    null_without_sequence: int
    null_without_field_id: int
    true_rows: int
    false_rows: int

    def as_json(self) -> dict:
        return {
            "total_rows": self.total,
            "null_rows": self.null_rows,
            "eligible_null_rows": self.eligible_null_rows,
            "materializable_rows": self.materializable_rows,
            "null_rows_without_sequence": self.null_without_sequence,
            "null_rows_without_field_id": self.null_without_field_id,
            "rows_by_value": {"true": self.true_rows, "false": self.false_rows, "null": self.null_rows},
        }

    def text(self) -> str:
        """The counts in one line, as ``field-history-eligibility status`` and the status view both show them."""
        return (f"{self.total} rows: {self.true_rows} TRUE, {self.false_rows} FALSE, {self.null_rows} NULL "
                f"({self.eligible_null_rows} eligible, {self.materializable_rows} materializable, "
                f"{self.null_without_sequence} without sequence, {self.null_without_field_id} without FieldId)")


def _count_if(condition):
    return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)


def row_counts(conn: Connection) -> RowCounts:
    """Every count in one pass over the audit table."""
    stmt = select(
        func.count(),
        _count_if(readers.is_null()),
        _count_if(readers.eligible_null()),
        _count_if(readers.materializable()),
        _count_if(readers.is_null() & Audit.c.HistorySequence.is_(None)),
        _count_if(readers.is_null() & Audit.c.FieldId.is_(None)),
        _count_if(readers.stamped_true()),
        _count_if(readers.stamped_false()),
    ).select_from(Audit)
    return RowCounts(*(int(v) for v in conn.execute(stmt).one()))


@dataclass
class FieldHistoryStatus:
    rows: RowCounts
    settings: FieldHistorySettings
    processes: list[ProducerProcess] = field(default_factory=list)
    outbox: list[OutboxCount] = field(default_factory=list)

    @property
    def eligible_null_rows(self) -> int:
        return self.rows.eligible_null_rows

    def as_json(self) -> dict:
        return {
            **self.rows.as_json(),
            **self.settings.as_json(),
            "producers": {
                "processes": [p.as_json() for p in self.processes],
                "outbox": [c.as_json() for c in self.outbox],
            },
        }


def read_status(engine: Engine, namespace: str | None = None) -> FieldHistoryStatus:
    """Counts, switches and producer inventory, read in one snapshot where the backend gives one."""
    with translate_errors("reading the Field History status"):
        require_eligibility_column(engine)
    return tx.read(
        engine,
        lambda conn: FieldHistoryStatus(row_counts(conn), read_settings(conn), producer_processes(conn, namespace), outbox_counts(conn)),
        what="reading the Field History status",
    )


# -- set fingerprints ----------------------------------------------------------

#: Two primes below 2**31: every term below is < 2**31, a product of two terms fits a
#: signed BIGINT, and a sum over a batch is an exact integer on MariaDB, TiDB and SQLite.
_P1 = 2_147_483_647
_P2 = 2_147_483_629


def _terms(change_id: ColumnElement) -> tuple[ColumnElement, ColumnElement]:
    """The two per-row terms of a fingerprint in SQL: ``id mod P1`` and ``(id mod P2)^2 mod P2``."""
    low = change_id % _P2
    return change_id % _P1, (low * low) % _P2


@dataclass(frozen=True)
class Fingerprint:
    """An order-independent fingerprint of a set of ChangeIds: ``(count, sum of id mod P1, sum of (id mod P2)^2 mod P2)``.

    The same definition in SQL (:func:`fingerprint_columns`, for non-negative
    ids) and in Python (:meth:`of_ids`). Equal sets have equal fingerprints; for
    ids below 2**31 the first sum is the sum of the ids, so two different sets
    of the same size collide only if they also have the same sum and the same
    sum of squares (mod P2): never for sets that differ in one or two rows each
    way. Fingerprints of disjoint sets add; a subset's subtracts.
    """

    rows: int = 0
    sum_1: int = 0
    sum_2: int = 0

    def __add__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(self.rows + other.rows, self.sum_1 + other.sum_1, self.sum_2 + other.sum_2)

    def __sub__(self, other: Fingerprint) -> Fingerprint:
        return Fingerprint(self.rows - other.rows, self.sum_1 - other.sum_1, self.sum_2 - other.sum_2)

    @classmethod
    def of_ids(cls, change_ids) -> Fingerprint:
        ids = [int(c) for c in change_ids]
        return cls(len(ids), sum(c % _P1 for c in ids), sum((c % _P2) * (c % _P2) % _P2 for c in ids))

    @property
    def hex(self) -> str:
        """A short printable form: count, then the two sums in hex."""
        return f"{self.rows}:{self.sum_1:x}:{self.sum_2:x}"


def fingerprint_columns(change_id: ColumnElement, weight: ColumnElement | None = None) -> list[ColumnElement]:
    """Aggregate columns (count, sum 1, sum 2) of the rows selected, or of those whose ``weight`` (0/1) is 1."""
    t1, t2 = _terms(change_id)
    if weight is None:
        return [func.count(), func.coalesce(func.sum(t1), 0), func.coalesce(func.sum(t2), 0)]
    return [func.coalesce(func.sum(weight), 0), func.coalesce(func.sum(weight * t1), 0), func.coalesce(func.sum(weight * t2), 0)]


def fingerprint_of(values) -> Fingerprint:
    """A :class:`Fingerprint` from the three values of :func:`fingerprint_columns` (as the driver returns them)."""
    return Fingerprint(*(int(v) for v in values))


def in_range(lo: int | None, hi: int) -> ColumnElement[bool]:
    """``lo < ChangeId <= hi`` (``lo`` None: from the first row), a primary-key range."""
    upper = Audit.c.ChangeId <= hi
    return upper if lo is None else and_(Audit.c.ChangeId > lo, upper)


def as_flag(condition: ColumnElement[bool]) -> ColumnElement[int]:
    """1 where ``condition`` holds, else 0 (the readers never evaluate to NULL)."""
    return case((condition, literal(1)), else_=literal(0))


def count_if(condition: ColumnElement[bool]) -> ColumnElement[int]:
    """How many of the selected rows satisfy ``condition`` (an integer count, cheaper than a SUM)."""
    return func.count(case((condition, literal(1))))


def value_text(value) -> str:
    return "NULL" if value is None else ("TRUE" if value else "FALSE")


# -- the whole-table read comparison (stage 3) ----------------------------------

#: Rows either reader accepts per chunk (the target); a chunk is a range of that many
#: ChangeId values at first, then adapts (x1/4..x4 per chunk) to the density found.
#: Chunks bound a statement, not a transaction (the comparison is one read, and stage 3
#: runs it under the settings row's lock): each costs a statement's fixed work, so they
#: are large. Measured on MariaDB 10.11 (docs/performance.md): 20,000 -> 200,000 took the
#: comparison from 1.86x to 1.63x one full compatibility scan at 1M rows, 1.92x -> 1.49x at 4M.
DEFAULT_CHUNK_ROWS = 200_000
#: A chunk never spans more than this many times DEFAULT_CHUNK_ROWS ChangeId values ...
MAX_WIDTH_FACTOR = 64
#: ... and the target doubles after this many chunks, so one comparison stays far below
#: TiDB's 5,000 statements per transaction whatever the table's size.
CHUNKS_PER_DOUBLING = 1000
EXAMPLES = 10


@dataclass
class ReadComparison:
    """Both readers over the whole table: what each accepts, and the rows whose read result would flip.

    ``compat_only`` rows are accepted by the compatibility reader only (with the
    readers of :mod:`.readers` these are exactly the eligible NULL rows);
    ``boolean_only`` rows by the boolean-only reader only (none, while the
    readers keep their definitions). ``differences`` lists the first few of both.
    Rows neither reader accepts are not counted (they cannot flip).
    """

    chunks: int = 0
    first_change_id: int | None = None
    last_change_id: int | None = None
    accepted_by_either: int = 0
    compat_accepted: int = 0
    boolean_accepted: int = 0
    differences: list[dict] = field(default_factory=list)

    @property
    def compat_only(self) -> int:
        return self.accepted_by_either - self.boolean_accepted

    @property
    def boolean_only(self) -> int:
        return self.accepted_by_either - self.compat_accepted

    @property
    def flips(self) -> int:
        return self.compat_only + self.boolean_only

    @property
    def equal(self) -> bool:
        """No row's read result would flip: both readers accept exactly the same rows."""
        return self.flips == 0

    def as_json(self) -> dict:
        return {
            "equal": self.equal,
            "chunks": self.chunks,
            "change_ids": [self.first_change_id, self.last_change_id],
            "rows_accepted_by_either": self.accepted_by_either,
            "compat_accepted": self.compat_accepted,
            "boolean_only_accepted": self.boolean_accepted,
            "rows_only_compat_accepts": self.compat_only,
            "rows_only_boolean_only_accepts": self.boolean_only,
            "differences": self.differences,
        }

    def render(self) -> str:
        return render_comparison(self.as_json())


def render_comparison(d: dict) -> str:
    """The lines a person reads, from :meth:`ReadComparison.as_json` (also what a report carries)."""
    flips = d["rows_only_compat_accepts"] + d["rows_only_boolean_only_accepts"]
    first, last = d["change_ids"]
    span = f"ChangeIds {first}..{last}" if first is not None else "an empty table"
    lines = [
        f"read comparison: {'EQUAL' if d['equal'] else 'DIFFERENT'} over {span} in {d['chunks']} chunk(s): "
        f"the compatibility reader accepts {d['compat_accepted']} row(s), the boolean-only reader "
        f"{d['boolean_only_accepted']}; {flips} row(s) would read differently "
        f"({d['rows_only_compat_accepts']} only the compatibility reader accepts, "
        f"{d['rows_only_boolean_only_accepts']} only the boolean-only reader)"
    ]
    lines += [f"  ChangeId {x['change_id']}: {x['why']}" for x in d["differences"]]
    if flips > len(d["differences"]):
        lines.append(f"  ... and {flips - len(d['differences'])} more")
    return "\n".join(lines)


def chunk_counts(lo: int, hi: int) -> Select:
    """One chunk: among the rows of ``(lo, hi]`` either reader accepts, how many, how many the boolean-only reader
    accepts, and how many of those the compatibility reader rejects (a primary-key range). The compatibility
    reader runs once per row (its interval probe only for NULL rows); the boolean-only reader comes first inside the
    counts, so the probe is not repeated there. (Measured: the other order in WHERE costs ~40% more on MariaDB.)"""
    compat, boolean = readers.compat_reader(), readers.boolean_only_reader()
    return (
        select(func.count(), count_if(boolean), count_if(and_(boolean, not_(compat))))
        .select_from(Audit)
        .where(in_range(lo, hi), or_(compat, boolean))
    )


def _flips(compat: ColumnElement[bool], boolean: ColumnElement[bool]) -> ColumnElement[bool]:
    return or_(and_(compat, not_(boolean)), and_(boolean, not_(compat)))


def differing_rows(lo: int | None, hi: int, limit: int) -> Select:
    """The rows of ``(lo, hi]`` whose two readers disagree, with what explains it (read only on a difference)."""
    compat = readers.compat_reader()
    return (
        select(Audit.c.ChangeId, Audit.c.FieldId, Audit.c.HistorySequence, readers.eligible_column(), as_flag(compat))
        .where(in_range(lo, hi), _flips(compat, readers.boolean_only_reader()))
        .order_by(Audit.c.ChangeId)
        .limit(limit)
    )


def _difference(row) -> dict:
    cid, fid, seq, value, compat = row
    if compat:
        why = (
            f"{value_text(value)}, and an interval of field {fid} proves sequence {seq}: the compatibility reader accepts it, "
            "the boolean-only reader would not (an eligible NULL row: run stage 2 materialization)"
        )
    else:
        why = f"{value_text(value)}: the boolean-only reader would accept it, the compatibility reader does not"
    return {
        "change_id": cid,
        "field_id": fid,
        "history_sequence": seq,
        "value": value_text(value),
        "compat": bool(compat),
        "boolean_only": not compat,
        "why": why,
    }


def _chunks(conn: Connection, chunk_rows: int) -> Iterator[tuple[int, int, tuple]]:
    """``(lo, hi, counts)`` per chunk over the whole table, until no row is left above (rows appended meanwhile too)."""
    first, top = conn.execute(select(func.min(Audit.c.ChangeId), func.max(Audit.c.ChangeId))).one()
    if first is None:
        return
    lo, width, n = int(first) - 1, chunk_rows, 0
    while True:
        if lo >= top:
            top = conn.scalar(select(func.max(Audit.c.ChangeId)))
            if top is None or lo >= top:
                return
        target = chunk_rows * 2 ** (n // CHUNKS_PER_DOUBLING)
        hi = lo + width
        counts = tuple(int(v) for v in conn.execute(chunk_counts(lo, hi)).one())
        yield lo, hi, counts
        n += 1
        lo = hi
        if counts[0]:
            width = max(width // 4, min(width * 4, width * target // counts[0]))
        else:  # nothing accepted here: skip to the next row, and widen
            following = conn.scalar(select(func.min(Audit.c.ChangeId)).where(Audit.c.ChangeId > hi))
            lo = hi if following is None else max(hi, int(following) - 1)
            width *= 4
        width = max(1, min(width, target * MAX_WIDTH_FACTOR))


def compare_readers(
    conn: Connection,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    examples: int = EXAMPLES,
    on_chunk: Callable[[int], None] | None = None,
) -> ReadComparison:
    """Both readers over the whole table on ``conn`` (the caller's transaction); see :class:`ReadComparison`.

    One aggregate statement per chunk (plus a primary-key seek past a range
    where neither reader accepts anything); only a chunk with a difference is
    read again, for its first differing rows (at most ``examples`` in all).
    ``on_chunk(n)`` runs after the n-th chunk (a test seam: stage 3's interleaving tests).
    """
    out = ReadComparison()
    for lo, hi, (either, boolean, compat_rejects) in _chunks(conn, chunk_rows):
        if out.first_change_id is None:
            out.first_change_id = lo + 1
        out.last_change_id = hi
        out.chunks += 1
        out.accepted_by_either += either
        out.boolean_accepted += boolean
        out.compat_accepted += either - compat_rejects
        if (either - boolean or compat_rejects) and len(out.differences) < examples:
            found = conn.execute(differing_rows(lo, hi, examples - len(out.differences))).all()
            out.differences += [_difference(r) for r in found]
        if on_chunk is not None:
            on_chunk(out.chunks)
    if out.last_change_id is not None:
        out.last_change_id = min(out.last_change_id, int(conn.scalar(select(func.max(Audit.c.ChangeId)))))
    return out


def read_comparison(engine: Engine, *, chunk_rows: int = DEFAULT_CHUNK_ROWS) -> ReadComparison:
    """:func:`compare_readers` in one read-only transaction (``stage3 -check``): nothing is written or switched."""
    with translate_errors("comparing the Field History readers"):
        require_eligibility_column(engine)
    return tx.read(engine, lambda conn: compare_readers(conn, chunk_rows=chunk_rows), what="comparing the Field History readers")

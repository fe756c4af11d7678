"""What the history digest digests: which rows are history, and the figures their chunks fold into.

What is history (of namespace NS; contract, "Ordinary work"): projection history.

* ``_System_Event`` rows of NS that are projection inputs (a projection
  ``WorkType``: :func:`~nexus_cutover.identity.is_projection_input`) whose
  ``EnqueueOrdinal`` is at or below their pack's cutoff (``LegacyMaxOrdinal``;
  a pack without a checkpoint yet: every such row), and
* ``_System_WorkItem`` rows of NS with ``WorkClass = 'projection'`` and
  ``InputStartOrdinal IS NULL`` (old projection work).

What the range runtime admits after the cutoff (Events above it, range
WorkItems) is not history and may change, like the selected Event of range work
the new host claims, which is above the cutoff. Ordinary work (ordinary Events
and ``WorkClass = 'ordinary'`` WorkItems) is not history either: the new runtime
processes it, so it changes and appears at any time after the old writers
stopped. Which rows are history is decided by their content, never by their id
(TiDB ids are not ordered).

The definition (one, for every server and for SQLite, where Python computes it;
:class:`_Shape` spells it in SQL and in Python, :class:`_Summer` is the Python
copy of the SQL aggregates):

* Row hash: ``CRC32`` of the UTF-8 text ``CONCAT_WS(US, v1, ..., vn, nullmask)``:
  every catalog column in catalog order as MySQL renders it (integers in
  decimal, ``DATETIME(6)`` as ``YYYY-MM-DD HH:MM:SS.ffffff``, text as UTF-8),
  NULLs skipped and told apart by ``nullmask`` (one ``0``/``1`` per nullable column).
* Chunks: keyset over the primary key, ``chunk_rows`` history rows each (at most
  :data:`MAX_CHUNK_ROWS`: the widths of the packed slices rely on it); chunk
  *i* covers ``(hi[i-1], hi[i]]``, the first from minus infinity.
  Per chunk, in the server: the row count, ``BIT_XOR`` of the row hashes,
  ``BIT_XOR`` of the keys, ``SUM`` of the row hashes, ``SUM(hash * (key & 2^31-1))``
  (with the first three, these locate one differing row of a chunk: its key and
  old hash), and per column a 16-bit fingerprint of ``BIT_XOR`` of its values (or
  their ``CRC32``) and its non-NULL count (which columns differ: exact for a named
  row; for a range, a column changed the same way in an even number of its rows
  can cancel out of the list).
* Slices: each chunk is also summarized in :data:`SLICES` slices, slice
  ``s(key)`` = the key's low 63 bits modulo 17 (:func:`slice_of`): consecutive
  keys fall in different slices (so do keys a power of two apart), so rows
  changed together (a batch, a run of ids) are told apart. Each slice carries six of the
  figures (not ``hi``) over its own rows, packed in one string per chunk; the chunk's figures are its slices'
  folded together (XOR, sums).

:data:`DIGEST_VERSION` names this definition: a digest taken by another cannot be verified by it.
"""

from __future__ import annotations

import datetime as dt
import zlib
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    Connection,
    DateTime,
    Engine,
    Integer,
    String,
    Table,
    case,
    cast,
    func,
    inspect,
    select,
)
from sqlalchemy.dialects import mysql
from sqlalchemy.sql import ColumnElement

from ... import catalog
from ...errors import MissingSchema
from ...identity import is_projection_input

#: 2: projection history only (contract, "Ordinary work"), and slices in every chunk. A version-1 digest counted
#: ordinary work as history: it cannot be verified by this definition and is refused (take a new one).
DIGEST_VERSION = 2
DEFAULT_CHUNK_ROWS = 5000
#: Slices per chunk (:func:`slice_of`): a prime, so no stride of ids but its multiples falls in one slice.
SLICES = 17
MAX_CHUNK_ROWS = 10_000
SEPARATOR = "\x1f"  # ASCII unit separator between column values
MASK31 = (1 << 31) - 1
MASK63 = (1 << 63) - 1
MASK32 = (1 << 32) - 1
MASK64 = (1 << 64) - 1
_FOLD_VALUE, _FOLD_COUNT = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F

Event, WorkItem, Protocol, PackInstall = (
    catalog.Event, catalog.WorkItem, catalog.ConnectorProjectionProtocol, catalog.PackInstall)
HISTORY_TABLES: tuple[Table, ...] = (Event, WorkItem)


def _pk(table: Table) -> Column:
    (pk,) = table.primary_key.columns
    return pk


def _kind(col: Column) -> str:
    if isinstance(col.type, Integer | BigInteger):
        return "int"
    if isinstance(col.type, DateTime):
        return "time"
    return "text"


# -- which rows are history -----------------------------------------------------------------


def pack_cutoffs(conn: Connection, namespace: str) -> dict[str, int]:
    """``LegacyMaxOrdinal`` of every checkpointed pack of ``namespace`` (all incarnations)."""
    rows = conn.execute(
        select(Protocol.c.PackInstallId, Protocol.c.LegacyMaxOrdinal)
        .join(PackInstall, PackInstall.c.PackInstallId == Protocol.c.PackInstallId)
        .where(PackInstall.c.Namespace == namespace)
    )
    return {p: int(o) for p, o in rows}


def history_rows(table: Table, namespace: str, cutoffs: dict[str, int]) -> list[ColumnElement[bool]]:
    """The WHERE terms that select ``table``'s history rows of ``namespace`` (module docstring)."""
    terms: list[ColumnElement[bool]] = [table.c.Namespace == namespace]
    if table is WorkItem:
        terms += [WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION, WorkItem.c.InputStartOrdinal.is_(None)]
        return terms
    terms.append(is_projection_input(Event))
    if cutoffs:
        limit = case(*((Event.c.PackInstallId == p, o) for p, o in sorted(cutoffs.items())), else_=MASK64 >> 1)
        terms.append(Event.c.EnqueueOrdinal <= limit)
    return terms


UTF8_CHARSETS = ("utf8mb4", "utf8mb3", "utf8", "ascii")  # stored bytes already are the UTF-8 text


def require_columns(engine: Engine, tables: Iterable[tuple[Table, Sequence[str]]]) -> dict[str, set[str]]:
    """MissingSchema naming every ``table.column`` the digest reads that the live table lacks.

    Returns, per table, its text columns stored in a charset other than UTF-8
    (MySQL-protocol servers only): only those are converted before hashing, so
    the hash is of the UTF-8 text everywhere at no cost where it already is.
    """
    live = inspect(engine)
    missing: list[str] = []
    convert: dict[str, set[str]] = {}
    for table, names in tables:
        if not live.has_table(table.name):
            missing.append(table.name)
            continue
        columns = {c["name"]: c for c in live.get_columns(table.name)}
        missing += [f"{table.name}.{n}" for n in names if n not in columns]
        if engine.dialect.name in ("mysql", "mariadb"):
            default = live.get_table_options(table.name).get("mysql_default charset", "utf8mb4")
            convert[table.name] = {n for n in names if n in columns and _charset(columns[n]["type"], default) not in UTF8_CHARSETS}
    if missing:
        raise MissingSchema(missing, "the history digest reads every column of _System_Event and _System_WorkItem; "
                                     "run apply_schema (nexus-cutover apply-schema) first")
    return convert


def _charset(sql_type: Any, table_default: str) -> str:
    """The charset a reflected column stores its text in (the table's default unless the column says otherwise)."""
    if not isinstance(sql_type, String):
        return "utf8mb4"  # not text
    charset = getattr(sql_type, "charset", None)
    collation = getattr(sql_type, "collation", None)
    return (charset or (collation.split("_", 1)[0] if collation else table_default)).lower()


# -- one chunk ------------------------------------------------------------------------------


#: Hex digits of a packed slice's figures: rows (4), CRC (8), key XOR (16), hash sum (12: at most 10,000 x 2^32),
#: weighted sum (20: at most 10,000 x 2^32 x 2^31); then 4 per column (its fingerprint).
_SLICE_WIDTHS = (4, 8, 16, 12, 20)
_SLICE_FIXED = sum(_SLICE_WIDTHS)


@dataclass(frozen=True, slots=True)
class Chunk:
    """One chunk's (or one slice's) summary; ``hi`` is its greatest key (None: an empty table, or a slice).

    ``slices``: the chunk's :data:`SLICES` slices, packed in one hexadecimal string (:func:`pack_slices`; fixed
    widths, slice by slice), read with :meth:`slice_chunks`. Empty for a slice itself, and for a verification's
    own look at a chunk, which is not sliced. Packed, a digest of 2.4M rows holds ~1 MB of slices as 480
    strings, not 7,680 objects, and its JSON (the XCom) stays flat.
    """

    hi: int | None
    rows: int
    crc: int
    key_xor: int
    hash_sum: int
    weighted_sum: int
    columns: str  # 4 hex digits per column: the per-column fingerprints
    slices: str = ""

    def figures(self) -> list:
        return [self.hi, self.rows, self.crc, self.key_xor, self.hash_sum, self.weighted_sum, self.columns]

    def as_list(self) -> list:
        """The chunk's seven figures, then (when sliced) its packed slices."""
        return self.figures() + ([self.slices] if self.slices else [])

    def slice_chunks(self) -> tuple[Chunk, ...]:
        """The :data:`SLICES` slices, unpacked (empty when the chunk is not sliced)."""
        if not self.slices:
            return ()
        width = len(self.slices) // SLICES
        return tuple(_unpack_slice(self.slices[j * width:(j + 1) * width]) for j in range(SLICES))

    @classmethod
    def from_list(cls, raw: Sequence) -> Chunk:
        hi, rows, crc, key_xor, hash_sum, weighted_sum, columns, *rest = raw
        if len(rest) > 1:
            raise ValueError(f"a chunk has 7 figures and its slices, got {len(raw)} items")
        chunk = cls(None if hi is None else int(hi), int(rows), int(crc), int(key_xor), int(hash_sum),
                    int(weighted_sum), str(columns), str(rest[0]) if rest else "")
        if chunk.slices:
            if len(chunk.slices) != SLICES * (_SLICE_FIXED + len(chunk.columns)):
                raise ValueError(f"a chunk's slices are {len(chunk.slices)} hex digits, not {SLICES} of its width")
            if sum(sl.rows for sl in chunk.slice_chunks()) != chunk.rows:
                raise ValueError("a chunk's slices do not add up to it")
        return chunk

    def same_content(self, other: Chunk) -> bool:
        return self.figures()[1:] == other.figures()[1:]


def pack_slices(slices: Sequence[Chunk]) -> str:
    """The :data:`SLICES` slices, packed: each slice's five figures in fixed-width hex, then its fingerprints."""
    out = []
    for sl in slices:
        for value, width in zip((sl.rows, sl.crc, sl.key_xor & MASK64, sl.hash_sum, sl.weighted_sum), _SLICE_WIDTHS,
                                strict=True):
            if value < 0 or value >= 1 << (4 * width):
                raise ValueError(f"a slice figure {value} does not fit {width} hex digits")
            out.append(f"{value:0{width}x}")
        out.append(sl.columns)
    return "".join(out)


def _unpack_slice(packed: str) -> Chunk:
    values, at = [], 0
    for width in _SLICE_WIDTHS:
        values.append(int(packed[at:at + width], 16))
        at += width
    rows, crc, key_xor, hash_sum, weighted = values
    return Chunk(None, rows, crc, key_xor, hash_sum, weighted, packed[at:])


def slice_of(key: int) -> int:
    """The slice of ``key``: its low 63 bits modulo :data:`SLICES` (never negative, whatever the key's sign).

    The SQL copy is :meth:`_Shape.slice_sql`. One ``MOD`` per row: a key-digit fold was measured twice as costly.
    """
    return (key & MASK63) % SLICES


def _fold(value_xor: int, count: int) -> int:
    return (((value_xor & MASK64) * _FOLD_VALUE + count * _FOLD_COUNT) & MASK64) >> 48


def _fingerprints(xors: Sequence[int], counts: Sequence[int]) -> str:
    return "".join(f"{_fold(x, n):04x}" for x, n in zip(xors, counts, strict=True))


class _Summer:
    """The per-chunk (or per-slice) aggregates over (key, row hash, column values), the Python copy of the SQL.

    Holds the raw column ``BIT_XOR`` values and non-NULL counts, so summers merge (a chunk is its slices
    merged) before the fingerprints are folded. (A ``SUM`` would not let an even number of rows changed from
    one value to the same other one cancel out of a range's column list, but measured ~15-20% slower per chunk;
    a named row's columns are exact either way.)
    """

    def __init__(self, ncols: int):
        self.rows = self.crc = self.key_xor = self.hash_sum = self.weighted_sum = 0
        self.hi: int | None = None
        self.xors = [0] * ncols
        self.counts = [0] * ncols

    @classmethod
    def of_sql(cls, hi, rows, crc, key_xor, hash_sum, weighted, xors: Sequence, counts: Sequence[int]) -> _Summer:
        summer = cls(len(xors))
        summer.hi = None if hi is None else int(hi)
        summer.rows, summer.crc, summer.key_xor = int(rows), int(crc or 0), int(key_xor or 0)
        summer.hash_sum, summer.weighted_sum = int(hash_sum or 0), int(weighted or 0)
        summer.xors = [int(x or 0) for x in xors]
        summer.counts = [int(n) for n in counts]
        return summer

    def merge(self, other: _Summer) -> None:
        self.rows += other.rows
        if other.hi is not None:
            self.hi = other.hi if self.hi is None else max(self.hi, other.hi)
        self.crc ^= other.crc
        self.key_xor ^= other.key_xor
        self.hash_sum += other.hash_sum
        self.weighted_sum += other.weighted_sum
        self.xors = [a ^ b for a, b in zip(self.xors, other.xors, strict=True)]
        self.counts = [a + b for a, b in zip(self.counts, other.counts, strict=True)]

    def add(self, key: int, row_hash: int, values: Sequence[int | None]) -> None:
        self.rows += 1
        self.hi = key if self.hi is None else max(self.hi, key)
        self.crc ^= row_hash
        self.key_xor ^= key & MASK64
        self.hash_sum += row_hash
        self.weighted_sum += row_hash * (key & MASK31)
        for i, v in enumerate(values):
            if v is not None:
                self.xors[i] ^= v & MASK64
                self.counts[i] += 1

    def chunk(self, slices: Sequence[_Summer] = ()) -> Chunk:
        return Chunk(self.hi, self.rows, self.crc, self.key_xor & MASK64, self.hash_sum, self.weighted_sum,
                     _fingerprints(self.xors, self.counts), pack_slices([sl.chunk() for sl in slices]) if slices else "")


def _merged(ncols: int, parts: Sequence[_Summer]) -> _Summer:
    total = _Summer(ncols)
    for part in parts:
        total.merge(part)
    return total


class _Shape:
    """How one table's rows are hashed: its columns (catalog order) and both spellings of the definition."""

    def __init__(self, table: Table, names: Sequence[str] | None = None, convert: Iterable[str] = ()):
        self.table = table
        self.convert = set(convert)
        self.pk = _pk(table)
        self.columns = [table.c[n] for n in names] if names is not None else list(table.columns)
        self.kinds = [_kind(c) for c in self.columns]
        self.nullable = [i for i, c in enumerate(self.columns) if c.nullable]

    # SQL (MySQL, MariaDB, TiDB) ------------------------------------------------------------

    def _text(self, i: int) -> ColumnElement:
        c = self.columns[i]
        return cast(c, mysql.CHAR(charset="utf8mb4")) if c.name in self.convert else c

    def _value(self, i: int) -> ColumnElement:
        return self.columns[i] if self.kinds[i] == "int" else func.crc32(self._text(i))

    def row_hash_sql(self) -> ColumnElement:
        mask = func.concat(*(func.isnull(self.columns[i]) for i in self.nullable)) if self.nullable else ""
        return func.crc32(func.concat_ws(SEPARATOR, *(self._text(i) for i in range(len(self.columns))), mask))

    def per_row(self, where: Sequence[ColumnElement[bool]], limit: int):
        """The materialized per-row subquery: key, row hash, and each column's value to fingerprint."""
        return (
            select(self.pk.label("k"), self.row_hash_sql().label("h"),
                   *(self._value(i).label(f"c{i}") for i in range(len(self.columns))))
            .where(*where).order_by(self.pk).limit(limit).subquery("r")
        )

    def _aggregates(self, r) -> list[ColumnElement]:
        """The seven figures' aggregates over per-row subquery ``r`` (the column ones raw: folded in Python)."""
        cols = [r.c[f"c{i}"] for i in range(len(self.columns))]
        return [
            func.max(r.c.k), func.count(), func.bit_xor(r.c.h), func.bit_xor(r.c.k), func.sum(r.c.h),
            func.sum(r.c.h * r.c.k.op("&")(MASK31)),
            *(func.bit_xor(c) for c in cols), *(func.count(cols[i]) for i in self.nullable),
        ]

    def chunk_sql(self, where: Sequence[ColumnElement[bool]], limit: int):
        """One row: the figures of every row ``where`` selects (up to ``limit``), unsliced (the verification's look)."""
        return select(*self._aggregates(self.per_row(where, limit)))

    @staticmethod
    def slice_sql(key: ColumnElement) -> ColumnElement:
        """:func:`slice_of` in SQL (MySQL dialect: a bit operation on BIGINT is unsigned 64-bit, then MOD)."""
        return key.op("&")(MASK63) % SLICES

    def sliced_sql(self, where: Sequence[ColumnElement[bool]], limit: int):
        """``(slice, figures...)`` per non-empty slice of the rows ``where`` selects (up to ``limit``, key order):
        the digest's chunk statement, and a verification's second look at a differing chunk."""
        r = self.per_row(where, limit)
        number = self.slice_sql(r.c.k).label("s")
        return select(number, *self._aggregates(r)).group_by(number)

    def summer_of_sql_row(self, row: Sequence) -> _Summer:
        """A :class:`_Summer` from one row of :meth:`_aggregates`."""
        hi, rows, crc, key_xor, hash_sum, weighted, *rest = row
        n = len(self.columns)
        xors, nonnull = rest[:n], dict(zip(self.nullable, rest[n:], strict=True))
        return _Summer.of_sql(hi, rows, crc, key_xor, hash_sum, weighted, xors, [int(nonnull.get(i, rows)) for i in range(n)])

    # Python (SQLite) ------------------------------------------------------------------------

    def _render(self, i: int, v: Any) -> str:
        if self.kinds[i] == "time":
            return v.strftime("%Y-%m-%d %H:%M:%S.%f") if isinstance(v, dt.datetime) else str(v)
        return str(v)

    def hash_values(self, values: Sequence[Any]) -> tuple[int, list[int | None]]:
        """(row hash, per-column values to fingerprint) of one row's column values, in Python."""
        texts = [None if v is None else self._render(i, v) for i, v in enumerate(values)]
        mask = "".join("1" if values[i] is None else "0" for i in self.nullable)
        row_hash = zlib.crc32(SEPARATOR.join([t for t in texts if t is not None] + [mask]).encode())
        fps: list[int | None] = []
        for i, (v, t) in enumerate(zip(values, texts, strict=True)):
            fps.append(None if v is None else (int(v) if self.kinds[i] == "int" else zlib.crc32(t.encode())))
        return row_hash, fps

    def rows_sql(self, where: Sequence[ColumnElement[bool]], limit: int | None = None):
        stmt = select(*self.columns).where(*where).order_by(self.pk)
        return stmt.limit(limit) if limit is not None else stmt

    def key_index(self) -> int:
        return self.columns.index(self.pk)


def row_hash(table: Table, convert: Iterable[str] = ()) -> ColumnElement:
    """The row hash of ``table`` as a server expression (MySQL dialect): what every chunk folds."""
    return _Shape(table, convert=convert).row_hash_sql()

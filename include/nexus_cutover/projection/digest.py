"""The history digest: proof, per tenant and inside the run, that the cutover changed no historical row.

Taken after the writer-stop confirmation (old writers stopped, the fence armed:
history can no longer change) and verified again at the end of the run, after
the new host has worked and admission resumed. Read only, always.

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

The definition (one, for every server and for SQLite, where Python computes it):

* Row hash: ``CRC32`` of the UTF-8 text ``CONCAT_WS(US, v1, ..., vn, nullmask)``:
  every catalog column in catalog order as MySQL renders it (integers in
  decimal, ``DATETIME(6)`` as ``YYYY-MM-DD HH:MM:SS.ffffff``, text as UTF-8),
  NULLs skipped and told apart by ``nullmask`` (one ``0``/``1`` per nullable column).
* Chunks: keyset over the primary key, ``chunk_rows`` history rows each; chunk
  *i* covers ``(hi[i-1], hi[i]]``, the first from minus infinity and, when
  verified, the last to plus infinity (an extra row anywhere is inside one).
  Read on several connections, the keys' span is first cut into equal key
  ranges, one keyset walk each (:func:`key_ranges`): each range's last chunk
  may hold fewer rows; the chunks still follow each other in key order.
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
  folded together (XOR, sums), so the chunk statement only groups by slice: no
  second pass, no window function. A differing chunk is narrowed down to its
  differing slices (Spirit/VDiff style): a slice with one differing row names it
  (its key, and the columns that differ). What remains (slices with several
  differing rows) is reported as the chunk's key range with its row counts then
  and now. At most :data:`MAX_NAMED_ROWS` rows are named per verification; past
  that, differing chunks are reported as key ranges with their row counts,
  without narrowing them.
* The short hash: the first 16 hex digits of a SHA-256 over the canonical JSON
  of the version, namespace, tables and their chunks (slices included), fed chunk
  by chunk.

Each chunk is one statement in its own short read transaction (TiDB: a bounded
read, far from the statement caps); memory holds one chunk's summary per
chunk, never rows (SQLite: one chunk's rows). A digest interrupted by a timeout
or a lost connection has written nothing: run it again.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import functools
import hashlib
import json
import logging
import time
import zlib
from collections.abc import Callable, Iterable, Iterator, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass, field
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

from .. import catalog, tx
from ..clock import utcnow
from ..db import Deadline
from ..errors import BadInput, MissingSchema
from ..identity import is_projection_input
from .digest_limits import MAX_DIGEST_CONNECTIONS

log = logging.getLogger(__name__)

#: 2: projection history only (contract, "Ordinary work"), and slices in every chunk. A version-1 digest counted
#: ordinary work as history: it cannot be verified by this definition and is refused (take a new one).
DIGEST_VERSION = 2
DEFAULT_CHUNK_ROWS = 5000
#: Slices per chunk (:func:`slice_of`): a prime, so no stride of ids but its multiples falls in one slice.
SLICES = 17
#: Rows named one by one in a verification; past this bound differences are key ranges with row counts.
MAX_NAMED_ROWS = 100
MAX_CHUNK_ROWS = 10_000
SEPARATOR = "\x1f"  # ASCII unit separator between column values
MASK31 = (1 << 31) - 1
MASK63 = (1 << 63) - 1
MASK32 = (1 << 32) - 1
MASK64 = (1 << 64) - 1
_FOLD_VALUE, _FOLD_COUNT = 0x9E3779B97F4A7C15, 0xC2B2AE3D27D4EB4F
_NO_LIMIT = 1 << 62  # a LIMIT that keeps the per-row subquery materialized (computed once per row)
EXAMPLES = 20

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


def _is_mysql(conn: Connection) -> bool:
    return conn.dialect.name in ("mysql", "mariadb")


def _chunk_in(conn: Connection, shape: _Shape, where: Sequence[ColumnElement[bool]], limit: int) -> Chunk:
    """The unsliced figures of the rows ``where`` selects: in the server on MySQL-protocol servers, in Python on SQLite."""
    if _is_mysql(conn):
        return shape.summer_of_sql_row(conn.execute(shape.chunk_sql(where, limit)).one()).chunk()
    summer = _Summer(len(shape.columns))
    key = shape.key_index()
    for row in conn.execute(shape.rows_sql(where, limit)):
        row_hash, fps = shape.hash_values(row)
        summer.add(int(row[key]), row_hash, fps)
    return summer.chunk()


def _slices_in(conn: Connection, shape: _Shape, where: Sequence[ColumnElement[bool]], limit: int) -> list[_Summer]:
    """The :data:`SLICES` slices (by number; empty ones included) of the rows ``where`` selects, up to ``limit``
    in key order: one statement on MySQL-protocol servers; in Python, streamed, on SQLite."""
    ncols = len(shape.columns)
    slices = [_Summer(ncols) for _ in range(SLICES)]
    if _is_mysql(conn):
        for number, *figures in conn.execute(shape.sliced_sql(where, limit)):
            slices[int(number)] = shape.summer_of_sql_row(figures)
    else:
        key = shape.key_index()
        for row in conn.execute(shape.rows_sql(where, None if limit >= _NO_LIMIT else limit)):
            k = int(row[key])
            slices[slice_of(k)].add(k, *shape.hash_values(row))
    return slices


def _sliced_chunk_in(conn: Connection, shape: _Shape, where: Sequence[ColumnElement[bool]], limit: int) -> Chunk:
    """One chunk of the digest with its slices (module docstring)."""
    slices = _slices_in(conn, shape, where, limit)
    return _merged(len(shape.columns), slices).chunk(slices)


def _row_hashes_in(conn: Connection, shape: _Shape, where: Sequence[ColumnElement[bool]]) -> dict[int, int]:
    """Key -> row hash of the rows ``where`` selects (narrowing only: a handful of rows)."""
    if _is_mysql(conn):
        stmt = select(shape.pk, shape.row_hash_sql()).where(*where)
        return {int(k): int(h) for k, h in conn.execute(stmt)}
    key = shape.key_index()
    return {int(row[key]): shape.hash_values(row)[0] for row in conn.execute(shape.rows_sql(where))}


def _range(shape: _Shape, lo: int | None, hi: int | None) -> list[ColumnElement[bool]]:
    terms = []
    if lo is not None:
        terms.append(shape.pk > lo)
    if hi is not None:
        terms.append(shape.pk <= hi)
    return terms


# -- the digest -------------------------------------------------------------------------------


@dataclass
class TableDigest:
    table: str
    pk: str
    columns: list[str]
    chunks: list[Chunk] = field(default_factory=list)

    @property
    def rows(self) -> int:
        return sum(c.rows for c in self.chunks)

    def as_json(self) -> dict[str, Any]:
        return {"pk": self.pk, "columns": self.columns, "rows": self.rows, "chunks": [c.as_list() for c in self.chunks]}


@dataclass
class HistoryDigest:
    namespace: str
    chunk_rows: int
    cutoffs: dict[str, int]
    tables: dict[str, TableDigest]
    taken_at: str = ""
    seconds: float = 0.0

    @property
    def rows(self) -> dict[str, int]:
        return {name: t.rows for name, t in self.tables.items()}

    @property
    def chunk_count(self) -> dict[str, int]:
        return {name: len(t.chunks) for name, t in self.tables.items()}

    @functools.cached_property
    def short_hash(self) -> str:
        """SHA-256 of the canonical JSON of the version, namespace, tables and chunks, fed chunk by chunk (no copy of
        the whole digest is built), computed once."""
        h = hashlib.sha256(json.dumps([DIGEST_VERSION, self.namespace], separators=(",", ":")).encode())
        for name, t in sorted(self.tables.items()):
            h.update(json.dumps([name, t.columns], separators=(",", ":")).encode())
            for chunk in t.chunks:
                h.update(json.dumps(chunk.as_list(), separators=(",", ":")).encode())
        return h.hexdigest()[:16]

    def summary(self) -> dict[str, Any]:
        """What the log, the XCom ``return_value``, the Asset event and the status view show."""
        return {"hash": self.short_hash, "rows": self.rows, "chunks": self.chunk_count, "chunk_rows": self.chunk_rows,
                "cutoffs": self.cutoffs, "taken_at": self.taken_at, "seconds": round(self.seconds, 3)}

    def summary_text(self) -> str:
        rows = ", ".join(f"{n} {r} rows / {self.chunk_count[n]} chunks" for n, r in self.rows.items())
        return f"history digest {self.short_hash} of namespace {self.namespace}: {rows}"

    def as_json(self) -> dict[str, Any]:
        return {"version": DIGEST_VERSION, "namespace": self.namespace, "hash": self.short_hash,
                "chunk_rows": self.chunk_rows, "cutoffs": self.cutoffs, "taken_at": self.taken_at,
                "seconds": round(self.seconds, 3), "tables": {n: t.as_json() for n, t in self.tables.items()}}

    @classmethod
    def from_json(cls, raw: Any, *, source: str = "the digest") -> HistoryDigest:
        """Parse a saved digest; BadInput naming what is wrong (never a partial digest)."""
        try:
            if isinstance(raw, dict) and raw.get("version") == 1:
                raise ValueError("it is a version-1 digest, taken by an earlier release whose history included ordinary "
                                 "work: it cannot be verified by this one; take a new digest")
            if not isinstance(raw, dict) or raw.get("version") != DIGEST_VERSION:
                raise ValueError(f"not a version-{DIGEST_VERSION} history digest")
            tables = {}
            for name, t in raw["tables"].items():
                table = catalog.metadata.tables.get(name)
                if table is None or table not in HISTORY_TABLES:
                    raise ValueError(f"unknown table {name!r}")
                unknown = [c for c in t["columns"] if c not in table.c]
                if unknown:
                    raise ValueError(f"{name} has no column(s) {', '.join(unknown)} in the catalog")
                tables[name] = TableDigest(name, str(t["pk"]), list(t["columns"]), [Chunk.from_list(c) for c in t["chunks"]])
            digest = cls(str(raw["namespace"]), int(raw["chunk_rows"]), {str(k): int(v) for k, v in raw["cutoffs"].items()},
                         tables, str(raw.get("taken_at", "")), float(raw.get("seconds", 0.0)))
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"{source} is not a usable history digest: {exc}") from exc
        if raw.get("hash") not in (None, digest.short_hash):
            raise BadInput(f"{source} is damaged: its chunks hash to {digest.short_hash}, it says {raw['hash']}")
        return digest


def _check_chunk_rows(chunk_rows: int) -> None:
    if not 1 <= chunk_rows <= MAX_CHUNK_ROWS:
        raise BadInput(f"chunk rows must be between 1 and {MAX_CHUNK_ROWS}, got {chunk_rows}")


class _Progress:
    def __init__(self, what: str, every_s: float):
        self.what, self.every_s = what, every_s
        self.started = self.last = time.monotonic()

    def tick(self, table: str, rows: int, chunks: int) -> None:
        now = time.monotonic()
        if now - self.last >= self.every_s:
            self.last = now
            log.info("%s: %s, %d rows in %d chunks so far (%.0fs)", self.what, table, rows, chunks, now - self.started)

    @property
    def seconds(self) -> float:
        return time.monotonic() - self.started


def _walk(engine: Engine, shape: _Shape, where: list, chunk_rows: int, deadline: Deadline | None,
          lo: int | None, hi: int | None, each: Callable[[Chunk], None] | None = None) -> list[Chunk]:
    """The chunks of the history rows in key range ``(lo, hi]`` (None: unbounded), keyset over the primary key,
    each its own short read; ``each(chunk)`` after each."""
    name, chunks = shape.table.name, []
    while True:
        terms = where + _range(shape, lo, hi)
        chunk = tx.read(engine, lambda conn: _sliced_chunk_in(conn, shape, terms, chunk_rows),  # noqa: B023 - called at once
                        what=f"digesting {name} after {shape.pk.name} {lo}", deadline=deadline)
        if chunk.rows == 0:
            return chunks
        chunks.append(chunk)
        lo = chunk.hi
        if each is not None:
            each(chunk)
        if chunk.rows < chunk_rows:
            return chunks


def key_ranges(lowest: int, highest: int, parts: int) -> list[tuple[int | None, int | None]]:
    """``(lo, hi]`` ranges cutting the keys ``lowest..highest`` into ``parts`` spans of equal width (by key value:
    TiDB's ids are unique, not dense or ordered, so some spans may hold more rows than others), the first open
    below and the last open above, so together they cover every key."""
    width = highest - lowest + 1
    edges = [lowest - 1 + width * i // parts for i in range(1, parts)]
    return list(zip([None, *edges], [*edges, None], strict=True))


def _digest_table(engine: Engine, shape: _Shape, where: list, chunk_rows: int, deadline: Deadline | None,
                  on_chunk: Callable[[str, Chunk], None] | None, progress: _Progress,
                  pool: ThreadPoolExecutor | None, connections: int) -> TableDigest:
    """One table's chunks. On one connection, one keyset walk. With a ``pool``, the history keys' span is read
    first (one short statement) and cut into ``connections`` key ranges (fewer when the span is under
    ``connections`` chunks), each walked on its own connection: the chunks are contiguous in key order as on
    one connection, each range's last one usually shorter. ``on_chunk`` is called in key order, on the caller's
    thread."""
    name = shape.table.name
    td = TableDigest(name, shape.pk.name, [c.name for c in shape.columns])

    def taken(chunk: Chunk) -> None:
        td.chunks.append(chunk)
        if on_chunk is not None:
            on_chunk(name, chunk)
        progress.tick(name, td.rows, len(td.chunks))

    if pool is None:
        _walk(engine, shape, where, chunk_rows, deadline, None, None, taken)
        return td
    lowest, highest = tx.read(engine, lambda conn: conn.execute(
        select(func.min(shape.pk), func.max(shape.pk)).where(*where)).one(),
        what=f"reading the key span of {name}'s history", deadline=deadline)
    if lowest is None:
        return td
    parts = max(1, min(connections, -(-(int(highest) - int(lowest) + 1) // chunk_rows)))
    ranges = key_ranges(int(lowest), int(highest), parts)
    for chunks in pool.map(lambda r: _walk(engine, shape, where, chunk_rows, deadline, *r), ranges):
        for chunk in chunks:
            taken(chunk)
    return td


@contextlib.contextmanager
def _chunk_pool(connections: int) -> Iterator[ThreadPoolExecutor]:
    """Threads for the chunk reads; on a failure (a timeout, a lost connection) the chunks not started are
    dropped, not read one after the other before the failure is reported."""
    pool = ThreadPoolExecutor(connections, thread_name_prefix="digest")
    try:
        yield pool
    finally:
        pool.shutdown(wait=True, cancel_futures=True)


def compute_digest(
    engine: Engine,
    namespace: str,
    *,
    chunk_rows: int = DEFAULT_CHUNK_ROWS,
    deadline: Deadline | None = None,
    on_chunk: Callable[[str, Chunk], None] | None = None,
    progress_every_s: float = 10.0,
    connections: int = 1,
) -> HistoryDigest:
    """The digest of every history row of ``namespace`` as it is now (read only; see the module docstring).

    ``on_chunk(table, chunk)`` is called after each chunk, in key order (progress; the fault tests' seam).
    ``connections`` > 1 on a MySQL-protocol server: each table's history keys are cut into that many key ranges,
    walked at once on as many connections (a larger server takes the digest sooner). The chunks then end at the
    ranges' edges too: the same rows and the same verification, a different short hash than on one connection
    (the same for the same ``connections`` and ``chunk_rows``).
    """
    if not 1 <= connections <= MAX_DIGEST_CONNECTIONS:
        raise BadInput(f"digest connections must be between 1 and {MAX_DIGEST_CONNECTIONS}, got {connections}")
    _check_chunk_rows(chunk_rows)
    convert = require_columns(engine, [(t, [c.name for c in t.columns]) for t in HISTORY_TABLES])
    cutoffs = tx.read(engine, lambda conn: pack_cutoffs(conn, namespace), what="reading the pack cutoffs", deadline=deadline)
    taken_at = utcnow().isoformat()
    progress = _Progress(f"history digest of {namespace}", progress_every_s)
    tables = {}
    parallel = connections > 1 and engine.dialect.name in ("mysql", "mariadb")
    with _chunk_pool(connections) if parallel else contextlib.nullcontext() as pool:
        for table in HISTORY_TABLES:
            shape = _Shape(table, convert=convert.get(table.name, ()))
            where = history_rows(table, namespace, cutoffs)
            tables[table.name] = _digest_table(engine, shape, where, chunk_rows, deadline, on_chunk, progress, pool,
                                               connections)
    digest = HistoryDigest(namespace, chunk_rows, cutoffs, tables, taken_at, progress.seconds)
    log.info("%s (%.1fs)", digest.summary_text(), digest.seconds)
    return digest


# -- verification -------------------------------------------------------------------------------


#: Kinds of :class:`Difference` that name one row.
NAMED_KINDS = ("changed", "missing", "extra")
RANGE = "range"


@dataclass
class Difference:
    """One difference between a digest and the rows now: a named row, or a key range whose rows cannot be told apart.

    ``kind``: ``changed`` / ``missing`` / ``extra`` (``key`` names the row) or ``range`` (``(lo, hi]`` holds
    several differing rows, ``rows_then`` / ``rows_now`` of them then and now; ``narrowed`` False when the
    bound of named rows was reached before this range was narrowed further).
    """

    table: str
    pk: str
    kind: str
    key: int | None
    lo: int | None
    hi: int | None
    columns: list[str]
    rows_then: int
    rows_now: int
    narrowed: bool = True

    @property
    def text(self) -> str:
        where = f"{self.table} {self.pk} {self.key}"
        cols = ", ".join(self.columns) or "undetermined"
        if self.kind == "changed":
            return f"{where} changed: column(s) {cols} differ"
        if self.kind == "missing":
            return f"{where} is missing: deleted, or no longer a history row"
        if self.kind == "extra":
            return f"{where} is extra: a history row (at or below its cutoff) that was not there at the digest"
        span = f"({'-inf' if self.lo is None else self.lo}, {'+inf' if self.hi is None else self.hi}]"
        why = ("more than one row of this range differs: compare the range with the tenant's backup" if self.narrowed
               else f"not narrowed down: {MAX_NAMED_ROWS} rows were already named; compare the range with the tenant's backup")
        return (f"{self.table} rows with {self.pk} in {span} differ ({self.rows_then} rows then, {self.rows_now} now; "
                f"column(s) {cols}): {why}")

    def as_json(self) -> dict[str, Any]:
        return {"table": self.table, "pk": self.pk, "kind": self.kind, "key": self.key, "range": [self.lo, self.hi],
                "columns": self.columns, "rows_then": self.rows_then, "rows_now": self.rows_now,
                "narrowed": self.narrowed, "text": self.text}


@dataclass
class DigestVerification:
    expected: HistoryDigest
    rows_now: dict[str, int]
    chunks_differing: dict[str, int]
    differences: list[Difference]
    seconds: float
    cutoffs_now: dict[str, int]

    @property
    def ok(self) -> bool:
        return not self.differences

    @property
    def named_rows(self) -> int:
        return sum(1 for d in self.differences if d.kind in NAMED_KINDS)

    def summary(self) -> str:
        if self.ok:
            return (f"history digest {self.expected.short_hash} verified: no history row of {self.expected.namespace} "
                    f"changed ({', '.join(f'{n} {r} rows' for n, r in self.rows_now.items())})")
        shown = "; ".join(d.text for d in self.differences[:EXAMPLES])
        more = f" (and {len(self.differences) - EXAMPLES} more)" if len(self.differences) > EXAMPLES else ""
        ranges = len(self.differences) - self.named_rows
        return (f"history digest {self.expected.short_hash} does NOT verify: {len(self.differences)} difference(s) in "
                f"history rows of {self.expected.namespace} ({self.named_rows} row(s) named, {ranges} key range(s)): "
                f"{shown}{more}")

    def as_json(self) -> dict[str, Any]:
        return {"ok": self.ok, "hash": self.expected.short_hash, "rows_then": self.expected.rows, "rows_now": self.rows_now,
                "chunks_differing": self.chunks_differing, "cutoffs_now": self.cutoffs_now,
                "named_rows": self.named_rows, "named_rows_bound": MAX_NAMED_ROWS,
                "differences": [d.as_json() for d in self.differences], "seconds": round(self.seconds, 3),
                "summary": self.summary()}


def _differing_columns(shape: _Shape, then: Chunk, now: Chunk) -> list[str]:
    return [c.name for i, c in enumerate(shape.columns) if then.columns[4 * i: 4 * i + 4] != now.columns[4 * i: 4 * i + 4]]


def _signed(key_xor: int) -> int:
    return key_xor - (1 << 64) if key_xor >= 1 << 63 else key_xor


def _range_difference(shape: _Shape, lo: int | None, hi: int | None, then: Chunk, now: Chunk, *,
                      narrowed: bool = True) -> Difference:
    return Difference(shape.table.name, shape.pk.name, RANGE, None, lo, hi, _differing_columns(shape, then, now),
                      then.rows, now.rows, narrowed)


def _narrow(conn: Connection, shape: _Shape, where: list, lo: int | None, hi: int | None, then: Chunk,
            now: Chunk, *, slice_number: int | None = None) -> Difference:
    """Name the one row that explains the difference of the key range ``(lo, hi]`` (of its slice ``slice_number``,
    when given), or say that several rows differ (a ``range``)."""
    columns = _differing_columns(shape, then, now)
    base = dict(table=shape.table.name, pk=shape.pk.name, lo=lo, hi=hi, rows_then=then.rows, rows_now=now.rows)
    crc_delta, sum_delta, weighted_delta = then.crc ^ now.crc, then.hash_sum - now.hash_sum, then.weighted_sum - now.weighted_sum
    in_range = [*where, *_range(shape, lo, hi)]
    if abs(then.rows - now.rows) == 1:
        key = _signed(then.key_xor ^ now.key_xor)
        inside = (lo is None or key > lo) and (hi is None or key <= hi) and slice_number in (None, slice_of(key))
        present = _row_hashes_in(conn, shape, [*in_range, shape.pk == key]) if inside else {}
        if then.rows > now.rows and inside and not present:
            old = sum_delta
            if 0 <= old <= MASK32 and old == crc_delta and weighted_delta == old * (key & MASK31):
                return Difference(kind="missing", key=key, columns=[], **base)
        if now.rows > then.rows and key in present:
            new = present[key]
            if -sum_delta == new == crc_delta and -weighted_delta == new * (key & MASK31):
                return Difference(kind="extra", key=key, columns=[], **base)
    elif then.rows == now.rows and then.key_xor == now.key_xor and sum_delta and weighted_delta % sum_delta == 0:
        low_bits = weighted_delta // sum_delta
        if 0 <= low_bits <= MASK31:
            candidates = _row_hashes_in(conn, shape, [*in_range, shape.pk.op("&")(MASK31) == low_bits])
            for key, new in sorted(candidates.items()):
                if slice_number not in (None, slice_of(key)):
                    continue
                old = new + sum_delta
                if 0 <= old <= MASK32 and old ^ new == crc_delta:
                    return Difference(kind="changed", key=key, columns=columns, **base)
    return _range_difference(shape, lo, hi, then, now)


class _Budget:
    """How many more rows a verification may name one by one (:data:`MAX_NAMED_ROWS` in all)."""

    def __init__(self, rows: int = MAX_NAMED_ROWS):
        self.left = rows

    def spend(self, difference: Difference) -> Difference:
        if difference.kind in NAMED_KINDS:
            self.left -= 1
        return difference


def _narrow_chunk(conn: Connection, shape: _Shape, where: list, lo: int | None, hi: int | None, then: Chunk,
                  now: Chunk, budget: _Budget) -> list[Difference]:
    """The differences of one differing chunk ``(lo, hi]``: its slices looked at again, each differing slice
    with one differing row naming it; what no slice could name (slices with several differing rows, or a digest
    without slices) is the chunk's key range with its row counts. Once the budget is spent, the whole chunk is
    one range, not narrowed."""
    then_slices = then.slice_chunks()
    if budget.left <= 0 or not then_slices:
        if budget.left <= 0:
            return [_range_difference(shape, lo, hi, then, now, narrowed=False)]
        return [budget.spend(_narrow(conn, shape, where, lo, hi, then, now))]
    in_chunk = [*where, *_range(shape, lo, hi)]
    now_slices = [sl.chunk() for sl in _slices_in(conn, shape, in_chunk, _NO_LIMIT)]
    named: list[Difference] = []
    unresolved: list[int] = []
    for number, (then_slice, now_slice) in enumerate(zip(then_slices, now_slices, strict=True)):
        if now_slice.same_content(then_slice):
            continue
        difference = _narrow(conn, shape, where, lo, hi, then_slice, now_slice, slice_number=number) if budget.left > 0 else None
        if difference is not None and difference.kind in NAMED_KINDS:
            named.append(budget.spend(difference))
        else:
            unresolved.append(number)
    if unresolved:
        columns = sorted({c for j in unresolved for c in _differing_columns(shape, then_slices[j], now_slices[j])},
                         key=[c.name for c in shape.columns].index)
        named.append(Difference(shape.table.name, shape.pk.name, RANGE, None, lo, hi, columns, then.rows, now.rows,
                                narrowed=budget.left > 0))
    return named


def _verify_table(engine: Engine, shape: _Shape, where: list, expected: HistoryDigest, deadline: Deadline | None,
                  progress: _Progress, budget: _Budget) -> tuple[list[Difference], int, int]:
    """(differences, history rows now, chunks differing) of one table, over the digest's chunk ranges (the last
    one open-ended)."""
    name, n = shape.table.name, len(shape.columns)
    recorded = expected.tables[name].chunks or [Chunk(None, 0, 0, 0, 0, 0, _fingerprints([0] * n, [0] * n))]
    differences: list[Difference] = []
    rows_now = chunks_differing = 0
    lo: int | None = None
    for i, then in enumerate(recorded):
        hi = None if i == len(recorded) - 1 else then.hi
        terms = where + _range(shape, lo, hi)

        def compare(conn: Connection, lo=lo, hi=hi, then=then, terms=terms) -> tuple[Chunk, list[Difference]]:
            now = _chunk_in(conn, shape, terms, _NO_LIMIT)
            return now, ([] if now.same_content(then) else _narrow_chunk(conn, shape, where, lo, hi, then, now, budget))

        now, found = tx.read(engine, compare, what=f"verifying {name} after {shape.pk.name} {lo}", deadline=deadline)
        rows_now += now.rows
        if found:
            chunks_differing += 1
            differences += found
            for difference in found:
                log.error("history digest %s: %s", expected.short_hash, difference.text)
        progress.tick(name, rows_now, i + 1)
        lo = then.hi
    return differences, rows_now, chunks_differing


def verify_digest(
    engine: Engine,
    expected: HistoryDigest,
    *,
    deadline: Deadline | None = None,
    progress_every_s: float = 10.0,
) -> DigestVerification:
    """Every history row of the digest's namespace, compared chunk by chunk with ``expected`` (read only).

    History is taken with the cutoffs in force now, so rows admitted above them
    (and range work, and ordinary work) are ignored wherever their ids fall; any
    changed, missing or extra history row is a :class:`Difference`: a differing
    chunk is narrowed to its differing slices, and each row is named by key (with
    the columns that differ) where it alone explains its slice, up to
    :data:`MAX_NAMED_ROWS` rows; the rest are key ranges with their row counts.
    """
    names = {t: [c for c in expected.tables[t.name].columns] for t in HISTORY_TABLES if t.name in expected.tables}
    if len(names) != len(HISTORY_TABLES):
        raise BadInput("the digest does not cover both _System_Event and _System_WorkItem")
    convert = require_columns(engine, list(names.items()))
    ns = expected.namespace
    cutoffs = tx.read(engine, lambda conn: pack_cutoffs(conn, ns), what="reading the pack cutoffs", deadline=deadline)
    progress = _Progress(f"verifying history digest {expected.short_hash}", progress_every_s)
    rows_now: dict[str, int] = {}
    differing: dict[str, int] = {}
    differences: list[Difference] = []
    budget = _Budget()
    for table, cols in names.items():
        shape = _Shape(table, cols, convert.get(table.name, ()))
        found, rows_now[table.name], differing[table.name] = _verify_table(
            engine, shape, history_rows(table, ns, cutoffs), expected, deadline, progress, budget)
        differences += found
    result = DigestVerification(expected, rows_now, differing, differences, progress.seconds, cutoffs)
    (log.info if result.ok else log.error)("%s (%.1fs)", result.summary(), result.seconds)
    return result


def load_digest(path: str) -> HistoryDigest:
    """A digest saved with ``nexus-cutover digest -out FILE``; BadInput naming the file when it is not one."""
    try:
        with open(path, encoding="utf-8") as fh:
            raw = json.load(fh)
    except OSError as exc:
        raise BadInput(f"cannot read the digest file {path}: {exc.strerror}") from exc
    except json.JSONDecodeError as exc:
        raise BadInput(f"the digest file {path} is not JSON: {exc}") from exc
    return HistoryDigest.from_json(raw, source=f"the digest file {path}")


__all__ = ["HistoryDigest", "DigestVerification", "Difference", "compute_digest", "verify_digest", "load_digest",
           "history_rows", "pack_cutoffs", "DEFAULT_CHUNK_ROWS"]

"""One key range's figures (:mod:`.definition`) read on one connection, and the progress log of a walk of chunks.

On MySQL-protocol servers (MySQL, MariaDB, TiDB) the server computes the
figures: a chunk with its slices is one statement that only groups by slice
(the chunk's figures are its slices' folded together), so no second pass, no
window function. On SQLite, Python computes them from the rows, streamed.
Every read here runs on the connection it is given, in its caller's (short,
read-only) transaction.
"""

from __future__ import annotations

import logging
import time
from collections.abc import Sequence

from sqlalchemy import Connection, select
from sqlalchemy.sql import ColumnElement

from .definition import SLICES, Chunk, _merged, _Shape, _Summer, slice_of

log = logging.getLogger(__name__)

_NO_LIMIT = 1 << 62  # a LIMIT that keeps the per-row subquery materialized (computed once per row)


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

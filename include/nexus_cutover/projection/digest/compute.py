"""Taking the history digest: every history row of a namespace as it is now, chunk by chunk (read only).

The chunks (:mod:`.definition`) are one keyset walk over the primary key. Read
on several connections, the keys' span is first cut into equal key ranges, one
keyset walk each (:func:`key_ranges`): each range's last chunk may hold fewer
rows; the chunks still follow each other in key order.

Each chunk is one statement in its own short read transaction (TiDB: a bounded
read, far from the statement caps); memory holds one chunk's summary per
chunk, never rows (SQLite: one chunk's rows). A digest interrupted by a timeout
or a lost connection has written nothing: run it again.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor

from sqlalchemy import Engine, func, select

from ... import tx
from ...clock import utcnow
from ...db import Deadline
from ...errors import BadInput
from ..digest_limits import MAX_DIGEST_CONNECTIONS
from .definition import DEFAULT_CHUNK_ROWS, HISTORY_TABLES, MAX_CHUNK_ROWS, Chunk, _Shape, history_rows, pack_cutoffs, require_columns
from .model import HistoryDigest, TableDigest
from .reads import _Progress, _range, _sliced_chunk_in

log = logging.getLogger(__name__)


def _check_chunk_rows(chunk_rows: int) -> None:
    if not 1 <= chunk_rows <= MAX_CHUNK_ROWS:
        raise BadInput(f"chunk rows must be between 1 and {MAX_CHUNK_ROWS}, got {chunk_rows}")


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

"""Verifying a history digest: every history row now, compared chunk by chunk with the digest (read only).

History is taken with the cutoffs in force now. The chunks are the digest's
(:mod:`.definition`), the last one to plus infinity: an extra row anywhere is
inside one. A differing chunk is narrowed down to its differing slices
(Spirit/VDiff style): a slice with one differing row names it (its key, and
the columns that differ). What remains (slices with several differing rows) is
reported as the chunk's key range with its row counts then and now. At most
:data:`MAX_NAMED_ROWS` rows are named per verification; past that, differing
chunks are reported as key ranges with their row counts, without narrowing them.

Each chunk is looked at, and narrowed, in its own short read transaction.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

from ... import tx
from ...db import Deadline
from ...errors import BadInput
from .definition import HISTORY_TABLES, MASK31, MASK32, Chunk, _fingerprints, _Shape, history_rows, pack_cutoffs, require_columns, slice_of
from .model import HistoryDigest
from .reads import _NO_LIMIT, _chunk_in, _Progress, _range, _row_hashes_in, _slices_in

log = logging.getLogger(__name__)

#: Rows named one by one in a verification; past this bound differences are key ranges with row counts.
MAX_NAMED_ROWS = 100
EXAMPLES = 20

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

"""Many small index reads in one statement: a UNION ALL of one read per key, each row tagged with its key's position.

What keeps a transaction that visits every lane (or every pack) of a tenant inside TiDB's bounds (a few thousand
statements per transaction): the reads that used to run one statement per key run :data:`UNION_CHUNK` keys per
statement, each member still the same index range read (so EXPLAIN of a member is EXPLAIN of the read), its
``ORDER BY``/``LIMIT`` kept inside a derived table (portable to SQLite, which has no parenthesised compound members).
A UNION ALL returns its members' rows in no particular order: callers order each key's rows themselves.

A member is built by a *template*, ``template(k, shape)``: the read of key ``k`` with bound parameters named
:func:`param` ``(name, k)``, whose form is decided by ``shape`` (hashable: a limit, whether a keyset is set). The
union of a tuple of shapes is built once and cached (building hundreds of expressions per statement would cost
more than running it); :func:`rows_by_key` binds each member's values.

Invariants: the rows of key ``k`` are exactly the rows its own statement returns; a statement holds at most
:data:`UNION_CHUNK` members (SQLite allows 500 compound terms; bound parameters stay in the low thousands).
"""

from __future__ import annotations

import functools
from collections.abc import Callable, Hashable, Iterator, Mapping, Sequence
from typing import Any, TypeVar

from sqlalchemy import BindParameter, Connection, Select, bindparam, literal, select, union_all

from .identity import COLUMN_NAMES, ProjectionIdentity

#: Keys (members) per statement.
UNION_CHUNK = 100

T = TypeVar("T")
Template = Callable[[int, Hashable], Select]


def chunks(items: Sequence[T], size: int = UNION_CHUNK) -> Iterator[Sequence[T]]:
    """``items`` in consecutive slices of ``size``, the rest in slices of powers of two (37 left: 32, 4, 1), so a
    read is built in a few sizes only (an engine's compiled cache keeps each size it ran)."""
    start = 0
    while len(items) - start >= size:
        yield items[start : start + size]
        start += size
    while start < len(items):
        n = 1 << ((len(items) - start).bit_length() - 1)
        yield items[start : start + n]
        start += n


def param(name: str, k: int) -> BindParameter[Any]:
    """The bound parameter ``name`` of member ``k``."""
    return bindparam(f"{name}_{k}")


def identity_slot(k: int) -> ProjectionIdentity:
    """An identity of bound parameters (``ident0`` ... ``ident5`` of member ``k``), for a template's read."""
    return ProjectionIdentity(*(param(f"ident{p}", k) for p in range(len(COLUMN_NAMES))))


def identity_values(ident: ProjectionIdentity) -> dict[str, Any]:
    """The values of :func:`identity_slot`'s parameters for ``ident``."""
    return {f"ident{p}": value for p, value in enumerate(ident)}


def tagged_union(statements: Sequence[Select]) -> Select:
    """``(k, the columns of statements[k])`` for every row of every statement, in one statement."""
    parts = [select(literal(k).label("k"), *stmt.subquery(f"m{k}").c) for k, stmt in enumerate(statements)]
    return parts[0] if len(parts) == 1 else union_all(*parts)


#: Unions kept built: a round of full chunks reuses one. A 100-member union holds some 1.6 MB of expression objects
#: (tracemalloc, a probe union of the audit), so only a few are kept in a long-running process (the status view).
UNIONS_KEPT = 8


@functools.lru_cache(maxsize=UNIONS_KEPT)
def _union(template: Template, shapes: tuple[Hashable, ...]) -> Select:
    return tagged_union([template(k, shape) for k, shape in enumerate(shapes)])


def rows_by_key(conn: Connection, template: Template, members: Sequence[tuple[Hashable, Mapping[str, Any]]]) -> list[list[tuple]]:
    """The rows of each member ``(shape, values)`` (at most :data:`UNION_CHUNK`), read in one statement; the tag dropped.

    ``template(k, shape)`` is member ``k``'s read; ``values`` binds its parameters (by ``name`` of :func:`param`).
    """
    if not members:
        return []
    if len(members) > UNION_CHUNK:
        raise ValueError(f"{len(members)} members in one statement (at most {UNION_CHUNK})")
    params = {f"{name}_{k}": value for k, (_, values) in enumerate(members) for name, value in values.items()}
    found: list[list[tuple]] = [[] for _ in members]
    for row in conn.execute(_union(template, tuple(shape for shape, _ in members)), params):
        found[row[0]].append(tuple(row[1:]))
    return found

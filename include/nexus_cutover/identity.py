"""The projection identity: the one helper that encodes it (contract, "Projection identity").

Identity = (PackInstallId, EventKind, RouteVersion, FlowVersion, WorkType, SourceLane).
Both ``_System_Event`` and ``_System_WorkItem`` carry these six columns, in this
order, as the prefix of their source-lane / projection-order indexes; nothing
else in the project lists them.
"""

from __future__ import annotations

import functools
import weakref
from collections.abc import Hashable, Iterable
from typing import Any, NamedTuple

from sqlalchemy import (
    Column,
    ColumnElement,
    Connection,
    Engine,
    Integer,
    Select,
    String,
    Table,
    and_,
    bindparam,
    case,
    false,
    func,
    literal,
    null,
    select,
    union_all,
)

from . import catalog
from .catalog import PROJECTION_WORK_TYPES

COLUMN_NAMES = ("PackInstallId", "EventKind", "RouteVersion", "FlowVersion", "WorkType", "SourceLane")


class ProjectionIdentity(NamedTuple):
    pack_install_id: str
    event_kind: str
    route_version: int
    flow_version: str
    work_type: str
    source_lane: str

    def as_values(self) -> dict[str, Any]:
        """Column name -> value, for INSERTs into Event or WorkItem."""
        return dict(zip(COLUMN_NAMES, self, strict=True))

    def label(self) -> str:
        return "/".join(str(part) for part in self)


def columns(table: Table) -> list[ColumnElement]:
    """The identity columns of ``table`` (Event or WorkItem), in index order."""
    return [table.c[name] for name in COLUMN_NAMES]


def of_row(row: Any) -> ProjectionIdentity:
    """The identity of a row selected with :func:`columns` (by column name)."""
    mapping = row._mapping if hasattr(row, "_mapping") else row
    return ProjectionIdentity(*(mapping[name] for name in COLUMN_NAMES))


def matches(table: Table, identity: ProjectionIdentity) -> ColumnElement[bool]:
    """``table``'s rows of exactly ``identity`` (an equality prefix of its index)."""
    return and_(*(table.c[name] == value for name, value in zip(COLUMN_NAMES, identity, strict=True)))


def is_projection_input(table: Table) -> ColumnElement[bool]:
    """``table``'s rows (Event or WorkItem) of a projection work type (contract, "Ordinary work").

    The one SQL form of the rule: an Event is a projection input when its ``WorkType`` is one of
    :data:`~nexus_cutover.catalog.PROJECTION_WORK_TYPES`; every other Event is ordinary work.
    """
    return table.c.WorkType.in_(PROJECTION_WORK_TYPES)


def projection_identities(conn: Connection, table: Table, identities: Iterable[ProjectionIdentity]) -> set[ProjectionIdentity]:
    """The members of ``identities`` (read from ``table``'s rows) whose work type is a projection work type.

    The server decides, as it decides every identity equality: a value spelled byte for byte like one of
    :data:`~nexus_cutover.catalog.PROJECTION_WORK_TYPES` is one under any collation; any other spelling
    (``'Connector.Projection'`` on a case-folding collation) is asked of the server with one index dive on
    ``table``'s identity prefix (:func:`is_projection_input` against the stored value), once per distinct spelling:
    the answer is the collation's of that spelling, whichever identity carries it (a pack may have thousands of
    lanes of one odd spelling, and the audit's transaction is bounded).
    """
    answers: dict[str, bool] = {}

    def server_says_projection(ident: ProjectionIdentity) -> bool:
        if ident.work_type not in answers:
            probe = select(literal(1)).where(matches(table, ident), is_projection_input(table)).limit(1)
            answers[ident.work_type] = conn.execute(probe).first() is not None
        return answers[ident.work_type]

    return {ident for ident in identities if ident.work_type in PROJECTION_WORK_TYPES or server_says_projection(ident)}


# -- equality of values, as the server decides it ---------------------------------
#
# Contract ("Projection identity and ordinals"): two values the tenant's collation
# treats as equal are the same value, in every query and in every comparison made in
# Python. Queries compare in the server already (``matches``, GROUP BY, joins); Python
# compares *keys*: ``key(a) == key(b)`` exactly when the server's ``column = a``
# matches a row holding ``b``. On MySQL-protocol servers a key is the value's weight
# string in the column's own collation (WEIGHT_STRING of a derived column that takes
# the collation of the real column, so no collation name is ever spelled), with the
# trailing weights of a space removed when the collation pads with spaces (MariaDB's
# WEIGHT_STRING keeps them, but ``'a' = 'a '`` holds under PAD SPACE). On SQLite the
# catalog's columns use the BINARY collation: the key is the value itself.

#: Values per weight-string statement (the statement is built once per size).
KEY_CHUNK = 250
#: Keys remembered per column and database (identity parts repeat batch after batch; receipt ids are not cached).
KEY_CACHE_SIZE = 65_536


class _ColumnCollation(NamedTuple):
    pad_space: bool  # ' ' = '' under the column's collation
    space_weight: bytes


class _ColumnKeys:
    """The collation facts and a bounded cache of keys of one column, on one database."""

    def __init__(self, collation: _ColumnCollation):
        self.collation = collation
        self.cache: dict[str, Hashable] = {}

    def key(self, weight: bytes) -> bytes:
        if not self.collation.pad_space:
            return weight
        space = self.collation.space_weight
        width = len(space)
        while width and len(weight) % width == 0 and weight.endswith(space):
            weight = weight[:-width]
        return weight

    def remember(self, value: str, key: Hashable) -> None:
        if len(self.cache) >= KEY_CACHE_SIZE:
            self.cache.clear()
        self.cache[value] = key


_columns_by_engine: weakref.WeakKeyDictionary[Engine, dict[tuple[str, str], _ColumnKeys]] = weakref.WeakKeyDictionary()


def _typed_like(column: Column) -> Select:
    """An empty SELECT of ``column``: the first part of a UNION whose values then take the column's collation."""
    return select(column.label("v"), null().label("k")).where(false())


@functools.lru_cache(maxsize=64)
def _weights_statement(column: Column, n: int) -> Select:
    """``(k, WEIGHT_STRING(v))`` of bound values ``v0..v<n-1>``, each compared as ``column`` compares (built once per n)."""
    parts = [select(bindparam(f"v{i}", type_=String), literal(i, Integer)) for i in range(n)]
    values = union_all(_typed_like(column), *parts).subquery("vals")
    return select(values.c.k, func.weight_string(values.c.v)).where(values.c.k.is_not(None))


@functools.lru_cache(maxsize=64)
def _collation_statement(column: Column) -> Select:
    """Whether ``' ' = ''`` under ``column``'s collation, and the weight string of a space."""
    values = union_all(_typed_like(column), select(literal(" ", String), literal(0, Integer))).subquery("vals")
    return select(
        func.max(case((values.c.v == literal("", String), 1), else_=0)), func.max(func.weight_string(values.c.v))
    ).where(values.c.k.is_not(None))


def _column_keys(conn: Connection, column: Column) -> _ColumnKeys:
    by_column = _columns_by_engine.setdefault(conn.engine, {})
    name = (column.table.name, column.name)
    found = by_column.get(name)
    if found is None:
        pad, space = conn.execute(_collation_statement(column)).one()
        found = by_column[name] = _ColumnKeys(_ColumnCollation(bool(pad), bytes(space or b"")))
    return found


def value_keys(conn: Connection, column: Column, values: Iterable[str], *, cache: bool = True) -> dict[str, Hashable]:
    """``{value: key}`` for each distinct value: equal keys exactly when the server compares the values as equal in ``column``.

    One statement per :data:`KEY_CHUNK` values not cached yet (none on SQLite).
    ``cache=False`` for values that do not repeat (receipt ids).
    """
    distinct = set(values)
    if conn.dialect.name not in ("mysql", "mariadb"):
        return {v: v for v in distinct}
    keys = _column_keys(conn, column)
    found = {v: keys.cache[v] for v in distinct if v in keys.cache}
    missing = sorted(distinct - found.keys())
    for start in range(0, len(missing), KEY_CHUNK):
        chunk = missing[start : start + KEY_CHUNK]
        params = {f"v{i}": v for i, v in enumerate(chunk)}
        for k, weight in conn.execute(_weights_statement(column, len(chunk)), params):
            if weight is None:
                raise ValueError(f"the server gave no weight string for {chunk[k]!r} in {column.table.name}.{column.name}")
            key = keys.key(bytes(weight))
            found[chunk[k]] = key
            if cache:
                keys.remember(chunk[k], key)
    return found


def identity_keys(
    conn: Connection, identities: Iterable[ProjectionIdentity], table: Table | None = None
) -> dict[ProjectionIdentity, tuple]:
    """``{identity: key}``: two identities have equal keys exactly when the server's join on the six identity
    columns of ``table`` (``_System_Event`` by default) equates them. One statement per column with uncached values."""
    table = table if table is not None else catalog.Event
    distinct = set(identities)
    per_column = []
    for position, name in enumerate(COLUMN_NAMES):
        column = table.c[name]
        if isinstance(column.type, String):
            per_column.append(value_keys(conn, column, (ident[position] for ident in distinct)))
        else:
            per_column.append(None)
    return {
        ident: tuple(part if keys is None else keys[part] for part, keys in zip(ident, per_column, strict=True))
        for ident in distinct
    }

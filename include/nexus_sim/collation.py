"""What the tenant's server holds and treats as equal, asked of the server itself (never modelled in Python).

The contract decides equality of identity values and receipt keys once, by the
server: MariaDB's default ``utf8mb4`` collation folds case, most MySQL-family
collations (``utf8mb4_bin`` included) ignore trailing spaces, SQLite's
``BINARY`` compares bytes. A builder that wants a tenant a real server could
hold asks :class:`ServerCollation` instead of guessing:

* :meth:`ServerCollation.classes` groups candidate values into the classes the
  server's collation of a key column treats as equal (one statement);
* :meth:`ServerCollation.holds` says which values the column's character set
  stores unchanged (a ``latin1`` column turns ``客`` into ``?``, or refuses it
  in strict mode).

Invariants: every answer comes from a statement run on the tenant's own server
with the values as bound parameters; the only names spliced into SQL are the
column's character set and collation, read from ``information_schema`` and
checked against ``[A-Za-z0-9_]+``. Answers are cached per value, so a builder
asking twice gets the same answer.
"""

from __future__ import annotations

import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, Table, text

from nexus_cutover import catalog
from nexus_cutover.db import is_sqlite

_NAME = re.compile(r"^[A-Za-z0-9_]+$")
#: Values per classes() statement (each value is bound twice: a self-join of a UNION ALL of bound values).
_CLASSES_CHUNK = 200


class CollationMismatch(ValueError):
    """The key columns a builder plans against do not share one collation (it cannot plan one equality)."""


@dataclass
class ServerCollation:
    """The character set and collation of one key column of a tenant, and the server's answers about them."""

    engine: Engine
    table: str
    column: str
    dialect: str
    charset: str | None
    collation: str
    _held: dict[str, bool] = field(default_factory=dict, repr=False)
    _equal: dict[tuple[str, str], bool] = field(default_factory=dict, repr=False)

    @classmethod
    def of_column(cls, engine: Engine, table: Table, column: str) -> ServerCollation:
        """Read ``table.column``'s character set and collation (SQLite: ``BINARY``, the only one the catalog uses)."""
        if is_sqlite(engine):
            return cls(engine, table.name, column, "sqlite", None, "BINARY")
        with engine.connect() as conn:
            row = conn.execute(
                text(
                    "SELECT CHARACTER_SET_NAME, COLLATION_NAME FROM information_schema.COLUMNS "
                    "WHERE TABLE_SCHEMA = DATABASE() AND TABLE_NAME = :t AND COLUMN_NAME = :c"
                ),
                {"t": table.name, "c": column},
            ).first()
        if row is None:
            raise ValueError(f"{table.name}.{column} does not exist in this tenant: create the schema first")
        charset, collation = row
        for name in (charset, collation):
            if not _NAME.match(name or ""):
                raise ValueError(f"unexpected character set / collation name {name!r} of {table.name}.{column}")
        return cls(engine, table.name, column, engine.dialect.name, charset, collation)

    @classmethod
    def of_tenant_keys(cls, engine: Engine) -> ServerCollation:
        """The collation of the receipt and lane keys (``SourceLane``, ``ReceiptId`` of Events and ingress receipts).

        Raises :class:`CollationMismatch` when those four columns do not share one character set and collation.
        """
        columns = [
            (catalog.Event, "SourceLane"),
            (catalog.Event, "ReceiptId"),
            (catalog.IngressReceipt, "SourceLane"),
            (catalog.IngressReceipt, "ReceiptId"),
        ]
        found = [cls.of_column(engine, table, column) for table, column in columns]
        kinds = {(c.charset, c.collation) for c in found}
        if len(kinds) != 1:
            raise CollationMismatch(
                "the lane and receipt key columns differ in collation: "
                + ", ".join(f"{c.table}.{c.column}={c.charset}/{c.collation}" for c in found)
            )
        return found[0]

    # -- the server's answers ------------------------------------------------

    def _value(self, param: str) -> str:
        """SQL for bound parameter ``param`` as a value of the column's character set and collation."""
        if self.charset is None:
            return f":{param}"
        return f"CONVERT(:{param} USING {self.charset}) COLLATE {self.collation}"

    def holds(self, values: Sequence[str]) -> list[bool]:
        """For each value: does the column's character set store it unchanged (no ``?`` substitution, no refusal)?"""
        todo = [v for v in dict.fromkeys(values) if v not in self._held]
        if todo and self.charset is None:
            self._held.update(dict.fromkeys(todo, True))
        elif todo:
            selects = ", ".join(
                f"BINARY CONVERT(CONVERT(:v{i} USING {self.charset}) USING utf8mb4) = BINARY CONVERT(:v{i} USING utf8mb4)"
                for i in range(len(todo))
            )
            with self.engine.connect() as conn:
                row = conn.execute(text(f"SELECT {selects}"), {f"v{i}": v for i, v in enumerate(todo)}).one()
            self._held.update({v: bool(ok) for v, ok in zip(todo, row, strict=True)})
        return [self._held[v] for v in values]

    def equal_pairs(self, values: Sequence[str]) -> set[tuple[int, int]]:
        """Index pairs ``(i, j)``, ``i < j``, of ``values`` the server's collation treats as equal."""
        pairs: set[tuple[int, int]] = set()
        n = len(values)
        for start in range(0, n, _CLASSES_CHUNK):
            for other in range(start, n, _CLASSES_CHUNK):
                left = list(range(start, min(n, start + _CLASSES_CHUNK)))
                right = list(range(other, min(n, other + _CLASSES_CHUNK)))
                pairs |= self._pairs(values, left, right)
        return pairs

    def _pairs(self, values: Sequence[str], left: list[int], right: list[int]) -> set[tuple[int, int]]:
        def derived(prefix: str, indexes: list[int]) -> str:
            return " UNION ALL ".join(f"SELECT {i} AS i, {self._value(f'{prefix}{i}')} AS v" for i in indexes)

        params: dict[str, Any] = {f"a{i}": values[i] for i in left}
        params.update({f"b{i}": values[i] for i in right})
        on = "a.v = b.v" if self.charset is None else f"a.v = b.v COLLATE {self.collation}"
        sql = f"SELECT a.i, b.i FROM ({derived('a', left)}) a JOIN ({derived('b', right)}) b ON {on} AND a.i < b.i"
        with self.engine.connect() as conn:
            return {(int(i), int(j)) for i, j in conn.execute(text(sql), params)}

    def classes(self, values: Sequence[str]) -> list[list[str]]:
        """``values`` (duplicates dropped) grouped into the server's equality classes.

        Classes are ordered by their first member's position in ``values`` and keep
        that order inside, so the same values in the same order give the same classes.
        """
        distinct = list(dict.fromkeys(values))
        parent = list(range(len(distinct)))

        def root(i: int) -> int:
            while parent[i] != i:
                parent[i] = parent[parent[i]]
                i = parent[i]
            return i

        for i, j in sorted(self.equal_pairs(distinct)):
            ri, rj = root(i), root(j)
            if ri != rj:
                parent[max(ri, rj)] = min(ri, rj)
        groups: dict[int, list[str]] = {}
        for i, value in enumerate(distinct):
            groups.setdefault(root(i), []).append(value)
        return [groups[k] for k in sorted(groups)]

    def equal(self, a: str, b: str) -> bool:
        """Whether the server treats ``a`` and ``b`` as equal in this column (asked once per pair)."""
        if a == b:
            return True
        pair = (a, b) if a < b else (b, a)
        if pair not in self._equal:
            self._equal[pair] = bool(self.equal_pairs(list(pair)))
        return self._equal[pair]

    @property
    def folds_case(self) -> bool:
        return self.equal("Lane-A", "lane-a")

    @property
    def pads_spaces(self) -> bool:
        return self.equal("Lane-A", "Lane-A ")

    def describe(self) -> dict[str, Any]:
        """What a report says about this collation (asked of the server)."""
        return {
            "dialect": self.dialect,
            "charset": self.charset,
            "collation": self.collation,
            "folds_case": self.folds_case,
            "pads_spaces": self.pads_spaces,
        }

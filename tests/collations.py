"""Tenant databases on a chosen collation of the MySQL-protocol test server (the project never changes one).

* :data:`DEFAULT` - MariaDB's default collation of ``utf8mb4`` (``utf8mb4_general_ci``): folds case,
  PAD SPACE, treats every 4-byte character as equal.
* :data:`PAD_SPACE_BIN` - ``utf8mb4_bin``: binary but PAD SPACE (trailing spaces ignored), TiDB's default.
  MariaDB's ``utf8mb4_nopad_bin`` is the binary one that keeps them (tests/test_identity.py checks both on
  the server).

:func:`collated_database` creates a fresh database whose default is the collation (every table created in it
takes it) and drops it afterwards; :func:`server_equal` is the test oracle of equality: the server's own ``=``
under an explicitly named collation (the product computes keys differently, from weight strings).
"""

from __future__ import annotations

import contextlib
import uuid
from collections.abc import Iterator

from sqlalchemy import Connection, bindparam, text
from sqlalchemy.engine import make_url

from nexus_cutover.db import make_engine

DEFAULT = "utf8mb4_general_ci"
PAD_SPACE_BIN = "utf8mb4_bin"
NO_PAD_BIN = "utf8mb4_nopad_bin"
COLLATIONS = (DEFAULT, PAD_SPACE_BIN)


@contextlib.contextmanager
def collated_database(server_url: str, collation: str) -> Iterator[str]:
    """The URL of a fresh database with ``collation`` (utf8mb4) as its default; dropped afterwards."""
    assert collation.replace("_", "").isalnum(), collation
    name = f"nx_{uuid.uuid4().hex[:12]}"
    server = make_url(server_url)
    admin = make_engine(server.set(database="mysql"))
    try:
        with admin.begin() as conn:
            conn.execute(text(f"CREATE DATABASE `{name}` CHARACTER SET utf8mb4 COLLATE {collation}"))
        yield server.set(database=name).render_as_string(hide_password=False)
    finally:
        with admin.begin() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()


class ServerEquality:
    """Equality of text values as the server decides it under a named collation (``=``), memoised per pair."""

    def __init__(self, conn: Connection | None, collation: str | None):
        self.conn = conn
        self.collation = collation
        self._memo: dict[tuple[str, str], bool] = {}
        self._classes: dict[str, int] = {}
        self._representatives: list[str] = []

    def fresh(self) -> ServerEquality:
        """A new oracle on the same connection, with no classes yet (one per example keeps the comparisons few)."""
        return ServerEquality(self.conn, self.collation)

    def equal(self, a: str, b: str) -> bool:
        if self.conn is None:  # SQLite: BINARY collation
            return a == b
        pair = (a, b) if a <= b else (b, a)
        if pair not in self._memo:
            stmt = text(
                f"SELECT CONVERT(:a USING utf8mb4) COLLATE {self.collation} = CONVERT(:b USING utf8mb4) COLLATE {self.collation}"
            ).bindparams(bindparam("a"), bindparam("b"))
            self._memo[pair] = bool(self.conn.execute(stmt, {"a": a, "b": b}).scalar())
            self.conn.rollback()  # one question, one (read-only) transaction
        return self._memo[pair]

    def cls(self, value: str) -> int:
        """A class number: equal for values the server equates (its ``=`` is an equivalence on these collations).

        One question to the server per new value: which known representative (if any) it equals.
        """
        if value not in self._classes:
            found = None
            if self.conn is None:
                found = next((k for k, rep in enumerate(self._representatives) if rep == value), None)
            elif self._representatives:
                reps = " UNION ALL ".join(f"SELECT {k} AS k, :r{k} AS v" for k in range(len(self._representatives)))
                stmt = text(
                    f"SELECT k FROM ({reps}) AS reps WHERE CONVERT(v USING utf8mb4) COLLATE {self.collation} = "
                    f"CONVERT(:a USING utf8mb4) COLLATE {self.collation} ORDER BY k LIMIT 1"
                )
                params = {"a": value, **{f"r{k}": rep for k, rep in enumerate(self._representatives)}}
                found = self.conn.execute(stmt, params).scalar()
                self.conn.rollback()
            if found is None:
                self._representatives.append(value)
                found = len(self._representatives) - 1
            self._classes[value] = found
        return self._classes[value]

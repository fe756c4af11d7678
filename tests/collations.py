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

    def equal(self, a: str, b: str) -> bool:
        if self.conn is None:  # SQLite: BINARY collation
            return a == b
        pair = (a, b) if a <= b else (b, a)
        if pair not in self._memo:
            stmt = text(
                f"SELECT CONVERT(:a USING utf8mb4) COLLATE {self.collation} = CONVERT(:b USING utf8mb4) COLLATE {self.collation}"
            ).bindparams(bindparam("a"), bindparam("b"))
            self._memo[pair] = bool(self.conn.execute(stmt, {"a": a, "b": b}).scalar())
        return self._memo[pair]

    def cls(self, value: str) -> int:
        """A class number: equal for values the server equates (its ``=`` is an equivalence on these collations)."""
        if value not in self._classes:
            for k, rep in enumerate(self._representatives):
                if self.equal(value, rep):
                    self._classes[value] = k
                    break
            else:
                self._representatives.append(value)
                self._classes[value] = len(self._representatives) - 1
        return self._classes[value]

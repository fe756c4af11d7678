"""A call's deadline, and the session-level bounds it puts on a tenant connection.

Split out of :mod:`nexus_cutover.db`, which re-exports every name here (importers may keep ``from .db import ...``).

Invariants:

* One :class:`Deadline` (monotonic clock) is shared by every wait of one call (``-timeout``); an expired one is
  :class:`~nexus_cutover.errors.LockTimeout` (exit 4), "nothing written".
* :func:`bounded_session` bounds row-lock waits (``innodb_lock_wait_timeout`` on MySQL protocol, ``busy_timeout`` on
  SQLite) and, when asked, each statement's run time by what is left of the deadline. The settings are
  session-level, so they are restored on exit: a pooled connection never carries one call's limits into the next.
* Session statements run on the raw DBAPI connection (:func:`session_execute`), so they never autobegin a
  SQLAlchemy transaction.
* :func:`is_sqlite` / :func:`is_mysql` are the dialect tests the bounds (and every caller, through
  :mod:`nexus_cutover.db`) dispatch on: MariaDB counts as MySQL protocol.
"""

from __future__ import annotations

import contextlib
import math
import time
from collections.abc import Iterator
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine

from .errors import LockTimeout


def is_sqlite(bind: Engine | Connection) -> bool:
    return bind.dialect.name == "sqlite"


def is_mysql(bind: Engine | Connection) -> bool:
    return bind.dialect.name in ("mysql", "mariadb")


@dataclass
class Deadline:
    """A monotonic deadline shared by every wait of one call (``-timeout``)."""

    seconds: float
    started: float = field(default_factory=time.monotonic)

    def remaining(self) -> float:
        return self.seconds - (time.monotonic() - self.started)

    def expired(self) -> bool:
        return self.remaining() <= 0

    def check(self, what: str) -> None:
        if self.expired():
            raise LockTimeout(f"timed out after {self.seconds:g}s while {what}; nothing written")

    def whole_seconds(self) -> int:
        """Remaining time rounded up to a whole second, at least 1 (InnoDB's unit)."""
        return max(1, int(math.ceil(self.remaining())))


def session_execute(conn: Connection, sql: str, params: tuple = ()) -> list:
    """Run a session-level statement on the raw DBAPI connection (no SQLAlchemy autobegin); its rows, if any."""
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        cursor.execute(sql, params) if params else cursor.execute(sql)
        return list(cursor.fetchall()) if cursor.description else []
    finally:
        cursor.close()


def bound_lock_waits(conn: Connection, deadline: Deadline) -> None:
    """Bound every row-lock wait of ``conn`` by what is left of ``deadline`` (see :func:`bounded_session`)."""
    if is_mysql(conn):
        session_execute(conn, "SET SESSION innodb_lock_wait_timeout = %s", (deadline.whole_seconds(),))
    elif is_sqlite(conn):
        session_execute(conn, f"PRAGMA busy_timeout = {max(1, int(deadline.remaining() * 1000))}")


@contextlib.contextmanager
def bounded_session(conn: Connection, deadline: Deadline, *, statements: bool = False) -> Iterator[None]:
    """Bound lock waits (and, with ``statements``, each statement's run time) by ``deadline``.

    The settings are session-level, so they are restored on exit: a pooled
    connection never carries one call's limits into the next.
    """
    saved_busy = None
    if is_sqlite(conn):
        saved_busy = session_execute(conn, "PRAGMA busy_timeout")[0][0]
    bound_lock_waits(conn, deadline)
    mariadb = getattr(conn.dialect, "is_mariadb", False)
    if statements and is_mysql(conn):
        if mariadb:
            session_execute(conn, "SET SESSION max_statement_time = %s", (max(0.001, deadline.remaining()),))
        else:
            session_execute(conn, "SET SESSION max_execution_time = %s", (max(1, int(deadline.remaining() * 1000)),))
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            if is_mysql(conn):
                session_execute(conn, "SET SESSION innodb_lock_wait_timeout = DEFAULT")
                if statements:
                    name = "max_statement_time" if mariadb else "max_execution_time"
                    session_execute(conn, f"SET SESSION {name} = DEFAULT")
            elif saved_busy is not None:
                session_execute(conn, f"PRAGMA busy_timeout = {int(saved_busy)}")

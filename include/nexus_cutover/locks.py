"""Named lifecycle locks on ``_System_Lock`` rows.

Invariants (contract, ``_System_Lock``):

* Locks are point locks on existing rows, taken with ``SELECT ... FOR UPDATE``
  inside the caller's transaction (TiDB has no gap locks, so we never lock a
  missing row). On SQLite the transaction itself is ``BEGIN IMMEDIATE``.
* Order is always namespace first, then packs by PackInstallId ascending, so
  two lifecycle writers can never deadlock on each other's lock rows.
* Lock rows are created beforehand, each in its own short autocommit
  transaction with an insert-if-absent; concurrent creators may deadlock on
  that insert, which is retried, never surfaced.
* The first read of a locked transaction is the lock itself, so the
  consistent-read snapshot of everything read afterwards is taken *after* the
  locks were granted and sees what the previous holder committed.
* Every wait is bounded by the caller's :class:`~nexus_cutover.db.Deadline`.
"""

from __future__ import annotations

import contextlib
import time
from collections.abc import Iterable, Iterator

from sqlalchemy import Connection, Engine, insert, select
from sqlalchemy import exc as sa_exc

from .catalog import Lock, namespace_lock_name, pack_lock_name
from .db import Deadline, bounded_session, classify, is_retryable_conflict, is_sqlite
from .errors import LockTimeout


def lifecycle_lock_names(namespace: str, pack_install_ids: Iterable[str] = ()) -> list[str]:
    """The lock rows of a lifecycle operation, in the one global acquisition order."""
    return [namespace_lock_name(namespace)] + [pack_lock_name(p) for p in sorted(set(pack_install_ids))]


def ensure_lock_rows(engine: Engine, names: Iterable[str], deadline: Deadline) -> None:
    """Create missing lock rows, each in its own transaction; deadlocks are retried."""
    for name in names:
        attempt = 0
        while True:
            deadline.check(f"creating lock row {name!r}")
            try:
                with engine.connect() as conn:
                    if is_sqlite(conn):  # a deferred read->write upgrade fails at once under WAL; wait instead
                        conn = conn.execution_options(sqlite_begin="IMMEDIATE")
                    with bounded_session(conn, deadline), conn.begin():
                        _insert_if_absent(conn, name)
                break
            except sa_exc.DBAPIError as exc:
                if is_retryable_conflict(exc):
                    attempt += 1
                    time.sleep(min(0.05 * attempt, 0.5))
                    continue
                raise classify(exc, f"creating lock row {name!r}") from exc


def _insert_if_absent(conn: Connection, name: str) -> None:
    if conn.execute(select(Lock.c.LockName).where(Lock.c.LockName == name)).first() is None:
        stmt = insert(Lock).values(LockName=name)
        conn.execute(stmt.prefix_with("IGNORE", dialect="mysql").prefix_with("OR IGNORE", dialect="sqlite"))


def acquire(conn: Connection, names: list[str], deadline: Deadline) -> None:
    """Lock ``names`` (already in acquisition order) inside ``conn``'s open transaction.

    The caller bounds the waits (:func:`~nexus_cutover.db.bounded_session`).
    """
    for name in names:
        deadline.check(f"waiting for lock {name!r}")
        try:
            row = conn.execute(select(Lock.c.LockName).where(Lock.c.LockName == name).with_for_update()).first()
        except sa_exc.DBAPIError as exc:
            raise classify(exc, f"waiting for lock {name!r}") from exc
        if row is None:
            raise LockTimeout(f"lock row {name!r} disappeared while waiting for it; nothing written")


@contextlib.contextmanager
def locked_transaction(
    engine: Engine, names: list[str], deadline: Deadline, *, bound_statements: bool = True
) -> Iterator[Connection]:
    """A transaction holding ``names``; commits on normal exit, rolls back on any error.

    Lock waits, and with ``bound_statements`` every statement, are bounded by ``deadline``.
    """
    ensure_lock_rows(engine, names, deadline)
    deadline.check("opening the locked transaction")
    try:
        conn = engine.connect()
    except sa_exc.DBAPIError as exc:
        raise classify(exc, "connecting") from exc
    try:
        if is_sqlite(conn):
            conn = conn.execution_options(sqlite_begin="IMMEDIATE")
        with bounded_session(conn, deadline, statements=bound_statements):
            try:
                with conn.begin():
                    acquire(conn, names, deadline)
                    yield conn
            except sa_exc.DBAPIError as exc:
                raise classify(exc, "holding the lifecycle locks") from exc
    finally:
        conn.close()

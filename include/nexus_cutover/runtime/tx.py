"""Transactions of the runtime, and the id / ordinal allocators used inside them.

Invariants:

* :func:`run_in_pack_transaction` holds the pack's ``_System_Lock`` row
  (``pack/<PackInstallId>``, a point lock taken first). It serializes fresh
  ingress, replay and old-style admission of one pack. On MySQL/MariaDB/TiDB
  every runtime transaction runs at READ COMMITTED, so each read after the lock
  sees what the previous holder committed (TiDB's REPEATABLE READ snapshot would
  predate the lock grant); the ordinal allocator row is also read FOR UPDATE.
  On SQLite the transaction is ``BEGIN IMMEDIATE`` (serializable).
* ``EventId`` / ``WorkId`` are plain BIGINT keys with no allocator table: they
  are allocated as ``MAX()+1`` (a one-row read at the end of the primary key)
  inside the transaction. Two packs admitting at once hold different pack locks
  and may pick the same id; the loser gets a duplicate-key error and the whole
  transaction is retried from the start (as are deadlock victims), within the
  caller's :class:`~nexus_cutover.db.Deadline`. Nothing is retried after a commit.
* Ordinals come from ``_System_EnqueueOrdinal`` under the pack lock: positive,
  strictly increasing, never reused, and always above the given floor
  (``LegacyMaxOrdinal``).
"""

from __future__ import annotations

import random
import time
import weakref
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Column, Connection, Engine, func, insert, select, update
from sqlalchemy import exc as sa_exc

from .. import catalog
from ..db import Deadline, bounded_session, classify, driver_error_code, is_mysql, is_retryable_conflict, is_sqlite
from ..errors import LockTimeout
from ..locks import acquire, ensure_lock_rows

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0
_MAX_ATTEMPTS = 200
_DUPLICATE_KEY = 1062

# Lock rows are never deleted, so once created for an engine they need no further check.
_known_lock_rows: weakref.WeakKeyDictionary[Engine, set[str]] = weakref.WeakKeyDictionary()


def is_duplicate_key(exc: BaseException) -> bool:
    if not isinstance(exc, sa_exc.IntegrityError):
        return False
    if driver_error_code(exc) == _DUPLICATE_KEY:
        return True
    return "unique constraint failed" in str(getattr(exc, "orig", exc)).lower()


def _retry_pause(attempt: int) -> None:
    time.sleep(random.uniform(0, min(0.002 * (2 ** min(attempt, 6)), 0.1)))


def _set_next_transaction_read_committed(conn: Connection) -> None:
    """READ COMMITTED for the next transaction only (raw cursor: no SQLAlchemy autobegin).

    Every read after the lock row then sees what the previous lock holder
    committed, on MariaDB and on TiDB alike (TiDB's REPEATABLE READ snapshot is
    taken before the lock is granted); conditional UPDATEs re-check the rest.
    """
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
    finally:
        cursor.close()


def run_transaction(
    engine: Engine,
    body: Callable[[Connection], T],
    *,
    what: str,
    deadline: Deadline | None = None,
    lock_names: list[str] | None = None,
) -> T:
    """Run ``body(conn)`` in one transaction, retrying id conflicts and deadlocks from the start.

    ``lock_names`` (in the global acquisition order) are locked first. Contract
    errors raised by ``body`` roll back and propagate unchanged.
    """
    deadline = deadline or Deadline(DEFAULT_TIMEOUT_S)
    if lock_names:
        known = _known_lock_rows.setdefault(engine, set())
        missing = [n for n in lock_names if n not in known]
        if missing:
            ensure_lock_rows(engine, missing, deadline)
            known.update(missing)
    for attempt in range(_MAX_ATTEMPTS):
        deadline.check(what)
        try:
            conn = engine.connect()
        except sa_exc.DBAPIError as exc:
            raise classify(exc, what) from exc
        try:
            if is_sqlite(conn):
                conn = conn.execution_options(sqlite_begin="IMMEDIATE")
            with bounded_session(conn, deadline):
                if is_mysql(conn):
                    _set_next_transaction_read_committed(conn)
                with conn.begin():
                    if lock_names:
                        acquire(conn, lock_names, deadline)
                    return body(conn)
        except sa_exc.DBAPIError as exc:
            if is_duplicate_key(exc) or is_retryable_conflict(exc):
                _retry_pause(attempt)
                continue
            raise classify(exc, what) from exc
        finally:
            conn.close()
    raise LockTimeout(f"gave up after {_MAX_ATTEMPTS} conflicting attempts while {what}; nothing written")


def run_in_pack_transaction(
    engine: Engine, pack_install_id: str, body: Callable[[Connection], T], *, what: str, deadline: Deadline | None = None
) -> T:
    """:func:`run_transaction` holding the pack lock row of ``pack_install_id``."""
    return run_transaction(engine, body, what=what, deadline=deadline, lock_names=[catalog.pack_lock_name(pack_install_id)])


def allocate_ids(conn: Connection, key: Column, count: int) -> int:
    """The first of ``count`` fresh ids of ``key``'s table (``MAX()+1``; conflicts retried by the caller)."""
    last = conn.execute(select(func.max(key))).scalar()
    return (last or 0) + 1 if count else 0


def allocate_event_and_work_ids(conn: Connection) -> tuple[int, int]:
    """The next free EventId and WorkId in one statement (``MAX()+1`` of each primary key)."""
    row = conn.execute(
        select(
            select(func.max(catalog.Event.c.EventId)).scalar_subquery(),
            select(func.max(catalog.WorkItem.c.WorkId)).scalar_subquery(),
        )
    ).one()
    return (row[0] or 0) + 1, (row[1] or 0) + 1


def allocate_ordinals(conn: Connection, pack_install_id: str, floor: int, count: int) -> int:
    """Reserve ``count`` ordinals above both ``LastOrdinal`` and ``floor``; returns the first.

    Must run under the pack lock. Creates the allocator row when the pack has none.
    """
    t = catalog.EnqueueOrdinal
    # A locking (current) read: TiDB's plain reads use the snapshot taken before the pack lock was granted.
    last = conn.execute(select(t.c.LastOrdinal).where(t.c.PackInstallId == pack_install_id).with_for_update()).scalar()
    first = max(last or 0, floor) + 1
    new_last = first + count - 1
    if last is None:
        conn.execute(insert(t).values(PackInstallId=pack_install_id, LastOrdinal=new_last))
    else:
        conn.execute(update(t).where(t.c.PackInstallId == pack_install_id).values(LastOrdinal=new_last))
    return first

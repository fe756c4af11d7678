"""Transactions of the runtime, and the id / ordinal allocators used inside them.

Invariants:

* Every runtime transaction is a transaction of the project's one policy
  (:func:`nexus_cutover.tx.run`): READ COMMITTED on MySQL/MariaDB/TiDB, so each
  read after a lock sees what the previous holder committed (TiDB's REPEATABLE
  READ snapshot would predate the lock grant); ``BEGIN IMMEDIATE`` on SQLite.
* :func:`run_in_pack_transaction` holds the pack's ``_System_Lock`` row
  (``pack/<PackInstallId>``, a point lock taken first). It serializes fresh
  ingress, replay and old-style admission of one pack; the ordinal allocator
  row is also read FOR UPDATE.
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

from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Column, Connection, Engine, func, insert, select, update

from .. import catalog
from .. import tx as policy
from ..db import Deadline

T = TypeVar("T")

#: Runtime transactions retry deadlock victims and lost ``MAX()+1`` id races.
RUNTIME_RETRY = policy.Retry.DEADLOCK | policy.Retry.DUPLICATE_KEY


def run_transaction(
    engine: Engine,
    body: Callable[[Connection], T],
    *,
    what: str,
    deadline: Deadline | None = None,
    lock_names: list[str] | None = None,
) -> T:
    """``body(conn)`` in one policy transaction holding ``lock_names``; id conflicts and deadlocks retried."""
    return policy.run(engine, body, what=what, deadline=deadline, locks=lock_names or (), retry=RUNTIME_RETRY)


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

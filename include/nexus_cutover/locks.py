"""Named lifecycle locks on ``_System_Lock`` rows: their names, their one order, and how one is taken.

Invariants (contract, ``_System_Lock``):

* Locks are point locks on existing rows, taken with ``SELECT ... FOR UPDATE``
  inside the caller's transaction (TiDB has no gap locks, so a missing row is
  never "locked": it is created first, by :func:`insert_lock_row_if_absent` in a
  transaction of its own). On SQLite the transaction itself is ``BEGIN IMMEDIATE``.
* Order is always namespace first, then packs by PackInstallId ascending, so
  two lifecycle writers can never deadlock on each other's lock rows.
* Lock rows are never deleted.

Transactions, retries and deadlines are :mod:`nexus_cutover.tx`'s business:
this module only names and takes the locks.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, bindparam, insert, select

from .catalog import Lock, namespace_lock_name, pack_lock_name
from .db import Deadline
from .errors import LockTimeout

#: The point lock on one existing row (built once: constructing a statement costs more than running this one).
_LOCK_ROW = select(Lock.c.LockName).where(Lock.c.LockName == bindparam("name", type_=Lock.c.LockName.type)).with_for_update()


def lifecycle_lock_names(namespace: str, pack_install_ids: Iterable[str] = ()) -> list[str]:
    """The lock rows of a lifecycle operation, in the one global acquisition order."""
    return [namespace_lock_name(namespace)] + [pack_lock_name(p) for p in sorted(set(pack_install_ids))]


def insert_lock_row_if_absent(conn: Connection, name: str) -> None:
    """Create lock row ``name`` unless it exists (a concurrent creator's duplicate key is the caller's retry)."""
    if conn.execute(select(Lock.c.LockName).where(Lock.c.LockName == name)).first() is None:
        conn.execute(insert(Lock).values(LockName=name))


def acquire(conn: Connection, names: list[str], deadline: Deadline) -> None:
    """Lock ``names`` (already in acquisition order) inside ``conn``'s open transaction.

    Driver errors (lock wait timeout, deadlock) propagate as they are, for the
    transaction policy to classify or retry.
    """
    for name in names:
        deadline.check(f"waiting for lock {name!r}")
        row = conn.execute(_LOCK_ROW, {"name": name}).first()
        if row is None:
            raise LockTimeout(f"lock row {name!r} disappeared while waiting for it; nothing written")

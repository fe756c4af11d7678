"""Named lifecycle locks on ``_System_Lock`` rows: their names, their one order, and how one is taken.

Invariants (contract, ``_System_Lock``):

* Locks are point locks on existing rows, taken with ``SELECT ... FOR UPDATE``
  inside the caller's transaction (TiDB has no gap locks, so a missing row is
  never "locked": it is created first, by :func:`insert_lock_row_if_absent` in a
  transaction of its own). On SQLite the transaction itself is ``BEGIN IMMEDIATE``.
* Order is always namespace first, then packs by PackInstallId ascending, so
  two lifecycle writers can never deadlock on each other's lock rows.
* Lock rows are never deleted.
* The time spent taking locks is measured here, where they are taken, and handed out as data
  (:func:`metering`, :class:`LockWaitMeter`): per thread, so a task's own waits are not mixed with those
  of other threads of the process (a host, a poller).

Transactions, retries and deadlines are :mod:`nexus_cutover.tx`'s business:
this module only names and takes the locks.
"""

from __future__ import annotations

import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

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


@dataclass
class LockWaitMeter:
    """What one thread spent taking locks since :func:`metering`: ``seconds`` from asking for the locks of a
    transaction to holding them all (retried attempts and failed waits included), over ``acquisitions``
    transactions, and the longest single wait."""

    seconds: float = 0.0
    acquisitions: int = 0
    longest_s: float = 0.0
    names: set[str] = field(default_factory=set)

    def add(self, seconds: float, names: list[str]) -> None:
        self.seconds += seconds
        self.acquisitions += 1
        self.longest_s = max(self.longest_s, seconds)
        self.names.update(names)


_meters = threading.local()


def metering() -> LockWaitMeter:
    """Start measuring this thread's lock waits (replacing any meter it had) and return the meter."""
    _meters.current = LockWaitMeter()
    return _meters.current


def current_meter() -> LockWaitMeter | None:
    """This thread's meter, if :func:`metering` started one."""
    return getattr(_meters, "current", None)


def acquire(conn: Connection, names: list[str], deadline: Deadline) -> None:
    """Lock ``names`` (already in acquisition order) inside ``conn``'s open transaction.

    Driver errors (lock wait timeout, deadlock) propagate as they are, for the
    transaction policy to classify or retry. The time taken is added to this thread's meter, if any.
    """
    if not names:
        return
    started = time.perf_counter()
    try:
        for name in names:
            deadline.check(f"waiting for lock {name!r}")
            row = conn.execute(_LOCK_ROW, {"name": name}).first()
            if row is None:
                raise LockTimeout(f"lock row {name!r} disappeared while waiting for it; nothing written")
    finally:
        meter = current_meter()
        if meter is not None:
            meter.add(time.perf_counter() - started, names)

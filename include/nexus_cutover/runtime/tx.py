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
* ``EventId`` / ``WorkId`` are plain BIGINT keys with no allocator table. The
  rows a pack writes take their ids from the pack's own **id shard**, a range of
  2**40 ids picked by a stable hash of the PackInstallId (shards 1..8191; shard 0,
  below 2**40, is where the legacy runtime's ids live): the next id is the
  shard's greatest id + 1, one indexed read at the end of that primary-key
  range, under the pack lock. So two packs admitting at once do not pick the
  same ids (the ``MAX()+1`` of the whole table, which every pack shared, made
  them collide on every concurrent batch), and on TiDB their inserts land in
  different key ranges instead of one hot region (what AUTO_RANDOM's shard bits
  do). Ids stay below 2**53, exact in JSON and JavaScript. Ids are unique, never
  an order: nothing reads "latest" from them.
* A collision is still possible (two packs whose hashes share a shard, or a
  writer outside this protocol taking ``MAX()+1`` of the table): the loser gets
  a duplicate-key error on the primary key and the whole transaction is retried
  from the start (as are deadlock victims), within the caller's
  :class:`~nexus_cutover.db.Deadline`. A duplicate on any other key is not retried.
  Nothing is retried after a commit.
* Ordinals come from ``_System_EnqueueOrdinal`` under the pack lock: positive,
  strictly increasing, never reused, and always above the given floor
  (``LegacyMaxOrdinal``).
"""

from __future__ import annotations

import zlib
from collections.abc import Callable
from typing import TypeVar

from sqlalchemy import Column, Connection, Engine, Select, bindparam, func, insert, select, update

from .. import catalog
from .. import tx as policy
from ..db import Deadline
from ..errors import CutoverError

T = TypeVar("T")

#: Runtime transactions retry deadlock victims and lost id races (duplicates on a primary key), nothing else: a
#: duplicate receipt key is not transient (:mod:`.duplicates` finds those before the INSERT).
RUNTIME_RETRY = policy.Retry.DEADLOCK | policy.Retry.DUPLICATE_ID


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


#: Bits of an id below its shard number: 2**40 ids per pack; shards 1..8191 keep every id below 2**53.
ID_SHARD_BITS = 40
ID_SHARDS = 2**13


def id_shard(pack_install_id: str) -> int:
    """The pack's id shard, 1..8191: a stable hash of the PackInstallId (the same in every process and release)."""
    return 1 + zlib.crc32(pack_install_id.encode()) % (ID_SHARDS - 1)


def _shard_range(pack_install_id: str) -> tuple[int, int]:
    low = id_shard(pack_install_id) << ID_SHARD_BITS
    return low, low + (1 << ID_SHARD_BITS) - 1


def _next_in_shard(key: Column, prefix: str):
    """The shard's greatest ``key`` + 1 (its low bound + 1 when empty); bound parameters ``<prefix>_low/_high``."""
    low, high = bindparam(f"{prefix}_low", type_=key.type), bindparam(f"{prefix}_high", type_=key.type)
    return select(func.coalesce(func.max(key), low) + 1).where(key.between(low, high)).scalar_subquery()


#: Built once (they run once per admission batch: constructing a statement costs more than these reads).
_NEXT_ID = {key.name: select(_next_in_shard(key, "id")) for key in (catalog.Event.c.EventId, catalog.WorkItem.c.WorkId)}
_NEXT_IDS = select(_next_in_shard(catalog.Event.c.EventId, "ev"), _next_in_shard(catalog.WorkItem.c.WorkId, "work"))


def _shard_params(pack_install_id: str, *prefixes: str) -> dict[str, int]:
    low, high = _shard_range(pack_install_id)
    return {name: value for p in prefixes for name, value in ((f"{p}_low", low), (f"{p}_high", high))}


def _checked(first: int, count: int, pack_install_id: str) -> int:
    if first + count - 1 > _shard_range(pack_install_id)[1]:
        raise CutoverError(f"pack {pack_install_id!r} used up its id shard {id_shard(pack_install_id)} (2**40 ids): "
                           "nothing written; a new pack incarnation gets a shard of its own")
    return first


def allocate_ids(conn: Connection, key: Column, pack_install_id: str, count: int = 1) -> int:
    """The first of ``count`` fresh ids of ``key`` (``Event.EventId`` or ``WorkItem.WorkId``) in the pack's id shard
    (under the pack lock)."""
    return _checked(conn.execute(_NEXT_ID[key.name], _shard_params(pack_install_id, "id")).scalar_one(), count, pack_install_id)


def next_ids_query(pack_install_id: str) -> Select:
    """The next free EventId and WorkId of the pack's id shard: two reads at the end of a primary-key range."""
    return _NEXT_IDS.params(_shard_params(pack_install_id, "ev", "work"))


def allocate_event_and_work_ids(conn: Connection, pack_install_id: str, events: int, works: int) -> tuple[int, int]:
    """The first of ``events`` EventIds and of ``works`` WorkIds of the pack's id shard, in one statement (under the pack lock)."""
    row = conn.execute(_NEXT_IDS, _shard_params(pack_install_id, "ev", "work")).one()
    return _checked(row[0], events, pack_install_id), _checked(row[1], works, pack_install_id)


_ordinal = catalog.EnqueueOrdinal
# A locking (current) read: TiDB's plain reads use the snapshot taken before the pack lock was granted.
_pack = bindparam("pack", type_=_ordinal.c.PackInstallId.type)
_last = bindparam("last", type_=_ordinal.c.LastOrdinal.type)
_LAST_ORDINAL = select(_ordinal.c.LastOrdinal).where(_ordinal.c.PackInstallId == _pack).with_for_update()
_SET_LAST_ORDINAL = update(_ordinal).where(_ordinal.c.PackInstallId == _pack).values(LastOrdinal=_last)
_NEW_LAST_ORDINAL = insert(_ordinal).values(PackInstallId=_pack, LastOrdinal=_last)


def allocate_ordinals(conn: Connection, pack_install_id: str, floor: int, count: int) -> int:
    """Reserve ``count`` ordinals above both ``LastOrdinal`` and ``floor``; returns the first.

    Must run under the pack lock. Creates the allocator row when the pack has none.
    """
    last = conn.execute(_LAST_ORDINAL, {"pack": pack_install_id}).scalar()
    first = max(last or 0, floor) + 1
    params = {"pack": pack_install_id, "last": first + count - 1}
    conn.execute(_NEW_LAST_ORDINAL if last is None else _SET_LAST_ORDINAL, params)
    return first

"""The one transaction policy: how every transaction of the project is opened, locked, bounded and retried.

Every write path (lifecycle steps, the range runtime, Field History) runs its
transaction through :func:`run`; every read goes through :func:`reading` (or
:func:`read`, the same path for a function): one read-only transaction, driver
errors translated. Nothing else opens a locked transaction or loops on a conflict.

Rules:

* **Isolation.** On MySQL-protocol servers (TiDB, MySQL, MariaDB) a transaction
  of :func:`run` is READ COMMITTED (set for that transaction only, on the raw
  connection, before it begins). TiDB fixes a REPEATABLE READ snapshot at the
  transaction's first statement, i.e. *before* a lock wait; at READ COMMITTED
  each statement reads the latest commit, so every read after the locks sees
  what the previous lock holder committed. This relies on TiDB's pessimistic
  mode (its default since 3.0.8), where READ COMMITTED is supported. On SQLite
  the transaction is ``BEGIN IMMEDIATE``: the database write lock is taken up
  front and the transaction is serializable.
  :func:`read` is a read-only REPEATABLE READ transaction: one consistent
  snapshot for a report of several statements; it is always rolled back.
* **Locks.** Named ``_System_Lock`` rows, in the one global order
  (:func:`~nexus_cutover.locks.lifecycle_lock_names`: namespace first, then
  packs ascending), are locked with ``SELECT ... FOR UPDATE`` as the first
  statements of the transaction. TiDB has no gap locks, so a missing row would
  lock nothing: lock rows are created beforehand, each in its own short
  transaction (insert-if-absent), and never deleted.
* **Retries.** Only what the caller names in ``retry`` (:class:`Retry`), always
  by re-running the whole body in a new transaction (nothing is retried after a
  commit): a deadlock victim (the server already rolled the transaction back);
  a lock-wait timeout, where each attempt is idempotent (a materialization
  batch); a duplicate key, where an id allocated from the greatest id in use
  (:mod:`nexus_cutover.runtime.tx`) lost a race or a row is inserted if absent. One backoff for all: jittered, doubling from 2 ms to at
  most 0.5 s; attempts are bounded by the deadline and :data:`MAX_ATTEMPTS`.
* **Deadline.** Every lock wait is bounded by what is left of the caller's
  :class:`~nexus_cutover.db.Deadline` (and by ``lock_wait_s`` per attempt);
  with ``bound_statements`` each statement's run time too. The session
  settings are restored afterwards (:func:`~nexus_cutover.db.bounded_session`).
* **Errors.** Driver errors leave as contract errors
  (:func:`~nexus_cutover.db.classify`); an error raised by the body rolls the
  transaction back and propagates unchanged.
"""

from __future__ import annotations

import contextlib
import enum
import logging
import random
import time
import weakref
from collections.abc import Callable, Iterable, Iterator
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine
from sqlalchemy import exc as sa_exc

from .db import (
    Deadline,
    bounded_session,
    classify,
    engine_tls,
    is_deadlock,
    is_duplicate_key,
    is_lock_wait_timeout,
    is_mysql,
    is_primary_key_duplicate,
    is_sqlite,
    tls_report,
)
from .errors import LockTimeout
from .locks import acquire, insert_lock_row_if_absent

log = logging.getLogger(__name__)

T = TypeVar("T")

DEFAULT_TIMEOUT_S = 30.0
MAX_ATTEMPTS = 200
_BACKOFF_FIRST_S = 0.002
_BACKOFF_CAP_S = 0.5


class Retry(enum.Flag):
    """Which failures of an attempt re-run the body in a new transaction."""

    NONE = 0
    DEADLOCK = enum.auto()
    LOCK_WAIT = enum.auto()
    DUPLICATE_KEY = enum.auto()
    #: A duplicate on a primary key only (an allocated id lost a race): never a unique secondary key such as a
    #: receipt key, which retrying does not remove.
    DUPLICATE_ID = enum.auto()


def retryable(exc: BaseException, retry: Retry) -> bool:
    """Whether ``exc`` is one of the failures ``retry`` names."""
    return (
        (Retry.DEADLOCK in retry and is_deadlock(exc))
        or (Retry.LOCK_WAIT in retry and is_lock_wait_timeout(exc))
        or (Retry.DUPLICATE_KEY in retry and is_duplicate_key(exc))
        or (Retry.DUPLICATE_ID in retry and is_primary_key_duplicate(exc))
    )


def backoff(attempt: int) -> None:
    """The one retry pause: jittered, doubling from 2 ms, at most 0.5 s."""
    time.sleep(random.uniform(0, min(_BACKOFF_FIRST_S * (2 ** min(attempt, 10)), _BACKOFF_CAP_S)))


class Attempt:
    """One try of a retried block: ``with attempt:`` swallows a retryable failure and records it."""

    def __init__(self, number: int, is_retryable: Callable[[BaseException], bool]):
        self.number = number
        self._is_retryable = is_retryable
        self.failure: BaseException | None = None

    def __enter__(self) -> Attempt:
        return self

    def __exit__(self, exc_type, exc, tb) -> bool:
        if exc is not None and self._is_retryable(exc):
            self.failure = exc
            return True
        return False


def attempts(
    what: str,
    *,
    deadline: Deadline,
    retry: Retry = Retry.DEADLOCK,
    also: tuple[type[BaseException], ...] = (),
    max_attempts: int = MAX_ATTEMPTS,
) -> Iterator[Attempt]:
    """Attempts of a block retried under this policy; the block returns (or breaks) when it succeeds::

        for attempt in attempts("doing x", deadline=d):
            with attempt:
                return do_x()

    ``also``: exception classes the caller treats as retryable conflicts too
    (e.g. a simulated retry loop's own conflict). When the deadline passes or
    ``max_attempts`` failed, :class:`~nexus_cutover.errors.LockTimeout` says so.
    """

    def is_retryable(exc: BaseException) -> bool:
        return retryable(exc, retry) or isinstance(exc, also)

    last: BaseException | None = None
    for number in range(1, max_attempts + 1):
        if last is not None:
            if deadline.expired():
                raise LockTimeout(f"timed out after {deadline.seconds:g}s while {what} (last conflict: {_short(last)})") from last
            backoff(number)
        else:
            deadline.check(what)
        attempt = Attempt(number, is_retryable)
        yield attempt
        if attempt.failure is None:
            return
        last = attempt.failure
        level = logging.WARNING if is_lock_wait_timeout(last) else logging.INFO if number % 10 == 1 else logging.DEBUG
        log.log(level, "%s: attempt %d hit %s; retrying", what, number, _short(last))
    raise LockTimeout(f"gave up after {max_attempts} conflicting attempts while {what}; nothing written") from last


def _short(exc: BaseException) -> str:
    lines = str(getattr(exc, "orig", exc)).splitlines()
    return (lines[0] if lines else type(exc).__name__)[:200]


# -- lock rows ----------------------------------------------------------------

# Lock rows are never deleted, so once present for an engine they need no further check.
_known_lock_rows: weakref.WeakKeyDictionary[Engine, set[str]] = weakref.WeakKeyDictionary()


def ensure_lock_rows(engine: Engine, names: Iterable[str], deadline: Deadline) -> None:
    """Create the missing lock rows of ``names``, each in its own short transaction (races retried)."""
    known = _known_lock_rows.setdefault(engine, set())
    for name in names:
        if name in known:
            continue
        run(
            engine,
            lambda conn, name=name: insert_lock_row_if_absent(conn, name),
            what=f"creating lock row {name!r}",
            deadline=deadline,
            retry=Retry.DEADLOCK | Retry.DUPLICATE_KEY,
            create_lock_rows=False,
        )
        known.add(name)


# -- transactions -------------------------------------------------------------


def _set_next_transaction_read_committed(conn: Connection) -> None:
    """READ COMMITTED for the next transaction only (raw cursor: no SQLAlchemy autobegin)."""
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
    finally:
        cursor.close()


def _connect(engine: Engine, what: str) -> Connection:
    try:
        return engine.connect()
    except sa_exc.DBAPIError as exc:
        raise classify(exc, what) from exc


def run(
    engine: Engine,
    body: Callable[[Connection], T],
    *,
    what: str,
    deadline: Deadline | None = None,
    locks: list[str] | tuple[str, ...] = (),
    retry: Retry = Retry.DEADLOCK,
    bound_statements: bool = False,
    lock_wait_s: float | None = None,
    create_lock_rows: bool = True,
) -> T:
    """Run ``body(conn)`` in one transaction of this policy (see the module rules) and return its result.

    ``locks``: ``_System_Lock`` names, already in the global acquisition order,
    locked before ``body`` runs (their rows are created first unless
    ``create_lock_rows`` is False). ``retry``: which failures re-run ``body``
    from the start. ``lock_wait_s``: a cap on each attempt's lock waits, below
    the overall ``deadline``.
    """
    deadline = deadline or Deadline(DEFAULT_TIMEOUT_S)
    locks = list(locks)
    if locks and create_lock_rows:
        ensure_lock_rows(engine, locks, deadline)
    for attempt in attempts(what, deadline=deadline, retry=retry):
        with attempt:
            return _once(engine, body, what, deadline, locks, bound_statements, lock_wait_s, retry)
    raise AssertionError("attempts() returns or raises")  # pragma: no cover


def _once(engine, body, what, deadline, locks, bound_statements, lock_wait_s, retry):
    bound = deadline if lock_wait_s is None else Deadline(max(0.1, min(lock_wait_s, deadline.remaining())))
    conn = _connect(engine, what)
    try:
        if is_sqlite(conn):
            conn = conn.execution_options(sqlite_begin="IMMEDIATE")
        with bounded_session(conn, bound, statements=bound_statements):
            if is_mysql(conn):
                _set_next_transaction_read_committed(conn)
            try:
                with conn.begin():
                    acquire(conn, locks, deadline)
                    return body(conn)
            except sa_exc.DBAPIError as exc:
                if retryable(exc, retry):
                    raise
                raise classify(exc, what) from exc
    finally:
        conn.close()


def read(engine: Engine, body: Callable[[Connection], T], *, what: str, deadline: Deadline | None = None) -> T:
    """Run ``body(conn)`` in one read-only transaction (one snapshot where the server gives one); rolled back.

    With a ``deadline``, lock waits and each statement's run time are bounded by it.
    """
    with reading(engine, what, deadline=deadline) as conn:
        return body(conn)


@contextlib.contextmanager
def reading(bind: Engine | Connection, what: str, *, deadline: Deadline | None = None) -> Iterator[Connection]:
    """The read path: a connection for the block's reads, in one read-only transaction rolled back at its end, with
    every driver error (the connect included) raised as a contract error naming ``what`` (exit 1 with a message,
    never a traceback). With a Connection (a caller's transaction, e.g. under its locks): that connection, its
    errors translated the same way. With a ``deadline``, lock waits and each statement's run time are bounded by it.
    """
    if isinstance(bind, Connection):
        try:
            yield bind
        except sa_exc.DBAPIError as exc:
            raise classify(exc, what) from exc
        return
    if deadline is not None:
        deadline.check(what)
    conn = _connect(bind, what)
    try:
        with bounded_session(conn, deadline, statements=True) if deadline is not None else contextlib.nullcontext():
            try:
                with conn.begin() as transaction:
                    yield conn
                    transaction.rollback()
            except sa_exc.DBAPIError as exc:
                raise classify(exc, what) from exc
    finally:
        conn.close()


def connection_tls(engine: Engine) -> dict[str, Any] | None:
    """What a run's report says of its tenant connection (:func:`nexus_cutover.db.tls_report` with ``in_use``, the
    TLS version negotiated), from one read-path connection and one status read: cheap enough for every run's first
    step; None for SQLite."""
    if engine_tls(engine) is None:
        return None
    with reading(engine, "reading the tenant connection's TLS") as conn:
        return tls_report(engine, conn)

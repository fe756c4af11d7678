"""TiDB semantics for MariaDB test sessions (``NEXUS_TIDB_SEMANTICS=1``).

Production runs on TiDB, which differs from MariaDB where the lifecycle code
cares (see shared/notes, "TiDB facts"):

1. a transaction's read snapshot is fixed at BEGIN: plain SELECTs of a
   REPEATABLE READ transaction keep reading it even after a ``SELECT ... FOR
   UPDATE`` waited for another session's commit (InnoDB instead takes the read
   view at the first consistent read, i.e. after the lock wait). READ COMMITTED
   reads the latest commit per statement on both;
2. transactions are bounded (100 MB; 5,000 statements in optimistic mode;
   100-500 statements recommended).

This module makes MariaDB sessions behave like TiDB for (1) and counts (2),
with SQLAlchemy event listeners installed either on one engine
(:func:`install` with an :class:`~sqlalchemy.engine.Engine`) or on the
``Engine`` class (:func:`install` with no argument), which covers every engine
of the process, including those product code creates from DSNs. SQLite
connections are left alone.

* ``begin``: ``START TRANSACTION WITH CONSISTENT SNAPSHOT`` on the raw DBAPI
  connection, so the read view exists before the first statement. After a raw
  ``SET TRANSACTION ISOLATION LEVEL READ COMMITTED`` (how the product asks for
  READ COMMITTED) MariaDB 10.11 accepts it silently, the transaction runs at
  READ COMMITTED (each statement sees the latest commit) and the following
  transaction is back at the session level: exactly TiDB's behaviour.
* per transaction (reset at begin, checked at commit/rollback): statements
  executed and rows written (rowcount of INSERT/UPDATE/DELETE/REPLACE,
  executemany included). More than :data:`MAX_ROWS_WRITTEN` rows or
  :data:`MAX_STATEMENTS` statements is a violation, recorded in
  :data:`violations` and appended as a JSON line to ``$NEXUS_TIDB_VIOLATIONS_FILE``
  (so child processes report too). Nothing is raised inside the product's call;
  the test fails at teardown (tests/conftest.py).

An engine (or a connection) opts out with the execution option
``tidb_semantics=False``, e.g. ``make_engine(url, execution_options={"tidb_semantics": False})``.
"""

from __future__ import annotations

import atexit
import json
import os
import re
import threading
import time
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Connection, Engine, event, text

ENV_MODE = "NEXUS_TIDB_SEMANTICS"
ENV_VIOLATIONS_FILE = "NEXUS_TIDB_VIOLATIONS_FILE"
ENV_STATS_FILE = "NEXUS_TIDB_STATS_FILE"  # child processes append their totals here at exit

MAX_ROWS_WRITTEN = 10_000  # a stand-in for txn-total-size-limit (100 MB)
MAX_STATEMENTS = 5_000  # stmt-count-limit
RECOMMENDED_STATEMENTS = 500  # TiDB's recommendation: counted, not a violation

OPTION = "tidb_semantics"  # execution option; False opts an engine or connection out
START_SNAPSHOT = "START TRANSACTION WITH CONSISTENT SNAPSHOT"
FIRST_STATEMENT_CHARS = 300

_STATE_KEY = "nexus_tidb_semantics_tx"
_WRITE = re.compile(r"^\s*(?:(?:/\*.*?\*/|--[^\n]*\n|#[^\n]*\n)\s*)*(?:INSERT|UPDATE|DELETE|REPLACE)\b", re.IGNORECASE | re.DOTALL)
_MYSQL_DIALECTS = ("mysql", "mariadb")


@dataclass
class Stats:
    """Totals of this process."""

    transactions: int = 0  # transactions checked (ended by commit or rollback)
    snapshots: int = 0  # START TRANSACTION WITH CONSISTENT SNAPSHOT issued
    snapshot_errors: int = 0  # ... and failed (the connection's next statement reports the real error)
    max_statements: int = 0
    max_rows_written: int = 0
    over_recommended: int = 0  # transactions above RECOMMENDED_STATEMENTS statements
    violations: int = 0


violations: list[dict[str, Any]] = []
stats = Stats()

_lock = threading.Lock()
_global = False  # the class-level listeners are installed
_atexit_registered = False


def enabled_by_env() -> bool:
    return os.environ.get(ENV_MODE) == "1"


# -- installing -------------------------------------------------------------------


def install(target: Engine | type[Engine] = Engine) -> None:
    """Listen on ``target``: one engine, or (the default) the Engine class, i.e. every engine of the process.

    Idempotent. An engine-level install is a no-op while the class-level one is in place.
    """
    global _global
    if target is Engine:
        _global = True
    for name, fn in _listeners("global" if target is Engine else "engine"):
        if not event.contains(target, name, fn):
            event.listen(target, name, fn)


def uninstall(target: Engine | type[Engine] = Engine) -> None:
    global _global
    if target is Engine:
        _global = False
    for name, fn in _listeners("global" if target is Engine else "engine"):
        if event.contains(target, name, fn):
            event.remove(target, name, fn)


def installed_globally() -> bool:
    return _global


def install_from_environment() -> bool:
    """For child processes (tests/tidb_site/sitecustomize.py): install globally when the mode is on."""
    global _atexit_registered
    if not enabled_by_env():
        return False
    install()
    if os.environ.get(ENV_STATS_FILE) and not _atexit_registered:
        _atexit_registered = True
        atexit.register(_write_stats_line)
    return True


def _write_stats_line() -> None:
    path = os.environ.get(ENV_STATS_FILE)
    if path:
        _append_line(path, {"pid": os.getpid(), **asdict(stats)})


# -- the listeners ----------------------------------------------------------------

_listeners_cache: dict[str, list[tuple[str, Any]]] = {}


def _listeners(scope: str) -> list[tuple[str, Any]]:
    """One set of listener functions per scope (the same objects, so they can be removed again)."""
    if scope not in _listeners_cache:

        def applies(conn: Connection) -> bool:
            if conn.dialect.name not in _MYSQL_DIALECTS:
                return False
            if scope == "engine" and _global:  # the class-level listeners handle this engine already
                return False
            return conn.get_execution_options().get(OPTION, True) is not False

        def on_begin(conn: Connection) -> None:
            if applies(conn):
                _begin(conn)

        def on_before(conn, cursor, statement, parameters, context, executemany) -> None:
            if applies(conn):
                _before_statement(conn, statement)

        def on_after(conn, cursor, statement, parameters, context, executemany) -> None:
            if applies(conn):
                _after_statement(conn, cursor, statement)

        def on_commit(conn: Connection) -> None:
            if applies(conn):
                _end(conn, "commit")

        def on_rollback(conn: Connection) -> None:
            if applies(conn):
                _end(conn, "rollback")

        _listeners_cache[scope] = [
            ("begin", on_begin),
            ("before_cursor_execute", on_before),
            ("after_cursor_execute", on_after),
            ("commit", on_commit),
            ("rollback", on_rollback),
        ]
    return _listeners_cache[scope]


def _begin(conn: Connection) -> None:
    info = conn.info
    leftover = info.pop(_STATE_KEY, None)
    if leftover is not None:  # a transaction that ended without a commit/rollback event
        _check(leftover, "ended unseen")
    info[_STATE_KEY] = {"statements": 0, "rows": 0, "first": None, "database": conn.engine.url.database}
    dbapi_connection = conn.connection.dbapi_connection
    get_autocommit = getattr(dbapi_connection, "get_autocommit", None)
    if get_autocommit is not None and get_autocommit():
        return  # AUTOCOMMIT isolation: every statement is its own transaction; no snapshot to fix
    try:
        cursor = dbapi_connection.cursor()
        try:
            cursor.execute(START_SNAPSHOT)
        finally:
            cursor.close()
    except Exception:  # noqa: BLE001 - never raise inside the product's call; its next statement fails properly
        with _lock:
            stats.snapshot_errors += 1
        return
    with _lock:
        stats.snapshots += 1


def _before_statement(conn: Connection, statement: str) -> None:
    state = conn.info.get(_STATE_KEY)
    if state is None:
        return
    state["statements"] += 1
    if state["first"] is None:
        state["first"] = " ".join(statement.split())[:FIRST_STATEMENT_CHARS]


def _after_statement(conn: Connection, cursor: Any, statement: str) -> None:
    state = conn.info.get(_STATE_KEY)
    if state is None or not _WRITE.match(statement):
        return
    rowcount = getattr(cursor, "rowcount", -1)
    if isinstance(rowcount, int) and rowcount > 0:
        state["rows"] += rowcount


def _end(conn: Connection, how: str) -> None:
    try:
        state = conn.info.pop(_STATE_KEY, None)
    except Exception:  # noqa: BLE001 - an invalidated connection has no info any more
        return
    if state is not None:
        _check(state, how)


def _check(state: dict[str, Any], how: str) -> None:
    statements, rows = state["statements"], state["rows"]
    problems = []
    if rows > MAX_ROWS_WRITTEN:
        problems.append(f"wrote {rows} rows (more than {MAX_ROWS_WRITTEN})")
    if statements > MAX_STATEMENTS:
        problems.append(f"ran {statements} statements (more than {MAX_STATEMENTS})")
    with _lock:
        stats.transactions += 1
        stats.max_statements = max(stats.max_statements, statements)
        stats.max_rows_written = max(stats.max_rows_written, rows)
        if statements > RECOMMENDED_STATEMENTS:
            stats.over_recommended += 1
        if not problems:
            return
        stats.violations += 1
        record = {
            "what": "; ".join(problems),
            "statements": statements,
            "rows_written": rows,
            "ended_by": how,
            "first_statement": state["first"],
            "database": state["database"],
            "pid": os.getpid(),
            "test": os.environ.get("PYTEST_CURRENT_TEST"),
        }
        violations.append(record)
    path = os.environ.get(ENV_VIOLATIONS_FILE)
    if path:
        _append_line(path, record)


def _append_line(path: str, record: dict[str, Any]) -> None:
    line = json.dumps(record, sort_keys=True, default=str) + "\n"
    with _lock, open(path, "a", encoding="utf-8") as fh:  # O_APPEND: one short write per line
        fh.write(line)


def read_lines(path: str | None, offset: int = 0) -> tuple[list[dict[str, Any]], int]:
    """JSON lines of ``path`` from byte ``offset``; returns them and the new offset (0 lines if absent)."""
    if not path or not os.path.exists(path):
        return [], offset
    with open(path, "rb") as fh:
        fh.seek(offset)
        data = fh.read()
    complete = data[: data.rfind(b"\n") + 1]
    return [json.loads(line) for line in complete.splitlines() if line.strip()], offset + len(complete)


def describe(record: dict[str, Any]) -> str:
    return (
        f"{record['what']} (ended by {record['ended_by']}, pid {record['pid']}, database {record['database']}); "
        f"first statement: {record['first_statement']}"
    )


# -- waiting for a lock wait (tests) ---------------------------------------------------


def wait_for_lock_waits(
    engine: Engine, *, count: int = 1, database: str | None = None, query_like: str | None = None,
    timeout_s: float = 20.0, alive: Any = None,
) -> list[tuple]:
    """Block until ``count`` InnoDB transactions are in LOCK WAIT (optionally sessions of ``database``,
    on a statement containing ``query_like``); poll from ``engine`` (a third session). Returns the
    waiting (thread id, statement) rows; AssertionError after ``timeout_s`` or once ``alive()`` is false.

    MariaDB serves information_schema.INNODB_TRX from a cache it refreshes only when the cache was
    not read for 0.1 s, so this polls every 0.15 s (faster polling reads the same stale rows forever).
    A transaction shown waiting stays waiting while the test holds the lock it waits for. The two
    information_schema tables are read separately: joining them crashed MariaDB 10.11.19 here.
    """
    sql = "SELECT trx_mysql_thread_id, trx_query FROM information_schema.INNODB_TRX WHERE trx_state = 'LOCK WAIT'"
    params: dict[str, Any] = {}
    if query_like is not None:
        sql += " AND trx_query LIKE :q"
        params["q"] = f"%{query_like}%"
    deadline = time.monotonic() + timeout_s
    rows: list[tuple] = []
    with engine.connect().execution_options(**{OPTION: False}, isolation_level="AUTOCOMMIT") as conn:
        while True:
            rows = [tuple(r) for r in conn.execute(text(sql), params)]
            if database is not None and rows:
                ids = set(conn.execute(text("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = :db"), {"db": database}).scalars())
                rows = [r for r in rows if r[0] in ids]
            if len(rows) >= count:
                return rows
            if alive is not None and not alive():
                raise AssertionError(f"the session expected to wait stopped first (waiting: {rows})")
            if time.monotonic() > deadline:
                break
            time.sleep(0.15)
        time.sleep(0.15)
        everything = [tuple(r) for r in conn.execute(text(
            "SELECT trx_mysql_thread_id, trx_state, trx_query FROM information_schema.INNODB_TRX"))]
        sessions = [tuple(r) for r in conn.execute(text(
            "SELECT ID, DB, COMMAND, STATE, LEFT(INFO, 120) FROM information_schema.PROCESSLIST WHERE ID <> CONNECTION_ID()"))]
    raise AssertionError(
        f"fewer than {count} lock waits after {timeout_s:g}s (waiting: {rows}; transactions: {everything}; sessions: {sessions})"
    )

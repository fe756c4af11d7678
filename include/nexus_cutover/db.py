"""Connections to a tenant database: engines, the session check, TLS, error mapping; the door to DSNs and deadlines.

What it holds: :func:`make_engine` and what it hangs on an engine (the session check, TLS, SQLite's BEGIN), and the
mapping of driver errors to the contract's errors. The DSN handling (:mod:`nexus_cutover.dsn`) and the deadlines
with their session bounds (:mod:`nexus_cutover.deadlines`) live beside it and are re-exported here, so every
importer keeps ``from .db import ...``. The MySQL/MariaDB/TiDB error numbers (and PostgreSQL's SQLSTATEs) are spelled
here and nowhere else in the product.

Invariants:

* A DSN comes only from the environment (or, in Airflow, from a connection);
  it is validated (:func:`parse_dsn`) and only ever printed through :func:`mask_dsn` (:mod:`nexus_cutover.dsn`).
* Two dialect families are supported: MySQL protocol (TiDB, MySQL, MariaDB via
  ``mysql+pymysql`` / ``mysql+mysqldb``) and SQLite (the embedded default).
* On SQLite, a transaction opened with ``execution_options(sqlite_begin="IMMEDIATE")``
  takes the database write lock up front (the SQLite stand-in for row locks).
* Driver errors leave this module as :mod:`nexus_cutover.errors` classes with
  the contract's exit codes (see :func:`translate_errors`).
* Every new connection to a MySQL-protocol server is checked before it is used
  (contract, "TiDB transaction mode"; :func:`session_problem`): the locking
  design needs pessimistic transactions (READ COMMITTED, and ``SELECT ... FOR
  UPDATE`` that waits), so TiDB's ``tidb_txn_mode`` must be ``pessimistic``, and
  the session's isolation READ COMMITTED or REPEATABLE READ (the read-only
  reports take one snapshot; READ UNCOMMITTED would read uncommitted rows).
  Anything else is :class:`~nexus_cutover.errors.BadInput` (exit 2) naming the
  setting to change, raised before any statement of the command runs.
* Every MySQL-protocol connection is secured as :mod:`nexus_cutover.tls` decides from the DSN's TLS query
  parameters (``ssl_mode``, ``ssl_ca``, ``ssl_cert``, ``ssl_key``), judged at the engine's first connection (so a
  command has shown its masked target first): a bad value is :class:`BadInput`; a server that offers no TLS under
  a mode that requires it is refused before anything is sent to it; a refused handshake is
  :class:`~nexus_cutover.errors.Unreachable` ("cannot connect: ..."), in words naming the mode and what to fix.
  :func:`engine_tls` is what an engine uses, :func:`tls_report` what a report shows.
"""

from __future__ import annotations

import contextlib
import functools
import math
import re
import ssl
import weakref
from collections.abc import Iterator
from typing import Any

import pymysql
from pymysql.constants import CLIENT
from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL

from . import catalog, tls
from .deadlines import (  # noqa: F401 - re-exported: importers know these as db's
    Deadline,
    bound_lock_waits,
    bounded_session,
    is_mysql,
    is_sqlite,
    session_execute,
)
from .dsn import (  # noqa: F401 - re-exported: importers know these as db's
    DSN_ENV_CUTOVER,
    DSN_ENV_LEDGER,
    DSN_ENV_TENANT,
    MALFORMED,
    MASK,
    MIN_SECRET_SEARCHED,
    SECRET_PARAMETER_ENDINGS,
    SECRET_PARAMETER_WORDS,
    SQLITE_DRIVERS,
    dsn_from_env,
    dsn_secrets,
    hide_dsn_secrets,
    host_environment,
    is_secret_parameter,
    mask_dsn,
    parse_dsn,
    withheld_from_host,
)
from .errors import BadInput, CutoverError, LockTimeout, MissingSchema, Unreachable

# MySQL/MariaDB/TiDB error numbers we classify: the only place the project spells them.
_LOCK_WAIT_TIMEOUT = 1205
_DEADLOCK = 1213
_DUPLICATE_KEY = 1062
_DDL_ALREADY_DONE = {1050, 1060, 1061}  # table exists / duplicate column / duplicate key name
_QUERY_INTERRUPTED = {1317, 1969, 3024}  # killed / max_statement_time / max_execution_time
_CONNECTION_ERRORS = {2002, 2003, 2005, 2006, 2013, 2055}
_TLS_CONNECTION_ERROR = 2026  # CR_SSL_CONNECTION_ERROR: the MySQL client's code for a refused TLS handshake
_ACCESS_DENIED = {1044, 1045}
_UNKNOWN_DATABASE = 1049
_NO_SUCH_TABLE = 1146
_NO_SUCH_COLUMN = 1054


#: The session isolations the transaction policy works with (MySQL spells them with dashes).
SUPPORTED_ISOLATIONS = ("READ-COMMITTED", "REPEATABLE-READ")
_SESSION_FACTS = (
    "SHOW SESSION VARIABLES WHERE Variable_name IN ('version', 'tidb_txn_mode', 'transaction_isolation', 'tx_isolation')"
)


def session_problem(facts: dict[str, str]) -> str | None:
    """What makes a MySQL-protocol session unfit for the cutover's locking, from its variables; None when fit.

    ``facts``: ``SHOW SESSION VARIABLES`` of ``version``, ``tidb_txn_mode`` and the isolation
    (``transaction_isolation``, or ``tx_isolation`` on MariaDB before 11.1). TiDB is recognized by
    ``tidb_txn_mode`` existing or its version string.
    """
    facts = {k.lower(): str(v) for k, v in facts.items()}
    tidb = "tidb_txn_mode" in facts or "tidb" in facts.get("version", "").lower()
    if tidb:
        mode = facts.get("tidb_txn_mode", "").strip().lower()
        if mode != "pessimistic":
            return (f"the tenant database is TiDB in {mode or 'optimistic (empty)'} transaction mode (tidb_txn_mode = "
                    f"{facts.get('tidb_txn_mode', '')!r}): the cutover's locking needs pessimistic transactions "
                    "(READ COMMITTED and SELECT ... FOR UPDATE that waits). Set tidb_txn_mode = 'pessimistic' "
                    "(SET GLOBAL tidb_txn_mode = 'pessimistic', or for the cutover user's sessions) and run again; "
                    "nothing of the tenant was read or written")
    isolation = (facts.get("transaction_isolation") or facts.get("tx_isolation") or "").strip().upper().replace(" ", "-")
    if isolation and isolation not in SUPPORTED_ISOLATIONS:
        return (f"the tenant database session runs at {isolation} (transaction_isolation): the cutover needs "
                f"{' or '.join(SUPPORTED_ISOLATIONS)} (it sets READ COMMITTED for each locked transaction; its reports "
                "take one snapshot). Set transaction_isolation = 'REPEATABLE-READ' for the cutover user's sessions "
                "(or globally) and run again; nothing of the tenant was read or written")
    return None


def _check_session(dbapi_connection, _record) -> None:  # pragma: no cover - driver hook, tested through engines
    """The ``connect`` hook of MySQL-protocol engines: :func:`session_problem` refuses the connection."""
    cursor = dbapi_connection.cursor()
    try:
        cursor.execute(_SESSION_FACTS)
        facts = {str(name): str(value) for name, value in cursor.fetchall()}
    finally:
        cursor.close()
    problem = session_problem(facts)
    if problem is not None:
        raise BadInput(problem)  # the pool closes the connection it could not set up


def make_engine(dsn: str | URL, *, connect_timeout: float = 10.0, **kwargs) -> Engine:
    """An engine for a tenant DSN (validated with :func:`parse_dsn`); on MySQL-protocol servers every new
    connection is secured as the DSN's TLS parameters say (:mod:`nexus_cutover.tls`) and checked by
    :func:`session_problem` first."""
    url = dsn if isinstance(dsn, URL) else parse_dsn(dsn)
    if url.drivername in SQLITE_DRIVERS:
        engine = create_engine(
            url,
            connect_args={"timeout": max(0.1, connect_timeout), "check_same_thread": False},
            **kwargs,
        )
        _configure_sqlite(engine)
        return engine
    if url.drivername == "mysql":
        url = url.set(drivername="mysql+pymysql")
    rest, tls_values = tls.split_tls(dict(url.query))
    url = url.set(query=rest)
    connector = _TlsConnector(tls_values, url)
    connect_args = {"connect_timeout": max(1, int(math.ceil(connect_timeout)))}
    engine = create_engine(url, pool_pre_ping=True, connect_args=connect_args, **kwargs)
    _ENGINE_TLS[engine] = connector
    event.listen(engine, "do_connect", connector.connect)
    event.listen(engine, "connect", _check_session)
    return engine


#: Each MySQL-protocol engine's :class:`_TlsConnector` (an engine holds no attributes of ours).
_ENGINE_TLS: weakref.WeakKeyDictionary = weakref.WeakKeyDictionary()


def engine_tls(engine: Engine) -> tls.TlsSettings | None:
    """The TLS settings ``engine`` connects with; None for SQLite (or an engine not made by :func:`make_engine`).
    :class:`BadInput` when the DSN's TLS parameters are bad."""
    connector = _ENGINE_TLS.get(engine)
    return connector.settings if connector is not None else None


def tls_report(engine: Engine, conn: Connection | None = None) -> dict[str, Any] | None:
    """What a report shows of ``engine``'s TLS (:meth:`TlsSettings.report`), and with ``conn`` (one of its
    connections) the TLS version that connection negotiated (``in_use``, None when plain); None for SQLite."""
    settings = engine_tls(engine)
    if settings is None:
        return None
    report = {**settings.report(), "text": settings.describe()}
    if conn is not None:
        rows = session_execute(conn, "SHOW SESSION STATUS LIKE 'Ssl_version'")
        report["in_use"] = (str(rows[0][1]) or None) if rows else None
    return report


def tls_line(report: dict[str, Any] | None) -> str:
    """The line a run says of its tenant connection's TLS (``report`` of :func:`connection_tls`)."""
    if report is None:
        return "tenant database: no TLS (SQLite file)"
    return f"tenant database: {report['text']}, " + (f"in use: {report['in_use']}" if report.get("in_use") else "plain (no TLS)")


class _TlsConnector:
    """Opens an engine's DBAPI connections with its TLS settings (the ``do_connect`` hook); the settings are judged
    at the first connection and kept."""

    def __init__(self, values: dict, url: URL) -> None:
        self.values = values
        self.url = url
        self.where = f"{url.host}:{url.port or 3306}" if url.host else "the server"

    @functools.cached_property
    def settings(self) -> tls.TlsSettings:
        return tls.settings_of(self.values, local=tls.is_local_host(self.url.host, dict(self.url.query)))

    @functools.cached_property
    def context(self):
        return self.settings.ssl_context()

    def connect(self, dialect, _record, cargs, cparams):  # pragma: no cover - driver hook, tested through engines
        settings = self.settings
        if dialect.driver != "pymysql":  # mysqlclient takes the MySQL client's modes as they are
            cparams["ssl_mode"] = settings.mode
            if settings.mode != "DISABLED":
                files = {"ca": settings.ca, "cert": settings.cert, "key": settings.key}
                cparams["ssl"] = {k: v for k, v in files.items() if v}
            return None

        if settings.mode == "DISABLED":
            cparams["ssl_disabled"] = True
        else:
            cparams["ssl"] = self.context
        try:
            return _pymysql_connection_class()(*cargs, nexus_tls=settings, nexus_where=self.where, **cparams)
        except pymysql.err.OperationalError as exc:
            original = getattr(exc, "original_exception", None)
            if isinstance(original, ssl.SSLError):
                raise pymysql.err.OperationalError(_TLS_CONNECTION_ERROR,
                                                   settings.handshake_refusal(original, self.where)) from None
            if exc.args and exc.args[0] in _ACCESS_DENIED and settings.mode == "DISABLED":
                raise pymysql.err.OperationalError(exc.args[0], f"{exc.args[1]} (ssl_mode=DISABLED: if this user must "
                                                   "connect over TLS (REQUIRE SSL), use ssl_mode=REQUIRED or a VERIFY_ mode)") from None
            raise


@functools.cache
def _pymysql_connection_class():
    """PyMySQL's connection, refusing before it authenticates a server that offers no TLS when the mode requires
    TLS (PyMySQL given a context goes on in plain text then: the MySQL client's PREFERRED).

    Why a subclass of a private method: PyMySQL's public TLS arguments cannot refuse. Its connect (1.1.3,
    ``Connection._request_authentication``) starts TLS only ``if self.ssl and self.server_capabilities &
    CLIENT.SSL`` and otherwise authenticates in plain text, whatever it was given: ``ssl=<context>``, ``ssl={"ca":
    ...}``, ``ssl_ca`` with ``ssl_verify_cert`` and ``ssl_verify_identity`` all connected in plain text to a server
    without TLS (tests/tls/test_tls_modes.py keeps that observation as a test: when it fails, PyMySQL refuses by
    itself and this class can go). The server's capabilities are known only inside the handshake, so the refusal
    lives at that point, before any credential is sent."""

    class TlsCheckedConnection(pymysql.connections.Connection):
        def __init__(self, *args, nexus_tls: tls.TlsSettings, nexus_where: str, **kwargs) -> None:
            self._nexus_tls = nexus_tls
            self._nexus_where = nexus_where
            super().__init__(*args, **kwargs)

        def _request_authentication(self) -> None:
            if self._nexus_tls.requires_tls and not self.server_capabilities & CLIENT.SSL:
                raise pymysql.err.OperationalError(_TLS_CONNECTION_ERROR, self._nexus_tls.no_server_tls(self._nexus_where))
            super()._request_authentication()

    return TlsCheckedConnection


def _configure_sqlite(engine: Engine) -> None:
    """Let SQLAlchemy, not pysqlite, emit BEGIN, so BEGIN IMMEDIATE is possible."""

    @event.listens_for(engine, "connect")
    def _on_connect(dbapi_connection, _record):  # pragma: no cover - driver hook
        dbapi_connection.isolation_level = None
        cursor = dbapi_connection.cursor()
        cursor.execute("PRAGMA journal_mode=WAL")
        cursor.close()

    @event.listens_for(engine, "begin")
    def _on_begin(conn):  # pragma: no cover - driver hook
        mode = conn.get_execution_options().get("sqlite_begin", "DEFERRED")
        conn.exec_driver_sql(f"BEGIN {'IMMEDIATE' if mode == 'IMMEDIATE' else 'DEFERRED'}")



def driver_error_code(exc: BaseException) -> int | None:
    orig = getattr(exc, "orig", None)
    args = getattr(orig, "args", ())
    if args and isinstance(args[0], int):
        return args[0]
    return None


def classify(exc: sa_exc.DBAPIError, what: str) -> CutoverError:
    """Map a driver error raised while doing ``what`` to a contract error."""
    code = driver_error_code(exc)
    message = str(getattr(exc, "orig", exc)).splitlines()[0] if getattr(exc, "orig", None) else str(exc)
    lowered = message.lower()
    if code in (_LOCK_WAIT_TIMEOUT, _DEADLOCK) or code in _QUERY_INTERRUPTED:
        return LockTimeout(f"could not take the locks or finish in time while {what}: {message}; nothing written")
    if "database is locked" in lowered or "database table is locked" in lowered:
        return LockTimeout(f"could not take the SQLite write lock while {what}; nothing written")
    if code == _TLS_CONNECTION_ERROR:
        args = getattr(getattr(exc, "orig", None), "args", ())
        words = str(args[1]) if len(args) > 1 else message
        return Unreachable(f"cannot connect to the tenant database while {what}: {words}")
    if code in _CONNECTION_ERRORS or isinstance(exc, sa_exc.InterfaceError):
        return Unreachable(f"cannot reach the tenant database while {what}: {message}")
    if code in _ACCESS_DENIED:
        return BadInput(f"the database refused the credentials while {what}: {message}")
    if code == _UNKNOWN_DATABASE:
        return BadInput(f"malformed DSN: {message}")
    if code in (_NO_SUCH_TABLE, _NO_SUCH_COLUMN) or "no such table" in lowered or "no such column" in lowered:
        return MissingSchema([message])
    if "unable to open database file" in lowered:
        return Unreachable(f"cannot open the SQLite database while {what}: {message}")
    return CutoverError(f"database error while {what}: {message}")


@contextlib.contextmanager
def translate_errors(what: str) -> Iterator[None]:
    """Re-raise driver errors inside the block as contract errors."""
    try:
        yield
    except sa_exc.DBAPIError as exc:
        raise classify(exc, what) from exc


def _message(exc: BaseException) -> str:
    return str(getattr(exc, "orig", exc)).lower()


def is_deadlock(exc: BaseException) -> bool:
    """The server chose this transaction as a deadlock victim and rolled it back: retry it from the start."""
    return isinstance(exc, sa_exc.DBAPIError) and driver_error_code(exc) == _DEADLOCK


def is_lock_wait_timeout(exc: BaseException) -> bool:
    """A row-lock wait ran out (MySQL protocol) or SQLite stayed busy past its busy timeout."""
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    return driver_error_code(exc) == _LOCK_WAIT_TIMEOUT or "database is locked" in _message(exc)


def is_duplicate_key(exc: BaseException) -> bool:
    """An INSERT lost a race for a primary or unique key (MySQL 1062, SQLite UNIQUE constraint)."""
    if not isinstance(exc, sa_exc.IntegrityError):
        return False
    return driver_error_code(exc) == _DUPLICATE_KEY or "unique constraint failed" in _message(exc)


#: PostgreSQL's SQLSTATEs of a transaction that lost to a concurrent one: unique violation, serialization failure,
#: deadlock (the delivery ledger may live on PostgreSQL).
_POSTGRES_CONFLICTS = {"23505", "40001", "40P01"}


def is_write_conflict(exc: BaseException) -> bool:
    """A write that lost to a concurrent writer of the same keys (its transaction won): a duplicate or unique key, a
    lock wait that ran out, a deadlock, on MySQL/MariaDB/TiDB, SQLite or PostgreSQL. Worth reading the keys again and
    retrying; an outage is not one."""
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    if isinstance(exc, sa_exc.IntegrityError) or is_deadlock(exc) or is_lock_wait_timeout(exc):
        return True
    return getattr(exc.orig, "pgcode", None) in _POSTGRES_CONFLICTS


# MariaDB: "... for key 'PRIMARY'"; MySQL 8 and TiDB: "... for key '_System_Event.PRIMARY'".
_MYSQL_DUPLICATE_KEY_NAME = re.compile(r"for key '(?:[^']*\.)?([^'.]+)'\s*$")
# SQLite: "UNIQUE constraint failed: _System_Event.PackInstallId, _System_Event.SourceLane, ..."
_SQLITE_UNIQUE_COLUMNS = re.compile(r"unique constraint failed: (.+)$")


def duplicate_key_columns(exc: BaseException) -> tuple[str, tuple[str, ...]] | None:
    """``(table, key columns)`` of the primary or unique key a duplicate-key error names; None when it names none.

    From the server's message: MySQL protocol names the key ('PRIMARY' or the unique
    index's name), resolved through the catalog's tables; SQLite lists the columns.
    """
    if not is_duplicate_key(exc):
        return None
    orig = getattr(exc, "orig", exc)
    args = getattr(orig, "args", ())
    text = str(args[1] if len(args) > 1 and isinstance(args[0], int) else orig).splitlines()[0].strip()
    match = _SQLITE_UNIQUE_COLUMNS.search(text.lower())
    if match:
        original = text[len(text) - len(match.group(1)) :]
        pairs = [part.strip().split(".", 1) for part in original.split(",")]
        if all(len(p) == 2 for p in pairs) and len({t for t, _ in pairs}) == 1:
            return pairs[0][0], tuple(c for _, c in pairs)
        return None
    match = _MYSQL_DUPLICATE_KEY_NAME.search(text)
    if not match:
        return None
    name = match.group(1)
    if name == "PRIMARY":
        return "", (name,)
    for table in catalog.metadata.tables.values():
        for index in table.indexes:
            if index.unique and index.name == name:
                return table.name, tuple(c.name for c in index.columns)
    return None


def is_primary_key_duplicate(exc: BaseException) -> bool:
    """A duplicate on a primary key: an id allocated from the greatest id in use lost a race (see the runtime's id
    shards), or a row inserted if absent was inserted first by another session. Never a unique secondary key."""
    found = duplicate_key_columns(exc)
    if found is None:
        return False
    table, columns = found
    if columns == ("PRIMARY",):
        return True
    known = catalog.metadata.tables.get(table)
    return known is not None and columns == tuple(c.name for c in known.primary_key.columns)


def is_ddl_already_done(exc: BaseException) -> bool:
    """An additive DDL statement failed because the object it adds exists (a concurrent identical DDL)."""
    if not isinstance(exc, sa_exc.DBAPIError):
        return False
    text = _message(exc)
    return driver_error_code(exc) in _DDL_ALREADY_DONE or "duplicate column" in text or "already exists" in text

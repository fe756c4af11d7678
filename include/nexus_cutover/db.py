"""Connections to a tenant database: DSN handling, engines, deadlines, error mapping.

Invariants:

* A DSN comes only from the environment (or, in Airflow, from a connection);
  it is validated here and only ever printed through :func:`mask_dsn`.
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
import os
import re
import ssl
import time
import weakref
from collections.abc import Iterator, Mapping
from dataclasses import dataclass, field
from typing import Any
from urllib.parse import quote_plus

from sqlalchemy import Connection, Engine, create_engine, event
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import URL, make_url

from . import catalog, tls
from .errors import BadInput, CutoverError, LockTimeout, MissingSchema, Unreachable

DSN_ENV_CUTOVER = "CONNECTOR_CUTOVER_DSN"
DSN_ENV_TENANT = "NEXUS_TENANT_DSN"
#: The delivery ledger's database (``nexus-cutover report``; :mod:`nexus_cutover.ledger`): never a tenant's.
DSN_ENV_LEDGER = "NEXUS_LEDGER_DSN"

_MYSQL_DRIVERS = {"mysql", "mysql+pymysql", "mysql+mysqldb", "mariadb+pymysql", "mariadb+mysqldb"}
_SQLITE_DRIVERS = {"sqlite", "sqlite+pysqlite"}

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


def dsn_from_env(*names: str) -> str:
    """The first non-empty variable of ``names``; :class:`BadInput` naming them all if none."""
    for name in names:
        value = os.environ.get(name, "").strip()
        if value:
            return value
    raise BadInput(
        "no tenant database given: set "
        + " or ".join(names)
        + " to an SQLAlchemy URL such as mysql+pymysql://user:pw@host:3306/tenant_db or sqlite:///path"
    )


def parse_dsn(dsn: str) -> URL:
    """Validate ``dsn``; :class:`BadInput` (never echoing the password) when malformed."""
    try:
        url = make_url(dsn)
    except (sa_exc.ArgumentError, ValueError) as exc:
        raise BadInput(
            "malformed DSN: expected an SQLAlchemy URL such as "
            "mysql+pymysql://user:pw@host:3306/tenant_db or sqlite:///path"
        ) from exc
    driver = url.drivername
    if driver in _SQLITE_DRIVERS:
        is_file = url.database and url.database != ":memory:" and not url.database.startswith("file:")
        if is_file and not os.path.exists(url.database):
            raise BadInput(f"malformed DSN: SQLite database file {url.database!r} does not exist")
        return url
    if driver in _MYSQL_DRIVERS:
        if not url.host:
            raise BadInput(f"malformed DSN: {mask_dsn(url)} has no host")
        if "@" in url.host:  # an unencoded '@' in the password: its tail was taken for the host
            raise BadInput("malformed DSN: the host contains '@'; write an '@' of the user name or password as %40")
        if not url.database:
            raise BadInput(f"malformed DSN: {mask_dsn(url)} names no database (the tenant schema)")
        return url
    raise BadInput(
        f"malformed DSN: unsupported scheme {driver!r}; use mysql+pymysql://, mysql+mysqldb:// or sqlite:///"
    )


#: Query-parameter names (lower case, ``-`` read as ``_``) whose value :func:`mask_dsn` hides, by what they contain.
SECRET_PARAMETER_WORDS = ("password", "passwd", "pwd", "secret", "token", "credential")
#: ...and by how they end: TLS key material (``ssl_key``, ``ssl-key``, ``key``, ``private_key``, ``api_key``).
SECRET_PARAMETER_ENDINGS = ("key",)
#: The ``ssl`` parameter is hidden unless it is one of these words: as an Airflow connection's ``ssl`` extra it is a
#: mapping (``{'ca': ..., 'key': ...}``) that may carry key material.
_PLAIN_SSL_VALUES = {"", "0", "1", "true", "false", "yes", "no", "on", "off", "required", "disabled", "preferred"}
MASK = "***"
MALFORMED = "<malformed DSN>"
_MASK_TOKEN = "NEXUSMASKEDVALUE"  # rendered as is by SQLAlchemy, then shown as MASK


def is_secret_parameter(name: str, value: str = "") -> bool:
    """Whether :func:`mask_dsn` hides the value of the DSN query parameter ``name`` (see its docstring)."""
    key = name.strip().lower().replace("-", "_")
    if any(word in key for word in SECRET_PARAMETER_WORDS) or key.endswith(SECRET_PARAMETER_ENDINGS):
        return True
    return key == "ssl" and str(value).strip().lower() not in _PLAIN_SSL_VALUES


def mask_dsn(dsn: str | URL) -> str:
    """``dsn`` as it may be shown: every secret it carries replaced by ``***``; never raises.

    The one masking function of the project: every log line, message and page that shows a DSN shows this.
    Hidden: the password before the ``@``; the value of every query parameter whose name (case-insensitive,
    ``-`` read as ``_``) contains ``password``, ``passwd``, ``pwd``, ``secret``, ``token`` or ``credential``
    (PyMySQL takes ``?password=``/``?passwd=`` as the password), or ends in ``key`` (``ssl_key``, ``ssl-key``,
    ``key``: TLS key material; PyMySQL reads ``ssl_key`` as a file path, but a path to a private key is hidden too,
    since the text cannot tell a path from key contents); and ``ssl`` unless it is a plain switch such as
    ``true`` (an Airflow connection's ``ssl`` extra is a mapping that may hold the key). Certificate paths
    (``ssl_ca``, ``ssl_cert``) and every other parameter are shown: they are not secret and they help find a
    wrong setting. A DSN that cannot be parsed, or whose host contains ``@`` (part of an unencoded password,
    see :func:`parse_dsn`), is shown as ``<malformed DSN>``.
    """
    try:
        url = dsn if isinstance(dsn, URL) else make_url(dsn)
        if url.host and "@" in url.host:
            return MALFORMED
        query = {name: tuple(_MASK_TOKEN if is_secret_parameter(name, v) else v for v in values)
                 if isinstance(values, tuple) else (_MASK_TOKEN if is_secret_parameter(name, values) else values)
                 for name, values in url.query.items()}
        return url.set(query=query).render_as_string(hide_password=True).replace(_MASK_TOKEN, MASK)
    except Exception:  # noqa: BLE001 - a malformed DSN is shown as a placeholder only
        return MALFORMED


def dsn_secrets(dsn: str) -> list[str]:
    """The secret values ``dsn`` carries (those :func:`mask_dsn` hides), as written and percent-decoded; never raises."""
    found = {dsn}  # the whole DSN, should a message quote it
    try:
        url = make_url(dsn)
    except Exception:  # noqa: BLE001 - unparseable: only the whole text is known to be secret
        return [dsn] if dsn else []
    if url.password:
        found.add(str(url.password))
    for name, values in url.query.items():
        for value in values if isinstance(values, tuple) else (values,):
            if is_secret_parameter(name, value):
                found.update({value, quote_plus(value)})
    if url.host and "@" in url.host:  # an unencoded '@' in the password: everything between '://' and the last '@'
        found.add(dsn.split("://", 1)[-1].rsplit("@", 1)[0])
    return sorted((s for s in found if len(s) >= MIN_SECRET_SEARCHED), key=len, reverse=True)


def host_environment(environ: Mapping[str, str], dsn: str) -> dict[str, str]:
    """The environment a new host is started with: ``environ`` (its starter's) without what the host must not hold,
    and ``dsn`` as ``NEXUS_TENANT_DSN``, the one secret it needs (with its TLS parameters, so it connects as the run
    does). Withheld (:func:`withheld_from_host`): Airflow's configuration and connections (``AIRFLOW*``: the metadata
    database's URL, the Fernet key, the broker's password, every other tenant's connection), the other DSN variable,
    and every variable whose name says it holds a secret (as :func:`mask_dsn` reads a parameter's name)."""
    env = {name: value for name, value in environ.items() if not withheld_from_host(name)}
    if dsn:
        env[DSN_ENV_TENANT] = dsn
    return env


def withheld_from_host(name: str) -> bool:
    """Whether :func:`host_environment` leaves the variable ``name`` out."""
    key = name.strip().upper()
    return key.startswith("AIRFLOW") or key in (DSN_ENV_TENANT, DSN_ENV_CUTOVER) or is_secret_parameter(name)


#: Secrets shorter than this are not searched for in free text by :func:`hide_dsn_secrets`: they would hide ordinary
#: words and protect nothing (a password that short is no secret).
MIN_SECRET_SEARCHED = 4


def hide_dsn_secrets(text: str, dsn: str) -> str:
    """``text`` (an error message, a driver's text) with the whole ``dsn`` shown masked and each secret it carries
    (:func:`dsn_secrets`) replaced by ``***``: the last guard before an error line is printed."""
    if dsn and dsn in text:
        text = text.replace(dsn, mask_dsn(dsn))
    for secret in dsn_secrets(dsn):
        text = text.replace(secret, MASK)
    return text


def is_sqlite(bind: Engine | Connection) -> bool:
    return bind.dialect.name == "sqlite"


def is_mysql(bind: Engine | Connection) -> bool:
    return bind.dialect.name in ("mysql", "mariadb")


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
    if url.drivername in _SQLITE_DRIVERS:
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
        rows = _session_execute(conn, "SHOW SESSION STATUS LIKE 'Ssl_version'")
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
        import pymysql

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
    import pymysql
    from pymysql.constants import CLIENT

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


def _session_execute(conn: Connection, sql: str, params: tuple = ()) -> list:
    """Run a session-level statement on the raw DBAPI connection (no SQLAlchemy autobegin)."""
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        cursor.execute(sql, params) if params else cursor.execute(sql)
        return list(cursor.fetchall()) if cursor.description else []
    finally:
        cursor.close()


def bound_lock_waits(conn: Connection, deadline: Deadline) -> None:
    """Bound every row-lock wait of ``conn`` by what is left of ``deadline`` (see :func:`bounded_session`)."""
    if is_mysql(conn):
        _session_execute(conn, "SET SESSION innodb_lock_wait_timeout = %s", (deadline.whole_seconds(),))
    elif is_sqlite(conn):
        _session_execute(conn, f"PRAGMA busy_timeout = {max(1, int(deadline.remaining() * 1000))}")


@contextlib.contextmanager
def bounded_session(conn: Connection, deadline: Deadline, *, statements: bool = False) -> Iterator[None]:
    """Bound lock waits (and, with ``statements``, each statement's run time) by ``deadline``.

    The settings are session-level, so they are restored on exit: a pooled
    connection never carries one call's limits into the next.
    """
    saved_busy = None
    if is_sqlite(conn):
        saved_busy = _session_execute(conn, "PRAGMA busy_timeout")[0][0]
    bound_lock_waits(conn, deadline)
    mariadb = getattr(conn.dialect, "is_mariadb", False)
    if statements and is_mysql(conn):
        if mariadb:
            _session_execute(conn, "SET SESSION max_statement_time = %s", (max(0.001, deadline.remaining()),))
        else:
            _session_execute(conn, "SET SESSION max_execution_time = %s", (max(1, int(deadline.remaining() * 1000)),))
    try:
        yield
    finally:
        with contextlib.suppress(Exception):
            if is_mysql(conn):
                _session_execute(conn, "SET SESSION innodb_lock_wait_timeout = DEFAULT")
                if statements:
                    name = "max_statement_time" if mariadb else "max_execution_time"
                    _session_execute(conn, f"SET SESSION {name} = DEFAULT")
            elif saved_busy is not None:
                _session_execute(conn, f"PRAGMA busy_timeout = {int(saved_busy)}")


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

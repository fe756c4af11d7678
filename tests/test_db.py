"""nexus_cutover.db without a database: DSNs, masking, the driver-error contract, deadlines, conflict predicates.

Driver errors are the real objects a failing statement raises: a PyMySQL (or
sqlite3) exception of the class PyMySQL picks for the error number, wrapped by
SQLAlchemy's own ``DBAPIError.instance`` (so a lock wait is a real
``sqlalchemy.exc.OperationalError``, a duplicate key a real ``IntegrityError``).
"""

from __future__ import annotations

import sqlite3
import time
import types

import pymysql
import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy.engine import make_url

from nexus_cutover import db, deadlines
from nexus_cutover.db import Deadline, classify, mask_dsn, parse_dsn
from nexus_cutover.errors import BadInput, CutoverError, LockTimeout, MissingSchema, Unreachable

PASSWORD = "Sup3r-s3cret"


def mysql_error(code: int, message: str = "driver says no") -> sa_exc.DBAPIError:
    """What SQLAlchemy raises for MySQL error ``code`` (PyMySQL's class for the number, SQLAlchemy's wrapper)."""
    errorclass = pymysql.err.error_map.get(code) or (pymysql.err.InternalError if code < 1000 else pymysql.err.OperationalError)
    return sa_exc.DBAPIError.instance("SELECT 1", None, errorclass(code, message), pymysql.err.Error)


def sqlite_error(errorclass: type[sqlite3.Error], message: str) -> sa_exc.DBAPIError:
    return sa_exc.DBAPIError.instance("SELECT 1", None, errorclass(message), sqlite3.Error)


def chain(exc: BaseException) -> list[BaseException]:
    found = []
    while exc is not None and exc not in found:
        found.append(exc)
        exc = exc.__cause__ or exc.__context__
    return found


# ---------------------------------------------------------------------------
# parse_dsn / mask_dsn
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    "dsn",
    [
        f"mysql+pymysql://nexus:{PASSWORD}@db.internal:4000/tenant_acme",
        "mysql://nexus@db.internal/tenant_acme",
        f"mysql+mysqldb://nexus:{PASSWORD}@db.internal/tenant_acme",
        f"mariadb+pymysql://nexus:{PASSWORD}@127.0.0.1:3306/tenant_acme?charset=utf8mb4",
        "mariadb+mysqldb://nexus@db.internal/tenant_acme",
        "mysql+pymysql://nexus:p%40ss%3Aw%2Ford@db.internal/tenant_acme",  # a percent-encoded '@', ':' and '/'
        "sqlite:///:memory:",
        "sqlite://",
        "sqlite:///file:tenant?mode=memory&uri=true",
    ],
)
def test_parse_dsn_accepts_each_supported_scheme(dsn):
    url = parse_dsn(dsn)
    assert url.drivername == dsn.split(":", 1)[0]


def test_parse_dsn_accepts_an_existing_sqlite_file(tmp_path):
    path = tmp_path / "tenant.db"
    path.touch()
    for scheme in ("sqlite", "sqlite+pysqlite"):
        assert parse_dsn(f"{scheme}:///{path}").database == str(path)


@pytest.mark.parametrize(
    ("dsn", "needle"),
    [
        (f"postgresql://nexus:{PASSWORD}@db.internal/tenant_acme", "unsupported scheme 'postgresql'"),
        (f"mysql+aiomysql://nexus:{PASSWORD}@db.internal/tenant_acme", "unsupported scheme 'mysql+aiomysql'"),
        (f"mysql+pymysql://nexus:{PASSWORD}@/tenant_acme", "has no host"),
        (f"mysql+pymysql://nexus:{PASSWORD}@db.internal", "names no database"),
        (f"mysql+pymysql://nexus:{PASSWORD}@db.internal/", "names no database"),
        (f"mysql+pymysql://nexus:{PASSWORD}@db.internal:port/tenant_acme", "malformed DSN: expected an SQLAlchemy URL"),
        (f"nexus:{PASSWORD} at db.internal", "malformed DSN: expected an SQLAlchemy URL"),
        (f"://nexus:{PASSWORD}@db.internal/tenant_acme", "malformed DSN: expected an SQLAlchemy URL"),
        ("", "malformed DSN"),
        # an unencoded '@' in the password: SQLAlchemy would take the password's tail for the host
        ("mysql+pymysql://nexus:Sup3r@s3cret@db.internal/tenant_acme", "%40"),
    ],
)
def test_parse_dsn_refuses_with_bad_input_and_never_echoes_the_password(dsn, needle):
    with pytest.raises(BadInput) as info:
        parse_dsn(dsn)
    assert info.value.exit_code == 2
    assert needle in str(info.value)
    for exc in chain(info.value):  # the chained driver/parser errors end up in tracebacks and task logs
        for secret in (PASSWORD, "Sup3r", "s3cret"):
            assert secret not in str(exc), (type(exc), str(exc))
            assert secret not in repr(exc.args), (type(exc), exc.args)


def test_parse_dsn_refuses_a_missing_sqlite_file(tmp_path):
    with pytest.raises(BadInput, match="does not exist"):
        parse_dsn(f"sqlite:///{tmp_path / 'nope.db'}")


@pytest.mark.parametrize(
    ("dsn", "masked"),
    [
        (f"mysql+pymysql://nexus:{PASSWORD}@db.internal:4000/tenant_acme", "mysql+pymysql://nexus:***@db.internal:4000/tenant_acme"),
        ("mysql+pymysql://nexus:p%40ss@db.internal/tenant_acme?charset=utf8mb4", "mysql+pymysql://nexus:***@db.internal/tenant_acme?charset=utf8mb4"),
        ("mysql+pymysql://nexus@db.internal/tenant_acme", "mysql+pymysql://nexus@db.internal/tenant_acme"),
        ("sqlite:////var/lib/nexus/tenant.db", "sqlite:////var/lib/nexus/tenant.db"),
        (f"nexus:{PASSWORD} at db.internal", "<malformed DSN>"),
        ("", "<malformed DSN>"),
        ("mysql+pymysql://nexus:Sup3r@s3cret@db.internal/tenant_acme", "<malformed DSN>"),
        # a password in the query string (PyMySQL takes it), and TLS key material
        (f"mysql+pymysql://nexus@db.internal/tenant_acme?password={PASSWORD}", "mysql+pymysql://nexus@db.internal/tenant_acme?password=***"),
        (f"mysql+pymysql://nexus@db.internal/tenant_acme?charset=utf8mb4&passwd={PASSWORD}",
         "mysql+pymysql://nexus@db.internal/tenant_acme?charset=utf8mb4&passwd=***"),
        (f"mysql+pymysql://nexus:{PASSWORD}@db.internal/tenant_acme?ssl_key=KEYDATA&ssl_cert=/etc/nexus/client.pem",
         "mysql+pymysql://nexus:***@db.internal/tenant_acme?ssl_cert=%2Fetc%2Fnexus%2Fclient.pem&ssl_key=***"),
        ("mysql+pymysql://nexus@db.internal/tenant_acme?ssl-key=KEYDATA&key=KEYDATA&Client_Secret=S&auth_token=T&PWD=P",
         "mysql+pymysql://nexus@db.internal/tenant_acme?Client_Secret=***&PWD=***&auth_token=***&key=***&ssl-key=***"),
        ("mysql+pymysql://nexus@db.internal/tenant_acme?password=A&password=B", "mysql+pymysql://nexus@db.internal/tenant_acme?password=***&password=***"),
        # Airflow's MySqlHook renders an 'ssl' extra mapping (which may hold the key) into the query; a plain switch stays
        ("mysql://nexus@db.internal/tenant_acme?ssl=%7B%27ca%27%3A+%27%2Fca.pem%27%2C+%27key%27%3A+%27KEYDATA%27%7D",
         "mysql://nexus@db.internal/tenant_acme?ssl=***"),
        ("mysql://nexus@db.internal/tenant_acme?ssl=true", "mysql://nexus@db.internal/tenant_acme?ssl=true"),
    ],
)
def test_mask_dsn_hides_the_password_and_never_raises(dsn, masked):
    assert mask_dsn(dsn) == masked
    if masked != "<malformed DSN>":
        assert mask_dsn(make_url(dsn)) == masked  # a URL object alike


def test_parse_dsn_messages_hide_a_query_password():
    with pytest.raises(BadInput) as info:
        parse_dsn(f"mysql+pymysql://nexus@db.internal?password={PASSWORD}")
    assert "names no database" in str(info.value) and PASSWORD not in str(info.value) and "password=***" in str(info.value)


# ---------------------------------------------------------------------------
# classify: driver error -> contract error and exit code
# ---------------------------------------------------------------------------


@pytest.mark.parametrize(
    ("code", "wrapper", "contract", "exit_code"),
    [
        (1205, sa_exc.OperationalError, LockTimeout, 4),  # lock wait timeout
        (1213, sa_exc.OperationalError, LockTimeout, 4),  # deadlock
        (1317, sa_exc.OperationalError, LockTimeout, 4),  # query interrupted (KILL QUERY)
        (1969, sa_exc.OperationalError, LockTimeout, 4),  # MariaDB max_statement_time
        (3024, sa_exc.OperationalError, LockTimeout, 4),  # MySQL/TiDB max_execution_time
        (2002, sa_exc.OperationalError, Unreachable, 1),
        (2003, sa_exc.OperationalError, Unreachable, 1),
        (2005, sa_exc.OperationalError, Unreachable, 1),
        (2006, sa_exc.OperationalError, Unreachable, 1),
        (2013, sa_exc.OperationalError, Unreachable, 1),
        (2055, sa_exc.OperationalError, Unreachable, 1),
        (1044, sa_exc.OperationalError, BadInput, 2),  # access denied to the database
        (1045, sa_exc.OperationalError, BadInput, 2),  # access denied (password)
        (1049, sa_exc.OperationalError, BadInput, 2),  # unknown database
        (1146, sa_exc.ProgrammingError, MissingSchema, 2),  # no such table
        (1054, sa_exc.OperationalError, MissingSchema, 2),  # unknown column
        (1064, sa_exc.ProgrammingError, CutoverError, 1),  # anything else: a plain error, exit 1
        (1062, sa_exc.IntegrityError, CutoverError, 1),
    ],
)
def test_classify_maps_each_mysql_error_number(code, wrapper, contract, exit_code):
    exc = mysql_error(code, f"message of {code}")
    assert type(exc) is wrapper and db.driver_error_code(exc) == code
    err = classify(exc, "reading the pack")
    assert type(err) is contract and err.exit_code == exit_code
    assert f"message of {code}" in str(err)
    if contract is not MissingSchema:
        assert "reading the pack" in str(err) or code == 1049


def test_classify_specifics():
    assert "nothing written" in str(classify(mysql_error(1205), "arming the fence"))
    assert str(classify(mysql_error(1049, "Unknown database 'tenant_x'"), "connecting")).startswith("malformed DSN: ")
    missing = classify(mysql_error(1146, "Table 'tenant.x' doesn't exist"), "auditing")
    assert missing.missing == ["(1146, \"Table 'tenant.x' doesn't exist\")"]


def test_classify_an_interface_error_is_unreachable():
    exc = sa_exc.DBAPIError.instance("SELECT 1", None, pymysql.err.InterfaceError(0, ""), pymysql.err.Error)
    assert type(exc) is sa_exc.InterfaceError
    err = classify(exc, "polling")
    assert type(err) is Unreachable and err.exit_code == 1


@pytest.mark.parametrize(
    ("errorclass", "message", "contract", "exit_code"),
    [
        (sqlite3.OperationalError, "database is locked", LockTimeout, 4),
        (sqlite3.OperationalError, "database table is locked", LockTimeout, 4),
        (sqlite3.OperationalError, "no such table: _System_Lock", MissingSchema, 2),
        (sqlite3.OperationalError, "no such column: InputStartOrdinal", MissingSchema, 2),
        (sqlite3.OperationalError, "unable to open database file", Unreachable, 1),
        (sqlite3.IntegrityError, "UNIQUE constraint failed: _System_Lock.LockName", CutoverError, 1),
    ],
)
def test_classify_maps_sqlite_errors_by_message(errorclass, message, contract, exit_code):
    exc = sqlite_error(errorclass, message)
    assert db.driver_error_code(exc) is None
    err = classify(exc, "checkpointing")
    assert type(err) is contract and err.exit_code == exit_code


def test_translate_errors_reraises_as_the_contract_error_from_the_driver_error():
    original = mysql_error(1213, "Deadlock found")
    with pytest.raises(LockTimeout) as info, db.translate_errors("writing"):
        raise original
    assert info.value.__cause__ is original
    with pytest.raises(KeyError), db.translate_errors("writing"):  # not a driver error: unchanged
        raise KeyError("x")


# ---------------------------------------------------------------------------
# Deadline
# ---------------------------------------------------------------------------


@pytest.fixture
def clock(monkeypatch):
    """A settable monotonic clock for :class:`Deadline` (only its module's view of ``time``: nexus_cutover.deadlines)."""
    now = types.SimpleNamespace(value=1000.0)
    monkeypatch.setattr(deadlines, "time", types.SimpleNamespace(monotonic=lambda: now.value))
    return now


def test_deadline_remaining_expired_and_check(clock):
    d = Deadline(30, started=1000.0)
    assert d.remaining() == 30 and not d.expired()
    d.check("waiting")  # not expired: nothing happens
    clock.value = 1029.5
    assert d.remaining() == pytest.approx(0.5) and not d.expired()
    clock.value = 1030.0
    assert d.remaining() == 0 and d.expired()
    with pytest.raises(LockTimeout) as info:
        d.check("waiting for lock 'namespace/acme'")
    assert str(info.value) == "timed out after 30s while waiting for lock 'namespace/acme'; nothing written"
    assert info.value.exit_code == 4
    clock.value = 1100.0
    assert d.remaining() == -70 and d.expired()


@pytest.mark.parametrize(("elapsed", "whole"), [(0, 30), (0.2, 30), (22.5, 8), (29.0, 1), (29.9, 1), (30, 1), (90, 1)])
def test_deadline_whole_seconds_rounds_up_and_is_at_least_one(clock, elapsed, whole):
    d = Deadline(30, started=1000.0)
    clock.value = 1000.0 + elapsed
    assert d.whole_seconds() == whole


def test_deadline_starts_now_by_default():
    before = time.monotonic()
    d = Deadline(5)
    assert before <= d.started <= time.monotonic()
    assert 4 < d.remaining() <= 5


# ---------------------------------------------------------------------------
# Conflict predicates (what nexus_cutover.tx retries)
# ---------------------------------------------------------------------------


def test_is_deadlock():
    assert db.is_deadlock(mysql_error(1213, "Deadlock found when trying to get lock"))
    assert not db.is_deadlock(mysql_error(1205))
    assert not db.is_deadlock(sqlite_error(sqlite3.OperationalError, "database is locked"))
    assert not db.is_deadlock(pymysql.err.OperationalError(1213, "the bare driver error, not SQLAlchemy's"))
    assert not db.is_deadlock(LockTimeout("deadlock"))


def test_is_lock_wait_timeout():
    assert db.is_lock_wait_timeout(mysql_error(1205, "Lock wait timeout exceeded; try restarting transaction"))
    assert db.is_lock_wait_timeout(sqlite_error(sqlite3.OperationalError, "database is locked"))
    assert not db.is_lock_wait_timeout(mysql_error(1213))
    assert not db.is_lock_wait_timeout(mysql_error(3024))
    assert not db.is_lock_wait_timeout(RuntimeError("database is locked"))


def test_is_duplicate_key():
    assert db.is_duplicate_key(mysql_error(1062, "Duplicate entry 'pack/pk-1' for key 'PRIMARY'"))
    assert db.is_duplicate_key(sqlite_error(sqlite3.IntegrityError, "UNIQUE constraint failed: _System_Lock.LockName"))
    assert not db.is_duplicate_key(mysql_error(1452, "Cannot add or update a child row: a foreign key constraint fails"))
    assert not db.is_duplicate_key(sqlite_error(sqlite3.IntegrityError, "NOT NULL constraint failed: _System_Event.Payload"))
    assert not db.is_duplicate_key(mysql_error(1213))


@pytest.mark.parametrize(
    "exc",
    [
        mysql_error(1050, "Table '_System_ConnectorProjectionProtocol' already exists"),
        mysql_error(1060, "Duplicate column name 'InputStartOrdinal'"),
        mysql_error(1061, "Duplicate key name 'ix_WorkItem_Input'"),
        sqlite_error(sqlite3.OperationalError, "table _System_ConnectorProjectionProtocol already exists"),
        sqlite_error(sqlite3.OperationalError, "duplicate column name: InputStartOrdinal"),
        sqlite_error(sqlite3.OperationalError, "index ix_WorkItem_Input already exists"),
    ],
)
def test_is_ddl_already_done(exc):
    assert db.is_ddl_already_done(exc)


def test_is_ddl_already_done_is_false_for_other_failures():
    assert not db.is_ddl_already_done(mysql_error(1146, "Table 'tenant._System_WorkItem' doesn't exist"))
    assert not db.is_ddl_already_done(mysql_error(1205))
    assert not db.is_ddl_already_done(RuntimeError("already exists"))


@pytest.mark.parametrize(
    ("exc", "columns", "primary"),
    [
        (mysql_error(1062, "Duplicate entry '7' for key 'PRIMARY'"), ("", ("PRIMARY",)), True),  # MariaDB
        (mysql_error(1062, "Duplicate entry '7' for key '_System_Event.PRIMARY'"), ("", ("PRIMARY",)), True),  # MySQL 8, TiDB
        (
            mysql_error(1062, "Duplicate entry 'pk-1-a-R1' for key 'ux_Event_Receipt'"),
            ("_System_Event", ("PackInstallId", "SourceLane", "ReceiptId")),
            False,
        ),
        (
            mysql_error(1062, "Duplicate entry 'pk-1-a-R1' for key '_System_Event.ux_Event_Receipt'"),
            ("_System_Event", ("PackInstallId", "SourceLane", "ReceiptId")),
            False,
        ),
        (sqlite_error(sqlite3.IntegrityError, "UNIQUE constraint failed: _System_Event.EventId"), ("_System_Event", ("EventId",)), True),
        (
            sqlite_error(
                sqlite3.IntegrityError,
                "UNIQUE constraint failed: _System_Event.PackInstallId, _System_Event.SourceLane, _System_Event.ReceiptId",
            ),
            ("_System_Event", ("PackInstallId", "SourceLane", "ReceiptId")),
            False,
        ),
        (mysql_error(1062, "Duplicate entry 'x' for key 'no_such_key'"), None, False),
        (mysql_error(1213), None, False),
    ],
    ids=["mariadb-pk", "mysql8-pk", "mariadb-ux", "mysql8-ux", "sqlite-pk", "sqlite-ux", "unknown-key", "not-a-duplicate"],
)
def test_a_duplicate_names_its_key_and_only_a_primary_key_is_an_id_race(exc, columns, primary):
    assert db.duplicate_key_columns(exc) == columns
    assert db.is_primary_key_duplicate(exc) is primary


@pytest.mark.parametrize("backend", ["sqlite", "mysql"])
def test_real_duplicates_of_the_receipt_key_and_of_the_primary_key_are_told_apart(backend, request):
    """The servers' own messages: MariaDB names the key, SQLite lists the columns."""
    import datetime as dt

    from sqlalchemy import insert

    from nexus_cutover import catalog
    from nexus_cutover.schema import create_legacy_schema

    engine = db.make_engine(request.getfixturevalue(f"{backend}_url"))
    create_legacy_schema(engine)
    row = dict(
        EventId=1, Namespace="n", PackInstallId="p", EventKind="k", RouteVersion=1, FlowVersion="1", WorkType="w", SourceLane="a",
        EnqueueOrdinal=1, ReceiptId="r", Status="pending", Payload="{}", ReceivedAt=dt.datetime(2026, 1, 1),
    )
    try:
        with engine.begin() as conn:
            conn.execute(insert(catalog.Event).values(**row))
        errors = []
        for changed in ({"ReceiptId": "other"}, {"EventId": 2}):
            with pytest.raises(sa_exc.IntegrityError) as info, engine.begin() as conn:
                conn.execute(insert(catalog.Event).values(**{**row, **changed}))
            errors.append(info.value)
    finally:
        engine.dispose()
    same_id, same_receipt = errors
    assert db.is_primary_key_duplicate(same_id) and not db.is_primary_key_duplicate(same_receipt)
    assert db.duplicate_key_columns(same_receipt) == ("_System_Event", ("PackInstallId", "SourceLane", "ReceiptId"))

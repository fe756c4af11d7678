"""The TiDB-semantics harness (tests/tidb_semantics.py) does what it claims, on real MariaDB sessions.

The harness is installed on dedicated engines here, so these tests prove the
same thing with and without NEXUS_TIDB_SEMANTICS=1; the "plain" engines opt out
of the class-level harness of that mode.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

import pytest
from sqlalchemy import Column, Integer, MetaData, Table, insert, select, text
from sqlalchemy.engine import make_url

from nexus_cutover.db import make_engine
from tests import tidb_semantics

REPO = Path(__file__).resolve().parents[1]
PLAIN = {"execution_options": {tidb_semantics.OPTION: False}}

md = MetaData()
LockRow = Table("h_lock", md, Column("id", Integer, primary_key=True, autoincrement=False))
Data = Table("h_data", md, Column("id", Integer, primary_key=True, autoincrement=False), Column("v", Integer))


@pytest.fixture
def db(mysql_url):
    """(url, database name, a plain observer engine) with the two tables and the lock row."""
    observer = make_engine(mysql_url, **PLAIN)
    md.create_all(observer)
    with observer.begin() as conn:
        conn.execute(insert(LockRow).values(id=1))
    yield mysql_url, make_url(mysql_url).database, observer
    observer.dispose()


@pytest.fixture
def harness_engine(db):
    engine = make_engine(db[0])
    tidb_semantics.install(engine)
    yield engine
    tidb_semantics.uninstall(engine)
    engine.dispose()


@pytest.fixture
def plain_engine(db):
    engine = make_engine(db[0], **PLAIN)
    yield engine
    engine.dispose()


@pytest.fixture
def new_violations():
    """The violations this process recorded since the test began; taken out of the harness's list at
    teardown, so the TiDB-mode check (tests/conftest.py) does not count the ones caused here on purpose."""
    start = len(tidb_semantics.violations)
    yield lambda: list(tidb_semantics.violations[start:])
    del tidb_semantics.violations[start:]


def set_next_transaction_read_committed(conn):
    """What the product does: a raw SET TRANSACTION just before conn.begin() (no SQLAlchemy autobegin)."""
    cursor = conn.connection.dbapi_connection.cursor()
    try:
        cursor.execute("SET TRANSACTION ISOLATION LEVEL READ COMMITTED")
    finally:
        cursor.close()


def read_after_lock_wait(reader, db, *, read_committed=False):
    """A reader transaction begins, waits on a row lock held by a writer that inserted a row, and reads
    that row with a plain SELECT after the writer committed. Returns how many rows the reader saw."""
    _, database, observer = db
    writer = observer.connect()
    writer.begin()
    writer.execute(select(LockRow).where(LockRow.c.id == 1).with_for_update())
    writer.execute(insert(Data).values(id=1, v=1))

    def read():
        with reader.connect() as conn:
            if read_committed:
                set_next_transaction_read_committed(conn)
            with conn.begin():
                conn.execute(select(LockRow).where(LockRow.c.id == 1).with_for_update())  # waits for the writer
                return conn.execute(select(Data).where(Data.c.id == 1)).all()

    with ThreadPoolExecutor(1) as pool:
        try:
            future = pool.submit(read)
            tidb_semantics.wait_for_lock_waits(observer, database=database, query_like="h_lock", alive=lambda: not future.done())
        finally:
            writer.commit()
            writer.close()
        return len(future.result(timeout=30))


# -- (1) the snapshot ----------------------------------------------------------------


def test_with_the_harness_a_repeatable_read_snapshot_predates_the_lock_wait(db, harness_engine):
    assert read_after_lock_wait(harness_engine, db) == 0  # TiDB: the plain SELECT reads at start_ts


def test_plain_mariadb_takes_the_read_view_after_the_lock_wait(db, plain_engine):
    assert read_after_lock_wait(plain_engine, db) == 1  # InnoDB: read view at the first consistent read


def test_with_the_harness_read_committed_sees_the_commit(db, harness_engine):
    assert read_after_lock_wait(harness_engine, db, read_committed=True) == 1


def test_read_committed_applies_to_the_next_transaction_only(db, harness_engine):
    """START TRANSACTION WITH CONSISTENT SNAPSHOT after SET TRANSACTION ISOLATION LEVEL READ COMMITTED:
    no error, each statement sees the latest commit, and the transaction after it is REPEATABLE READ again."""
    _, _, observer = db

    def bump(v):
        with observer.begin() as other:
            other.execute(Data.update().where(Data.c.id == 7).values(v=v))

    def v_of(conn):
        return conn.execute(select(Data.c.v).where(Data.c.id == 7)).scalar_one()

    with observer.begin() as conn:
        conn.execute(insert(Data).values(id=7, v=0))
    with harness_engine.connect() as conn:
        set_next_transaction_read_committed(conn)
        with conn.begin():
            first = v_of(conn)
            bump(1)
            second = v_of(conn)
        with conn.begin():  # back at the session's REPEATABLE READ: the snapshot is fixed at begin
            bump(2)
            third = v_of(conn)
            bump(3)
            fourth = v_of(conn)
    assert (first, second) == (0, 1)
    assert (third, fourth) == (1, 1)


def test_sqlite_is_left_alone(tmp_path):
    path = tmp_path / "t.db"
    path.touch()
    engine = make_engine(f"sqlite:///{path}")
    tidb_semantics.install(engine)
    before = tidb_semantics.stats.transactions
    try:
        with engine.begin() as conn:
            conn.execute(text("CREATE TABLE t (id INTEGER PRIMARY KEY)"))
            conn.execute(text("INSERT INTO t VALUES (1)"))
    finally:
        tidb_semantics.uninstall(engine)
        engine.dispose()
    assert tidb_semantics.stats.transactions == before


# -- (2) the transaction limits ---------------------------------------------------------


def test_a_transaction_writing_10001_rows_is_a_violation(db, harness_engine, new_violations):
    with harness_engine.begin() as conn:
        conn.execute(insert(Data), [{"id": i, "v": 0} for i in range(10_001)])  # executemany
    (violation,) = new_violations()
    assert violation["rows_written"] == 10_001
    assert "wrote 10001 rows" in violation["what"]
    assert violation["ended_by"] == "commit"
    assert violation["first_statement"].startswith("INSERT INTO h_data")


def test_a_transaction_running_5001_statements_is_a_violation_even_when_rolled_back(db, harness_engine, new_violations):
    with harness_engine.connect() as conn, conn.begin() as tx:
        conn.execute(Data.update().values(v=1))
        for _ in range(5_000):
            conn.execute(text("SELECT 1"))
        tx.rollback()
    (violation,) = new_violations()
    assert (violation["statements"], violation["rows_written"]) == (5_001, 0)
    assert "ran 5001 statements" in violation["what"] and violation["ended_by"] == "rollback"


def test_a_transaction_at_the_limits_is_not_a_violation(db, harness_engine, new_violations):
    checked = tidb_semantics.stats.transactions
    with harness_engine.begin() as conn:
        conn.execute(text("INSERT INTO h_data (id, v) SELECT seq, 0 FROM seq_1_to_10000"))  # 10,000 rows
        for _ in range(4_999):
            conn.execute(text("SELECT 1"))
    with harness_engine.begin() as conn:  # an ordinary one
        conn.execute(Data.update().where(Data.c.id < 10).values(v=2))
    assert new_violations() == []
    assert tidb_semantics.stats.transactions == checked + 2


def test_child_processes_load_the_harness_and_report_to_the_file(db, tmp_path):
    """tests/tidb_site/sitecustomize.py: any Python child started with the mode's environment checks its
    engines (created from a DSN, as product CLIs do) and appends its violations to the file."""
    violations_file, stats_file = tmp_path / "violations.jsonl", tmp_path / "stats.jsonl"
    env = dict(
        os.environ,
        NEXUS_TIDB_SEMANTICS="1",
        NEXUS_TIDB_VIOLATIONS_FILE=str(violations_file),
        NEXUS_TIDB_STATS_FILE=str(stats_file),
        PYTHONPATH=os.pathsep.join([str(REPO / "tests" / "tidb_site"), str(REPO)]),
    )
    code = (
        "import sys\n"
        "from sqlalchemy import text\n"
        "from nexus_cutover.db import make_engine\n"
        "engine = make_engine(sys.argv[1])\n"
        "with engine.begin() as conn:\n"
        "    conn.execute(text('INSERT INTO h_data (id, v) SELECT seq, 0 FROM seq_1_to_10001'))\n"
        "from tests import tidb_semantics\n"
        "print(tidb_semantics.installed_globally(), tidb_semantics.stats.snapshots)\n"
    )
    proc = subprocess.run([sys.executable, "-c", code, db[0]], env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.split() == ["True", "1"]
    (line,) = violations_file.read_text().splitlines()
    violation = json.loads(line)
    assert violation["rows_written"] == 10_001 and violation["pid"] != os.getpid()
    (stats_line,) = stats_file.read_text().splitlines()
    assert json.loads(stats_line)["transactions"] == 1

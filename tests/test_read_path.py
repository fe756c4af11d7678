"""The read path (``tx.reading``): every read's driver errors leave as contract errors, the connect included.

On real servers: a lost connection in the middle of a read (the server kills the session) and an unreachable
database are :class:`~nexus_cutover.errors.Unreachable` (exit 1 with a message, never a traceback), a missing
table is MissingSchema; the domain's reads (the cutover standing, the fence, the drain) go through it; and
``nexus-cutover status``/``verify`` against an unreachable database exit 1 naming what they were reading.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sqlalchemy import select, text

from nexus_cutover import catalog, tx
from nexus_cutover.db import make_engine
from nexus_cutover.errors import CutoverError, MissingSchema, Unreachable
from nexus_cutover.projection import steps
from nexus_cutover.projection.cutover_fence import cutover_fence_in_force
from nexus_cutover.schema import create_legacy_schema


def test_a_connection_lost_mid_read_is_unreachable_with_what_was_read(mysql_url):
    engine = make_engine(mysql_url)
    try:
        with pytest.raises(Unreachable) as err, tx.reading(engine, "reading where namespace 'acme' stands") as conn:
            own = conn.execute(text("SELECT CONNECTION_ID()")).scalar()
            with make_engine(mysql_url).connect() as killer:
                killer.execute(text(f"KILL {int(own)}"))  # the server ends this session between two statements
            conn.execute(text("SELECT 1"))
        assert "cannot reach the tenant database while reading where namespace 'acme' stands" in str(err.value)
    finally:
        engine.dispose()


def test_an_unreachable_database_is_unreachable_before_any_statement():
    engine = make_engine("mysql+pymysql://u:s3cret@127.0.0.1:1/nowhere", connect_timeout=2.0)
    try:
        with pytest.raises(Unreachable) as err:
            steps.cutover_standing(engine, "acme")
        assert "cannot reach the tenant database while reading where namespace 'acme' stands" in str(err.value)
        assert "s3cret" not in str(err.value)
        with pytest.raises(Unreachable):
            cutover_fence_in_force(engine, "acme")
    finally:
        engine.dispose()


def test_a_missing_table_is_missing_schema_not_a_driver_error(tenant_url):
    engine = make_engine(tenant_url)
    try:
        with pytest.raises(MissingSchema), tx.reading(engine, "reading the admission fences") as conn:
            conn.execute(select(catalog.AdmissionFence)).all()
    finally:
        engine.dispose()


def test_a_callers_connection_is_read_in_its_own_transaction_and_left_open(tenant_url):
    engine = make_engine(tenant_url)
    try:
        create_legacy_schema(engine)
        with engine.begin() as conn:
            with tx.reading(conn, "reading under the caller's locks") as same:
                assert same is conn and same.execute(select(catalog.WorkItem.c.WorkId)).all() == []
            assert conn.in_transaction()  # the read path neither commits nor rolls back the caller's transaction
            with pytest.raises(CutoverError), tx.reading(conn, "reading a missing table"):
                conn.execute(text("SELECT * FROM no_such_table"))
    finally:
        engine.dispose()


@pytest.mark.parametrize("command", [["status", "-namespace", "acme"], ["verify", "-namespace", "acme"]])
def test_the_command_line_against_an_unreachable_database_exits_1_with_a_message(command):
    env = {**os.environ, "NEXUS_TENANT_DSN": "mysql+pymysql://u:s3cret@127.0.0.1:1/nowhere"}
    proc = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", *command, "-timeout", "2s"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "cannot reach the tenant database while" in proc.stderr
    assert "Traceback" not in proc.stderr and "OperationalError" not in proc.stdout + proc.stderr
    assert "s3cret" not in proc.stdout + proc.stderr

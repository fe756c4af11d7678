"""Every command checks the MySQL-protocol session it connects with (contract, "TiDB transaction mode").

The locking design needs pessimistic transactions (READ COMMITTED, ``SELECT ... FOR UPDATE`` that waits): on TiDB
``tidb_txn_mode`` must be ``pessimistic``, and the session's isolation READ COMMITTED or REPEATABLE READ. Anything
else is bad input (exit 2) naming the setting, before any statement of the command runs.

The TiDB branch is checked through :func:`nexus_cutover.db.session_problem` with the variables TiDB reports (its
documentation: ``tidb_txn_mode`` ``pessimistic`` / ``optimistic``, ``''`` before 3.0.8; version strings like
``8.0.11-TiDB-v7.5.1``): no TiDB server runs here. The connection hook itself is tested on the real MariaDB: a
tenant user whose sessions run at READ UNCOMMITTED is refused by every command, nothing written.
"""

from __future__ import annotations

import os
import subprocess
import sys
from urllib.parse import quote

import pytest
from sqlalchemy import select, text

from nexus_cutover import catalog
from nexus_cutover.db import make_engine, session_problem
from nexus_cutover.errors import BadInput
from nexus_sim.scenario import TenantScenario
from tests.support import make_cutover_ready, prepared_engine

TIDB = "8.0.11-TiDB-v7.5.1"


@pytest.mark.parametrize(
    ("facts", "needle"),
    [
        ({"version": TIDB, "tidb_txn_mode": "optimistic", "transaction_isolation": "REPEATABLE-READ"}, "tidb_txn_mode"),
        ({"version": TIDB, "tidb_txn_mode": "", "transaction_isolation": "REPEATABLE-READ"}, "optimistic (empty)"),
        ({"version": "5.7.25-TiDB-v3.0.1", "tidb_txn_mode": "OPTIMISTIC", "tx_isolation": "REPEATABLE-READ"}, "pessimistic"),
        ({"version": TIDB, "tidb_txn_mode": "pessimistic", "transaction_isolation": "SERIALIZABLE"}, "transaction_isolation"),
        ({"version": "10.11.19-MariaDB", "tx_isolation": "READ-UNCOMMITTED"}, "READ-UNCOMMITTED"),
        ({"version": "8.0.36", "transaction_isolation": "SERIALIZABLE"}, "SERIALIZABLE"),
    ],
)
def test_an_unfit_session_is_named_with_the_setting_to_change(facts, needle):
    problem = session_problem(facts)
    assert problem is not None and needle in problem and "run again" in problem


@pytest.mark.parametrize(
    "facts",
    [
        {"version": TIDB, "tidb_txn_mode": "pessimistic", "transaction_isolation": "REPEATABLE-READ"},
        {"version": TIDB, "tidb_txn_mode": "PESSIMISTIC", "transaction_isolation": "READ-COMMITTED"},
        {"Variable_name": "x", "version": "10.11.19-MariaDB-0+deb12u1", "tx_isolation": "REPEATABLE-READ"},
        {"version": "8.0.36", "transaction_isolation": "READ-COMMITTED"},
    ],
)
def test_a_fit_session_passes(facts):
    assert session_problem(facts) is None


def test_the_test_servers_own_sessions_pass_and_are_what_the_check_reads(mysql_url):
    engine = make_engine(mysql_url)
    try:
        with engine.connect() as conn:
            rows = dict(conn.execute(text("SHOW SESSION VARIABLES WHERE Variable_name IN "
                                          "('version', 'tidb_txn_mode', 'transaction_isolation', 'tx_isolation')")).all())
        assert "version" in rows and ("tx_isolation" in rows or "transaction_isolation" in rows)
        assert session_problem(rows) is None
    finally:
        engine.dispose()


def read_uncommitted(url: str) -> str:
    """``url`` with every session of it at READ UNCOMMITTED (as a tenant user's default could be)."""
    return url + "?init_command=" + quote("SET SESSION TRANSACTION ISOLATION LEVEL READ UNCOMMITTED")


def test_an_engine_on_an_unfit_session_refuses_before_any_statement(mysql_url):
    with prepared_engine(mysql_url, make_cutover_ready):
        pass
    engine = make_engine(read_uncommitted(mysql_url))
    try:
        with pytest.raises(BadInput, match="READ-UNCOMMITTED.*transaction_isolation") as refused:
            with engine.connect() as conn:
                conn.execute(select(catalog.PackInstall))
        assert refused.value.exit_code == 2
    finally:
        engine.dispose()


def rows_of(engine) -> dict[str, list]:
    """Every row of the tables a command could write first (fence, lock rows, registry)."""
    with engine.connect() as conn:
        return {t.name: conn.execute(select(t)).all() for t in (catalog.AdmissionFence, catalog.Lock, catalog.ProcessRegistry)}


@pytest.mark.parametrize(
    "argv",
    [
        ["nexus-cutover", "arm-fence", "-namespace", "acme"],
        ["nexus-cutover", "status", "-namespace", "acme"],
        ["connector-projection-cutover", "-pack-install-id", "pk-1"],
        ["field-history-eligibility", "status"],
        ["nexus-host", "--namespace", "acme", "--drain-and-exit"],
    ],
    ids=lambda a: " ".join(a[:2]),
)
def test_every_command_on_an_unfit_session_exits_2_naming_the_setting_and_writes_nothing(mysql_url, argv):
    with prepared_engine(mysql_url, make_cutover_ready) as engine:
        sc = TenantScenario(namespace="acme")
        sc.pack("pk-1").lane("a").generation(1)
        sc.write(engine)
        before = rows_of(engine)
        exe = os.path.join(os.path.dirname(sys.executable), argv[0])
        env = {**os.environ, "NEXUS_TENANT_DSN": read_uncommitted(mysql_url), "CONNECTOR_CUTOVER_DSN": ""}
        proc = subprocess.run([exe, *argv[1:]], env=env, capture_output=True, text=True, timeout=120)
        assert proc.returncode == 2, proc.stdout + proc.stderr
        assert "transaction_isolation" in proc.stderr and "READ-UNCOMMITTED" in proc.stderr
        assert rows_of(engine) == before


def test_sqlite_engines_are_not_checked(sqlite_url):
    engine = make_engine(sqlite_url)
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()

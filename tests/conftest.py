"""Shared fixtures: real tenant databases on MariaDB (or TiDB) and SQLite.

* ``mysql_server_url`` comes from ``NEXUS_TEST_MYSQL_URL`` (``make test`` starts a
  throwaway MariaDB and sets it). Each test gets its own fresh database.
* A missing server is an error, never a skip; and with ``NEXUS_DB_REQUIRED=1``
  (set by ``make test``) *any* skipped test is an error too: a database test can
  never pass by not running.
"""

from __future__ import annotations

import os
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from nexus_cutover.db import make_engine
from nexus_cutover.schema import create_legacy_schema
from tests.support import prepared_engine

DB_REQUIRED = os.environ.get("NEXUS_DB_REQUIRED") == "1"

_mysql_tests_run = 0


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    """Count executed MySQL tests; under NEXUS_DB_REQUIRED=1 turn any skip into a failure."""
    global _mysql_tests_run
    outcome = yield
    report = outcome.get_result()
    if DB_REQUIRED and report.skipped and not hasattr(report, "wasxfail"):
        report.outcome = "failed"
        report.longrepr = f"a skipped test is an error under NEXUS_DB_REQUIRED=1: {report.longrepr}"
    if report.when == "call" and report.passed and getattr(item, "_nexus_uses_mysql", False):
        _mysql_tests_run += 1


def pytest_terminal_summary(terminalreporter):
    terminalreporter.write_line(f"MySQL-protocol database tests executed: {_mysql_tests_run}")


@pytest.fixture(scope="session")
def mysql_server_url() -> str:
    url = os.environ.get("NEXUS_TEST_MYSQL_URL", "").strip()
    if not url:  # never a skip: a database test that did not run must not look like one that passed
        pytest.fail(
            "NEXUS_TEST_MYSQL_URL is not set: run `make test`, or wrap pytest in scripts/with-mariadb.sh, "
            "which starts a throwaway MariaDB"
        )
    return url


@pytest.fixture
def mysql_url(request, mysql_server_url):
    """A fresh, empty database on the MySQL-protocol server; dropped afterwards."""
    request.node._nexus_uses_mysql = True  # counted in the terminal summary
    name = f"nx_{uuid.uuid4().hex[:12]}"
    server = make_url(mysql_server_url)
    admin = make_engine(server.set(database="mysql"))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}`"))
    url = server.set(database=name)
    yield url.render_as_string(hide_password=False)
    with admin.begin() as conn:
        conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
    admin.dispose()


@pytest.fixture
def sqlite_url(tmp_path):
    path = tmp_path / "tenant.db"
    path.touch()
    return f"sqlite:///{path}"


@pytest.fixture(params=["mysql", "sqlite"])
def tenant_url(request):
    """One test, both backends: the MySQL-protocol server and the embedded SQLite default."""
    return request.getfixturevalue(f"{request.param}_url")


@pytest.fixture
def legacy_engine(tenant_url):
    """An engine on a database holding the Part A (pre-cutover) schema, on both backends."""
    with prepared_engine(tenant_url, create_legacy_schema) as engine:
        yield engine


@pytest.fixture
def mysql_legacy_engine(mysql_url):
    with prepared_engine(mysql_url, create_legacy_schema) as engine:
        yield engine

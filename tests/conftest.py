"""Shared fixtures: real tenant databases on MariaDB (or TiDB) and SQLite.

* ``mysql_server_url`` comes from ``NEXUS_TEST_MYSQL_URL`` (``make test`` starts a
  throwaway MariaDB and sets it). Each test gets its own fresh database.
* A missing server is an error, never a skip; and with ``NEXUS_DB_REQUIRED=1``
  (set by ``make test``) *any* skipped test is an error too: a database test can
  never pass by not running.
"""

from __future__ import annotations

import os
import shutil
import tempfile
from pathlib import Path

import pytest

from nexus_cutover.schema import create_legacy_schema
from tests import tidb_semantics
from tests.support import COLLATED_BACKENDS, mysql_database, prepared_engine

# In-process DAG runs (dag.test) poll every second; the runbook's 10 s floor guards a LocalExecutor race they do not have.
os.environ.setdefault("NEXUS_MIN_POLL_INTERVAL_S", "1")

DB_REQUIRED = os.environ.get("NEXUS_DB_REQUIRED") == "1"
TIDB_SEMANTICS = tidb_semantics.enabled_by_env()

_mysql_tests_run = 0
_tidb_dir: str | None = None
_tidb_failed_tests: list[tuple[str, int]] = []  # (test, violations) failed by _tidb_transaction_limits

if TIDB_SEMANTICS:
    # Every engine of this process, and (via tests/tidb_site/sitecustomize.py) of its Python children.
    tidb_semantics.install()
    _tidb_dir = tempfile.mkdtemp(prefix="nexus-tidb-semantics-")
    os.environ[tidb_semantics.ENV_VIOLATIONS_FILE] = os.path.join(_tidb_dir, "violations.jsonl")
    os.environ[tidb_semantics.ENV_STATS_FILE] = os.path.join(_tidb_dir, "stats.jsonl")
    _repo = Path(__file__).resolve().parents[1]
    os.environ["PYTHONPATH"] = os.pathsep.join(
        [str(_repo / "tests" / "tidb_site"), str(_repo)] + [p for p in os.environ.get("PYTHONPATH", "").split(os.pathsep) if p]
    )


# ---------------------------------------------------------------------------
# Markers (declared in pyproject.toml), set from what each test uses, so that
# ``-m "not mysql"`` runs without a server and ``-m "not airflow"`` is the fast loop.
# A module the rules below cannot see declares its own ``pytestmark``.
# ---------------------------------------------------------------------------

#: Fixtures on the MySQL-protocol test server; fixtures built on them are covered too
#: (``item.fixturenames`` is the closure of what a test requests).
MYSQL_FIXTURES = frozenset({"mysql_server_url", "mysql_url"})
#: Parameters whose value ``"mysql"`` (or ``"mysql-<collation>"``) picks the server at run time: ``tenant_url``'s
#: own, ``collated_tenant_url``'s, and a test's ``backend`` (by convention ``request.getfixturevalue(f"{backend}_url")``
#: or ``f"{backend}_range_engine"``).
MYSQL_PARAMS = ("tenant_url", "collated_tenant_url", "backend")
#: Fixtures that run real Airflow (the migrated metadata DB of tests/dags/airflow_harness.py).
AIRFLOW_FIXTURES = frozenset({"airflow_db"})
#: Directories whose every test runs under the Airflow harness (its conftest sets up Airflow).
AIRFLOW_DIRS = (Path(__file__).resolve().parent / "dags",)


def automatic_markers(item) -> list[str]:
    """The markers ``item`` needs by the rules above (whatever it already carries)."""
    names = set(getattr(item, "fixturenames", ()))
    params = getattr(getattr(item, "callspec", None), "params", {})
    found = []
    if names & MYSQL_FIXTURES or any(str(params.get(p, "")).split("-")[0] == "mysql" for p in MYSQL_PARAMS):
        found.append("mysql")
    path = Path(item.path).resolve()
    if names & AIRFLOW_FIXTURES or any(path.is_relative_to(d) for d in AIRFLOW_DIRS):
        found.append("airflow")
    return found


@pytest.hookimpl(tryfirst=True)  # before -m deselects
def pytest_collection_modifyitems(config, items):
    for item in items:
        for name in automatic_markers(item):
            if item.get_closest_marker(name) is None:
                item.add_marker(name)


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
    if not TIDB_SEMANTICS:
        return
    own = tidb_semantics.stats
    children = [s for s in tidb_semantics.read_lines(os.environ.get(tidb_semantics.ENV_STATS_FILE))[0] if s["pid"] != os.getpid()]
    child_violations = _child_violations(0)[0]
    total = own.transactions + sum(s["transactions"] for s in children)
    terminalreporter.write_line(
        f"TiDB-semantics mode was ON (snapshot at BEGIN; limits {tidb_semantics.MAX_STATEMENTS} statements / "
        f"{tidb_semantics.MAX_ROWS_WRITTEN} rows written per transaction): {total} transactions checked "
        f"({own.transactions} in this process, {total - own.transactions} in {len(children)} child processes), "
        f"{own.snapshots + sum(s['snapshots'] for s in children)} snapshots fixed at BEGIN, "
        f"{own.violations + len(child_violations)} limit violations recorded "
        f"({sum(n for _, n in _tidb_failed_tests)} of them failed {len(_tidb_failed_tests)} tests; "
        "the harness's own tests cause some on purpose)"
    )
    for nodeid, n in _tidb_failed_tests:
        terminalreporter.write_line(f"TiDB-semantics mode: {n} violation(s) in {nodeid}")
    terminalreporter.write_line(
        f"TiDB-semantics mode: largest transaction {max([own.max_statements] + [s['max_statements'] for s in children])} "
        f"statements / {max([own.max_rows_written] + [s['max_rows_written'] for s in children])} rows written; "
        f"{own.over_recommended + sum(s['over_recommended'] for s in children)} above TiDB's recommended "
        f"{tidb_semantics.RECOMMENDED_STATEMENTS} statements"
    )
    if own.snapshot_errors + sum(s["snapshot_errors"] for s in children):
        terminalreporter.write_line(
            f"TiDB-semantics mode: {own.snapshot_errors + sum(s['snapshot_errors'] for s in children)} "
            "START TRANSACTION WITH CONSISTENT SNAPSHOT statements failed"
        )


def pytest_unconfigure(config):
    if _tidb_dir is not None:
        shutil.rmtree(_tidb_dir, ignore_errors=True)


def _child_violations(offset: int) -> tuple[list[dict], int]:
    """Violations child processes appended to the file since ``offset`` (this process's own are in the list)."""
    lines, offset = tidb_semantics.read_lines(os.environ.get(tidb_semantics.ENV_VIOLATIONS_FILE), offset)
    return [v for v in lines if v["pid"] != os.getpid()], offset


@pytest.fixture(autouse=True)
def _tidb_transaction_limits(request):
    """Under NEXUS_TIDB_SEMANTICS=1: fail the test (at teardown) if any transaction broke TiDB's limits during it."""
    if not TIDB_SEMANTICS:
        yield
        return
    start = len(tidb_semantics.violations)
    _, offset = _child_violations(0)
    yield
    found = tidb_semantics.violations[start:] + _child_violations(offset)[0]
    if found:
        _tidb_failed_tests.append((request.node.nodeid, len(found)))
        details = "\n".join(f"  - {tidb_semantics.describe(v)}" for v in found)
        pytest.fail(f"{len(found)} transaction(s) broke TiDB's limits during this test:\n{details}", pytrace=False)


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
    """A fresh, empty database on the MySQL-protocol server (the server's default character set); dropped afterwards."""
    request.node._nexus_uses_mysql = True  # counted in the terminal summary
    with mysql_database(mysql_server_url) as url:
        yield url


@pytest.fixture(params=[b for b in COLLATED_BACKENDS if b != "sqlite" or not TIDB_SEMANTICS])
def collated_tenant_url(request):
    """One test, three equalities of text keys: SQLite, the server's case-insensitive utf8mb4 default, utf8mb4_bin."""
    if request.param == "sqlite":
        yield request.getfixturevalue("sqlite_url")
        return
    request.node._nexus_uses_mysql = True
    charset, collation = COLLATED_BACKENDS[request.param]
    with mysql_database(request.getfixturevalue("mysql_server_url"), charset=charset, collation=collation) as url:
        yield url


@pytest.fixture
def sqlite_url(tmp_path):
    path = tmp_path / "tenant.db"
    path.touch()
    return f"sqlite:///{path}"


@pytest.fixture(params=["mysql"] if TIDB_SEMANTICS else ["mysql", "sqlite"])
def tenant_url(request):
    """One test, both backends: the MySQL-protocol server and the embedded SQLite default
    (MySQL only under NEXUS_TIDB_SEMANTICS=1: TiDB semantics do not touch SQLite)."""
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

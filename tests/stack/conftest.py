"""One production-topology stack (scripts/stack.py) for every test of this folder, started once per session.

PostgreSQL metadata, Redis, CeleryExecutor (scheduler, dag-processor, api-server, two triggerers, two Celery
workers), tenants on the MySQL-protocol test server (``NEXUS_TEST_MYSQL_URL``: ``make test`` and
``scripts/with-mariadb.sh`` start a throwaway MariaDB). A missing package or server is a failure naming what to
install, never a skip. Bounded waits everywhere; a failing test (or a failed start) shows the tail of every
process log. At the end every process of the stack is stopped, and none may be left.
"""

from __future__ import annotations

import pytest

from scripts.stack import ProductionStack, StackError

_stack: ProductionStack | None = None


@pytest.fixture(scope="session")
def stack(tmp_path_factory, mysql_server_url):
    global _stack
    root = tmp_path_factory.mktemp("stack")
    s = ProductionStack(root, extra_env={"NEXUS_AIRFLOW_PAUSE_DIR": str(root / "pause"),
                                            # every poll logged: the fault tests count a survivor's polls in its log
                                            "NEXUS_TRIGGER_QUIET_LOG_S": "0"})
    (root / "pause").mkdir()
    try:
        s.start(timeout_s=240)
    except StackError as exc:
        pytest.fail(f"the stack did not come up: {exc}", pytrace=False)
    s.wait_for_dag("connector_projection_cutover", timeout_s=120)
    _stack = s
    yield s
    _stack = None
    s.stop()
    left = s.leftovers()
    assert not left, f"processes of the stack still alive after its stop: {left}"


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(item, call):
    outcome = yield
    report = outcome.get_result()
    if report.failed and _stack is not None:
        report.sections.append(("stack process logs (tails)", _stack.log_tails(40)))

"""The status view tests' process environment: :mod:`tests.dags.airflow_harness` first (a temporary
``AIRFLOW_HOME`` before anything imports Airflow), so the in-process tests open ``nexus_tenant_*``
connections from ``AIRFLOW_CONN_*`` variables; the stack tests' ``airflow standalone`` gets its own
environment (``scripts.demo_airflow.AirflowStack`` drops inherited Airflow settings)."""

from __future__ import annotations

import pytest  # noqa: E402 - after the harness, which must come first

import tests.dags.airflow_harness  # noqa: F401 - imported for its environment setup, first


@pytest.fixture
def client():
    """The plugin's app in process, its tenant-read permission checks passed (the auth manager's answers are the
    Chromium tests' subject, ``test_status_view.py``); everything behind them is the product's. A module that needs
    other permissions passed defines its own ``client``."""
    from fastapi.testclient import TestClient
    from nexus_status.app import TENANT_READS, app

    for dependency in TENANT_READS:
        app.dependency_overrides[dependency.dependency] = lambda: None
    try:
        yield TestClient(app)
    finally:
        app.dependency_overrides.clear()

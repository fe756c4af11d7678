"""Fixtures of the DAG tests, built on :mod:`tests.dags.airflow_harness` (the harness and its helpers).

Importing the harness here, first, sets up the Airflow environment before any
test module (or anything else) imports Airflow. Test modules import their helpers
from ``tests.dags.airflow_harness``, never from this conftest: pytest loads this
file as ``conftest``, so importing it by another name would run it twice.
"""

from __future__ import annotations

import pathlib

import pytest

from tests.dags.airflow_harness import connection_json, load_dag, migrate_metadata_db


@pytest.fixture(scope="session")
def airflow_db() -> pathlib.Path:
    """The migrated metadata DB of this session's Airflow home (migrated once, ~7 s)."""
    return migrate_metadata_db()


@pytest.fixture
def tenant_connection(monkeypatch):
    """``tenant_connection(conn_id, url)``: make ``conn_id`` resolve to the tenant DB ``url``.

    Also usable for any other connection: ``tenant_connection(conn_id, raw_json=...)``.
    """

    def _make(conn_id: str, url: str | None = None, *, raw_json: str | None = None) -> str:
        value = raw_json if raw_json is not None else connection_json(url)
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", value)
        return conn_id

    return _make


# ---------------------------------------------------------------------------
# The cutover DAG's fixtures (modules of another DAG define their own ``dag`` / ``tenant``)
# ---------------------------------------------------------------------------


@pytest.fixture
def dag(airflow_db):
    """The cutover DAG, parsed fresh per test: in-process task runs may mutate the DAG's params."""
    from tests.dags.cutover_support import DAG_ID

    return load_dag(DAG_ID)


@pytest.fixture
def tenant(mysql_url, tenant_connection):
    """``(engine, conn_id)``: a fresh MariaDB tenant with the Part A schema and its Airflow connection."""
    from nexus_cutover.db import make_engine
    from nexus_cutover.schema import create_legacy_schema

    engine = make_engine(mysql_url)
    create_legacy_schema(engine)
    conn_id = tenant_connection("nexus_tenant_acme_test", mysql_url)
    yield engine, conn_id
    engine.dispose()

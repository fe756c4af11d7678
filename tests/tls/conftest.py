"""A TLS MariaDB for the TLS tests, next to the plain one of ``scripts/with-mariadb.sh`` (``NEXUS_TEST_MYSQL_URL``).

The session's :func:`tls_server` is :func:`tests.tls.server.tls_mariadb` (its certificates made with ``openssl``: a
CA; a server certificate signed by it for the name ``localhost`` only; a client certificate signed by it; a second,
unrelated CA; a throwaway MariaDB serving TLS, its users ``tls_user`` (``REQUIRE SSL``) and ``x509_user``
(``REQUIRE X509``)).

:mod:`tests.dags.airflow_harness` is imported first (a temporary ``AIRFLOW_HOME`` before anything imports
Airflow): the hook tests read connections from ``AIRFLOW_CONN_*`` variables.
"""

from __future__ import annotations

import os
import pathlib

import pytest

import tests.dags.airflow_harness  # noqa: F401 - imported for its environment setup, first
from tests.tls.server import TLS_PASSWORD, X509_PASSWORD, TlsServer, make_certificates, tls_mariadb  # noqa: F401


@pytest.fixture(scope="session")
def tls_server():
    """A MariaDB serving TLS (:func:`tests.tls.server.tls_mariadb`); stopped and removed after the session."""
    with tls_mariadb() as server:
        yield server


@pytest.fixture
def cli_env():
    """The environment of a command line run: this process's, without any tenant DSN."""
    return {k: v for k, v in os.environ.items() if k not in ("NEXUS_TENANT_DSN", "CONNECTOR_CUTOVER_DSN")}


@pytest.fixture
def tls_database(tls_server):
    """``(database name, engine)``: a fresh database on the TLS server with the Part A schema, reached over TLS
    (``VERIFY_IDENTITY``); dropped afterwards."""
    import uuid

    from sqlalchemy import text

    from nexus_cutover.db import make_engine
    from nexus_cutover.schema import create_legacy_schema

    name = f"nx_tls_{uuid.uuid4().hex[:10]}"
    admin = make_engine(tls_server.dsn("mysql", ssl_mode="VERIFY_IDENTITY", ssl_ca=tls_server.ca))
    with admin.begin() as conn:
        conn.execute(text(f"CREATE DATABASE `{name}`"))
    engine = make_engine(tls_server.dsn(name, ssl_mode="VERIFY_IDENTITY", ssl_ca=tls_server.ca))
    try:
        create_legacy_schema(engine)
        yield name, engine
    finally:
        engine.dispose()
        with admin.begin() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{name}`"))
        admin.dispose()


@pytest.fixture
def tls_tenant(tls_database):
    """``(database name, engine)``: :func:`tls_database` with one pack of 'acme' (pk-1), written over TLS."""
    from nexus_sim.scenario import TenantScenario

    scenario = TenantScenario(namespace="acme")
    scenario.pack("pk-1")
    scenario.write(tls_database[1])
    return tls_database


@pytest.fixture(scope="session")
def airflow_db() -> pathlib.Path:
    """The migrated metadata DB of this session's Airflow home (as in tests/dags)."""
    from tests.dags.airflow_harness import migrate_metadata_db

    return migrate_metadata_db()


@pytest.fixture
def airflow_connection(monkeypatch):
    """``airflow_connection(conn_id, fields)``: make ``conn_id`` resolve to the connection ``fields`` (JSON form)."""
    import json

    def _make(conn_id: str, fields: dict) -> str:
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", json.dumps(fields))
        return conn_id

    return _make

"""The delivery ledger's databases: SQLite (the embedded default), the MySQL-protocol test server, PostgreSQL."""

from __future__ import annotations

import pytest

from tests.ledger_support import ledger_postgres


@pytest.fixture(scope="session")
def postgres_server():
    with ledger_postgres() as server:
        yield server


@pytest.fixture
def postgres_url(postgres_server):
    return postgres_server.database_url()


@pytest.fixture
def sqlite_ledger_url(tmp_path):
    return f"sqlite:///{tmp_path / 'ledger' / 'ledger.db'}"  # its directory does not exist yet: created


@pytest.fixture(params=["sqlite", "mysql", "postgres"])
def ledger_url(request):
    """One test, the three databases a ledger may live in."""
    return request.getfixturevalue({"sqlite": "sqlite_ledger_url", "mysql": "mysql_url",
                                    "postgres": "postgres_url"}[request.param])

"""Fixtures of the runtime tests: tenants with the range schema, on MariaDB and SQLite."""

from __future__ import annotations

import pytest

from nexus_cutover.db import make_engine
from nexus_cutover.schema import apply_steps, create_legacy_schema, projection_steps
from tests import collations, tidb_semantics

from .support import range_tenant


def _range_engine(url):
    engine = make_engine(url)
    create_legacy_schema(engine)
    apply_steps(engine, projection_steps(engine))
    return engine


@pytest.fixture
def range_engine(tenant_url):
    """Part A + Part B schema, empty, on both backends."""
    engine = _range_engine(tenant_url)
    yield engine
    engine.dispose()


@pytest.fixture
def sqlite_range_engine(sqlite_url):
    engine = _range_engine(sqlite_url)
    yield engine
    engine.dispose()


@pytest.fixture
def mysql_range_engine(mysql_url):
    engine = _range_engine(mysql_url)
    yield engine
    engine.dispose()


@pytest.fixture
def tenant(range_engine):
    """One activated pack ``pk-1`` (cutoff 0) in namespace ``acme``."""
    return range_tenant(range_engine)


#: Where the hostile-text tests run: SQLite (BINARY: exact bytes), and tenants on MariaDB's default collation and on a
#: binary PAD SPACE one (TiDB's default); MySQL only under NEXUS_TIDB_SEMANTICS=1.
COLLATION_PARAMS = ([] if tidb_semantics.enabled_by_env() else [pytest.param("sqlite", id="sqlite")]) + [
    pytest.param(c, id=c, marks=pytest.mark.mysql) for c in collations.COLLATIONS
]


@pytest.fixture(params=COLLATION_PARAMS)
def collation(request):
    """``"sqlite"`` or the collation of a MySQL-protocol tenant (see :data:`COLLATION_PARAMS`)."""
    return request.param


@pytest.fixture
def collated_url(collation, request):
    if collation == "sqlite":
        yield request.getfixturevalue("sqlite_url")
        return
    request.node._nexus_uses_mysql = True
    with collations.collated_database(request.getfixturevalue("mysql_server_url"), collation) as url:
        yield url


@pytest.fixture
def collated_engine(collated_url):
    """Part A + Part B schema, empty, on a tenant of the collation of :func:`collation`."""
    engine = _range_engine(collated_url)
    yield engine
    engine.dispose()


@pytest.fixture
def equality(collation, collated_engine):
    """The test oracle of equality on the tenant: the server's ``=`` under the tenant's collation (exact on SQLite)."""
    if collation == "sqlite":
        yield collations.ServerEquality(None, None)
        return
    with collated_engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:  # one statement, one transaction
        yield collations.ServerEquality(conn, collation)


@pytest.fixture(params=[pytest.param(c, id=c) for c in collations.COLLATIONS])
def mysql_collated_engine(request, mysql_server_url):
    """Part A + Part B schema on a MariaDB tenant of each collation of :data:`tests.collations.COLLATIONS`."""
    request.node._nexus_uses_mysql = True
    with collations.collated_database(mysql_server_url, request.param) as url:
        engine = _range_engine(url)
        yield engine
        engine.dispose()

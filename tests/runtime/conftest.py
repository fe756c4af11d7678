"""Fixtures of the runtime tests: tenants with the range schema, on MariaDB and SQLite."""

from __future__ import annotations

import pytest

from nexus_cutover.db import make_engine
from nexus_cutover.schema import apply_steps, create_legacy_schema, projection_steps

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

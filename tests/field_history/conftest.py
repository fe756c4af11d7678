"""Fixtures for Field History tests: tenant databases at stage 1 (the nullable column present)."""

from __future__ import annotations

import pytest

from nexus_cutover.schema import apply_steps, create_legacy_schema, field_history_steps
from tests.support import prepared_engine


def make_stage1(engine) -> None:
    create_legacy_schema(engine)
    apply_steps(engine, field_history_steps(engine))


@pytest.fixture
def fh_engine(tenant_url):
    """Part A + the FieldHistoryEligible column, on MariaDB and on SQLite."""
    with prepared_engine(tenant_url, make_stage1) as engine:
        yield engine


@pytest.fixture
def mysql_fh_engine(mysql_url):
    with prepared_engine(mysql_url, make_stage1) as engine:
        yield engine


@pytest.fixture
def sqlite_fh_engine(sqlite_url):
    with prepared_engine(sqlite_url, make_stage1) as engine:
        yield engine

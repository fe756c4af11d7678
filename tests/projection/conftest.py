"""Fixtures of the cutover step tests: a tenant with the projection Part B applied, on both backends."""

from __future__ import annotations

import pytest

from tests.support import make_cutover_ready, prepared_engine


@pytest.fixture
def engine(tenant_url):
    """Part A + the projection Part B objects (cutover step 1 applied), on MariaDB and on SQLite."""
    with prepared_engine(tenant_url, make_cutover_ready) as eng:
        yield eng

"""The production-shaped tenant, built once per module and backend for tests that only read it.

``production`` is parametrized over the embedded SQLite default and two MariaDB
databases created ``CHARACTER SET utf8mb4``: the server's default utf8mb4
collation (case-insensitive, PAD SPACE) and ``utf8mb4_bin`` (binary, PAD SPACE).
Tests that write build their own tenant (``collated_tenant_url``).
"""

from __future__ import annotations

import contextlib
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine

from nexus_cutover.clock import utcnow
from nexus_cutover.db import make_engine
from nexus_cutover.schema import apply_steps, projection_steps
from nexus_sim.scenario.production import ProductionTenant, build_production_tenant
from tests import tidb_semantics
from tests.support import COLLATED_BACKENDS, mysql_database

NS = "prod"
SEED = 24
#: Small sizes everywhere except the registry: its 10,000 stopped rows are what the tests of it read.
SIZES = {"active_packs": 2, "plain_lanes": 3, "generations": 3}


@dataclass
class Built:
    backend: str
    url: str
    engine: Engine
    tenant: ProductionTenant

    @property
    def is_mysql(self) -> bool:
        return self.backend != "sqlite"


BACKEND_PARAMS = [
    pytest.param(name, marks=[pytest.mark.mysql] if name != "sqlite" else [], id=name)
    for name in COLLATED_BACKENDS
    if name != "sqlite" or not tidb_semantics.enabled_by_env()
]


@pytest.fixture(scope="module", params=BACKEND_PARAMS)
def built(request, tmp_path_factory):
    """The default production-shaped tenant on one backend, built once for the module (read-only for its tests)."""
    with contextlib.ExitStack() as stack:
        if request.param == "sqlite":
            path = tmp_path_factory.mktemp("production") / "tenant.db"
            path.touch()
            url = f"sqlite:///{path}"
        else:
            charset, collation = COLLATED_BACKENDS[request.param]
            url = stack.enter_context(
                mysql_database(request.getfixturevalue("mysql_server_url"), charset=charset, collation=collation))
        engine = make_engine(url)
        stack.callback(engine.dispose)
        tenant = build_production_tenant(engine, namespace=NS, seed=SEED, now=utcnow(), **SIZES)
        apply_steps(engine, projection_steps(engine))  # cutover step 1 (additive): the audit reads its column
        yield Built(request.param, url, engine, tenant)


@pytest.fixture
def production(request, built) -> Built:
    """``built``, counted as a MySQL-protocol test when it runs on the server."""
    if built.is_mysql:
        request.node._nexus_uses_mysql = True
    return built

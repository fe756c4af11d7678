"""Registry ids are never cut and never shared through the collation (issue 33: "registry ids").

A ``--process-id`` longer than ``_System_ProcessRegistry.ProcessId`` is bad input (cut, two processes would share a
row); one the tenant's collation equates with another process's id while the bytes differ is refused (the upsert
would take over that process's row). On SQLite and MariaDB tenants of two collations.
"""

from __future__ import annotations

import os
import subprocess
import sys

import pytest
from sqlalchemy import select

from nexus_cutover.catalog import ProcessRegistry
from nexus_cutover.errors import BadInput
from nexus_cutover.runtime.registry import register

from .support import NS, range_tenant


def _ids(engine) -> list[str]:
    with engine.connect() as conn:
        return sorted(conn.execute(select(ProcessRegistry.c.ProcessId)).scalars())


def test_a_process_id_longer_than_the_column_is_refused_not_cut(collated_engine):
    range_tenant(collated_engine)
    before = _ids(collated_engine)
    with pytest.raises(BadInput, match="--process-id"):
        register(collated_engine, "h" * 129, NS, "integration_host", 1)
    assert _ids(collated_engine) == before


def test_a_process_id_the_collation_equates_with_another_is_refused(collated_engine, equality):
    range_tenant(collated_engine)
    register(collated_engine, "Host-1", NS, "integration_host", 1)
    for variant in ("host-1", "Host-1 "):
        if equality.equal("Host-1", variant):
            with pytest.raises(BadInput, match="collation"):
                register(collated_engine, variant, NS, "integration_host", 1)
        else:
            register(collated_engine, variant, NS, "integration_host", 1)
    register(collated_engine, "Host-1", NS, "integration_host", 1)  # the same bytes: a restart re-registers
    assert "Host-1" in _ids(collated_engine)
    assert len(_ids(collated_engine)) == 1 + sum(not equality.equal("Host-1", v) for v in ("host-1", "Host-1 "))


def test_nexus_host_with_a_too_long_process_id_exits_2(sqlite_range_engine):
    range_tenant(sqlite_range_engine)
    env = {**os.environ, "NEXUS_TENANT_DSN": sqlite_range_engine.url.render_as_string(hide_password=False)}
    done = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.host", "--namespace", NS, "--process-id", "p" * 200,
                           "--drain-and-exit"], env=env, capture_output=True, text=True, timeout=120)
    assert done.returncode == 2, done.stdout + done.stderr
    assert "--process-id" in done.stderr

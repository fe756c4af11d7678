"""The Airflow harness itself: migrated metadata DB, connections resolved by the tenant hook."""

from __future__ import annotations

import pytest
from sqlalchemy import text

from nexus_cutover.errors import BadInput


def test_metadata_db_is_migrated(airflow_db):
    from airflow.utils.db import check_migrations

    check_migrations(timeout=1)  # raises when the metadata DB is not at head


@pytest.mark.parametrize("backend", ["mysql", "sqlite"])
def test_tenant_connection_resolves_to_the_tenant_db(airflow_db, tenant_connection, backend, request):
    from nexus_airflow.hooks import NexusTenantHook

    url = request.getfixturevalue(f"{backend}_url")
    tenant_connection("nexus_tenant_probe", url)
    hook = NexusTenantHook("nexus_tenant_probe")
    assert "nexus-test" not in hook.masked_dsn
    engine = hook.get_engine()
    try:
        with engine.connect() as conn:
            assert conn.execute(text("SELECT 1")).scalar() == 1
    finally:
        engine.dispose()


def test_unknown_connection_type_is_refused(airflow_db, tenant_connection):
    from nexus_airflow.hooks import NexusTenantHook

    tenant_connection("nexus_tenant_bad", raw_json='{"conn_type": "postgres", "host": "h"}')
    with pytest.raises(BadInput, match="use a 'mysql'"):
        NexusTenantHook("nexus_tenant_bad").get_engine()

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


def test_masked_dsn_hides_every_secret_a_connection_carries(airflow_db, tenant_connection, tmp_path):
    """The password, and extras rendered into the query string: a ``password``/``passwd`` extra (PyMySQL takes it),
    the key of MySqlHook's ``ssl`` mapping (a TLS query parameter now, ``ssl_key``); certificate paths and the charset
    stay visible. A TLS parameter given twice (the mapping's key and an ``ssl_key`` extra) is refused, naming it."""
    import json

    from nexus_airflow.hooks import NexusTenantHook

    extra = {"client": "pymysql", "passwd": "Xtra-pw-81c2", "ssl": {"ca": "/etc/nexus/ca.pem", "key": "Ssl-key-5e07"},
             "ssl_cert": "/etc/nexus/client.pem", "charset": "utf8mb4"}
    fields = {"conn_type": "mysql", "host": "db.internal", "port": 4000, "login": "nexus", "password": "Conn-pw-4af1",
              "schema": "tenant_acme", "extra": extra}
    tenant_connection("nexus_tenant_secrets", raw_json=json.dumps(fields))
    masked = NexusTenantHook("nexus_tenant_secrets").masked_dsn
    for secret in ("Conn-pw-4af1", "Xtra-pw-81c2", "Ssl-key-5e07"):
        assert secret not in masked, masked
    assert masked == ("mysql+pymysql://nexus:***@db.internal:4000/tenant_acme?charset=utf8mb4&passwd=***"
                      "&ssl_ca=%2Fetc%2Fnexus%2Fca.pem&ssl_cert=%2Fetc%2Fnexus%2Fclient.pem&ssl_key=***")
    tenant_connection("nexus_tenant_twice", raw_json=json.dumps({**fields, "extra": {**extra, "ssl_key": "Key-file-93ad"}}))
    with pytest.raises(BadInput, match="gives ssl_key twice") as twice:
        _ = NexusTenantHook("nexus_tenant_twice").masked_dsn
    assert "Key-file-93ad" not in str(twice.value) and "Ssl-key-5e07" not in str(twice.value)

"""Which tenants the status view lists, and how it opens them: the ``nexus_tenant_<tenant>`` connections.

Tenants are the Airflow connections whose id starts with ``nexus_tenant_``:
those in the metadata database and those defined as ``AIRFLOW_CONN_NEXUS_TENANT_*``
environment variables. Each is opened with :class:`nexus_airflow.hooks.NexusTenantHook`;
only the masked DSN ever leaves this module, and the page shows only the
connection id and its type.
"""

from __future__ import annotations

import os
from typing import Any

PREFIX = "nexus_tenant_"
ENV_PREFIX = "AIRFLOW_CONN_" + PREFIX.upper()
MAX_TENANTS = 200


def tenant_conn_ids() -> list[str]:
    ids: set[str] = set()
    try:
        from airflow.models.connection import Connection
        from airflow.utils.session import create_session
        from sqlalchemy import select

        with create_session() as session:
            rows = session.execute(
                select(Connection.conn_id).where(Connection.conn_id.like(f"{PREFIX}%")).limit(MAX_TENANTS)
            ).scalars()
            ids.update(rows)
    except Exception:  # noqa: BLE001 - no metadata DB (e.g. a unit test): the environment still counts
        pass
    ids.update(k[len("AIRFLOW_CONN_"):].lower() for k in os.environ if k.startswith(ENV_PREFIX))
    return sorted(ids)[:MAX_TENANTS]


def tenant_of(conn_id: str) -> str:
    return conn_id[len(PREFIX):]


def read_tenant(conn_id: str) -> dict[str, Any]:
    """The state of the tenant behind ``conn_id`` (an ``error`` entry when it cannot be read)."""
    from nexus_airflow.hooks import NexusTenantHook
    from nexus_cutover.tenant_status import read_tenant_state

    tenant = tenant_of(conn_id)
    try:
        hook = NexusTenantHook(conn_id)
        engine = hook.get_engine(connect_timeout=5.0)
    except Exception as exc:  # noqa: BLE001 - shown on the page; the hook's messages name no password
        return {"tenant": tenant, "conn_id": conn_id, "error": f"{type(exc).__name__}: {exc}"[:300]}
    try:
        state = read_tenant_state(engine, tenant)
    finally:
        engine.dispose()
    state["conn_id"] = conn_id
    state["database"] = hook.masked_dsn.split("://", 1)[0]
    return state

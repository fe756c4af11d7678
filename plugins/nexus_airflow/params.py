"""The trigger form of the cutover DAG (JSON-schema Params) and their resolution at run time.

Invariants:

* The form never holds a DSN or password: the tenant DB is named by an Airflow
  connection id (default ``nexus_tenant_<tenant>``), resolved by
  :class:`~nexus_airflow.hooks.NexusTenantHook` inside tasks only.
* ``tenant`` is required and pattern-checked (it is a namespace: lower-case
  letters, digits, ``_`` and ``-``, at most 64 characters); every other field
  has a bounded default, so a form with only a tenant is a valid run.
* Light to import: only ``airflow.sdk.Param`` (the DAG file imports this at parse time).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
CONN_ID_PATTERN = r"^$|^[A-Za-z0-9_.-]{1,200}$"
PACK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
HOST_CONTROLLERS = ("manual", "command", "http")


def conn_id_for(tenant: str) -> str:
    return f"nexus_tenant_{tenant}"


def notify_conn_param():
    """The optional notification connection of a run (see :mod:`nexus_airflow.notify`)."""
    from airflow.sdk import Param

    return Param(
        "", type="string", pattern=CONN_ID_PATTERN, title="Notification connection id",
        description="Where failures and needs-confirmation events are sent: an smtp connection (extra 'to') or "
        "a Slack webhook connection (needs the Slack provider). Empty: the Variable nexus_notify_conn_id, else "
        "the task log only.",
    )


def tenant_params() -> dict[str, Any]:
    """``tenant`` (required, pattern-checked) and ``conn_id``: the first fields of every per-tenant form."""
    from airflow.sdk import Param

    return {
        "tenant": Param(
            type="string",
            pattern=TENANT_PATTERN,
            title="Tenant (namespace)",
            description="The tenant's namespace, e.g. acme. Lower-case letters, digits, _ and -.",
        ),
        "conn_id": Param(
            "",
            type="string",
            pattern=CONN_ID_PATTERN,
            title="Tenant DB connection id",
            description="Airflow connection of the tenant database (mysql for MySQL/TiDB, sqlite for the embedded "
            "demo). Empty: nexus_tenant_<tenant>.",
        ),
    }


def cutover_params() -> dict[str, Any]:
    """The ``params`` of the cutover DAG."""
    from airflow.sdk import Param

    return {
        **tenant_params(),
        "pack_install_ids": Param(
            [],
            type="array",
            items={"type": "string", "pattern": PACK_ID_PATTERN},
            uniqueItems=True,
            title="Pack incarnations",
            description="PackInstallIds to cut over. Empty: every active pack of the namespace.",
        ),
        "drain_timeout": Param(
            3600, type="integer", minimum=1, maximum=7 * 86400, title="Drain timeout (s)",
            description="How long wait_for_drain may wait for old projection work to become terminal.",
        ),
        "stale_heartbeat": Param(
            120, type="integer", minimum=1, maximum=86400, title="Stale heartbeat window (s)",
            description="A process whose last heartbeat is older than this is silent (not live).",
        ),
        "host_controller": Param(
            "manual", type="string", enum=list(HOST_CONTROLLERS), title="How the new host is started",
            description="manual: ask the engineer (HITL); command: run the configured host command "
            "(Variable nexus_host_command); http: POST to the deployer via host_http_conn_id.",
        ),
        "host_http_conn_id": Param(
            "nexus_deployer", type="string", pattern=CONN_ID_PATTERN, title="Deployer HTTP connection id",
            description="Used when host_controller is http.",
        ),
        "dry_run": Param(
            False, type="boolean", title="Dry run",
            description="Run every check and print the exact plan of writes; write nothing.",
        ),
        "poll_interval": Param(
            30, type="integer", minimum=1, maximum=3600, title="Poll interval (s)",
            description="How often the waiting steps (drain, writers, readiness) look at the tenant DB.",
        ),
        "writers_stop_timeout": Param(
            3600, type="integer", minimum=1, maximum=7 * 86400, title="Writers stop timeout (s)",
            description="How long check_old_writers waits for every old writer to be stopped or silent.",
        ),
        "confirm_timeout": Param(
            86400, type="integer", minimum=1, maximum=30 * 86400, title="Confirmation timeout (s)",
            description="How long the human confirmations wait. A timeout never confirms.",
        ),
        "checkpoint_timeout": Param(
            300, type="integer", minimum=1, maximum=86400, title="Audit/checkpoint timeout (s)",
            description="Bound of each pack's audit + checkpoint call (lock waits included).",
        ),
        "readiness_timeout": Param(
            1800, type="integer", minimum=1, maximum=86400, title="Readiness timeout (s)",
            description="How long verify_readiness waits for the new host to activate.",
        ),
        "notify_conn_id": notify_conn_param(),
    }


@dataclass(frozen=True)
class RunParams:
    """The resolved form of one run."""

    tenant: str
    conn_id: str
    pack_install_ids: tuple[str, ...]
    drain_timeout: int
    stale_heartbeat: int
    host_controller: str
    host_http_conn_id: str
    dry_run: bool
    poll_interval: int
    writers_stop_timeout: int
    confirm_timeout: int
    checkpoint_timeout: int
    readiness_timeout: int

    @classmethod
    def from_context(cls, context) -> RunParams:
        p = context["params"]
        tenant = p["tenant"]
        return cls(
            tenant=tenant,
            conn_id=p.get("conn_id") or conn_id_for(tenant),
            pack_install_ids=tuple(p.get("pack_install_ids") or ()),
            drain_timeout=int(p.get("drain_timeout", 3600)),
            stale_heartbeat=int(p.get("stale_heartbeat", 120)),
            host_controller=p.get("host_controller", "manual"),
            host_http_conn_id=p.get("host_http_conn_id") or "nexus_deployer",
            dry_run=bool(p.get("dry_run", False)),
            poll_interval=int(p.get("poll_interval", 30)),
            writers_stop_timeout=int(p.get("writers_stop_timeout", 3600)),
            confirm_timeout=int(p.get("confirm_timeout", 86400)),
            checkpoint_timeout=int(p.get("checkpoint_timeout", 300)),
            readiness_timeout=int(p.get("readiness_timeout", 1800)),
        )

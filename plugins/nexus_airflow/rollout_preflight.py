"""The rollout's preflight (``tenant_rollout``'s first task): every tenant's ``plan`` verdict, as one table.

The rows come from :func:`nexus_cutover.projection.preflight.preflight` (the verdict
``nexus-cutover plan`` prints, read ``preflight_concurrency`` tenants at a time); this
module only reaches each tenant the way its cutover run would and publishes the table.

Invariants (the vocabulary is :mod:`nexus_airflow.rollout`):

* Each tenant's database is reached through its Airflow connection ``nexus_tenant_<tenant>``
  (:class:`~nexus_airflow.hooks.NexusTenantHook`), inside the task only: no DSN in the
  rows, the XCom, the log or the page. A missing connection is that tenant's ``stop`` row.
* The dry run is the tenant's own cutover run's: its holder (the run id the rollout
  would give it), the form's shared timeouts and stale-heartbeat window, and the
  cutover DAG's fence takeover (a fence of a finished Airflow run would be adopted).
* XCom ``preflight`` (:data:`~nexus_airflow.rollout.PREFLIGHT_KEY`, read back by
  :func:`~nexus_airflow.rollout.preflight_rows`) is the table: a list of dicts, one per
  tenant in the form's order (:data:`~nexus_cutover.projection.preflight.COLUMNS`);
  the log shows it as a table. Nothing is written to any tenant database.
* ``mode: preflight`` ends the rollout here: every later task but ``summary`` is skipped
  at once (no fence armed, no tenant run triggered) and the rollout succeeds with the table.
"""

from __future__ import annotations

import contextlib
import logging
import threading
from collections.abc import Iterator
from typing import Any

from nexus_airflow import rollout as ro


class TenantLog(logging.LoggerAdapter):
    """The task log with each line naming its tenant first: the preflight and the plan read several tenants at once,
    so their lines interleave (issue 51, item 8)."""

    def __init__(self, log, tenant: str) -> None:
        super().__init__(log, {"tenant": tenant})

    def process(self, msg, kwargs):
        return f"tenant {self.extra['tenant']}: {msg}", kwargs


def run_preflight(params: dict[str, Any], run_id: str, context, log) -> list[dict[str, Any]]:
    """The table (XCom ``preflight``), logged; raises ValueError for a form the rollout refuses (before any
    tenant database is read)."""
    from nexus_airflow.params import ROLLOUT_FIELDS, resolve
    from nexus_airflow.rollout_form import check_form
    from nexus_cutover.errors import BadInput
    from nexus_cutover.projection.preflight import preflight, text_table

    values = resolve(ROLLOUT_FIELDS, params)
    tenants = check_form(values)
    airflow = threading.Lock()  # the pool's calls into Airflow (connections, run states), one at a time
    options = dry_run_options(values, run_id, context, log, airflow)
    try:
        rows = preflight(tenants, lambda t: tenant_engine_of(t, log, airflow), options,
                         concurrency=values["preflight_concurrency"])
    except BadInput as exc:  # a concurrency the form's schema let through (a trigger through the API): refused
        raise ValueError(str(exc)) from None
    log.info("preflight of %d tenant(s), %d at a time:\n%s", len(rows), values["preflight_concurrency"],
             text_table(rows))
    return rows


@contextlib.contextmanager
def tenant_engine_of(tenant: str, log, airflow: threading.Lock) -> Iterator[Any]:
    """The tenant's engine as its cutover run opens it (:func:`nexus_airflow.base.tenant_engine`, connection
    ``nexus_tenant_<tenant>``), opened under ``airflow`` (a task's calls into Airflow are not all safe from several
    threads at once); the reads run outside the lock. For the rollout's reads of many tenants from one task (the
    preflight, the plan's standings)."""
    from nexus_airflow.base import tenant_engine
    from nexus_airflow.params import conn_id_for

    with contextlib.ExitStack() as opened:
        with airflow:
            engine = opened.enter_context(tenant_engine(conn_id_for(tenant), TenantLog(log, tenant)))
        yield engine


def dry_run_options(values: dict[str, Any], run_id: str, context, log, airflow: threading.Lock):
    """tenant -> the dry run's options, as the tenant's cutover run of this rollout would act."""
    from nexus_airflow.base import DAG_TAKE_OVER, holder_of_run, holder_state
    from nexus_airflow.params import CUTOVER_FIELDS, default_stale_heartbeat, renamed_fields
    from nexus_cutover.projection.dry_run import PlanOptions

    conf = renamed_fields(values.get("cutover_conf") or {})

    def state_for(tenant: str):
        judge = holder_state(context, TenantLog(log, tenant))

        def locked_state(holder: str) -> str:
            with airflow:
                return judge(holder)
        return locked_state

    timeout = CUTOVER_FIELDS["lock_timeout"].value(conf, "lock_timeout")
    drain = CUTOVER_FIELDS["drain_timeout"].value(conf, "drain_timeout")
    arm_below = CUTOVER_FIELDS["arm_when_drain_below"].value(conf, "arm_when_drain_below")
    stale = default_stale_heartbeat(CUTOVER_FIELDS["stale_heartbeat"].value(conf, "stale_heartbeat"))
    return lambda tenant: PlanOptions(
        namespace=tenant, holder=holder_of_run(ro.CUTOVER_DAG, ro.run_id_for(run_id, tenant)),
        timeout_s=float(timeout), drain_timeout_s=float(drain), stale_heartbeat_s=float(stale),
        arm_when_drain_below_s=float(arm_below),
        holder_state=state_for(tenant), take_over=DAG_TAKE_OVER)


def stopped_tenants(rows: list[dict[str, Any]] | None) -> dict[str, str]:
    """tenant -> ``preflight: stop: <reason>`` for every row whose verdict is stop."""
    return {r["tenant"]: f"preflight: stop: {r['reason']}" for r in rows or [] if r.get("verdict") == "stop"}


def halt_reason(stops: dict[str, str]) -> str:
    """The refusal of a rollout whose form says ``on_preflight_stop: halt``."""
    named = "; ".join(f"{t} ({why.removeprefix('preflight: stop: ')})" for t, why in stops.items())
    return (f"the preflight found {len(stops)} tenant(s) whose run would stop, and on_preflight_stop is halt: "
            f"{named}. Next: resolve them, or set on_preflight_stop to skip to run the others.")


def later_tasks() -> list[str]:
    """Every task after the preflight but ``summary``: what ``mode: preflight`` skips."""
    return [ro.PLAN_TASK] + ro.unused_wave_tasks(0)

"""Bench-only DAG of ``bench/bench_stack.py``: N tenants waiting in the real drain trigger at once.

Loaded only by the bench's own stack (its dags folder), never by the project's. One mapped task,
``wait_for_drain``, one map index per tenant, with ``start_from_trigger``: the scheduler defers each task
instance straight to a triggerer (no Celery worker slot, no worker start per tenant), where the cutover's own
:class:`nexus_airflow.triggers.StatusPollTrigger` runs the cutover's own ``DrainPoller`` on the tenant's
database, named by the connection ``nexus_bench_t_<map index>`` (rendered on the triggerer). Invariants:
the trigger kwargs carry connection ids, never a DSN; the deadline is fixed (a parse-time clock would make
every parse a new DAG version); a tenant whose drain ends is a failed task (the bench's tenants never drain).
"""

from __future__ import annotations

import os

from airflow.sdk import DAG, BaseOperator
from airflow.triggers.base import StartTriggerArgs

DAG_ID = "nexus_bench_waiting_tenants"
TENANTS = int(os.environ.get("NEXUS_BENCH_WAITING_TENANTS") or 0)
POLL_INTERVAL_S = float(os.environ.get("NEXUS_BENCH_POLL_INTERVAL_S") or 30)
STALE_HEARTBEAT_S = 30 * 86400.0  # the tenants' old worker heartbeated when the bench built them: live
DEADLINE = "2099-01-01T00:00:00"


class WaitForTenantDrain(BaseOperator):
    """The drain wait of one tenant, started on the triggerer by the scheduler."""

    template_fields = ("poller_kwargs",)
    start_from_trigger = True
    start_trigger_args = StartTriggerArgs(
        trigger_cls="nexus_airflow.triggers.StatusPollTrigger",
        trigger_kwargs={
            "poller": "nexus_airflow.pollers.DrainPoller",
            "poller_kwargs": {"conn_id": "nexus_bench_t_{{ ti.map_index }}", "namespace": "bench",
                              "deadline": DEADLINE, "stale_heartbeat_s": STALE_HEARTBEAT_S},
            "poll_interval": POLL_INTERVAL_S,
        },
        next_method="execute_complete",
        next_kwargs=None,
        timeout=None,
    )

    def __init__(self, *, tenant: int, poller_kwargs: dict | None = None, **kwargs) -> None:
        super().__init__(**kwargs)
        self.tenant = tenant
        self.poller_kwargs = poller_kwargs or {}

    def execute_complete(self, context, event: dict) -> None:
        from airflow.sdk.exceptions import AirflowFailException

        raise AirflowFailException(f"a bench tenant's drain ended ({event.get('state')}): {event.get('message')}")


with DAG(DAG_ID, schedule=None, catchup=False, max_active_runs=1, tags=["bench"],
         doc_md="bench/bench_stack.py only: N tenants waiting on the drain trigger") as dag:
    if TENANTS:
        WaitForTenantDrain.partial(task_id="wait_for_drain").expand(tenant=list(range(TENANTS)))

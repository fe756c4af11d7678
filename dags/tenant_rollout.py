"""Tenant rollout: the connector projection cutover for a list of tenants, one per-tenant run each.

It reuses the per-tenant DAG ``connector_projection_cutover`` (TriggerDagRunOperator,
one mapped task per tenant, deferrable while it waits): the cutover's tasks are
never copied here. Invariants:

* one run of the per-tenant DAG per tenant, with the run id
  ``rollout__<rollout run id>__<tenant>``; duplicate tenants are refused up front;
* bounded concurrency: the pool ``nexus_tenant_rollout`` (create it with
  ``include_deferred`` so a waiting tenant holds its slot), at most
  ``MAX_PARALLEL_TENANTS`` tenants of one rollout at a time, and ``max_active_runs=1``;
* a failure in one tenant never stops the others (mapped tasks are independent);
* ``summary`` runs whatever happened (``all_done``), lists each tenant's outcome
  (the per-tenant run's state and, for a failure, the tasks that failed), and
  fails the rollout run if any tenant did not succeed.
"""

from __future__ import annotations

import re
from typing import Any

from airflow.providers.standard.operators.trigger_dagrun import TriggerDagRunOperator
from airflow.sdk import DAG, Param, TriggerRule, task

from nexus_airflow.params import TENANT_PATTERN

CUTOVER_DAG = "connector_projection_cutover"
POOL = "nexus_tenant_rollout"
MAX_PARALLEL_TENANTS = 4
#: Fields of the per-tenant form a rollout may set for every tenant (never a DSN: connections are per tenant).
SHARED_FIELDS = ("drain_timeout", "stale_heartbeat", "host_controller", "host_http_conn_id", "dry_run",
                 "poll_interval", "writers_stop_timeout", "confirm_timeout", "checkpoint_timeout", "digest_timeout",
                 "readiness_timeout")

DOC = f"""
# Tenant rollout

Runs `{CUTOVER_DAG}` once per tenant of `tenants`, at most {MAX_PARALLEL_TENANTS} at a time (pool `{POOL}`,
create it with *include deferred*). Each tenant's run is an ordinary per-tenant run: its confirmations
appear in *Required actions* as usual. A failed tenant does not stop the others; `summary` lists every
tenant's outcome and fails the rollout if any tenant failed. Rerun a failed tenant from its own run
(clear the failed task there), not by rerunning the rollout.
"""


def run_id_for(rollout_run_id: str, tenant: str) -> str:
    return re.sub(r"[^A-Za-z0-9_.~:+-]", "_", f"rollout__{rollout_run_id}__{tenant}")[:250]


@task
def plan(params: dict[str, Any] | None = None, run_id: str | None = None, ti=None) -> list[dict[str, Any]]:
    """One trigger per tenant: its conf and run id. Refuses duplicates, malformed names and unknown fields."""
    from airflow.sdk.exceptions import AirflowFailException

    def refuse(reason: str) -> None:
        ti.xcom_push(key="refusal", value=reason)  # what summary reports as the rollout's failure
        raise AirflowFailException(reason)

    tenants = list(params["tenants"])
    bad = [t for t in tenants if not re.match(TENANT_PATTERN, t)]
    dupes = sorted({t for t in tenants if tenants.count(t) > 1})
    if bad or dupes or not tenants:
        refuse(f"tenants: malformed {bad}, duplicated {dupes}, or empty list")
    shared = {k: v for k, v in (params.get("cutover_conf") or {}).items() if k in SHARED_FIELDS}
    unknown = sorted(set(params.get("cutover_conf") or {}) - set(SHARED_FIELDS))
    if unknown:
        refuse(f"cutover_conf: unknown or per-tenant fields {unknown}; allowed {', '.join(SHARED_FIELDS)}")
    return [{"conf": {"tenant": t, **shared}, "trigger_run_id": run_id_for(run_id, t)} for t in tenants]


@task(trigger_rule=TriggerRule.ALL_DONE)
def summary(triggers: list[dict[str, Any]], ti=None) -> dict[str, Any]:
    """Every tenant's outcome, logged as a table; fails the rollout when any tenant did not succeed."""
    from airflow.sdk.exceptions import AirflowFailException

    if not triggers:  # the plan refused (or died): no tenant ran, which is never a successful rollout
        reason = ti.xcom_pull(task_ids="plan", key="refusal") or "the plan task failed (see its log)"
        ti.xcom_push(key="summary", value={"tenants": {}, "succeeded": [], "not_succeeded": [], "refusal": reason})
        raise AirflowFailException(f"the rollout started no tenant: {reason}")
    outcomes: dict[str, Any] = {}
    for item in triggers:
        tenant, run_id = item["conf"]["tenant"], item["trigger_run_id"]
        try:
            state = ti.get_dagrun_state(dag_id=CUTOVER_DAG, run_id=run_id)
        except Exception as exc:  # noqa: BLE001 - the run was never created
            outcomes[tenant] = {"run_id": run_id, "state": "not triggered", "detail": type(exc).__name__}
            continue
        state = str(getattr(state, "value", state))  # a DagRunState prints as DagRunState.FAILED: show the word
        failed: list[str] = []
        if state != "success":
            states = ti.get_task_states(dag_id=CUTOVER_DAG, run_ids=[run_id]).get(run_id, {})
            failed = sorted(t for t, s in states.items() if s == "failed")  # the causes, not upstream_failed
        outcomes[tenant] = {"run_id": run_id, "state": state, "failed_tasks": failed}
    width = max([len(t) for t in outcomes] + [6])
    lines = [f"{'tenant':<{width}}  outcome", *(
        f"{t:<{width}}  {o['state']}" + (f" (failed: {', '.join(o['failed_tasks'])})" if o.get("failed_tasks") else "")
        + f"  run {o['run_id']}" for t, o in outcomes.items())]
    print("\n".join(lines))
    ok = [t for t, o in outcomes.items() if o["state"] == "success"]
    result = {"tenants": outcomes, "succeeded": ok, "not_succeeded": [t for t in outcomes if t not in ok]}
    ti.xcom_push(key="summary_text", value="\n".join(lines))
    if result["not_succeeded"]:
        ti.xcom_push(key="summary", value=result)
        raise AirflowFailException(f"{len(result['not_succeeded'])} of {len(outcomes)} tenant(s) did not succeed: "
                                   + ", ".join(result["not_succeeded"]))
    return result


with DAG(
    dag_id="tenant_rollout",
    description=f"Fan-out of {CUTOVER_DAG} over a list of tenants (bounded, failure-isolated)",
    schedule=None,
    catchup=False,
    max_active_runs=1,
    doc_md=DOC,
    default_args={"retries": 0},
    tags=["nexus", "cutover", "rollout"],
    params={
        "tenants": Param(["demo"], type="array", items={"type": "string", "pattern": TENANT_PATTERN},
                         minItems=1, uniqueItems=True, title="Tenants",
                         description="Namespaces; each uses the connection nexus_tenant_<tenant>."),
        "cutover_conf": Param({"host_controller": "manual"}, type="object", title="Per-tenant form fields",
                              description=f"Applied to every tenant's run; allowed keys: {', '.join(SHARED_FIELDS)}."),
    },
) as dag:
    triggers = plan()
    cutover = TriggerDagRunOperator.partial(
        task_id="cutover",
        trigger_dag_id=CUTOVER_DAG,
        wait_for_completion=True,
        deferrable=True,
        poke_interval=30,
        allowed_states=["success"],
        failed_states=["failed"],
        pool=POOL,
        max_active_tis_per_dagrun=MAX_PARALLEL_TENANTS,
        logical_date=None,
    ).expand_kwargs(triggers)
    cutover >> summary(triggers)

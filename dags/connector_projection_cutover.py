"""Connector projection range cutover: the five-step transition of seed 000, one run per tenant.

The steps and their order are declared once, in
``nexus_cutover.projection.transition.CUTOVER`` (``nexus-cutover run`` and ``plan``
follow the same list and run the same step bodies): this file names the operators
that run the bodies, by declared role or kind (the generic step operator; a sensor for a wait; a
human-in-the-loop operator where a person answers); :func:`nexus_airflow.declared.build` creates the tasks in the
declared order, in one TaskGroup per declared stage, their docs the declaration's. Every database access and every heavy
import happens inside the operators at run time.
"""

from __future__ import annotations

from airflow.sdk import DAG, AssetAlias, TriggerRule

from nexus_airflow.base import STEP_HOOKS, never_retry_stops, step_failed
from nexus_airflow.declared import CUTOVER, Kind, build, steps_md
from nexus_airflow.hitl import ConfirmWritersStoppedOperator, StartNewHostOperator
from nexus_airflow.notify import SUCCESS, CutoverNotifier
from nexus_airflow.operators import ASSET_ALIAS, CutoverStepOperator, StopOldWritersOperator
from nexus_airflow.params import cutover_params
from nexus_airflow.sensors import TenantWaitSensor

DAG_DOC = f"""
# Connector projection range cutover (per tenant)

Moves one tenant (namespace) from the old coverage-inference projection runtime
to durable input ranges, in the order of seed 000 "Existing-data cutover" (the steps below, each with
what it does to the database). The last step, **{CUTOVER.names[-1]}**, emits the Asset event
`nexus://<tenant>/connector-projection-ranges`.

{steps_md(CUTOVER)}

Trigger with at least `tenant`; the DB is the Airflow connection `conn_id`
(default `nexus_tenant_<tenant>`). `dry_run` runs every check and logs the
`PLAN:` of writes without writing. Every step is safe to clear and rerun.
It never UPDATEs or DELETEs an Event or WorkItem, never changes a WorkItem's
status, never revokes a fence override and has no way to skip a refusal.

**When it stops**: read the failed task's log and its XCom `report`; fix what it
names (usually with the old runtime, or a separately reviewed decision) and
clear that task. The fence stays armed until **{CUTOVER.with_role("release").fused_into or CUTOVER.with_role("release").name}** releases it.
"""

#: The operators of the declared steps, by declared role or kind (the rest: the generic step operator); every task doc
#: is the declaration's (nexus_airflow.declared.build), so the docs cannot name a task this DAG does not have.
OPERATORS = {
    Kind.WAITS: TenantWaitSensor,
    CUTOVER.with_role("confirmation").role: ConfirmWritersStoppedOperator,
    CUTOVER.with_role("host").role: StartNewHostOperator,
    CUTOVER.with_role("writers_stop").role: StopOldWritersOperator,
}
#: The last step's: the Asset event with the per-pack cutoffs and the verified digest, and the run's one success notice.
LAST = {
    "outlets": [AssetAlias(ASSET_ALIAS)],
    "trigger_rule": TriggerRule.ALL_SUCCESS,
    "on_success_callback": [CutoverNotifier(SUCCESS)],  # the run's end, cut over: one message (never a dry run)
}

with DAG(
    dag_id="connector_projection_cutover",
    description="Per-tenant connector projection range cutover (seed 000, steps 1-5)",
    schedule=None,
    catchup=False,
    max_active_runs=16,
    # A cleared or rerun task keeps the DAG bundle version its run started with (a versioned bundle, e.g. Git):
    # runbook, "Upgrading while cutovers are in flight"; the product version a run started on is checked by every step.
    rerun_with_latest_version=False,
    params=cutover_params(),
    doc_md=DAG_DOC,
    default_args={"retries": 0, "retry_policy": never_retry_stops(), **STEP_HOOKS,
                  "on_failure_callback": [CutoverNotifier(), step_failed]},
    tags=["nexus", "cutover", "connector-projection"],
    render_template_as_native_obj=False,
) as dag:
    # an armed tenant's tasks outrank a new tenant's first ones
    build(CUTOVER, OPERATORS, default=CutoverStepOperator, last=LAST, armed_by=CUTOVER.with_role("fence").name)

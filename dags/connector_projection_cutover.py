"""Connector projection range cutover: the five-step transition of seed 000, one run per tenant.

The steps and their order are declared once, in
``nexus_cutover.projection.transition.CUTOVER`` (``nexus-cutover run`` and ``plan``
follow the same list and run the same step bodies): this file names, per step, the
operator that runs its body (the generic step operator; a sensor for a wait; a
human-in-the-loop operator where a person answers) and the task doc a UI user
reads; :func:`nexus_airflow.declared.build` creates the tasks in the declared
order, in one TaskGroup per declared stage. Every database access and every heavy
import happens inside the operators at run time.
"""

from __future__ import annotations

from airflow.sdk import DAG, AssetAlias, TriggerRule

from nexus_airflow.base import STEP_HOOKS, never_retry_stops, step_failed
from nexus_airflow.declared import CUTOVER, build, steps_md, task
from nexus_airflow.hitl import ConfirmWritersStoppedOperator, StartNewHostOperator
from nexus_airflow.notify import SUCCESS, CutoverNotifier
from nexus_airflow.operators import ASSET_ALIAS, CutoverStepOperator
from nexus_airflow.params import cutover_params
from nexus_airflow.sensors import TenantWaitSensor

DAG_DOC = f"""
# Connector projection range cutover (per tenant)

Moves one tenant (namespace) from the old coverage-inference projection runtime
to durable input ranges, in the order of seed 000 "Existing-data cutover" (the steps below, each with
what it does to the database). The last step emits the Asset event
`nexus://<tenant>/connector-projection-ranges`.

{steps_md(CUTOVER)}

Trigger with at least `tenant`; the DB is the Airflow connection `conn_id`
(default `nexus_tenant_<tenant>`). `dry_run` runs every check and logs the
`PLAN:` of writes without writing. Every step is safe to clear and rerun.
It never UPDATEs or DELETEs an Event or WorkItem, never changes a WorkItem's
status, never revokes a fence override and has no way to skip a refusal.

**When it stops**: read the failed task's log and its XCom `report`; fix what it
names (usually with the old runtime, or a separately reviewed decision) and
clear that task. The fence stays armed until resume_admission.
"""

#: Per declared step: the operator and the task doc shown in the UI (its name is the task id; steps the DAG runs as one
#: fused task, nexus_airflow.declared.FUSED, are one task of their first step's operator, their docs in order).
TASKS = {
    "resolve_packs": task(
        CutoverStepOperator,
        doc_md="Reads the tenant's active packs (or checks `pack_install_ids`). Writes nothing. "
        "**Stops** on an unknown/inactive/foreign pack or a namespace without active packs: fix the form.",
    ),
    "apply_schema": task(
        CutoverStepOperator,
        doc_md="Additive DDL only: `_System_WorkItem.InputStartOrdinal` and `_System_ConnectorProjectionProtocol`, "
        "each skipped when present. **Refuses** when the v2 prerequisite `ReplayOfWorkId` is missing (it is "
        "never manufactured): land the WorkItem-only v2 handoff first, then clear.",
    ),
    "wait_for_short_drain": task(
        TenantWaitSensor,
        doc_md="Deferrable, before the fence: waits, with admission still open, until the old projection backlog "
        "would drain within `arm_when_drain_below` seconds at its measured rate (two looks give the rate), so the "
        "admission pause holds only a short residual drain; 0 arms at once. Writes nothing and holds nothing. "
        "**Stops and reports** (nothing written, the fence not armed) when the backlog cannot drain (its blockers "
        "by cause) or at `pre_arm_timeout` (the remaining work and the rate). The drain the cutover relies on is "
        "still `wait_for_drain`, after the fence.",
    ),
    "arm_fence": task(
        CutoverStepOperator,
        doc_md="Arms one non-expiring namespace-wide `*` admission fence held by this run (`ArmedBy`), reuses it on "
        "rerun, or adopts the one a failed/finished run left. **Stops** at once, writing nothing, while another "
        "unfinished run holds the tenant (named in XCom `report`), and while any fence override is active (listed; "
        "it revokes nothing): have L2 revoke them, then clear. Keep the old workers and dependency resolvers running.",
    ),
    "wait_for_drain": task(
        TenantWaitSensor,
        doc_md="Deferrable: waits until no old projection WorkItem is pending, blocked, retry or processing, "
        "logging the remaining counts and trend each poll. **Stops and reports** (XCom `report`, log) as soon "
        "as the drain provably cannot finish within `drain_timeout` -- retry not due before the deadline, "
        "blocked on an external dependency while no live old dependency_resolver heartbeats (with one, blocked "
        "items are progressing), "
        "expired lease, no live old worker -- or at the timeout, reporting everything still remaining. It never "
        "changes a WorkItem. Resolve the blockers with the old runtime, then clear.",
    ),
    "check_old_writers": task(
        TenantWaitSensor,
        doc_md="Now stop every old ingress_writer, receipt_materializer, projection_worker and dependency_resolver "
        "(keep the fence). Waits until `_System_ProcessRegistry` shows each one stopped or silent beyond "
        "`stale_heartbeat`; the evidence is in XCom. **Stops** at `writers_stop_timeout`.",
    ),
    "confirm_writers_stopped": task(
        ConfirmWritersStoppedOperator,
        doc_md="Human in the loop: shows the process evidence (and when it was taken) and asks the engineer to "
        "confirm that no old writer will resume. The registry is read again when the answer arrives: a writer that "
        "is live, or started or heartbeated since the evidence, fails the run. No default: **Reject or no answer** "
        "ends the run FAILED, cutover not performed, fence still armed, no checkpoint written.",
    ),
    "history_digest": task(
        CutoverStepOperator,
        doc_md="Read only: the digest of every history `_System_Event` / `_System_WorkItem` row of the tenant "
        "(chunks by primary key, each checksum computed in the server), taken now that no old writer can change "
        "them. Summary (hash, rows, chunks) in the log and XCom; `final_old_writer_check` verifies it at the end. "
        "**Stops** at `digest_timeout` or on a missing column (named): it wrote nothing, clear it.",
    ),
    "audit_and_checkpoint": task(
        CutoverStepOperator,
        doc_md="One per pack: the Controlplane lifecycle entrypoint (same as `connector-projection-cutover`) with "
        "a bounded `lock_timeout`. Under the namespace/pack locks it verifies the fence is in force with no "
        "active override, audits retained responsibility and "
        "writes only `LegacyMaxOrdinal`; an existing checkpoint is returned unchanged. **Refusals** fail with "
        "every finding in the log and XCom `report`: they need a separately reviewed recovery decision.",
    ),
    "start_new_host": task(
        StartNewHostOperator,
        doc_md="Starts the matching new host per `host_controller`: `manual` asks you (HITL) to start it, "
        "`command` runs the Variable `nexus_host_command` (default: the reference `nexus-host`), `http` POSTs "
        "to the deployer connection. Skips when a new host already runs. **Abort** fails the run; the fence "
        "stays armed.",
    ),
    "verify_readiness": task(
        TenantWaitSensor,
        doc_md="Deferrable: waits for a registered ProjectionProtocol=1 integration_host with ActivatedAt and a "
        "fresh heartbeat, and no live old writer. **Stops** at `readiness_timeout`: check the host log, clear.",
    ),
    "resume_admission": task(
        CutoverStepOperator,
        doc_md="Re-checks readiness, then releases the fence this run holds (sets ReleasedAt): admission "
        "resumes through L2 and the new host. Already released: no-op success; held by another run: stops.",
    ),
    "final_old_writer_check": task(
        CutoverStepOperator,
        outlets=[AssetAlias(ASSET_ALIAS)],
        trigger_rule=TriggerRule.ALL_SUCCESS,
        on_success_callback=[CutoverNotifier(SUCCESS)],  # the run's end, cut over: one message (never a dry run)
        doc_md="Reports any old-protocol writer seen after the fence release (**do not restart an old writer "
        "after this point**), then verifies the history digest: any history row changed, missing or extra since "
        "`history_digest` fails the task, named by key with the columns that differ (rows admitted above the "
        "cutoffs and range work may change). On success emits the Asset event "
        "nexus://<tenant>/connector-projection-ranges with the per-pack cutoffs and the verified digest as extra.",
    ),
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
    build(CUTOVER, TASKS, armed_by="arm_fence", default=CutoverStepOperator)  # an armed tenant's tasks outrank a new tenant's first ones

"""Field History eligibility: the three stage gates of seed 003, one run per tenant.

The steps and their order are declared once, in
``nexus_cutover.field_history.transition.FIELD_HISTORY`` (the
``field-history-eligibility`` stage commands follow the same list): this file
names, per step, the operator and the task doc a UI user reads. Every database
access happens inside the operators (``plugins/nexus_airflow/field_history.py``) at run time.
"""

from __future__ import annotations

from airflow.sdk import DAG

from nexus_airflow.base import STEP_HOOKS, never_retry_stops, step_failed
from nexus_airflow.declared import FIELD_HISTORY, build, task
from nexus_airflow.field_history import (
    GateOperator,
    OutboxDrainSensor,
    Stage1Operator,
    field_history_params,
)
from nexus_airflow.notify import CutoverNotifier

DAG_DOC = """
# Field History eligibility (per tenant)

Moves one tenant from the sequence/interval compatibility reader to boolean-only
Field History reads, in the release stages of seed 003. Each stage is a gate
that checks evidence in the tenant database, acts only when it holds, and
otherwise **stops and reports** (failed task, log, XCom `report`):

1. **stage_1**: the nullable `FieldHistoryEligible` column (additive DDL, skipped when present) and every
   `runtime_api` / `audit_outbox_worker` at least `stage1_release`;
2. **stage_2_producers** (every `runtime_api` / `service_manager` at least `producer_release`, and no NULL
   row with a stable FieldId from such a producer), **stage_2_drain_outbox** (pre-cutover outbox work
   delivered; deferrable), **stage_2_materialize** (legacy NULL rows decided from their sequence/interval
   facts, in batches of `batch_size`);
3. **stage_3**: every deployed producer upgraded and no pre-cutover outbox work; then
   `FieldHistorySequenceReservationEnabled = false` first, in-flight mutations and their outbox rows settle
   (producers keep writing throughout), and under the locks a whole-table comparison that finds no eligible
   NULL row switches `FieldHistoryReadMode = boolean_only`; the report lists the machinery now removable.

Trigger with `tenant`, `stage1_release`, `target_stage` and (stages 2-3) `producer_release`; the DB is the
Airflow connection `conn_id` (default `nexus_tenant_<tenant>`). Stages above `target_stage` are skipped;
stages already passed are re-verified, not redone, so the same form can be run again at any time.
It never UPDATEs or DELETEs an Event, WorkItem, outbox or process row, never overwrites a stamped
eligibility value, and has no way to skip a refusal.
"""

#: Per declared step (its name is the task id): the operator and the task doc shown in the UI.
TASKS = {
    "stage_1": task(
        Stage1Operator,
        doc_md="Adds the nullable `_System_AuditFieldChange.FieldHistoryEligible` if absent (idempotent) and checks "
        "that every deployed `runtime_api` and `audit_outbox_worker` runs at least `stage1_release`. **Stops** "
        "listing the lagging processes: upgrade them (or mark gone ones stopped), then clear.",
    ),
    "stage_2_producers": task(
        GateOperator,
        doc_md="Every deployed `runtime_api` and `service_manager` runs at least `producer_release`, and no row "
        "with a stable FieldId written by such a producer is NULL. **Stops** listing lagging processes or example "
        "unstamped rows (a producer is not stamping): fix the producer, then clear. Writes nothing.",
    ),
    "stage_2_drain_outbox": task(
        OutboxDrainSensor,
        doc_md="Deferrable: waits until no outbox row older than `producer_release` is pending or processing, "
        "logging the remaining count each poll. **Stops and reports** failed pre-cutover rows, open rows without "
        "a live `audit_outbox_worker`, or `drain_timeout`. It never changes an outbox row.",
    ),
    "stage_2_materialize": task(
        GateOperator,
        doc_md="Sets NULL rows with a FieldId and a HistorySequence to TRUE where an interval proves eligibility "
        "and FALSE where none does, in keyset batches of `batch_size`, each its own transaction, never "
        "overwriting a stamped value. Resumable: a failure or timeout keeps committed batches; clear to finish.",
    ),
    "stage_3": task(
        GateOperator,
        doc_md="**Refuses with the counts** unless every deployed producer runs `producer_release` and no pre-cutover "
        "outbox work is left. Then turns `FieldHistorySequenceReservationEnabled` off (and leaves it off), waits for "
        "in-flight mutations and their outbox rows to settle (within `switch_timeout`), and in one locked transaction "
        "compares the readers over the whole table: only when no eligible NULL row exists does it set "
        "`FieldHistoryReadMode = boolean_only`. Reports what machinery is now removable.",
    ),
}

with DAG(
    dag_id="field_history_eligibility",
    description="Per-tenant Field History eligibility stage gates (seed 003)",
    schedule=None,
    catchup=False,
    max_active_runs=16,
    # A cleared or rerun task keeps the DAG bundle version its run started with (a versioned bundle, e.g. Git):
    # runbook, "Upgrading while cutovers are in flight"; the product version a run started on is checked by every step.
    rerun_with_latest_version=False,
    params=field_history_params(),
    doc_md=DAG_DOC,
    default_args={"retries": 0, "retry_policy": never_retry_stops(), **STEP_HOOKS,
                  "on_failure_callback": [CutoverNotifier(), step_failed]},
    tags=["nexus", "field-history"],
) as dag:
    build(FIELD_HISTORY, TASKS)

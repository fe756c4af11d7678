"""Field History eligibility: the three stage gates of seed 003, one run per tenant.

The steps and their order are declared once, in
``nexus_cutover.field_history.transition.FIELD_HISTORY`` (the
``field-history-eligibility`` stage commands follow the same list): this file
names the operators by kind; the task docs and the overview are the declaration's. Every database
access happens inside the operators (``plugins/nexus_airflow/field_history.py``) at run time.
"""

from __future__ import annotations

from airflow.sdk import DAG

from nexus_airflow.base import STEP_HOOKS, never_retry_stops, step_failed
from nexus_airflow.declared import FIELD_HISTORY, Kind, build, steps_md
from nexus_airflow.field_history import (
    GateOperator,
    OutboxDrainSensor,
    Stage1Operator,
    field_history_params,
)
from nexus_airflow.notify import CutoverNotifier

DAG_DOC = f"""
# Field History eligibility (per tenant)

Moves one tenant from the sequence/interval compatibility reader to boolean-only
Field History reads, in the release stages of seed 003. Each stage is a gate
that checks evidence in the tenant database, acts only when it holds, and
otherwise **stops and reports** (failed task, log, XCom `report`):

{steps_md(FIELD_HISTORY)}

Trigger with `tenant`, `stage1_release`, `target_stage` and (stages 2-3) `producer_release`; the DB is the
Airflow connection `conn_id` (default `nexus_tenant_<tenant>`). Stages above `target_stage` are skipped
(empty: 3 with a `producer_release`, else 1);
stages already passed are re-verified, not redone, so the same form can be run again at any time.
It never UPDATEs or DELETEs an Event, WorkItem, outbox or process row, never overwrites a stamped
eligibility value, and has no way to skip a refusal.
"""

#: The operators of the declared gates, by kind: the first gate checks the form; the waits are deferrable sensors.
OPERATORS = {Kind.WAITS: OutboxDrainSensor}

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
    build(FIELD_HISTORY, OPERATORS, default=GateOperator, first=Stage1Operator)

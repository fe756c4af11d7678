"""Back out of a connector projection cutover before its checkpoint: the fence released without a cutover.

The steps and their order are declared once, in ``nexus_cutover.projection.transition.BACK_OUT``
(``nexus-cutover back-out`` runs the same bodies): this file names the operators by declared kind (the generic step
operator; the human-in-the-loop operator for the question); :func:`nexus_airflow.declared.build` creates the tasks in
the declared order, their docs the declaration's. Every database access happens inside the operators at run time.
"""

from __future__ import annotations

from airflow.sdk import DAG

from nexus_airflow.back_out import ConfirmBackOutOperator
from nexus_airflow.base import STEP_HOOKS, never_retry_stops, step_failed
from nexus_airflow.declared import BACK_OUT, Kind, build, steps_md
from nexus_airflow.notify import CutoverNotifier
from nexus_airflow.operators import CutoverStepOperator
from nexus_airflow.params import BACK_OUT_FIELDS, params_of_fields

DAG_DOC = f"""
# Back out of a connector projection cutover (per tenant)

The runbook's back-out ("Rollback stance"), for a tenant whose cutover stopped **before its checkpoint** (a rejected
or unanswered writer-stop question, a stuck drain): its cutover fence is released without a cutover, so the old
runtime admits the tenant's work again. Restart the old writers you stopped.

{steps_md(BACK_OUT)}

It refuses, writing nothing, once any pack of the tenant has its checkpoint (too late: finish the cutover with a rerun
instead), when no cutover fence is in force, and while the fence's holder is a run still at work. Everything the
question shows is read again under the tenant's lock when the fence is released. The delivery ledger records the
question, the answer and `backed_out`; the notification channel gets **BACKED OUT** with the pause it ended.
"""

with DAG(
    dag_id=BACK_OUT.name,
    description="Per-tenant back-out before the checkpoint: the cutover fence released without a cutover",
    schedule=None,
    catchup=False,
    max_active_runs=16,
    rerun_with_latest_version=False,
    params=params_of_fields(BACK_OUT_FIELDS),
    doc_md=DAG_DOC,
    default_args={"retries": 0, "retry_policy": never_retry_stops(), **STEP_HOOKS,
                  "on_failure_callback": [CutoverNotifier(), step_failed]},
    tags=["nexus", "cutover", "connector-projection", "back-out"],
    render_template_as_native_obj=False,
) as dag:
    build(BACK_OUT, {Kind.ASKS: ConfirmBackOutOperator}, default=CutoverStepOperator)

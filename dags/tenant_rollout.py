"""Tenant rollout: the connector projection cutover for a fleet of tenants, in waves, canary first.

It reuses the per-tenant DAG ``connector_projection_cutover`` (one run per tenant,
run id ``rollout__<rollout run id>__<tenant>``): the cutover's tasks are never
copied here. The tasks live in ``nexus_airflow``, one job per module (the invariants
are their docstrings): ``rollout_form`` (the form's refusals), ``rollout_plan`` (the plan), ``rollout_lanes`` (a wave's lanes),
``rollout_confirm`` (the wave question, its text ``rollout_render``) and
``rollout_tasks`` (the waves' and the rollout's outcomes); this file declares the flow: ``preflight`` (``rollout_preflight``: every tenant's
``plan`` verdict as one table) >> ``plan`` >> wave 0 (the canary) >>
wave 1 >> ... >> ``summary``, each wave ``open`` >> (``cutover`` per lane,
``confirm``) >> ``close``. The DAG declares ``MAX_WAVES`` wave groups; those past
the plan's last wave are skipped by ``plan``, at once.
"""

from __future__ import annotations

from typing import Any

from airflow.sdk import DAG, TaskGroup, TriggerRule, task

from nexus_airflow.base import never_retry_stops
from nexus_airflow.declared import PRIORITY_ARMED
from nexus_airflow.params import MAX_PARALLEL_CAP, ROLLOUT_FIELDS, params_of_fields
from nexus_airflow.rollout import (
    CLOSE_TASK,
    CONFIRM_TASK,
    LANE_TASK,
    MAX_WAVES,
    MODE_KEY,
    OPEN_TASK,
    PLAN_KEY,
    PREFLIGHT_KEY,
    REFUSAL_KEY,
    ROLLOUT_DAG,
    wave_group,
)
from nexus_airflow.rollout_confirm import WaveConfirmOperator
from nexus_airflow.rollout_lanes import WaveLaneOperator

CUTOVER_DAG = "connector_projection_cutover"

DOC = f"""
# Tenant rollout

Runs `{CUTOVER_DAG}` once per tenant, in waves: the **canary** wave first, then waves of `wave_size`.
A wave starts only after the previous one ended within `max_failed` (a count, or a fraction of the wave);
past it the rollout **halts** and later tenants are never started. At most `max_parallel` tenants of a wave
run at once.

**Preflight** (first, always): every tenant's `nexus-cutover plan` verdict (proceed / wait for what / stop on which
finding, old work remaining, live old writers, drain ETA), `preflight_concurrency` tenants at a time, as one table:
the task log, XCom `preflight`, the *Nexus rollouts* page and its CSV. `mode: preflight` runs only that (no fence,
no tenant run) and succeeds with the table. A real rollout skips the tenants whose verdict is stop
(`on_preflight_stop: skip`, named in the summary with the reason), halts before any wave (`halt`), or starts
them anyway (`run`: each one's own run stops where the preflight said, counted against `max_failed`).

**Approval**: `per_tenant` (default): each tenant's run asks its own writer-stop confirmation in
*Required actions*. `per_wave`: one question per wave (`wave_NN.confirm`), with one table of the ready tenants'
evidence, asked once no tenant of the wave is still on its way to its confirmation; a late tenant (waiting for
its old backlog before arming, fenced for the rest of it, or for a live old writer to be stopped) is not waited for and asks its own
follow-up question in its run when ready. Each tenant re-checks its own evidence when the answer arrives and
fails alone if a writer came back. `approvers` limits who may answer; the user who
triggered the rollout may not, unless `allow_self_approval`.

**Rerun** (clear the rollout run, or trigger it again): tenants already cut over are skipped; tenants that
failed before are retried only with `retry_failed`.

**Notifications** (`notify_conn_id`, else the Variable `nexus_notify_conn_id`; handed to every tenant's run): each
wave's question as one message naming its tenants, with the link to answer it, and the rollout's end (succeeded,
halted, cancelled or failed, with done / failed with reasons / not run), from `summary`.

**Pause / resume / cancel**: set the Airflow Variable `nexus_rollout_control__<run id>` to `pause`, `resume`
or `cancel` (UI: Admin > Variables, or the REST API). Pause holds tenants not yet started; cancel also stops
running tenants before their checkpoints (their fences stay armed and are reported).
"""


@task
def preflight(params: dict[str, Any] | None = None, run_id: str | None = None, ti=None) -> None:
    """Every tenant's ``plan`` verdict as one table (XCom ``preflight``, the log, the rollout page); read only.

    ``mode: preflight`` ends the rollout here: every later task but ``summary`` is skipped at once."""
    import logging

    from airflow.sdk import get_current_context
    from airflow.sdk.exceptions import DownstreamTasksSkipped

    from nexus_airflow.base import stopped
    from nexus_airflow.params import ROLLOUT_FIELDS
    from nexus_airflow.rollout_preflight import later_tasks, run_preflight

    log = logging.getLogger("nexus.rollout")
    try:
        rows = run_preflight(params, run_id, get_current_context(), log)
    except ValueError as exc:
        ti.xcom_push(key=REFUSAL_KEY, value=str(exc))  # what summary reports as the rollout's failure
        raise stopped(log, f"the rollout's form is refused: {exc}. Next: fix the form and trigger again.", code=2) from None
    ti.xcom_push(key=PREFLIGHT_KEY, value=rows)
    mode = ROLLOUT_FIELDS["mode"].value(params, "mode")
    ti.xcom_push(key=MODE_KEY, value=mode)
    if mode == "preflight":
        raise DownstreamTasksSkipped(tasks=later_tasks())


@task
def plan(params: dict[str, Any] | None = None, run_id: str | None = None, dag_run=None, ti=None) -> None:
    """The waves and every tenant's trigger (XCom ``rollout``); refuses bad input before any tenant starts.

    Skips the wave groups past the last planned wave at once (one call, so a small rollout does not wait for
    a skip to travel through every unused wave)."""
    import logging

    from airflow.sdk.exceptions import DownstreamTasksSkipped

    from nexus_airflow.base import stopped
    from nexus_airflow.rollout import preflight_rows, unused_wave_tasks
    from nexus_airflow.rollout_plan import build_plan

    log = logging.getLogger("nexus.rollout")
    rows = preflight_rows(ti)
    try:
        result = build_plan(params, run_id, getattr(dag_run, "triggering_user_name", None), ti, log, rows)
    except ValueError as exc:
        ti.xcom_push(key=REFUSAL_KEY, value=str(exc))  # what summary reports as the rollout's failure
        raise stopped(log, f"the rollout's form is refused: {exc}. Next: fix the form and trigger again.", code=2) from None
    ti.xcom_push(key=PLAN_KEY, value=result)
    for w in result["waves"]:
        log.info("wave %d (%s): %s", w["wave"], w["name"], ", ".join(w["tenants"]))
    for tenant, why in result["skipped"].items():
        log.info("skipped %s: %s", tenant, why)
    if unused := unused_wave_tasks(len(result["waves"])):
        raise DownstreamTasksSkipped(tasks=unused)


@task(show_return_value_in_logs=False)  # the task logs its lanes itself; the value is the XCom
def open_wave(wave: int, params: dict[str, Any] | None = None, run_id: str | None = None, ti=None) -> list[dict[str, Any]]:
    import logging

    from nexus_airflow.rollout_lanes import open_wave as _open

    return _open(wave, run_id, params, ti, logging.getLogger("nexus.rollout"))


# multiple_outputs=False: a dict return would otherwise be spread into one XCom per key, and its "wave" key
# would overwrite the wave's outcome (XCom ``wave``). show_return_value_in_logs=False: Airflow would log the value
# as a Python dict (issue 51, item 9); these tasks log their outcome as lines a person reads.
@task(trigger_rule=TriggerRule.NONE_SKIPPED, multiple_outputs=False, show_return_value_in_logs=False)
def close_wave(wave: int, run_id: str | None = None, ti=None) -> dict[str, Any]:
    import logging

    from nexus_airflow.rollout_tasks import close_wave as _close

    return _close(wave, run_id, ti, logging.getLogger("nexus.rollout"))


@task(trigger_rule=TriggerRule.ALL_DONE, multiple_outputs=False, show_return_value_in_logs=False)
def summary(run_id: str | None = None, ti=None) -> dict[str, Any]:
    """Every tenant's outcome, logged as a table; fails the rollout unless every planned tenant succeeded."""
    import logging

    from nexus_airflow.rollout_tasks import summarize

    return summarize(run_id, ti, logging.getLogger("nexus.rollout"))


#: The form (set on the DAG after its tasks are declared: see the end of this file).
ROLLOUT_PARAMS = params_of_fields(ROLLOUT_FIELDS)


with DAG(
    dag_id=ROLLOUT_DAG,
    description=f"{CUTOVER_DAG} over a fleet of tenants: canary, waves, failure budget, approvals",
    schedule=None,
    catchup=False,
    max_active_runs=1,
    doc_md=DOC,
    default_args={"retries": 0, "retry_policy": never_retry_stops()},
    tags=["nexus", "cutover", "rollout"],
) as dag:
    planned = previous = plan()
    preflight() >> planned
    closes = []
    for k in range(MAX_WAVES):
        with TaskGroup(wave_group(k)):
            lanes = open_wave.override(task_id=OPEN_TASK)(k)
            cutover = WaveLaneOperator.partial(task_id=LANE_TASK, max_active_tis_per_dagrun=MAX_PARALLEL_CAP).expand_kwargs(lanes)
            # the wave's question is asked of armed tenants: it outranks new tenants' first tasks, as their steps do
            confirm = WaveConfirmOperator(task_id=CONFIRM_TASK, wave=k, priority_weight=PRIORITY_ARMED, weight_rule="absolute")
            closed = close_wave.override(task_id=CLOSE_TASK)(k)
            # Every wave also hangs off plan directly: a refused plan fails every wave in one step, not 20.
            ([planned] if previous is planned else [planned, previous]) >> lanes
            lanes >> [cutover, confirm] >> closed
        previous = closed
        closes.append(closed)
    closes >> summary()  # every wave, not only the last: unused ones are skipped before the first one ends
    # The form is set last: a task declared while the DAG has params deep-copies them all (80 tasks, half of this
    # file's parse time). Airflow merges the DAG's params into every task's when it runs (process_params).
    dag.params = ROLLOUT_PARAMS

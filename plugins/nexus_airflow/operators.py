"""The cutover's declared steps as Airflow tasks: one generic operator over the steps' bodies.

:class:`CutoverStepOperator` runs the body of the declared step its task id
names (:mod:`nexus_cutover.projection.steps`, the bodies ``nexus-cutover run``
and ``plan`` run too) with a run built from the task's params
(:func:`cutover_run`): it logs what the body says (on a dry run the ``PLAN:``
of the writes it would make, and writes nothing), pushes the body's further
results to XCom, returns its value, and stops the task with the body's report
when its verdict is ``stop``. What only Airflow has runs around the body, as the
declaration places it (:func:`before`, :func:`after`): the form check of the run's
first step, a cancelled rollout at a step's declared ``cancel_point`` (before the
digest), the Asset event of the last step. The
waiting steps are sensors (:mod:`nexus_airflow.sensors`), the ones that ask a
person human-in-the-loop operators (:mod:`nexus_airflow.hitl`); they run the
same bodies.

Every step converges when cleared and rerun (see each body). Heavy imports
(SQLAlchemy, the domain package) happen inside ``execute`` only.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from airflow.sdk import BaseOperator

from nexus_airflow import armed_slots, results, writers_stop
from nexus_airflow.base import DAG_TAKE_OVER, domain_errors, holder_state, params_of, run_holder, stop, tenant_engine
from nexus_airflow.declared import ARMED_WINDOWS, task_of
from nexus_airflow.faults import fault_point

ASSET_ALIAS = "nexus-connector-projection-ranges"


def asset_uri(tenant: str) -> str:
    return f"nexus://{tenant}/connector-projection-ranges"


def cutover_run(context, log, engine, *, pack: str | None = None):
    """The :class:`~nexus_cutover.projection.steps.CutoverRun` of this task: the run's params, this run as the
    holder, earlier steps' results read from XCom, the body's lines in the task log, the fault seams."""
    from nexus_cutover.projection import steps

    p = params_of(context)
    ti = context["ti"]
    return steps.CutoverRun(
        engine, p.tenant, run_holder(context), dry_run=p.dry_run, requested_packs=tuple(p.pack_install_ids),
        adopt=p.adopt, lock_timeout_s=p.lock_timeout, digest_timeout_s=p.digest_timeout,
        drain_timeout_s=p.drain_timeout, digest_connections=p.digest_connections,
        arm_when_drain_below_s=p.arm_when_drain_below,
        stale_heartbeat_s=p.stale_heartbeat, holder_state=holder_state(context, log), take_over=DAG_TAKE_OVER,
        pack=pack, earlier=lambda step, key: results.pulled(ti, step, key=key), say=lambda line: log.info("%s", line),
        seam=fault_point, transition=results.transition_of(ti.dag_id))


def run_body(op: BaseOperator, context, step: str, *, pack: str | None = None,
             prepare: Callable[[Any], None] | None = None) -> Any:
    """Run the body of ``step`` for this task: its value (XCom ``return_value``), its further results pushed by
    their keys, and a ``stop`` verdict failing the task with the body's message and report."""
    from nexus_cutover.projection import steps

    p = params_of(context)
    with domain_errors(context, op.log), tenant_engine(p.conn_id, op.log) as engine:
        run = cutover_run(context, op.log, engine, pack=pack)
        if prepare is not None:
            prepare(run)
        result = steps.run_step(step, run)
    for key, value in result.keyed.items():
        context["ti"].xcom_push(key=key, value=value)
    if result.verdict.outcome == "stop":
        stop(context, op.log, result.stop_message, result.stop_report, step=step if step != op.task_id else None)
    if p.dry_run:
        for line in result.planned or ["(no write)"]:
            op.log.info("PLAN: %s", line)
    return result.value


class CutoverStepOperator(BaseOperator):
    """The declared step its task id names (a per-pack step: mapped over ``pack_install_id``), or a fused task's
    ``steps`` in order (:func:`run_fused`)."""

    template_fields = ("pack_install_id",)

    def __init__(self, *, pack_install_id: str | None = None, steps: tuple[str, ...] = (), **kwargs) -> None:
        super().__init__(**kwargs)
        self.pack_install_id = pack_install_id
        self.steps = tuple(steps) or (self.task_id,)
        if len(self.steps) > 1:  # a fused task: its metrics and stops are its steps' (nexus_airflow.base)
            self.current_step = self.steps[0]

    def execute(self, context) -> Any:
        if len(self.steps) == 1:
            return run_declared(self, context, self.task_id, pack=self.pack_install_id)
        self.log.info("::group::%s", self.steps[0])
        return run_fused(self, context, self.steps, run_declared(self, context, self.steps[0]))


class StopOldWritersOperator(CutoverStepOperator):
    """The writer-stop step's body, its controller configured from the form and the deployment
    (:func:`nexus_airflow.writers_stop.configure`)."""

    def execute(self, context) -> Any:
        return run_declared(self, context, self.task_id, prepare=lambda run: writers_stop.configure(context, run))


def run_declared(op: BaseOperator, context, step: str, *, pack: str | None = None,
                 prepare: Callable[[Any], None] | None = None) -> Any:
    """The step ``step`` as its task runs it: what Airflow adds before and after it (:func:`before`,
    :func:`after`) around its body (:func:`run_body`; ``prepare`` gives its run what only this task has)."""
    for hook in before(step, op.dag_id):
        hook(op, context)
    value = run_body(op, context, step, pack=pack, prepare=prepare)
    for hook in after(step, op.dag_id):
        value = hook(op, context, value)
    return value


def run_fused(op: BaseOperator, context, steps: tuple[str, ...], first: Any) -> Any:
    """A fused task's later ``steps[1:]``, once its first step passed with the value ``first``: each step its own
    record -- its value in XCom under its name, its log section, its metric -- and a stop fails the task naming
    the step (:func:`~nexus_airflow.base.stop`). The task's value is the last step's. Cleared, the task runs them
    all again: each converges (an already released fence is a no-op)."""
    from nexus_airflow.base import step_record_ended, step_record_started

    ti = context["ti"]
    ti.xcom_push(key=steps[0], value=first)
    step_record_ended(op, context, steps[0], first)
    op.log.info("::endgroup::")
    value = first
    for step in steps[1:]:
        op.log.info("::group::%s", step)
        step_record_started(op, step)
        value = run_declared(op, context, step)
        ti.xcom_push(key=step, value=value)
        step_record_ended(op, context, step, value)
        op.log.info("::endgroup::")
    op.metric_sent = True  # each step sent its own
    return value


def _check_the_form(op: BaseOperator, context) -> None:
    """The run's first task: a bad form, or a controller the deployment has not configured, fails before anything is
    read."""
    from nexus_airflow.params import check_form, form_of
    from nexus_cutover.projection.transition import CUTOVER

    with domain_errors(context, op.log):
        check_form(context, *form_of(op.dag_id))
        if op.dag_id == CUTOVER.name:  # what the form names must exist in this deployment: refused before any write
            writers_stop.require_configuration(context)


def _unless_cancelled(op: BaseOperator, context, safe_point: str) -> None:
    from nexus_airflow.rollout import stop_if_cancelled

    stop_if_cancelled(context, op.log, safe_point)


def _wait_for_an_armed_slot(op: BaseOperator, context, window: tuple[str, str, tuple[str, ...]]) -> None:
    """Before the fence step: arm only while fewer runs are armed than ``[nexus] armed_slots``
    (:mod:`nexus_airflow.armed_slots`); a tenant fenced already never waits."""
    from nexus_cutover.projection import steps

    def fenced() -> bool:
        p = params_of(context)
        with domain_errors(context, op.log), tenant_engine(p.conn_id, op.log) as engine:
            return steps.fence_and_checkpoints(engine, p.tenant, [])[0] is not None

    armed_slots.wait_for_a_slot(op, context, fence_task=window[0], release_task=window[1], fenced=fenced)


def _emit_the_asset_event(op: BaseOperator, context, value: dict[str, Any], step: str) -> dict[str, Any]:
    """The cutover's Asset event after its last step ``step``, with the per-pack cutoffs and the verified digest
    (not on a dry run)."""
    from airflow.sdk import Asset, AssetAlias

    from nexus_airflow.results import cut_over_before

    p = params_of(context)
    if p.dry_run:
        return value
    if (before := cut_over_before(context["ti"])) is not None:  # a rerun: nothing was cut over by this run
        op.log.info("%s: %s. No Asset event: this run changed nothing.", p.tenant, before)
        return {**value, "already_cut_over": before} if isinstance(value, dict) else value
    fault_point(f"{step}.before_emit")
    context["outlet_events"][AssetAlias(ASSET_ALIAS)].add(Asset(asset_uri(p.tenant)), extra=value)
    from nexus_cutover.projection.steps import complete_text

    op.log.info("%s. Do not restart an old writer after this point.", complete_text(value))
    return value


def before(step: str, dag_id: str) -> list[Callable[[BaseOperator, Any], None]]:
    """What runs in Airflow before the body of the step ``step`` of the DAG ``dag_id`` (the task, the context), read
    from its declaration: the form check before its first step, a cancelled rollout's stop at a declared
    ``cancel_point``."""
    transition = results.transition_of(dag_id)
    hooks: list[Callable[[BaseOperator, Any], None]] = []
    if step == transition.names[0]:
        hooks.append(_check_the_form)
    window = ARMED_WINDOWS.get(dag_id)
    if window is not None and task_of(dag_id, step) == window[0]:
        hooks.append(lambda op, context: _wait_for_an_armed_slot(op, context, window))
    declared = transition.get(step)
    if declared is not None and declared.cancel_point:
        hooks.append(lambda op, context: _unless_cancelled(op, context, declared.cancel_point))
    return hooks


def after(step: str, dag_id: str) -> list[Callable[[BaseOperator, Any, Any], Any]]:
    """What runs in Airflow after the body of the step ``step`` of the DAG ``dag_id`` passed (the task, the context,
    the value) -> the task's value, read from the declaration: the cutover's Asset event after its last step."""
    from nexus_cutover.projection.transition import CUTOVER

    if dag_id == CUTOVER.name and step == CUTOVER.names[-1]:
        return [lambda op, context, value: _emit_the_asset_event(op, context, value, step)]
    return []

"""What every cutover task shares: resolved params, a tenant engine, and how a task stops.

Invariants:

* Domain errors end a task with a message that says what to fix:
  :class:`~nexus_cutover.errors.BadInput` and
  :class:`~nexus_cutover.errors.Refused` are expected stops (:func:`stop`):
  never retried (:data:`NEVER_RETRY_STOPS`), and the task's log ends with the
  reason as short lines and the next action, not a traceback
  (:class:`TaskStopped`); unreachable databases and lock timeouts are ordinary
  failures (retryable when the DAG allows retries), with their traceback.
* A report that explains a stop is pushed to XCom (key ``report``) and logged
  *before* the task fails.
* Engines are created per task execution and disposed of afterwards; only the
  masked DSN is ever logged, with the TLS mode the connection uses.
* Every step of the per-tenant DAGs passes :func:`pin_the_code` (their ``pre_execute``) before it touches the
  tenant: a step of a run that started on another product version stops there, naming both
  (:mod:`nexus_cutover.code_version`).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import textwrap
from collections.abc import Iterator
from typing import Any

from nexus_airflow.params import RunParams


def params_of(context) -> RunParams:
    return RunParams.from_context(context)


@contextlib.contextmanager
def tenant_engine(conn_id: str, log) -> Iterator[Any]:
    from nexus_airflow.hooks import NexusTenantHook

    hook = NexusTenantHook(conn_id)
    log.info("tenant database: %s (connection %s, %s)", hook.masked_dsn, conn_id, hook.tls_text)
    engine = hook.get_engine()
    try:
        yield engine
    finally:
        engine.dispose()


#: Width of the lines a person reads in a task log (the log pane shows about this many without scrolling).
LINE_WIDTH = 100


class TaskStopped(SystemExit):
    """An expected stop of a task (a refusal, bad input, a person's answer): it fails, is never retried, and its
    log ends with the reason, not a traceback.

    A ``SystemExit`` because Airflow's task runner logs one as a single line
    ("Task exited", with its code) where it logs any other exception with the
    whole traceback, which buried the reason a person needs under frames that
    say nothing about the tenant; it still fails the task and runs its failure
    callbacks. The code is the command line's for the same stop (2 bad input,
    3 refused). ``str()`` is the message.
    """

    def __init__(self, message: str, code: int = 3) -> None:
        super().__init__(code)
        self.message = message

    def __str__(self) -> str:
        return self.message


def never_retry_stops():
    """The retry policy of every task: an expected stop (:class:`TaskStopped`) fails at once, whatever ``retries``."""
    from airflow.sdk.definitions.retry_policy import ExceptionRetryPolicy, RetryAction, RetryRule

    return ExceptionRetryPolicy(rules=[RetryRule(exception=f"{__name__}.TaskStopped", action=RetryAction.FAIL,
                                                 reason="an expected stop: retrying changes nothing")])


def with_next_action(context, message: str, next_action: str | None = None, step: str | None = None) -> str:
    """``message`` followed by the next action: ``next_action`` when the stop knows its own, else the runbook's
    for its ``step`` (this task's when None; one source: projection.next_actions)."""
    from nexus_cutover.projection.next_actions import next_action as step_action

    if "Next:" in message:
        return message
    ti = context.get("ti") if hasattr(context, "get") else None
    action = next_action or step_action(step or getattr(ti, "task_id", "") or "")
    if not action:
        return message
    return f"{message.rstrip().rstrip('.')}. Next: {action.rstrip('.')}."


def readable(message: str, width: int = LINE_WIDTH) -> str:
    """``message`` as short lines: every line wrapped at ``width``, the next action on lines of its own."""
    body, found, action = message.partition(" Next: ")
    lines = [wrapped for line in body.splitlines() for wrapped in (textwrap.wrap(line, width) or [""])]
    if found:
        lines += textwrap.wrap(f"Next: {action}", width, subsequent_indent="  ")
    return "\n".join(lines)


def stop(context, log, message: str, report: Any = None, *, next_action: str | None = None, code: int = 3,
         step: str | None = None) -> None:
    """Push ``report`` (XCom key ``report``), log it, then the reason and the next action as short lines, and
    fail the task without retry and without a traceback (:class:`TaskStopped`). ``step``: the declared step that
    stopped, when it is not the task's own (a fused task's): its next action, and named in the report."""
    message = with_next_action(context, message, next_action, step)
    if isinstance(report, dict):  # the stop's reason travels with its report (the rollout and the status view read it)
        report = {**report, "message": message, **({"step": step} if step else {})}
    if report is not None:
        if "ti" in context:  # every task run has one; a bare unit call of a callback may not
            context["ti"].xcom_push(key="report", value=report)
        log.info("report (XCom report):\n%s", report if isinstance(report, str) else fact_lines(report))
    raise stopped(log, message, code)


def fact_lines(report: Any, most: int = 50) -> str:
    """A report as a person reads it in a task log (issue 51, item 9): one fact per line, ``key: value``, a table's
    rows one per line (the first ``most``; the whole is the XCom), never a Python dict or a JSON block."""
    def fact(value: Any) -> str:
        if value is None:
            return "none"
        if isinstance(value, (list, tuple)) and all(not isinstance(v, (dict, list, tuple)) for v in value):
            return ", ".join(fact(v) for v in value) or "none"
        if isinstance(value, (dict, list, tuple)):
            return json.dumps(value, default=str)
        return str(value)

    if not isinstance(report, dict):
        return fact(report)
    lines: list[str] = []
    for key, value in report.items():
        if isinstance(value, dict) and value:
            lines += [f"{key}:", *(f"  {k}: {fact(v)}" for k, v in value.items())]
        elif isinstance(value, (list, tuple)) and value and all(isinstance(v, dict) for v in value):
            lines.append(f"{key}: {len(value)}")
            lines += ["  - " + "; ".join(f"{k} {fact(v)}" for k, v in row.items()) for row in value[:most]]
            if len(value) > most:
                lines.append(f"  ... and {len(value) - most} more (XCom report)")
        else:
            lines.append(f"{key}: {fact(value)}")
    return "\n".join(lines)


def stopped(log, message: str, code: int = 3) -> TaskStopped:
    """Log ``message`` as the task's last readable lines and return the :class:`TaskStopped` to raise."""
    log.error("%s", readable(f"STOPPED: {message}"))
    return TaskStopped(message, code)


@contextlib.contextmanager
def domain_errors(context, log) -> Iterator[None]:
    """Map :mod:`nexus_cutover.errors` to task outcomes (see the module invariants)."""
    from nexus_cutover.errors import BadInput, CutoverError, Refused

    try:
        yield
    except (BadInput, Refused) as exc:
        stop(context, log, f"{type(exc).__name__}: {exc}", {"error": type(exc).__name__, "message": str(exc)},
             code=exc.exit_code)
    except CutoverError as exc:  # not a stop (a lost database may come back): failed as is, its reason kept
        message = f"{type(exc).__name__}: {exc}"
        if "ti" in context:  # the rollout's summary and the status view read a failed step's reason from it
            context["ti"].xcom_push(key="report", value={"error": type(exc).__name__, "message": message})
        log.error("%s", message)
        raise


#: DagRun states in which a run still holds its tenant (contract, "One cutover per tenant at a time").
HOLDING_RUN_STATES = ("queued", "running")


def run_holder(context) -> str:
    """This run's holder name, whole: ``airflow:<dag_id>:<run_id>``. The domain stores it in ``ArmedBy`` /
    ``ReleasedBy`` / ``WrittenBy`` as :func:`nexus_cutover.holders.stored_holder` spells it (unique at any length)."""
    return holder_of_run(context['dag'].dag_id, context['run_id'])


def holder_of_run(dag_id: str, run_id: str) -> str:
    """Run ``run_id`` of ``dag_id`` as a holder (:func:`nexus_cutover.holders.holder_of_airflow_run`, the one
    spelling; imported here, not at the top: a DAG file parses this module and only the declarations)."""
    from nexus_cutover.holders import holder_of_airflow_run

    return holder_of_airflow_run(dag_id, run_id)


#: How a person takes over a fence from the cutover DAG (FenceHeld's "Next:"); ``{holder}`` is filled in.
DAG_TAKE_OVER = ("if {holder} is finished (a command that ended or was killed, a fence armed by hand) and you know it, "
                 "take its fence over: trigger the run again with adopt = {holder} in the form (the fence then records "
                 "this run as its holder)")


def holder_state(context, log):
    """``holder -> active | finished | unknown`` (:mod:`nexus_cutover.projection.cutover_fence`'s holder states).

    An Airflow run of this Airflow is ``finished`` in a final state, ``active``
    while queued or running (deferred and waiting for a person included). A run
    whose state cannot be read counts as active: adopting a fence on a guess
    could interleave two cutovers, refusing only waits. Any other holder (a
    fence armed by hand or by a CLI invocation) is ``unknown``: never adopted
    unless the person names it (the run's ``adopt`` field); so is a run whose
    holder name was too long for ``ArmedBy`` (its stored spelling ends in a
    digest, :func:`nexus_cutover.holders.is_digested`): its run id cannot be
    read back from it, so its state cannot be asked.

    Called by the domain before it takes any tenant lock (never under one).
    """
    from nexus_cutover.holders import airflow_run_named
    from nexus_cutover.projection.steps import HOLDER_ACTIVE, HOLDER_FINISHED, HOLDER_UNKNOWN

    def state_of(holder: str) -> str:
        run = airflow_run_named(holder)
        if run is None:
            return HOLDER_UNKNOWN
        dag_id, run_id = run
        if run_id is None:
            log.warning("the fence's holder %s is a run whose id was too long to store whole: its state cannot be read "
                        "here; it is adopted only when named (adopt)", holder)
            return HOLDER_UNKNOWN
        try:
            state = str(context["ti"].get_dagrun_state(dag_id=dag_id, run_id=run_id))
        except Exception as exc:  # noqa: BLE001 - unreadable: refuse rather than guess
            log.error("could not read the state of run %s of %s (%s): treating it as still holding the tenant",
                      run_id, dag_id, exc)
            return HOLDER_ACTIVE
        state = state.rsplit(".", 1)[-1].lower()  # an enum's repr, or its value
        log.info("the fence's holder %s is %s", holder, state)
        return HOLDER_ACTIVE if state in HOLDING_RUN_STATES else HOLDER_FINISHED

    return state_of


def plan(log, lines: list[str]) -> list[str]:
    """Log a dry-run plan of writes, one ``PLAN:`` line each; returns it for XCom."""
    for line in lines or ["(no write)"]:
        log.info("PLAN: %s", line)
    return lines


# --- the one choke point of every task of the per-tenant DAGs (their default_args): the code pin, step metrics ---

def step_started(context) -> None:
    """``pre_execute`` of every step: the run's code pin first (:func:`pin_the_code`: a step of a run that started on
    another product version stops here, before it touches the tenant), then start measuring this step's lock waits
    (:func:`nexus_cutover.locks.metering`)."""
    from nexus_cutover.locks import metering

    pin_the_code(context)
    metering()


#: Per DAG, how a tenant goes on with a new product version when a run stopped on the old one's pin: a new run,
#: which takes over what the stopped run left the way any failed run's leftovers are taken over.
GO_ON_WITH_THE_NEW_VERSION = {
    "connector_projection_cutover": "trigger a new run for the tenant on it: it adopts the fence this failed run "
                                    "left (the fence's Reason then records the new version) and checks every step "
                                    "again",
    "field_history_eligibility": "trigger a new run for the tenant on it with the same form: it re-verifies the "
                                 "stages already passed, then goes on",
}


def pin_the_code(context) -> None:
    """Stop this step (never retried) unless the steps of its run before it ran on the product version this
    process loaded (:func:`nexus_cutover.code_version.check`); then record the version it runs on (XCom
    ``product_version``: the run's first step's is the run's pin).

    The one place every step of the per-tenant DAGs passes before it touches the tenant: Airflow's task runner
    calls ``pre_execute`` before ``execute`` and before every resumption (a sensor's ``execute_complete`` after its
    trigger, a question's after its answer, a rescheduled poke), a dry run's too. A wait's trigger checks the
    triggerer's version itself (:mod:`nexus_airflow.triggers`). A DAG without a declared transition is not pinned.
    """
    from nexus_airflow import results
    from nexus_cutover import code_version

    ti = context["ti"]
    try:
        recorded = results.versions_before(ti)
    except KeyError:  # not a per-tenant DAG's declared step
        return
    stop_on_another_version(context, context["task"], recorded)
    ti.xcom_push(key=results.VERSION_KEY, value=code_version.RUNNING)


def stop_on_another_version(context, op, recorded, *, where: str = "this step's worker",
                            running: str | None = None) -> None:
    """Stop the task ``op`` (:func:`stop`, with both versions in its report) when a version in ``recorded``
    (``(recorded by, version)`` pairs) is not ``running`` (default: the version this process loaded)."""
    from nexus_cutover import code_version

    go_on = GO_ON_WITH_THE_NEW_VERSION.get(op.dag_id, "trigger a new run for the tenant on it")
    try:
        code_version.check(op.task_id, recorded, where=where, go_on=go_on,
                           **({"running": running} if running is not None else {}))
    except code_version.VersionChanged as exc:
        stop(context, op.log, str(exc), exc.report)


def step_ended(context, result: Any = None) -> None:
    """``post_execute`` of every step: its end through the run's recorder (:func:`nexus_airflow.ledger.recorder_for`):
    the events its result means in the delivery ledger, its duration, lock wait and figures as metrics (none when
    its trigger sent them: a wait that ended in the triggerer and was resumed anyway). A fused task's steps were
    recorded one by one (:func:`step_record_ended`)."""
    task = context.get("task")
    if len(getattr(task, "steps", ())) > 1:
        return
    _recorded_end(context, getattr(task, "task_id", None) or context["ti"].task_id, result,
                  figures=not getattr(task, "metric_sent", False))


def step_failed(context) -> None:
    """``on_failure_callback`` of every step: its stop through the run's recorder: ``stopped`` with the reason in the
    delivery ledger, its duration and lock wait until it failed and its failure by reason
    (:func:`nexus_cutover.metrics.failure_reason` of the task's exception) as metrics (a fused task's: of the step
    it was in)."""
    from nexus_airflow.ledger import recorder_for
    from nexus_cutover.metrics import failure_reason

    task, ti = context.get("task"), context.get("ti")
    exc = context.get("exception")
    step = getattr(task, "current_step", None) or getattr(ti, "task_id", None) or ""
    seconds, lock_wait = _measured(context)
    recorder_for(context).step_stopped(step, (str(exc) or type(exc).__name__) if exc is not None else "the task failed",
                                       error=type(exc).__name__ if exc is not None else None,
                                       failure=failure_reason(exc), seconds=seconds, lock_wait_s=lock_wait)


def step_record_started(op, step: str) -> None:
    """A fused task starts its step ``step``: the step's own clock and lock-wait meter (its metric's)."""
    from nexus_cutover.locks import metering

    op.current_step, op.current_step_started = step, dt.datetime.now(dt.UTC)
    metering()


def step_record_ended(op, context, step: str, result: Any) -> None:
    """A fused task's step ``step`` passed with ``result``: recorded as a task of its own would record it."""
    _recorded_end(context, step, result, started=getattr(op, "current_step_started", None))


def _recorded_end(context, step: str, result: Any, *, started: dt.datetime | None = None, figures: bool = True) -> None:
    from nexus_airflow.ledger import recorder_for

    seconds, lock_wait = _measured(context, started)
    recorder_for(context, figures=figures).step_passed(step, result, seconds=seconds, lock_wait_s=lock_wait)


def _measured(context, started: dt.datetime | None = None) -> tuple[float | None, float | None]:
    """This step's duration (from its first start: a deferred or rescheduled wait included) and lock wait so far."""
    from nexus_cutover.locks import current_meter

    ti, task = context.get("ti"), context.get("task")
    if ti is None:
        return None, None
    meter = current_meter()
    started = started or getattr(task, "current_step_started", None) or getattr(ti, "start_date", None)
    seconds = (dt.datetime.now(dt.UTC) - started).total_seconds() if started else None
    return seconds, meter.seconds if meter is not None and meter.acquisitions else None


#: The step hooks, for a DAG's ``default_args`` (``on_failure_callback`` is a list the DAG extends).
STEP_HOOKS = {"pre_execute": step_started, "post_execute": step_ended}

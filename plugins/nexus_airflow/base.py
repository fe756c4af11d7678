"""What every cutover task shares: resolved params, a tenant engine, and how a task stops.

Invariants:

* Domain errors end a task with a message that says what to fix:
  :class:`~nexus_cutover.errors.BadInput` and
  :class:`~nexus_cutover.errors.Refused` are not retried
  (``AirflowFailException``); unreachable databases and lock timeouts are
  ordinary failures (retryable when the DAG allows retries).
* A report that explains a stop is pushed to XCom (key ``report``) and logged
  *before* the task fails.
* Engines are created per task execution and disposed of afterwards; only the
  masked DSN is ever logged.
"""

from __future__ import annotations

import contextlib
import json
from collections.abc import Iterator
from typing import Any

from nexus_airflow.params import RunParams


def params_of(context) -> RunParams:
    return RunParams.from_context(context)


@contextlib.contextmanager
def tenant_engine(conn_id: str, log) -> Iterator[Any]:
    from nexus_airflow.hooks import NexusTenantHook

    hook = NexusTenantHook(conn_id)
    log.info("tenant database: %s (connection %s)", hook.masked_dsn, conn_id)
    engine = hook.get_engine()
    try:
        yield engine
    finally:
        engine.dispose()


def with_next_action(context, message: str) -> str:
    """``message`` followed by the runbook's next action for this task (one source: projection.next_actions)."""
    from nexus_cutover.projection.next_actions import next_action

    ti = context.get("ti") if hasattr(context, "get") else None
    action = next_action(getattr(ti, "task_id", "") or "")
    return f"{message} Next: {action}." if action and "Next:" not in message else message


def stop(context, log, message: str, report: Any = None) -> None:
    """Push ``report`` (XCom key ``report``), log it with ``message``, and fail the task without retry."""
    from airflow.sdk.exceptions import AirflowFailException

    message = with_next_action(context, message)
    if isinstance(report, dict):  # the stop's reason travels with its report (the rollout and the status view read it)
        report = {**report, "message": message}
    if report is not None:
        if "ti" in context:  # every task run has one; a bare unit call of a callback may not
            context["ti"].xcom_push(key="report", value=report)
        log.error("%s\n%s", message, report if isinstance(report, str) else json.dumps(report, indent=2, default=str))
    else:
        log.error("%s", message)
    raise AirflowFailException(message)


@contextlib.contextmanager
def domain_errors(context, log) -> Iterator[None]:
    """Map :mod:`nexus_cutover.errors` to task outcomes (see the module invariants)."""
    from nexus_cutover.errors import BadInput, CutoverError, Refused

    try:
        yield
    except (BadInput, Refused) as exc:
        stop(context, log, f"{type(exc).__name__}: {exc}", {"error": type(exc).__name__, "message": str(exc)})
    except CutoverError as exc:
        log.error("%s: %s", type(exc).__name__, exc)
        raise


RUN_HOLDER_PREFIX = "airflow"
#: DagRun states in which a run still holds its tenant (contract, "One cutover per tenant at a time").
HOLDING_RUN_STATES = ("queued", "running")


def run_holder(context) -> str:
    """This run's holder name, as written to ``ArmedBy`` / ``ReleasedBy`` / ``WrittenBy``."""
    return f"{RUN_HOLDER_PREFIX}:{context['dag'].dag_id}:{context['run_id']}"[:128]


#: How a person takes over a fence from the cutover DAG (FenceHeld's "Next:"); ``{holder}`` is filled in.
DAG_TAKE_OVER = ("if {holder} is finished (a command that ended or was killed, a fence armed by hand) and you know it, "
                 "take its fence over: trigger the run again with adopt = {holder} in the form (the fence then records "
                 "this run as its holder)")


def holder_state(context, log):
    """``holder -> active | finished | unknown`` (:mod:`nexus_cutover.projection.fence`'s holder states).

    An Airflow run of this Airflow is ``finished`` in a final state, ``active``
    while queued or running (deferred and waiting for a person included). A run
    whose state cannot be read counts as active: adopting a fence on a guess
    could interleave two cutovers, refusing only waits. Any other holder (a
    fence armed by hand or by a CLI invocation) is ``unknown``: never adopted
    unless the person names it (the run's ``adopt`` field).
    """
    from nexus_cutover.projection.fence import HOLDER_ACTIVE, HOLDER_FINISHED, HOLDER_UNKNOWN

    def state_of(holder: str) -> str:
        prefix, _, rest = holder.partition(":")
        dag_id, _, run_id = rest.partition(":")
        if prefix != RUN_HOLDER_PREFIX or not dag_id or not run_id:
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

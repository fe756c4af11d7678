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


def stop(context, log, message: str, report: Any = None) -> None:
    """Push ``report`` (XCom key ``report``), log it with ``message``, and fail the task without retry."""
    from airflow.sdk.exceptions import AirflowFailException

    if report is not None:
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
        stop(context, log, f"{type(exc).__name__}: {exc}")
    except CutoverError as exc:
        log.error("%s: %s", type(exc).__name__, exc)
        raise


def plan(log, lines: list[str]) -> list[str]:
    """Log a dry-run plan of writes, one ``PLAN:`` line each; returns it for XCom."""
    for line in lines or ["(no write)"]:
        log.info("PLAN: %s", line)
    return lines

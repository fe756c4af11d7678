"""Deferrable sensors over domain pollers: wait_for_drain, check_old_writers, verify_readiness.

:class:`StatusPollSensor` is the general base (also for other DAGs): it polls
once in the worker, then -- while the poller says ``waiting`` -- defers to
:class:`~nexus_airflow.triggers.StatusPollTrigger`, so a waiting tenant holds no
worker slot. A subclass names its poller, builds the poller's kwargs (ids and
bounds only) and decides what a final state means in :meth:`finish`.

Invariants: never ``soft_fail`` (a stop is a failure, never a skip); the wait is
bounded by a deadline computed when the sensor starts, carried in the trigger's
kwargs and enforced by the poller; a defer timeout backs it up should the
triggerer die. Nothing here writes to the tenant database.
"""

from __future__ import annotations

import datetime as dt
import time
from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseSensorOperator

from nexus_airflow.base import params_of, stop
from nexus_airflow.faults import fault_point
from nexus_airflow.triggers import WAITING, StatusPollTrigger, import_poller


class StatusPollSensor(BaseSensorOperator):
    poller_path: str = ""

    def __init__(self, *, deferrable: bool = True, **kwargs) -> None:
        kwargs.setdefault("poke_interval", 30)
        super().__init__(soft_fail=False, mode="poke", **kwargs)
        self.deferrable = deferrable

    # -- subclass API --------------------------------------------------------

    def poller_kwargs(self, context) -> dict[str, Any]:
        raise NotImplementedError

    def wait_seconds(self, context) -> float:
        raise NotImplementedError

    def interval(self, context) -> float:
        return float(params_of(context).poll_interval)

    def poll_only_once(self, context) -> bool:
        return False

    def finish(self, context, result: dict[str, Any]) -> Any:
        raise NotImplementedError

    # -- machinery -----------------------------------------------------------

    def _poll(self, kwargs: dict[str, Any]) -> dict[str, Any]:
        poller = import_poller(self.poller_path)(**kwargs)
        try:
            return poller.poll()
        finally:
            poller.close()

    def execute(self, context) -> Any:
        kwargs = self.poller_kwargs(context)
        result = self._poll(kwargs)
        self.log.info("%s", result.get("message", ""))
        fault_point(f"{self.task_id}.poll")
        if result.get("state") != WAITING or self.poll_only_once(context):
            return self.finish(context, result)
        if "remaining" in result:
            kwargs["initial_remaining"] = result["remaining"]
        interval = self.interval(context)
        if not self.deferrable:
            while result.get("state") == WAITING:
                time.sleep(interval)
                result = self._poll(kwargs)
                self.log.info("%s", result.get("message", ""))
            return self.finish(context, result)
        self.defer(
            trigger=StatusPollTrigger(self.poller_path, kwargs, interval),
            method_name="execute_complete",
            timeout=dt.timedelta(seconds=self.wait_seconds(context) + 3 * interval + 60),
        )

    def execute_complete(self, context, event: dict[str, Any]) -> Any:
        if event.get("state") == "error":
            stop(context, self.log, f"{self.task_id}: polling the tenant database failed: {event.get('message')}")
        return self.finish(context, event)


def _base_kwargs(context, wait_s: float) -> dict[str, Any]:
    from nexus_airflow.pollers import deadline_in

    p = params_of(context)
    return {"conn_id": p.conn_id, "namespace": p.tenant, "deadline": deadline_in(wait_s),
            "stale_heartbeat_s": p.stale_heartbeat}


@dataclass(frozen=True)
class TenantWait:
    """What one waiting step of the cutover waits for: its poller, its bound, its passing state, its stop."""

    poller_path: str
    timeout_param: str  # the RunParams field bounding the wait
    done_state: str
    stop_message: str
    plan: str  # the dry run's PLAN line (one look, no wait)
    text_key: str | None = None  # XCom key for the poller's human report, when it has one


WAITS = {
    "drain": TenantWait(
        "nexus_airflow.pollers.DrainPoller", "drain_timeout", "drained",
        "the drain of old projection work cannot finish within drain_timeout: stopped and reported "
        "(no WorkItem was changed; the fence stays armed)",
        "wait for the drain", "report_text",
    ),
    "old_writers": TenantWait(
        "nexus_airflow.pollers.OldWritersPoller", "writers_stop_timeout", "stopped",
        "old-protocol writers are still live after writers_stop_timeout: stop them (keep the fence), "
        "then clear check_old_writers",
        "wait until every old writer is stopped", "evidence_md",
    ),
    "readiness": TenantWait(
        "nexus_airflow.pollers.ReadinessPoller", "readiness_timeout", "ready",
        "the new host did not become ready within readiness_timeout; admission stays fenced. "
        "Check the host's logs, fix, then clear verify_readiness",
        "wait for the new host to be ready",
    ),
}


class TenantWaitSensor(StatusPollSensor):
    """One waiting step of the cutover (``wait``: drain, old_writers, readiness): the one sensor class for all three.

    Passes on the wait's ``done_state``; a dry run looks once and logs the PLAN
    when the real run would wait; any other final state stops the run with the
    poller's report (on a dry run too: the real run would stop there).
    """

    def __init__(self, *, wait: str, **kwargs) -> None:
        super().__init__(**kwargs)
        self.wait = wait
        self.poller_path = WAITS[wait].poller_path

    @property
    def spec(self) -> TenantWait:
        return WAITS[self.wait]

    def wait_seconds(self, context) -> float:
        return float(getattr(params_of(context), self.spec.timeout_param))

    def poller_kwargs(self, context) -> dict[str, Any]:
        return _base_kwargs(context, self.wait_seconds(context))

    def poll_only_once(self, context) -> bool:
        return params_of(context).dry_run

    def finish(self, context, result: dict[str, Any]) -> Any:
        spec = self.spec
        if spec.text_key:
            context["ti"].xcom_push(key=spec.text_key, value=result.get("report_text"))
        report = result.get("report", {})
        if result["state"] == spec.done_state:
            self.log.info("%s", result.get("message", spec.done_state))
            return report
        if result["state"] == WAITING:  # a dry run's one look: the real run would wait here
            self.log.info("PLAN: %s; now: %s", spec.plan, result.get("message"))
            return report
        stop(context, self.log, spec.stop_message, report)

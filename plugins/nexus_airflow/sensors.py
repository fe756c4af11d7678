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


class DrainSensor(StatusPollSensor):
    """Wait until no old projection WorkItem is pending/blocked/retry/processing; stop and report when stuck."""

    poller_path = "nexus_airflow.pollers.DrainPoller"

    def wait_seconds(self, context) -> float:
        return params_of(context).drain_timeout

    def poller_kwargs(self, context) -> dict[str, Any]:
        return _base_kwargs(context, self.wait_seconds(context))

    def poll_only_once(self, context) -> bool:
        return params_of(context).dry_run

    def finish(self, context, result: dict[str, Any]) -> Any:
        report = result.get("report", {})
        if result["state"] == "drained":
            self.log.info("old projection work drained")
            return report
        if result["state"] == WAITING:  # dry run: one look, no wait
            self.log.info("PLAN: wait for the drain; now: %s", result.get("message"))
            return report
        context["ti"].xcom_push(key="report_text", value=result.get("report_text"))
        stop(
            context, self.log,
            "the drain of old projection work cannot finish within drain_timeout: stopped and reported "
            "(no WorkItem was changed; the fence stays armed)",
            report,
        )


class OldWritersSensor(StatusPollSensor):
    """Wait until every old-protocol writer is stopped or silent; the evidence goes to XCom."""

    poller_path = "nexus_airflow.pollers.OldWritersPoller"

    def wait_seconds(self, context) -> float:
        return params_of(context).writers_stop_timeout

    def poller_kwargs(self, context) -> dict[str, Any]:
        return _base_kwargs(context, self.wait_seconds(context))

    def poll_only_once(self, context) -> bool:
        return params_of(context).dry_run

    def finish(self, context, result: dict[str, Any]) -> Any:
        context["ti"].xcom_push(key="evidence_md", value=result.get("report_text"))
        if result["state"] == "stopped" or params_of(context).dry_run:
            return result.get("report")
        stop(
            context, self.log,
            "old-protocol writers are still live after writers_stop_timeout: stop them (keep the fence), "
            "then clear check_old_writers",
            result.get("report"),
        )


class ReadinessSensor(StatusPollSensor):
    """Wait for an activated ProjectionProtocol=1 integration_host with a fresh heartbeat and no live old writer."""

    poller_path = "nexus_airflow.pollers.ReadinessPoller"

    def wait_seconds(self, context) -> float:
        return params_of(context).readiness_timeout

    def poller_kwargs(self, context) -> dict[str, Any]:
        return _base_kwargs(context, self.wait_seconds(context))

    def poll_only_once(self, context) -> bool:
        return params_of(context).dry_run

    def finish(self, context, result: dict[str, Any]) -> Any:
        if result["state"] == "ready" or params_of(context).dry_run:
            if result["state"] != "ready":
                self.log.info("PLAN: wait for the new host to be ready; now: %s", result.get("message"))
            return result.get("report")
        stop(
            context, self.log,
            "the new host did not become ready within readiness_timeout; admission stays fenced. "
            "Check the host's logs, fix, then clear verify_readiness",
            result.get("report"),
        )

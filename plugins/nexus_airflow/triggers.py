"""A general deferrable polling trigger: poll a domain status on the triggerer until it settles.

Invariants:

* The trigger serializes only the import path of a *poller* class and its
  keyword arguments (connection ids, namespaces, deadlines, windows), never a
  DSN or password.
* A poller is any class ``P(**poller_kwargs)`` with ``poll() -> dict`` and
  ``close()``; ``poll()`` returns at least ``{"state": "waiting" | <final>,
  "message": str}``. Every blocking call (constructing, polling, closing) runs in
  a worker thread (``asyncio.to_thread``), so the triggerer's event loop --
  shared by thousands of waiting tenants -- never blocks on the database.
* A poll's ``message`` is logged when its progress changed (the result's
  ``progress``, else its message) and, while nothing changes, once every
  :func:`quiet_log_s` (default 5 min) with how long it has been unchanged: the task
  log shows every change, and a thousand tenants that wait without change do not
  each write a line per poll (the triggerer's largest per-poll cost after the
  poll itself); so is the first poll after failed ones. The first non-``waiting``
  result is logged and fired as the single event, whose payload is the poller's
  result unchanged.
* Polls are spaced by :func:`nexus_cutover.polling.gaps`: 1 s after the
  first, then 2 s, 4 s, ... up to ``poll_interval`` (a wait that ends soon, a
  host that is ready in seconds, is seen in seconds).
* A wait told how its task ends (``end_task``: the passing state, the XComs it pushes from the result, the
  step's metric) ends the task here when the poll reaches that state: Airflow's ``TaskSuccessEvent`` with
  those XComs, so the task does not go back to a worker to say what the trigger already knows (a task start and
  a handoff inside the admission pause). Any other final state resumes the task on a worker as before (a stop
  is the sensor's, with its report). The sensors pass ``end_task`` only with ``NEXUS_WAITS_END_IN_TRIGGERER=1``
  in the workers' environment (off by default: measured, it did not shorten the pause).
* A wait deferred with the product version its task runs on (``pinned_version``) checks, before its first
  poll, that the triggerer loaded that version (:func:`nexus_cutover.code_version.check`): else its one event
  is ``version_changed`` (both versions), and it never opens the tenant database: the triggerer is code too,
  and a release deployed while a tenant waits does not poll it with other code than the run started on.
* A wait told to wake at a moment (``wake_at``, ISO-8601 UTC: when its run's fenced-tenant alert is due,
  :mod:`nexus_airflow.fence_watch`) ends there with one ``{"state": "wake"}`` event carrying the wait's
  ``deadline``, unless a final state came first: the task resumes on a worker, alerts once and waits again
  (to the same deadline). No trigger sends anything itself.
* A poll that fails on the database (a restarted server, a dropped connection)
  is logged and retried every ``poll_interval`` until the poller's own deadline
  (``expired()``); only then, or at once for bad input or a refusal (which no
  retry can fix), does the wait end with an ``error`` event naming the error.
"""

from __future__ import annotations

import asyncio
import datetime as dt
import time
from collections.abc import AsyncIterator
from typing import Any

from airflow.triggers.base import BaseTrigger, TriggerEvent

from nexus_cutover import settings

WAITING = "waiting"
#: The event of a wait whose triggerer runs another product version than the task that deferred (module invariants).
VERSION_CHANGED = "version_changed"
#: The event of a wait that reached its ``wake_at`` (see the module invariants).
WAKE = "wake"


def import_poller(path: str):
    from airflow.sdk.module_loading import import_string

    return import_string(path)


def _retryable(exc: BaseException) -> bool:
    """A database or network error may pass; bad input and refusals never do."""
    from nexus_cutover.errors import BadInput, Refused

    return not isinstance(exc, (BadInput, Refused, ImportError, TypeError))


def _expired(poller) -> bool:
    expired = getattr(poller, "expired", None)
    return bool(expired()) if callable(expired) else True  # no deadline known: do not retry blindly


#: Seconds between two log lines of a wait whose progress does not change (0: every poll), from the
#: triggerer's environment; the runbook's settings table.
QUIET_LOG_ENV = settings.BY_NAME["trigger_quiet_log_s"].alias
QUIET_LOG_DEFAULT_S = settings.BY_NAME["trigger_quiet_log_s"].default


def quiet_log_s() -> float:
    """How often an unchanged wait is logged: the setting ``trigger_quiet_log_s`` (``$NEXUS_TRIGGER_QUIET_LOG_S``) if
    it is a number >= 0, else 5 min (a wait keeps waiting on a bad value)."""
    try:
        value = settings.value("trigger_quiet_log_s")
    except settings.BadSetting:
        return QUIET_LOG_DEFAULT_S
    return value if value >= 0 else QUIET_LOG_DEFAULT_S


class ProgressLog:
    """Which waiting polls to log: a change of progress at once, an unchanged one every ``quiet_s`` seconds."""

    def __init__(self, quiet_s: float):
        self.quiet_s = quiet_s
        self.progress: Any = None
        self.logged_at = 0.0
        self.unchanged = 0
        self.since: str | None = None

    def line(self, result: dict[str, Any], now: float) -> str | None:
        """The line to log for this poll's ``result`` (None: nothing new to say yet)."""
        progress = result.get("progress", result.get("message"))
        message = str(result.get("message", ""))
        if self.since is None or progress != self.progress or result.get("state") != WAITING:
            self.progress, self.logged_at, self.unchanged = progress, now, 0
            self.since = dt.datetime.now(dt.UTC).strftime("%H:%M:%SZ")
            return message
        self.unchanged += 1
        if now - self.logged_at < self.quiet_s:
            return None
        self.logged_at = now
        return f"unchanged since {self.since} ({self.unchanged} more poll(s)): {message}"


class StatusPollTrigger(BaseTrigger):
    """Poll ``poller(**poller_kwargs).poll()`` until its state is not ``waiting``: soon at first, then every
    ``poll_interval`` s."""

    #: While a wait's progress does not change, its poll is logged once in this many seconds (None: the
    #: triggerer's :func:`quiet_log_s`).
    quiet_log_s: float | None = None

    def __init__(self, poller: str, poller_kwargs: dict[str, Any], poll_interval: float = 30.0,
                 end_task: dict[str, Any] | None = None, pinned_version: str | None = None,
                 wake_at: str | None = None):
        super().__init__()
        self.poller = poller
        self.poller_kwargs = dict(poller_kwargs)
        self.poll_interval = float(poll_interval)
        self.end_task = dict(end_task) if end_task else None
        self.pinned_version = pinned_version
        self.wake_at = wake_at

    def serialize(self) -> tuple[str, dict[str, Any]]:
        kwargs = {"poller": self.poller, "poller_kwargs": self.poller_kwargs, "poll_interval": self.poll_interval}
        if self.end_task:
            kwargs["end_task"] = self.end_task
        if self.pinned_version is not None:
            kwargs["pinned_version"] = self.pinned_version
        if self.wake_at:
            kwargs["wake_at"] = self.wake_at
        return f"{type(self).__module__}.{type(self).__qualname__}", kwargs

    def version_changed(self) -> dict[str, Any] | None:
        """The ``version_changed`` event's payload when this triggerer loaded another product version than
        ``pinned_version`` (None: the same, or no pin given)."""
        if self.pinned_version is None:
            return None
        from nexus_cutover import code_version

        try:
            code_version.check("the wait", [("the task that deferred", self.pinned_version)], where="the triggerer",
                               go_on="trigger a new run for the tenant on it")
        except code_version.VersionChanged as exc:
            return {"state": VERSION_CHANGED, "message": str(exc), "started_on": exc.started, "running": exc.running}
        return None

    def event(self, result: dict[str, Any]) -> TriggerEvent:
        """The one event of a final ``result``: the task's end when ``end_task`` says this state passes, else the
        result for the task to resume with."""
        end = self.end_task
        if not end or result.get("state") != end.get("state"):
            return TriggerEvent(result)
        from airflow.triggers.base import TaskSuccessEvent

        xcoms = {key: result.get(field) for key, field in (end.get("xcoms") or {}).items()}
        ended_step(end, xcoms.get("return_value"))
        return TaskSuccessEvent(xcoms=xcoms)

    async def run(self) -> AsyncIterator[TriggerEvent]:
        from nexus_cutover.polling import gaps

        changed = self.version_changed()
        if changed is not None:  # before the poller is made: it would open the tenant database
            self.log.error("%s", changed["message"])
            yield TriggerEvent(changed)
            return
        cls = import_poller(self.poller)
        instance = await asyncio.to_thread(cls, **self.poller_kwargs)
        failures, next_gap, progress_log = 0, gaps(self.poll_interval), ProgressLog(
            quiet_log_s() if self.quiet_log_s is None else self.quiet_log_s)
        try:
            while True:
                try:
                    result = await asyncio.to_thread(instance.poll)
                except Exception as exc:  # noqa: BLE001 - retried while it may pass, else a reportable event
                    failures += 1
                    text = f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}"
                    if not _retryable(exc) or _expired(instance):
                        yield TriggerEvent({"state": "error", "message": text, "failed_polls": failures})
                        return
                    self.log.warning("poll %d failed (%s); retrying in %g s, until the step's deadline", failures,
                                     text, self.poll_interval)
                    await asyncio.sleep(self.poll_interval)
                    continue
                line = progress_log.line(result, time.monotonic())
                if line is None and failures:  # the first poll after failed ones says it got through
                    line = str(result.get("message", ""))
                failures = 0
                if line is not None:
                    self.log.info("%s", line)
                if result.get("state") != WAITING:
                    yield self.event(result)
                    return
                gap = next(next_gap)
                if self.wake_at:
                    left = (dt.datetime.fromisoformat(self.wake_at) - dt.datetime.now(dt.UTC)).total_seconds()
                    if left <= 0:
                        yield TriggerEvent({"state": WAKE, "deadline": self.poller_kwargs.get("deadline")})
                        return
                    gap = min(gap, left)
                await asyncio.sleep(gap)
        finally:
            await asyncio.to_thread(instance.close)


def ended_step(end: dict[str, Any], result: Any) -> None:
    """The step metric a task ended by its trigger sends (its worker's ``post_execute`` does not run): duration
    from the task's first start (``end["started_at"]``), as :func:`nexus_airflow.base.step_ended` measures it."""
    if not end.get("tenant") or not end.get("step"):
        return
    from nexus_airflow.metrics import emit
    from nexus_cutover.recording import MetricsSink, Origin, Recorder

    started = end.get("started_at")
    seconds = (dt.datetime.now(dt.UTC) - dt.datetime.fromisoformat(started)).total_seconds() if started else None
    origin = Origin(tenant=str(end["tenant"]), dag_id=str(end.get("dag_id") or ""), run_id=str(end.get("run_id") or ""))
    Recorder(origin, [MetricsSink(emit)]).step_passed(str(end["step"]), result, seconds=seconds)

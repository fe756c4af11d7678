"""Sensors over domain pollers: the declared waits of the cutover (and Field History's outbox drain).

:class:`StatusPollSensor` is the general base (also for other DAGs). It is an
ordinary Airflow sensor: :meth:`~StatusPollSensor.poke` is one poll of the
tenant database, and Airflow's :class:`~airflow.sdk.BaseSensorOperator` runs the
wait in the mode the task asks for:

* ``deferrable=True`` (the DAGs' default): poke once in the worker; while the
  poller says ``waiting``, defer to :class:`~nexus_airflow.triggers.StatusPollTrigger`
  with the sensor's remaining timeout plus two polls (the trigger's verdict past the
  deadline comes first), so a waiting tenant holds no worker slot; with
  ``NEXUS_WAITS_END_IN_TRIGGERER=1`` a wait that passes there ends there
  (:meth:`~StatusPollSensor.end_task`: its XComs and metric from the trigger, no
  worker), a stop resumes on a worker;
* ``deferrable=False``, ``mode="poke"``: the base class pokes every
  ``poke_interval`` in the worker; ``mode="reschedule"``: one poke per
  execution, the worker slot given back and the task rescheduled in between.

A subclass names its poller, builds the poller's kwargs (ids and bounds only,
never a DSN), names its timeout and decides what a final state means in
:meth:`~StatusPollSensor.finish`.

Invariants:

* The sensor's ``timeout`` and ``poke_interval`` are the run's params (e.g.
  ``drain_timeout``, ``poll_interval``), set when the task starts, before the
  base class reads them.
* One deadline bounds the wait: the wait's start plus ``timeout``. Its start
  is the base class's own: the first poke of this try, or in reschedule mode
  the try's first reschedule (:meth:`get_first_reschedule_date`), so a
  reschedule never extends the wait. The poller gets the deadline and says
  ``timed_out`` (or the drain ``stuck``) past it.
* A wait that runs out stops with the wait's own report in every mode: the
  poller's verdict past the deadline, or, when Airflow's timeout fires first
  (:class:`AirflowSensorTimeout`: the base class's check, a deferral timeout
  after a lost trigger), one more look at the tenant database past the
  deadline (a look that fails stops naming the error). The stop names the
  timeout param, pushes the evidence to XCom and fails the task
  (:func:`~nexus_airflow.base.stop`): never ``soft_fail``, ``never_fail`` or
  ``silent_fail`` (a stop is a failure, never a skip).
* Nothing here writes to the tenant database.
* A wait inside the fenced window looks at its run's fenced-tenant alert at every look on a worker
  (:meth:`~StatusPollSensor.while_waiting`: :mod:`nexus_airflow.fence_watch`), and a deferred one is woken by its
  trigger when the alert is due: it alerts once, then waits again to the same deadline.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseSensorOperator, PokeReturnValue
from airflow.sdk.exceptions import AirflowSensorTimeout

from nexus_airflow.base import params_of, stop, stop_on_another_version
from nexus_airflow.faults import fault_point
from nexus_airflow.triggers import VERSION_CHANGED, WAITING, WAKE, StatusPollTrigger, import_poller
from nexus_cutover import settings

#: The state a wait's result carries when Airflow's timeout ended it and the poller had no final word.
TIMED_OUT = "timed_out"
#: Flags that would turn a stop into a skip or hide a failed poll: refused (see the module invariants).
_NEVER = ("soft_fail", "never_fail", "silent_fail")


#: The workers' environment switch of a wait ending in its trigger: off unless ``1`` (measured alone on the stack
#: it did not shorten the pause: docs/performance.md, "Both levers on the stack").
END_IN_TRIGGERER_ENV = settings.BY_NAME["waits_end_in_triggerer"].alias


def waits_end_in_triggerer() -> bool:
    """Whether a passing wait ends in the triggerer (the setting ``waits_end_in_triggerer``,
    ``$NEXUS_WAITS_END_IN_TRIGGERER``, is true)."""
    return bool(settings.value("waits_end_in_triggerer"))


def _utcnow() -> dt.datetime:
    from nexus_cutover.clock import utcnow

    return utcnow()


def _naive_utc(value: dt.datetime) -> dt.datetime:
    return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value


class StatusPollSensor(BaseSensorOperator):
    """A wait on a poller (see the module invariants); ``deferrable`` and ``mode`` as in Airflow's sensors."""

    poller_path: str = ""
    timeout_param: str = "timeout"  # the run's param that is the sensor's timeout, as a stop names it

    def __init__(self, *, deferrable: bool = True, **kwargs) -> None:
        if refused := [flag for flag in _NEVER if kwargs.pop(flag, False)]:
            raise ValueError(f"{', '.join(refused)}: a wait that cannot finish stops the run; it is never skipped")
        kwargs.setdefault("poke_interval", 30)
        super().__init__(**kwargs)
        self.deferrable = deferrable
        #: The declared step this sensor waits for (its task id, unless it leads a fused task), and the steps the
        #: task runs (a fused task's: :class:`TenantWaitSensor`).
        self.step = self.task_id
        self.steps: tuple[str, ...] = (self.task_id,)
        self._deadline: dt.datetime | None = None
        #: The step's metric was sent by its trigger (see :meth:`execute_complete`): the step hook sends none.
        self.metric_sent = False
        self._poller = None
        self._last: dict[str, Any] = {}
        #: When the deferred wait must come back to a worker (its run's fenced-tenant alert is due), if ever.
        self._wake: dt.datetime | None = None

    # -- subclass API --------------------------------------------------------

    def poller_kwargs(self, context, deadline: str) -> dict[str, Any]:
        """The poller's kwargs (ids and bounds only), bounded by ``deadline`` (ISO-8601 naive UTC)."""
        raise NotImplementedError

    def wait_seconds(self, context) -> float:
        """The sensor's ``timeout``: the run's param bounding this wait."""
        raise NotImplementedError

    def interval(self, context) -> float:
        """The sensor's ``poke_interval`` (and the trigger's)."""
        return float(params_of(context).poll_interval)

    def poll_only_once(self, context) -> bool:
        return False

    def while_waiting(self, context) -> dt.datetime | None:
        """Called at each look that says ``waiting``: when a deferred wait must come back here (None: never)."""
        return None

    def finish(self, context, result: dict[str, Any]) -> Any:
        """A final state (or a dry run's one look): the task's XCom value, or :func:`~nexus_airflow.base.stop`."""
        raise NotImplementedError

    def end_task(self, context) -> dict[str, Any] | None:
        """How the trigger may end the task itself (see :mod:`nexus_airflow.triggers`): the passing state, the
        XComs from its result, the step's metric tags; None: every event resumes the task on a worker."""
        return None

    # -- Airflow's sensor API ------------------------------------------------

    def execute(self, context) -> Any:
        if len(self.steps) > 1:
            self.log.info("::group::%s", self.step)
        self._start(context)
        try:
            if self.deferrable:
                return self._poke_then_defer(context)
            try:
                return super().execute(context)
            except AirflowSensorTimeout:
                return self._timed_out(context)
        finally:
            self._close()

    def poke(self, context) -> bool | PokeReturnValue:
        """One poll: not done while the poller says ``waiting``; a final state is :meth:`finish`'s."""
        result = self._poll(context)
        fault_point(f"{self.step}.poll")
        if result.get("state") == WAITING and not self.poll_only_once(context):
            self._wake = self.while_waiting(context)
            return False
        return PokeReturnValue(is_done=True, xcom_value=self.finish(context, result))

    def execute_complete(self, context, event: dict[str, Any]) -> Any:
        if not isinstance(event, dict):  # a runner resumed a task its trigger ended (dag.test): look again here
            self.log.info("%s: the wait's trigger ended it (%s); looking once more on the worker", self.task_id, event)
            self.metric_sent = True  # by the trigger, which ended the step
            return self._poke_then_defer(context)
        if event.get("state") == WAKE:  # the run's fenced-tenant alert is due: look (and alert), then wait again
            self.timeout, self.poke_interval = float(self.wait_seconds(context)), float(self.interval(context))
            self._deadline = dt.datetime.fromisoformat(event["deadline"]) if event.get("deadline") else None
            try:
                return self._poke_then_defer(context)
            finally:
                self._close()
        if event.get("state") == "error":
            stop(context, self.log, f"{self.step}: polling the tenant database failed: {event.get('message')}",
                 step=self.step)
        if event.get("state") == VERSION_CHANGED:  # the triggerer runs another release than the run (its check)
            stop_on_another_version(context, self, [(f"{self.step} when it deferred", event.get("started_on"))],
                                    where="the triggerer that ran its wait", running=str(event.get("running")))
        return self.finish(context, event)

    def resume_execution(self, next_method: str, next_kwargs: dict[str, Any] | None, context) -> Any:
        try:
            return super().resume_execution(next_method, next_kwargs, context)
        except AirflowSensorTimeout:  # the deferral's timeout: the trigger did not report in time
            return self._timed_out(context)

    # -- machinery -----------------------------------------------------------

    def _start(self, context) -> None:
        """The sensor's timeout and interval from the run's params, and the deadline from the wait's start."""
        self.timeout = float(self.wait_seconds(context))
        self.poke_interval = float(self.interval(context))
        first = context["ti"].get_first_reschedule_date(context) if self.reschedule and not self.deferrable else None
        started = _naive_utc(first) if first is not None else _utcnow()
        self._deadline = started + dt.timedelta(seconds=self.timeout)

    def _kwargs(self, context) -> dict[str, Any]:
        return self.poller_kwargs(context, (self._deadline or _utcnow()).isoformat())

    def _poll(self, context) -> dict[str, Any]:
        if self._poller is None:  # one poller per try: the drain's trend and rate span its polls
            self._poller = import_poller(self.poller_path)(**self._kwargs(context))
        self._last = self._poller.poll()
        self.log.info("%s", self._last.get("message", ""))
        return self._last

    def _close(self) -> None:
        poller, self._poller = self._poller, None
        if poller is not None:
            poller.close()

    def _poke_then_defer(self, context) -> Any:
        done = self.poke(context)
        if done:
            return done.xcom_value
        kwargs = self._kwargs(context)
        if "remaining" in self._last:
            kwargs["initial_remaining"] = self._last["remaining"]
        self._close()
        end = self.end_task(context) if waits_end_in_triggerer() else None
        from nexus_cutover.code_version import RUNNING

        self.defer(  # the trigger checks that the triggerer runs this (the run's, checked) product version
            trigger=StatusPollTrigger(self.poller_path, kwargs, self.poke_interval, end_task=end, pinned_version=RUNNING,
                                      wake_at=self._wake.isoformat() if self._wake else None),
            method_name="execute_complete",
            # What is left of the wait, plus two polls: the trigger's own verdict past the deadline (with the
            # drain's rate and ETA) comes at most one poll after it; the resumed worker's last look is the backup.
            timeout=max(self._deadline - _utcnow(), dt.timedelta(0)) + dt.timedelta(seconds=2 * self.poke_interval),
        )

    def _timed_out(self, context) -> Any:
        """Airflow's timeout fired before the poller's verdict: one more look past the deadline, then finish.

        A look that fails (the database still down at the deadline) stops as the trigger's error event does."""
        self.log.warning("%s: its timeout (%s s) ran out; looking once more for the report", self.step,
                         self.wait_seconds(context))
        self._close()
        self._deadline = min(self._deadline or _utcnow(), _utcnow())
        try:
            result = self._poll(context)
        except Exception as exc:  # noqa: BLE001 - reported as a stop, like the trigger's error event
            first_line = str(exc).splitlines()[0][:300] if str(exc) else ""
            stop(context, self.log, f"{self.step}: {self.timeout_param} ran out and polling the tenant database "
                 f"failed: {type(exc).__name__}: {first_line}", step=self.step)
        finally:
            self._close()
        if result.get("state") == WAITING:
            result = {**result, "state": TIMED_OUT}
        return self.finish(context, result)


def _base_kwargs(context, deadline: str) -> dict[str, Any]:
    p = params_of(context)
    return {"conn_id": p.conn_id, "namespace": p.tenant, "deadline": deadline, "stale_heartbeat_s": p.stale_heartbeat}


@dataclass(frozen=True)
class TenantWait:
    """What one waiting step of the cutover waits with, read from its declaration (:func:`wait_of`): its poller,
    its passing state, its stop (its bound is the step's declared :attr:`~nexus_cutover.transition.Step.bound`)."""

    poller_path: str
    done_state: str
    stop_message: str
    plan: str  # the dry run's PLAN line (one look, no wait)
    text_key: str | None = None  # XCom key for the poller's human report, when it has one
    #: More of the poller's kwargs, from the run's params: (kwarg, RunParams field) pairs.
    more: tuple[tuple[str, str], ...] = ()


#: The cutover's pollers by the kind of look a declared wait names (:attr:`~nexus_cutover.transition.Wait.poller`).
POLLERS = {
    "pre_arm": "nexus_airflow.pollers.PreArmPoller",
    "drain": "nexus_airflow.pollers.DrainPoller",
    "old_writers": "nexus_airflow.pollers.OldWritersPoller",
    "readiness": "nexus_airflow.pollers.ReadinessPoller",
}


def wait_of(step: str) -> TenantWait:
    """How the cutover's waiting step ``step`` is waited on: its declared wait (its texts, the kind of look) and that
    kind's poller (its passing state, its human report's key, the params it takes). KeyError: ``step`` declares no
    wait, or one of a kind no poller serves."""
    from nexus_cutover.projection.transition import CUTOVER

    wait = CUTOVER[step].wait
    if wait is None:
        raise KeyError(f"{step}: no wait declared")
    watch = wait.watch_class()
    return TenantWait(POLLERS[wait.poller], watch.done, wait.ran_out, wait.plan, watch.text_key, watch.params)


class TenantWaitSensor(StatusPollSensor):
    """The waiting step of the cutover its task id names (a step with a declared wait: wait_for_short_drain,
    wait_for_drain, check_old_writers), or that leads the fused task's ``steps`` (verify_readiness, then
    resume_admission: :data:`nexus_airflow.declared.FUSED`).

    Passes on the wait's ``done_state``; a dry run looks once and logs the PLAN
    when the real run would wait; any other final state stops the run with the
    poller's report (on a dry run too: the real run would stop there). Once it
    passes, a fused task runs its later steps' bodies here, each its own record
    (:func:`nexus_airflow.operators.run_fused`), and its value is the last one's.
    """

    def __init__(self, *, steps: tuple[str, ...] = (), **kwargs) -> None:
        from nexus_cutover.projection.transition import CUTOVER

        super().__init__(**kwargs)
        self.steps = tuple(steps) or (self.task_id,)
        self.step = self.steps[0]
        if len(self.steps) > 1:  # a fused task: its metrics and stops are its steps' (nexus_airflow.base)
            self.current_step = self.step
        self.poller_path = POLLERS[CUTOVER[self.step].wait.poller]
        self.timeout_param = CUTOVER[self.step].bound

    @property
    def spec(self) -> TenantWait:
        return wait_of(self.step)

    def wait_seconds(self, context) -> float:
        return float(getattr(params_of(context), self.timeout_param))

    def poller_kwargs(self, context, deadline: str) -> dict[str, Any]:
        p = params_of(context)
        return {**_base_kwargs(context, deadline), "step": self.step,
                **{kwarg: getattr(p, name) for kwarg, name in self.spec.more}}

    def poll_only_once(self, context) -> bool:
        return params_of(context).dry_run

    def while_waiting(self, context) -> dt.datetime | None:
        """The run's fenced-tenant alert, at this look (:func:`nexus_airflow.fence_watch.look`)."""
        from nexus_airflow.fence_watch import look

        return look(context, self.step, self.log)

    def end_task(self, context) -> dict[str, Any] | None:
        """Passing, the wait ends in its trigger with what :meth:`finish` would push: the report as the task's
        value, the human report under its key, the step's duration metric (never on a dry run: it looks once;
        never for a fused task: its later steps run on a worker)."""
        p, spec = params_of(context), self.spec
        if p.dry_run or len(self.steps) > 1:
            return None
        started = getattr(context.get("ti"), "start_date", None)
        return {"state": spec.done_state, "tenant": p.tenant, "step": self.step,
                "started_at": started.astimezone(dt.UTC).isoformat() if started else None,
                "xcoms": {"return_value": "report", **({spec.text_key: "report_text"} if spec.text_key else {})}}

    def finish(self, context, result: dict[str, Any]) -> Any:
        report = self._finish_wait(context, result)
        if len(self.steps) == 1:
            return report
        from nexus_airflow.operators import run_fused

        return run_fused(self, context, self.steps, report)

    def _finish_wait(self, context, result: dict[str, Any]) -> Any:
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
        stop(context, self.log, self.stop_message(report), report, step=self.step)

    def stop_message(self, report: dict[str, Any]) -> str:
        """The wait's stop with its cause: the declared step's verdict on the report (the stuck drain's causes with
        their counts, the live old writers by id, the host's reasons)."""
        from nexus_cutover.projection.transition import CUTOVER

        step = CUTOVER.get(self.step)
        try:
            cause = step.verdict(report).reason if step is not None and report else None
        except (KeyError, TypeError, ValueError):  # a report without the verdict's fields: the message alone
            cause = None
        return f"{self.spec.stop_message}. Now: {cause}" if cause else self.spec.stop_message

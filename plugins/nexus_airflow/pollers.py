"""Pollers for :class:`~nexus_airflow.triggers.StatusPollTrigger`: drain, old writers, new-host readiness.

Each poller is the look of one kind (a declared :class:`~nexus_cutover.transition.Wait`'s
``poller``: :attr:`_EnginePoller.kind`) at the waiting step it is given (``step``, the sensor's; without one
the cutover's step declared with a wait of its kind). It opens an engine from an Airflow connection id (never a
DSN), runs that step's body once per ``poll()`` (:mod:`nexus_cutover.projection.steps`,
the look ``nexus-cutover run`` and ``plan`` take too) and returns a
JSON-serializable dict: ``state`` (``waiting`` or a final state, from the body's
verdict: :func:`wait_state`), ``verdict`` (that verdict), ``message`` (one
progress line) and ``report`` (the body's value). Deadlines are ISO-8601 naive
UTC strings, so a trigger restarted on another triggerer keeps the same bound.
Read only: nothing here writes to the tenant database.
"""

from __future__ import annotations

import datetime as dt
import math
import time
from collections import deque
from typing import Any

from nexus_airflow.triggers import WAITING


def _utcnow() -> dt.datetime:
    from nexus_cutover.clock import utcnow  # the one clock; imported at run time (DAG files import this module)

    return utcnow()


def _parse(deadline: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(deadline)
    return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value




def measured_rate(samples: list[tuple[float, int]]) -> float | None:
    """:func:`nexus_cutover.polling.measured_rate`, the one rate of a wait (imported when called: the Field History
    DAG's file loads this module at parse time, which loads no domain module but the declarations)."""
    from nexus_cutover.polling import measured_rate as rate

    return rate(samples)


def eta_minutes(remaining: int | None, rate: float | None) -> int | None:
    """Whole minutes until ``remaining`` reaches 0 at ``rate`` items/min (0 when drained; None if not draining)."""
    if remaining is not None and remaining <= 0:
        return 0
    if remaining is None or rate is None or rate <= 0:
        return None
    return math.ceil(remaining / rate)


def eta_text(remaining: int | None, rate: float | None) -> str:
    """The ETA as the log line and the page say it: ``"12.0 items/min, ETA ~3 min"``, or why there is none."""
    eta = eta_minutes(remaining, rate)
    if eta == 0:
        return "drained"
    if rate is None:
        return "ETA unknown (one sample so far)"
    if eta is None:
        return f"ETA unknown (no progress measured: {rate:+.1f} items/min)"
    return f"{rate:.1f} items/min, ETA ~{eta} min"


def wait_state(verdict, done: str, *, expired: bool = False) -> str:
    """The poll's ``state`` from the waiting step's verdict (its body's, on this look): ``done`` when it
    proceeds, ``stuck`` when it stops, ``timed_out`` past the deadline, else waiting."""
    if verdict.proceeds:
        return done
    if verdict.outcome == "stop":
        return "stuck"
    return "timed_out" if expired else WAITING


def verdict_json(verdict) -> dict[str, Any]:
    """A poll's verdict as the trigger's event carries it."""
    return {"outcome": str(verdict.outcome), "reason": verdict.reason, "timed_out": verdict.timed_out}


def deadline_in(seconds: float) -> str:
    return (_utcnow() + dt.timedelta(seconds=seconds)).isoformat()


def declared_wait(kind: str) -> str:
    """The cutover's waiting step whose declared wait is polled by the poller of ``kind``."""
    from nexus_cutover.projection.transition import CUTOVER

    return next(step.name for step in CUTOVER.waits if step.wait.poller == kind)


class _EnginePoller:
    #: The kind of look (the declared :attr:`~nexus_cutover.transition.Wait.poller` this poller serves).
    kind = ""
    #: The ``state`` a passing look reports.
    done = ""
    #: The XCom key the sensor pushes the poll's human report (``report_text``) under; None: it pushes none.
    text_key: str | None = None
    #: More of the poller's kwargs, from the run's params: (kwarg, RunParams field) pairs.
    params: tuple[tuple[str, str], ...] = ()

    def __init__(self, conn_id: str, namespace: str, deadline: str, stale_heartbeat_s: float, *,
                 step: str | None = None):
        from nexus_airflow.hooks import NexusTenantHook

        #: The waiting step this poller looks at (its body runs at each poll).
        self.step = step or declared_wait(self.kind)
        self.namespace = namespace
        self.deadline = _parse(deadline)
        self.stale = dt.timedelta(seconds=float(stale_heartbeat_s))
        # no idle connection between polls: a triggerer may hold thousands of waiting tenants
        self.engine = NexusTenantHook(conn_id).get_engine(pooled=False)

    def close(self) -> None:
        self.engine.dispose()

    def look(self, **more: Any):
        """One run of the waiting step's body (read only): its :class:`~nexus_cutover.transition.StepResult`."""
        from nexus_cutover.projection import steps

        run = steps.CutoverRun(self.engine, self.namespace, "(a wait's poll)", deadline=self.deadline,
                               stale_heartbeat_s=self.stale.total_seconds(), **more)
        return steps.run_step(self.step, run)

    def expired(self) -> bool:
        return _utcnow() >= self.deadline


#: The drain rate is measured over the last this many polls (a moving window: an old burst does not skew the ETA).
RATE_SAMPLES = 20


class DrainPoller(_EnginePoller):
    """Old projection work of the namespace: ``drained``, ``stuck`` (with blockers) or ``waiting``.

    Each poll's message ends with the measured drain rate and ETA (:func:`eta_text`) over the last
    ``RATE_SAMPLES`` polls of this poller (a restarted trigger measures again from its first poll)."""

    kind, done, text_key = "drain", "drained", "report_text"

    def __init__(self, conn_id: str, namespace: str, deadline: str, stale_heartbeat_s: float,
                 initial_remaining: int | None = None, sample_limit: int = 200, *, step: str | None = None):
        super().__init__(conn_id, namespace, deadline, stale_heartbeat_s, step=step)
        self.initial = initial_remaining
        self.previous: int | None = initial_remaining
        self.sample_limit = sample_limit
        self.range_column: bool | None = None  # probed once: the column never disappears
        self.samples: deque[tuple[float, int]] = deque(maxlen=RATE_SAMPLES)  # (monotonic s, remaining)

    def poll(self) -> dict[str, Any]:
        from nexus_cutover import catalog
        from nexus_cutover.schema import has_column

        if not self.range_column:
            self.range_column = has_column(self.engine, catalog.INPUT_START_ORDINAL)
        looked = self.look(drain_sample_limit=self.sample_limit, range_column=self.range_column)
        report = looked.domain
        remaining = report.remaining
        trend = []
        if self.previous is not None:
            trend.append(f"{remaining - self.previous:+d} since last poll")
        if self.initial is not None:
            trend.append(f"{remaining - self.initial:+d} since start")
        if self.initial is None:
            self.initial = remaining
        self.previous = remaining
        as_json = looked.value
        state = wait_state(looked.verdict, self.done)
        message = report.counts_text() + (f"; {', '.join(trend)}" if trend else "")
        if report.live_old_workers:
            message += f"; live old projection_workers: {len(report.live_old_workers)}"
        self.samples.append((time.monotonic(), remaining))
        rate = measured_rate(list(self.samples))
        message += f"; {eta_text(remaining, rate)}"
        drain_metrics(self.namespace, remaining, rate)
        return {"state": state, "verdict": verdict_json(looked.verdict), "message": message, "remaining": remaining,
                "rate_per_min": rate,
                "eta_min": eta_minutes(remaining, rate), "progress": progress(report),
                "report": as_json, "report_text": report.report_text()}


def progress(report) -> list:
    """What a drain's progress is, for the trigger's log: old projection work by status and its live workers
    (ordinary work, which moves with the tenant's traffic, is not progress of the drain)."""
    from nexus_cutover import catalog

    return [report.counts.get(s, 0) for s in catalog.WORK_LIVE_STATUSES] + [len(report.live_old_workers)]


def drain_metrics(tenant: str, remaining: int, rate: float | None) -> None:
    """One look of the drain as figures (:func:`nexus_cutover.metrics.figures_of` of its ``drain_looked`` event:
    ``nexus.drain.remaining``, ``nexus.drain.rate`` once measured, ``nexus.drain.eta`` while it shrinks), per poll."""
    from nexus_airflow.metrics import emit
    from nexus_cutover.events import drain_looked
    from nexus_cutover.polling import eta_seconds
    from nexus_cutover.recording import MetricsSink, Origin, Recorder

    Recorder(Origin(tenant, "", ""), [MetricsSink(emit)]).emit(
        [drain_looked(remaining, rate, eta_seconds(remaining, rate))])


class PreArmPoller(_EnginePoller):
    """The old backlog before the fence is armed: ``short`` (arm now), ``stuck`` (it cannot drain), ``timed_out``
    at the deadline, else waiting. One run of the step for the poller's life: its drain rate spans its polls."""

    kind, done, text_key = "pre_arm", "short", "report_text"
    params = (("arm_when_drain_below_s", "arm_when_drain_below"), ("drain_timeout_s", "drain_timeout"))

    def __init__(self, conn_id: str, namespace: str, deadline: str, stale_heartbeat_s: float,
                 arm_when_drain_below_s: float = 0.0, drain_timeout_s: float = 3600.0, *, step: str | None = None):
        from nexus_cutover.projection import steps

        super().__init__(conn_id, namespace, deadline, stale_heartbeat_s, step=step)
        self.run = steps.CutoverRun(self.engine, namespace, "(a wait's poll)", stale_heartbeat_s=float(stale_heartbeat_s),
                                    arm_when_drain_below_s=float(arm_when_drain_below_s),
                                    drain_timeout_s=float(drain_timeout_s))

    def poll(self) -> dict[str, Any]:
        from nexus_cutover.projection import steps

        looked = steps.run_step(self.step, self.run)
        state = wait_state(looked.verdict, self.done, expired=self.expired())
        message = (f"arming: {looked.domain.counts_text()}" if state == self.done else looked.verdict.reason)
        return {"state": state, "verdict": verdict_json(looked.verdict), "message": message, "report": looked.value,
                "report_text": looked.domain.report_text(), "progress": [looked.value["remaining"]]}


class OldWritersPoller(_EnginePoller):
    """Old-protocol writers: ``stopped`` when all are stopped or silent, ``timed_out`` at the deadline."""

    kind, done, text_key = "old_writers", "stopped", "evidence_md"

    def poll(self) -> dict[str, Any]:
        looked = self.look()
        ev = looked.domain
        live = [p["process_id"] for p in ev.live]
        state = wait_state(looked.verdict, self.done, expired=self.expired())
        if state == self.done:
            message = f"every old-protocol writer of {self.namespace!r} is stopped or silent"
        else:
            message = f"{len(live)} old-protocol writer(s) still live: {', '.join(live[:20])}; stop them (keep the fence)"
        return {"state": state, "verdict": verdict_json(looked.verdict), "message": message, "report": looked.value,
                "report_text": looked.keyed[self.text_key]}


class ReadinessPoller(_EnginePoller):
    """New host readiness: ``ready``, ``timed_out`` at the deadline, else ``waiting``."""

    kind, done = "readiness", "ready"

    def poll(self) -> dict[str, Any]:
        looked = self.look()
        r = looked.domain
        state = wait_state(looked.verdict, self.done, expired=self.expired())
        if state == self.done:
            message = f"ready: activated integration_host(s) {', '.join(h['process_id'] for h in r.ready_hosts)}"
        else:
            message = "not ready: " + "; ".join(r.reasons)
        return {"state": state, "verdict": verdict_json(looked.verdict), "message": message, "report": looked.value,
                "report_text": message}


class WaveAnswerPoller:
    """``per_wave``: a tenant's confirmation waiting, in the triggerer, for its wave's question to be answered
    (:func:`nexus_airflow.rollout.wave_wait_state`), reading the rollout run's XComs and state through the Task
    SDK as a task would; a final state resumes the confirmation on a worker, which decides there (the answer's
    checks and the re-read of the registry are the task's, never the trigger's). ``deadline``: how long a failing
    read is retried."""

    def __init__(self, rollout_run_id: str, wave: int, tenant: str, deadline: str):
        self.rollout_run_id, self.wave, self.tenant = rollout_run_id, int(wave), tenant
        self.deadline = _parse(deadline)

    def poll(self) -> dict[str, Any]:
        from nexus_airflow import rollout as ro
        from nexus_airflow.compat import dag_run_state, xcom_of_run

        def xcom(key: str) -> Any:
            return xcom_of_run(key=key, dag_id=ro.ROLLOUT_DAG, task_id=ro.wave_task(self.wave, ro.CONFIRM_TASK),
                               run_id=self.rollout_run_id, map_index=-1)

        answer = xcom(ro.ANSWER_KEY)
        state = ro.wave_wait_state(answer, xcom(ro.SHOWN_KEY) if not answer else None,
                                   dag_run_state(ro.ROLLOUT_DAG, self.rollout_run_id) if not answer
                                   else "running", self.tenant)
        return {"state": WAITING if state == "waiting" else state,
                "message": f"wave {self.wave} of rollout {self.rollout_run_id}: {state.replace('_', ' ')}"}

    def expired(self) -> bool:
        return _utcnow() >= self.deadline

    def close(self) -> None:
        return None

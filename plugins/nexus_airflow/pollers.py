"""Pollers for :class:`~nexus_airflow.triggers.StatusPollTrigger`: the declared watch of a waiting step, from an
Airflow connection id.

What one look *is* lives with the step (its :class:`~nexus_cutover.watch.Watch`, named by its declared
:attr:`~nexus_cutover.transition.Wait.watch`): the command line's wait polls the same watch. A poller here only adds
what is Airflow's: the tenant's engine from a connection id (never a DSN: a trigger's kwargs are stored in Airflow's
database), no idle connection between looks (a triggerer may hold thousands of waiting tenants), and Airflow's
metrics client as the sink of the figures a look records. One class per kind of look (``DrainPoller``, ...) keeps the
import path a trigger serialized in an earlier release: a deploy while a run waits resumes it.
Read only: nothing here writes to the tenant database.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from nexus_airflow.triggers import WAITING

__all__ = ["WAITING", "StepPoller", "DrainPoller", "PreArmPoller", "OldWritersPoller", "ReadinessPoller",
           "WaveAnswerPoller", "deadline_in", "eta_minutes", "eta_text", "measured_rate"]


def _utcnow() -> dt.datetime:
    from nexus_cutover.clock import utcnow  # the one clock; imported at run time (DAG files import this module)

    return utcnow()


def _parse(deadline: str) -> dt.datetime:
    from nexus_cutover.watch import naive_utc

    return naive_utc(deadline)


def measured_rate(samples: list[tuple[float, int]]) -> float | None:
    """:func:`nexus_cutover.polling.measured_rate` (imported when called: DAG files load this module at parse time)."""
    from nexus_cutover.polling import measured_rate as rate

    return rate(samples)


def eta_minutes(remaining: int | None, rate: float | None) -> int | None:
    """:func:`nexus_cutover.watch.eta_minutes`."""
    from nexus_cutover.watch import eta_minutes as eta

    return eta(remaining, rate)


def eta_text(remaining: int | None, rate: float | None) -> str:
    """:func:`nexus_cutover.watch.eta_text`."""
    from nexus_cutover.watch import eta_text as text

    return text(remaining, rate)


def deadline_in(seconds: float) -> str:
    return (_utcnow() + dt.timedelta(seconds=seconds)).isoformat()


def _metrics(tenant: str):
    """The sink of a look's figures: Airflow's metrics client, tagged with the tenant."""
    from nexus_airflow.metrics import emit
    from nexus_cutover.recording import MetricsSink, Origin, Recorder

    return Recorder(Origin(tenant, "", ""), [MetricsSink(emit)]).emit


class StepPoller:
    """The declared watch of the waiting step ``step`` (of the transition its name is declared in), over the tenant
    database of the Airflow connection ``conn_id``; ``more``: the watch's own keyword arguments."""

    #: The kind of look of a trigger serialized without ``step`` (an earlier release's): its declared waiting step.
    kind = ""

    @staticmethod
    def transition():
        """The declaration the waiting step is read from."""
        from nexus_cutover.projection.transition import CUTOVER

        return CUTOVER

    def __init__(self, conn_id: str, namespace: str, deadline: str, stale_heartbeat_s: float, *,
                 step: str | None = None, **more: Any):
        from nexus_airflow.hooks import NexusTenantHook

        declared = self.transition()
        step = step or next(s.name for s in declared.waits if s.wait.poller == self.kind)
        # no idle connection between polls: a triggerer may hold thousands of waiting tenants
        engine = NexusTenantHook(conn_id).get_engine(pooled=False)
        self.watch = declared[step].wait.watch_class()(engine, namespace, step, deadline,
                                                       stale_heartbeat_s=float(stale_heartbeat_s),
                                                       record=_metrics(namespace), **more)
        self.step, self.engine = step, engine

    @property
    def samples(self):
        return self.watch.samples

    def poll(self) -> dict[str, Any]:
        return self.watch.poll()

    def expired(self) -> bool:
        return self.watch.expired()

    def close(self) -> None:
        self.engine.dispose()


class PreArmPoller(StepPoller):
    kind = "pre_arm"


class DrainPoller(StepPoller):
    kind = "drain"


class OldWritersPoller(StepPoller):
    kind = "old_writers"


class ReadinessPoller(StepPoller):
    kind = "readiness"


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

"""A wave's lanes (``tenant_rollout``'s ``open`` and ``cutover`` tasks): at most ``max_parallel`` tenants at once.

Invariants: a wave starts only after the previous wave's ``close`` passed; the
wave runs in ``max_parallel`` lanes, each starting its tenants one after another
(deferred while one runs), so the bound holds by construction and nothing polls
for a slot. Pause holds tenants not yet started (no slot held); cancel starts no
further tenant. A tenant's run is started by the Task SDK's trigger request
(:meth:`WaveLaneOperator._trigger`, the one place that builds it).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.sdk import BaseOperator

from nexus_airflow import rollout as ro


def open_wave(wave: int, run_id: str, params: dict[str, Any], ti, log) -> list[dict[str, Any]]:
    """The wave's lanes (``max_parallel`` of them at most, tenant ``i`` in lane ``i % lanes``); skipped past the
    last wave, held while paused, failed when cancelled."""
    from airflow.sdk.exceptions import AirflowSkipException

    plan = ro.plan_of(ti) or {}
    waves = plan.get("waves") or []
    if wave >= len(waves):
        raise AirflowSkipException(f"the rollout has {len(waves)} wave(s)")
    control = ro.read_control(run_id)
    if control == "pause":
        log.info("rollout paused (Variable %s): wave %d waits to start", ro.control_variable(run_id), wave)
        raise ro.later(ro.wait_s(params))
    if control == "cancel":
        raise ro.fail(f"rollout cancelled before wave {wave} started: its tenants were not started")
    tenants = waves[wave]["tenants"]
    lanes = max(1, min(int(plan.get("max_parallel") or 1), len(tenants)))
    log.info("wave %d (%s): %d tenant(s) in %d lane(s): %s", wave, waves[wave]["name"], len(tenants), lanes,
             ", ".join(tenants))
    return [{"lane": j, "triggers": [plan["triggers"][t] for t in tenants[j::lanes]]} for j in range(lanes)]


def wave_triggers(ti, wave: int) -> list[dict[str, Any]] | None:
    """Every tenant trigger of the wave's lanes, in the wave's order (None: the wave did not open)."""
    lanes = ro.wave_lanes(ti, wave)
    if lanes is None:
        return None
    by_lane = [lane["triggers"] for lane in lanes]
    rounds = max((len(x) for x in by_lane), default=0)
    return [x[i] for i in range(rounds) for x in by_lane if i < len(x)]  # tenant k*lanes+j is lane j's k-th


class WaveLaneOperator(BaseOperator):
    """One lane of a wave: its tenants' cutover runs one after another, each triggered and then waited for
    deferred (no worker slot held while a tenant runs). ``max_parallel`` lanes bound the wave's parallelism by
    construction: nothing waits for a slot.

    Idempotent: a tenant whose run already ended is not started again (a cleared lane resumes where it was);
    one still running is waited for. Pause holds the lane before its next tenant (deferred); cancel starts no
    further tenant. The lane fails at its end if any of its tenants did not succeed (``close`` reports why).
    """

    def __init__(self, *, lane: int, triggers: list[dict[str, Any]], **kwargs) -> None:
        super().__init__(**kwargs)
        self.lane = lane
        self.triggers = triggers

    def execute(self, context):
        return self._advance(context, 0)

    def execute_complete(self, context, event: Any = None, resume_at: int | None = None):
        if resume_at is not None:  # back from a pause
            return self._advance(context, resume_at)
        _, data = event  # DagStateTrigger: (classpath, {"run_ids": [the tenant's run], ...})
        ids = [t["trigger_run_id"] for t in self.triggers]
        done = ids.index(data["run_ids"][0])
        self.log.info("lane %d: %s ended", self.lane, self.triggers[done]["conf"]["tenant"])
        return self._advance(context, done + 1)

    def _trigger(self, trig: dict[str, Any], *, reset: bool, every_s: int):
        """Start one tenant's run and defer this task until it ends (back in :meth:`execute_complete`).

        The Task SDK's :class:`~airflow.sdk.exceptions.DagRunTriggerException` is the request the task runner
        serves for ``TriggerDagRunOperator`` itself; a lane starts its tenants one after another from one task,
        which that operator cannot do, and running it nested inside this one is deprecated (Airflow logs "cannot
        be called outside of the Task Runner" and will refuse it). Every argument is named here, once."""
        from airflow.sdk.exceptions import DagRunTriggerException

        return DagRunTriggerException(
            trigger_dag_id=ro.CUTOVER_DAG, dag_run_id=trig["trigger_run_id"], conf=trig["conf"], logical_date=None,
            reset_dag_run=reset, skip_when_already_exists=False, wait_for_completion=True, allowed_states=["success"],
            failed_states=["failed"], poke_interval=every_s, deferrable=True)

    def _advance(self, context, i: int):
        from airflow.providers.standard.triggers.external_task import DagStateTrigger
        from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger

        ti, run_id = context["ti"], context["run_id"]
        every_s = ro.wait_s(context["params"])  # a tenant's end is seen within the rollout's poll_interval
        for index in range(i, len(self.triggers)):
            trig = self.triggers[index]
            rid, tenant = trig["trigger_run_id"], trig["conf"]["tenant"]
            state = ro.state_word(ti.get_dagrun_state(dag_id=ro.CUTOVER_DAG, run_id=rid)) \
                if ti.get_dr_count(dag_id=ro.CUTOVER_DAG, run_ids=[rid]) else None
            if state == "success" or (state == "failed" and not trig.get("reset_dag_run")):
                continue  # this lane already ran it (a cleared lane resuming)
            if state in ("queued", "running"):
                self.defer(trigger=DagStateTrigger(dag_id=ro.CUTOVER_DAG, states=["success", "failed"],
                                                   execution_dates=None, run_ids=[rid],
                                                   poll_interval=every_s), method_name="execute_complete")
            control = ro.read_control(run_id)
            if control == "cancel":
                self.log.info("rollout cancelled: lane %d starts none of %s", self.lane,
                              ", ".join(t["conf"]["tenant"] for t in self.triggers[index:]))
                break
            if control == "pause":
                self.log.info("rollout paused: lane %d holds %s", self.lane, tenant)
                self.defer(trigger=TimeDeltaTrigger(dt.timedelta(seconds=ro.wait_s(context["params"]))),
                           method_name="execute_complete", kwargs={"resume_at": index})
            self.log.info("lane %d: starting %s (run %s)", self.lane, tenant, rid)
            raise self._trigger(trig, reset=bool(trig.get("reset_dag_run")) and state is not None, every_s=every_s)
        by_run = ro.cutover_run_states(ti, [t["trigger_run_id"] for t in self.triggers])
        states = {t["conf"]["tenant"]: by_run[t["trigger_run_id"]] for t in self.triggers}
        bad = {t: s for t, s in states.items() if s != "success"}
        if bad:
            raise ro.fail(f"lane {self.lane}: {len(bad)} tenant(s) did not succeed: "
                        + ", ".join(f"{t} ({s})" for t, s in bad.items()))
        return states

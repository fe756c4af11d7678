"""The code pin in the Airflow adapters (issue 37, item 4): the DAGs keep a rerun on its bundle version, every step
passes the pin in ``pre_execute`` (``step_started``), and a deferred wait's trigger checks the triggerer's version before it polls.

The whole thing, two builds of the wheel and a run parked at the confirmation across an upgrade, is
tests/pinning/test_upgrade_under_a_run.py; the rule itself is tests/projection/test_code_version.py.
"""

from __future__ import annotations

import asyncio
import threading

import pytest

from nexus_cutover.code_version import RUNNING
from tests.dags.airflow_harness import load_dag, run_dag

OTHER = "0.0.1+another.build"
FH_DAG = "field_history_eligibility"


class CountingPoller:
    """A poller that says ``done`` at once and counts how often it was made (a trigger that makes it has opened what
    a real poller opens: the tenant database)."""

    made = 0

    def __init__(self, **_kwargs):
        CountingPoller.made += 1

    def poll(self):
        return {"state": "done", "message": "done"}

    def close(self):
        pass


def _first_event(trigger):
    async def first():
        async for event in trigger.run():
            return event

    return asyncio.run(first())


@pytest.mark.parametrize("dag_id", ["connector_projection_cutover", "field_history_eligibility"])
def test_the_per_tenant_dags_rerun_a_task_on_its_runs_bundle_version(airflow_db, dag_id):
    """(Every task's ``pre_execute`` is ``step_started``, which pins: tests/dags/test_notifications.py.)"""
    assert load_dag(dag_id).rerun_with_latest_version is False


def test_a_wait_whose_triggerer_loaded_another_version_never_makes_its_poller():
    from nexus_airflow.triggers import VERSION_CHANGED, StatusPollTrigger

    CountingPoller.made = 0
    trigger = StatusPollTrigger(f"{__name__}.CountingPoller", {}, 1.0, pinned_version=OTHER)
    event = _first_event(trigger).payload
    assert (event["state"], event["started_on"], event["running"]) == (VERSION_CHANGED, OTHER, RUNNING)
    assert f"nexus-cutover {OTHER}" in event["message"] and f"the triggerer runs nexus-cutover {RUNNING}" in event["message"]
    assert CountingPoller.made == 0


def test_a_wait_on_its_own_version_polls_and_the_pin_survives_serialization():
    from nexus_airflow.triggers import StatusPollTrigger

    CountingPoller.made = 0
    trigger = StatusPollTrigger(f"{__name__}.CountingPoller", {}, 1.0, pinned_version=RUNNING)
    path, kwargs = trigger.serialize()
    assert kwargs["pinned_version"] == RUNNING
    assert _first_event(StatusPollTrigger(**kwargs)).payload["state"] == "done"
    assert CountingPoller.made == 1
    unpinned = StatusPollTrigger(f"{__name__}.CountingPoller", {}, 1.0)  # deferred by a release before the pin
    assert "pinned_version" not in unpinned.serialize()[1] and _first_event(unpinned).payload["state"] == "done"


def test_a_wait_resumed_with_the_triggerers_version_change_stops_naming_both(dag):
    """The worker that resumes the wait may run the run's version while the triggerer ran another: the event
    stops it all the same, before :meth:`finish` reads anything."""
    from nexus_airflow.base import TaskStopped
    from nexus_airflow.triggers import VERSION_CHANGED

    sensor = dag.task_dict["wait_for_drain"]
    event = {"state": VERSION_CHANGED, "started_on": RUNNING, "running": OTHER, "message": "..."}
    with pytest.raises(TaskStopped) as stopped:
        sensor.execute_complete({"params": {"tenant": "acme"}}, event)
    text = str(stopped.value)
    assert f"ran on nexus-cutover {RUNNING} (recorded by wait_for_drain when it deferred)" in text
    assert f"the triggerer that ran its wait runs nexus-cutover {OTHER}" in text
    assert "it adopts the fence this failed run left" in text


class OlderRunOnTheDrain(threading.Thread):
    """Once the Field History run's ``stage_2_drain_outbox`` passed its pin and waits: its first step's record says
    an older release (the record a run started on that release has), then the reference outbox worker delivers, so
    the wait passes and the step resumes."""

    def __init__(self, engine, older: str):
        super().__init__(daemon=True)
        self.engine, self.older, self.halt, self.rewritten = engine, older, threading.Event(), None
        self.error: BaseException | None = None

    def run(self):
        try:
            self._run()
        except BaseException as exc:  # noqa: BLE001 - the test's assertion names it
            self.error = exc
            raise

    def _run(self):
        from airflow.models.xcom import XComModel
        from airflow.utils.session import create_session
        from sqlalchemy import select

        from nexus_airflow.results import VERSION_KEY
        from nexus_sim import outbox_worker

        while not self.halt.is_set() and self.rewritten is None:
            with create_session() as session:
                # the wait's first try passed its pin (it recorded its version last in pre_execute): it polls now,
                # then defers; under dag.test its trigger runs inline and the step resumes in this process
                passed = session.scalars(select(XComModel).where(
                    XComModel.dag_id == FH_DAG, XComModel.task_id == "stage_2_drain_outbox",
                    XComModel.key == VERSION_KEY)).first()
                if passed is not None:
                    XComModel.set(VERSION_KEY, self.older, dag_id=FH_DAG, task_id="stage_1", run_id=passed.run_id,
                                  serialize=False, session=session)  # as the task SDK pushes it: already serialized
                    self.rewritten = passed.run_id
            self.halt.wait(0.3)
        while not self.halt.is_set():
            outbox_worker.run_once(self.engine)
            self.halt.wait(0.3)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.halt.set()
        self.join(10)


def test_a_field_history_wait_resumed_on_another_release_than_its_run_started_on_stops_before_the_tenant(
        airflow_db, mysql_url, tenant_connection):
    """A Field History run whose first step recorded an older release (as a run started on it has) resumes its
    deferred outbox drain on this release: the resumed step stops in its ``pre_execute``, naming both versions and
    the Field History way on; nothing after it runs, nothing is materialized or switched."""
    from nexus_cutover.db import make_engine
    from nexus_cutover.schema import create_legacy_schema
    from tests.dags.test_field_history_dag import conf, legacy, settings

    engine = make_engine(mysql_url)
    try:
        create_legacy_schema(engine)
        tenant_connection("nexus_tenant_acme", mysql_url)
        legacy(engine, outbox_rows=2)
        before = settings(engine)
        dag = load_dag(FH_DAG)
        with OlderRunOnTheDrain(engine, OTHER) as older:  # its outbox worker stays live however slow the machine
            result = run_dag(dag, conf(target_stage=3, stale_heartbeat=86400, drain_timeout=120))
        assert older.error is None and older.rewritten == result.run_id, older.error
        assert result.state == "failed" and result.state_of("stage_2_drain_outbox") == "failed", result.task_states
        assert result.state_of("stage_2_materialize") == "upstream_failed", result.task_states
        report = result.xcom("stage_2_drain_outbox", "report")
        assert (report["started_on"], report["running"], report["recorded_by"]) == (OTHER, RUNNING, "stage_1"), report
        assert "it re-verifies the stages already passed" in report["message"]
        assert result.xcom("stage_2_drain_outbox") is None  # no drain result: finish() never ran
        assert result.xcom("stage_2_materialize") is None and settings(engine) == before  # nothing decided or switched
    finally:
        engine.dispose()

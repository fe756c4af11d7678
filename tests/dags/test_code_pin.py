"""The code pin in the Airflow adapters (issue 37, item 4): the DAGs keep a rerun on its bundle version, every step
passes the pin in ``pre_execute`` (``step_started``), and a deferred wait's trigger checks the triggerer's version before it polls.

The whole thing, two builds of the wheel and a run parked at the confirmation across an upgrade, is
tests/pinning/test_upgrade_under_a_run.py; the rule itself is tests/projection/test_code_version.py.
"""

from __future__ import annotations

import asyncio

import pytest

from nexus_cutover.code_version import RUNNING
from tests.dags.airflow_harness import load_dag

OTHER = "0.0.1+another.build"


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

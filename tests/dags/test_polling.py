"""The polling trigger and pollers (real tenant DB), and the HITL steps' answer handling."""

from __future__ import annotations

import asyncio
import datetime as dt
import threading

import pytest

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_sim.scenario import TenantScenario, utcnow
from tests.support import make_cutover_ready

NS = "acme"


class BlockingPoller:
    """A poller whose poll() blocks its thread until a coroutine on the event loop releases it."""

    release = threading.Event()
    polls = 0

    def __init__(self, **kwargs):
        self.kwargs = kwargs

    def poll(self):
        assert BlockingPoller.release.wait(timeout=30), "the event loop never ran while poll() was blocked"
        BlockingPoller.polls += 1
        state = "waiting" if BlockingPoller.polls < 2 else "done"
        return {"state": state, "message": f"poll {BlockingPoller.polls}", "kwargs": self.kwargs}

    def close(self):
        pass


class FlakyPoller:
    """Fails its first ``fail`` polls with ``error``, then reports done; ``expired`` after ``expire_after`` polls."""

    def __init__(self, fail: int, error: str, expire_after: int = 100):
        self.fail, self.error, self.expire_after, self.polls = fail, error, expire_after, 0

    def poll(self):
        from sqlalchemy.exc import OperationalError

        from nexus_cutover.errors import BadInput

        self.polls += 1
        if self.polls <= self.fail:
            if self.error == "bad_input":
                raise BadInput("connection nexus_tenant_acme does not exist")
            raise OperationalError("SELECT 1", {}, Exception("(2013, 'Lost connection to server during query')"))
        return {"state": "done", "message": "done", "polls": self.polls}

    def expired(self):
        return self.polls >= self.expire_after

    def close(self):
        pass


class ScriptedPoller:
    """Returns ``script``'s results in order: (state, progress, message) each."""

    def __init__(self, script: list[list]):
        self.script = list(script)

    def poll(self):
        from sqlalchemy.exc import OperationalError

        state, progress, message = self.script.pop(0)
        if state == "error":  # a poll that fails on the database (retried: not expired)
            raise OperationalError("SELECT 1", {}, Exception(message))
        return {"state": state, "message": message, **({"progress": progress} if progress is not None else {})}

    def expired(self):
        return False

    def close(self):
        pass


def _logged_lines(capsys, trigger_class, script) -> list[str]:
    """The lines the trigger logs (Airflow's structured log on stdout) while it runs ``script`` to its end."""
    import re

    async def run():
        return [e async for e in trigger_class(f"{__name__}.ScriptedPoller", {"script": script}, poll_interval=0).run()]

    capsys.readouterr()
    events = asyncio.run(asyncio.wait_for(run(), timeout=60))
    assert [e.payload["state"] for e in events] == ["done"]
    line = re.compile(r"\[info\s*\] (.*?)\s+\[[\w.]*\b" + trigger_class.__name__ + r"\]")
    return [m.group(1) for m in map(line.search, capsys.readouterr().out.splitlines()) if m]


def test_a_wait_logs_each_change_of_progress_not_each_poll(airflow_db, capsys, monkeypatch):
    """A thousand tenants waiting without change must not each write a line per poll: a poll is logged when its
    progress (else its message) changed, an unchanged one once per ``quiet_log_s``, the final one always."""
    from nexus_airflow.triggers import QUIET_LOG_ENV, StatusPollTrigger, quiet_log_s

    monkeypatch.delenv(QUIET_LOG_ENV, raising=False)
    assert quiet_log_s() == 300.0
    for raw, seconds in (("0", 0.0), ("12.5", 12.5), ("-1", 300.0), ("soon", 300.0)):
        monkeypatch.setenv(QUIET_LOG_ENV, raw)
        assert quiet_log_s() == seconds, raw
    monkeypatch.delenv(QUIET_LOG_ENV)

    script = [["waiting", [5, 0], "5 left; ETA unknown"], ["waiting", [5, 0], "5 left; 0.1 items/min"],
              ["waiting", [5, 0], "5 left; 0.0 items/min"], ["waiting", [3, 0], "3 left"],
              ["waiting", None, "not ready: host h1 starting"], ["waiting", None, "not ready: host h1 starting"],
              ["waiting", None, "not ready: host h1 warming"], ["error", None, "(2013, 'Lost connection')"],
              ["waiting", None, "not ready: host h1 warming"], ["waiting", None, "not ready: host h1 warming"],
              ["done", [0, 0], "0 left; drained"]]
    assert _logged_lines(capsys, StatusPollTrigger, script) == [
        "5 left; ETA unknown", "3 left", "not ready: host h1 starting", "not ready: host h1 warming",
        "not ready: host h1 warming",  # the first poll after a failed one (the failure is a warning line)
        "0 left; drained"]

    class EveryPoll(StatusPollTrigger):  # nothing is quiet for 0 s: every unchanged poll says how long it has been
        quiet_log_s = 0.0

    lines = _logged_lines(capsys, EveryPoll, script)
    assert len(lines) == len(script) - 1 and lines[0] == "5 left; ETA unknown" and lines[3] == "3 left", lines
    assert lines[1].startswith("unchanged since ") and lines[1].endswith("(1 more poll(s)): 5 left; 0.1 items/min")
    assert lines[2].endswith("(2 more poll(s)): 5 left; 0.0 items/min"), lines


def _events(poller_kwargs):
    from nexus_airflow.triggers import StatusPollTrigger

    async def collect():
        return [e async for e in StatusPollTrigger(f"{__name__}.FlakyPoller", poller_kwargs, poll_interval=0).run()]

    return asyncio.run(asyncio.wait_for(collect(), timeout=60))


def test_a_database_error_mid_wait_is_retried_until_the_poll_succeeds(airflow_db):
    (event,) = _events({"fail": 3, "error": "operational"})  # e.g. the tenant's server restarting
    assert event.payload == {"state": "done", "message": "done", "polls": 4}


def test_database_errors_past_the_deadline_end_the_wait_naming_the_error(airflow_db):
    (event,) = _events({"fail": 10, "error": "operational", "expire_after": 3})
    assert event.payload["state"] == "error" and event.payload["failed_polls"] == 3
    assert "OperationalError" in event.payload["message"] and "Lost connection" in event.payload["message"]


def test_bad_input_ends_the_wait_at_once(airflow_db):
    (event,) = _events({"fail": 10, "error": "bad_input"})
    assert event.payload["state"] == "error" and event.payload["failed_polls"] == 1
    assert "nexus_tenant_acme does not exist" in event.payload["message"]


def test_trigger_polls_off_the_event_loop_and_fires_the_final_result(airflow_db):
    from nexus_airflow.triggers import StatusPollTrigger

    trigger = StatusPollTrigger(f"{__name__}.BlockingPoller", {"conn_id": "c", "namespace": NS}, poll_interval=0)

    async def scenario():
        async def releaser():
            BlockingPoller.release.set()  # runs only if poll() is not blocking the loop

        events = []

        async def consume():
            async for event in trigger.run():
                events.append(event)

        await asyncio.gather(consume(), releaser())
        return events

    events = asyncio.run(asyncio.wait_for(scenario(), timeout=60))
    assert [e.payload["state"] for e in events] == ["done"]
    assert events[0].payload["kwargs"] == {"conn_id": "c", "namespace": NS}


def test_trigger_serializes_ids_only(airflow_db):
    from nexus_airflow.triggers import StatusPollTrigger

    path, kwargs = StatusPollTrigger("nexus_airflow.pollers.DrainPoller", {"conn_id": "nexus_tenant_acme"}, 5).serialize()
    assert path == "nexus_airflow.triggers.StatusPollTrigger"
    assert kwargs == {"poller": "nexus_airflow.pollers.DrainPoller", "poller_kwargs": {"conn_id": "nexus_tenant_acme"},
                      "poll_interval": 5.0}


@pytest.mark.parametrize("backend", ["mysql", "sqlite"])
def test_drain_poller_reports_counts_and_trend(airflow_db, tenant_connection, backend, request):
    from nexus_airflow.pollers import DrainPoller, deadline_in
    from nexus_airflow.triggers import StatusPollTrigger

    url = request.getfixturevalue(f"{backend}_url")
    engine = make_engine(url)
    make_cutover_ready(engine)
    sc = TenantScenario(namespace=NS)
    lane = sc.pack("pk-a").lane("l")
    _, first = lane.generation(1, status="pending")
    lane.generation(1, status="processing", lease_owner="w", lease_expires_at=utcnow() + dt.timedelta(minutes=5))
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="w")
    ordinary = sc.ordinary_work(None, status="pending")
    sc.write(engine)
    conn_id = tenant_connection(f"nexus_tenant_poll_{backend}", url)
    kwargs = {"conn_id": conn_id, "namespace": NS, "deadline": deadline_in(600), "stale_heartbeat_s": 600}
    poller = DrainPoller(**kwargs)
    # a waiting tenant keeps no connection and no compiled statements between polls (its memory on a triggerer)
    assert type(poller.engine.pool).__name__ == "NullPool" and poller.engine._compiled_cache is None
    try:
        one = poller.poll()
        assert one["state"] == "waiting" and one["remaining"] == 2
        assert "2 old projection WorkItems remaining (pending 1, blocked 0, retry 0, processing 1)" in one["message"]
        with engine.begin() as conn:  # the old runtime completes one item
            conn.execute(catalog.WorkItem.update().where(catalog.WorkItem.c.WorkId == first["WorkId"])
                         .values(Status="completed"))
        two = poller.poll()
        assert two["remaining"] == 1 and "-1 since last poll" in two["message"] and "-1 since start" in two["message"]
        # the trigger logs a change of progress: old projection work by status and live old workers, not ordinary work
        assert (one["progress"], two["progress"]) == ([1, 0, 0, 1, 1], [0, 0, 0, 1, 1]), (one, two)
        with engine.begin() as conn:  # ordinary work moves with the tenant's traffic: not the drain's progress
            conn.execute(catalog.WorkItem.update().where(catalog.WorkItem.c.WorkId == ordinary["WorkId"])
                         .values(Status="completed"))
        three = poller.poll()
        assert three["progress"] == two["progress"] and "live ordinary" in two["message"], (two, three)
        assert "live ordinary" not in three["message"], three
    finally:
        poller.close()
    with engine.begin() as conn:
        conn.execute(catalog.WorkItem.update().values(Status="completed"))
    events = asyncio.run(_collect(StatusPollTrigger("nexus_airflow.pollers.DrainPoller", kwargs, 0)))
    assert [e.payload["state"] for e in events] == ["drained"]
    engine.dispose()


async def _collect(trigger):
    return [event async for event in trigger.run()]


def _timeout_event():
    return {"error": "timed out", "error_type": "timeout"}


@pytest.mark.parametrize(
    ("event", "needle"),
    [
        (_timeout_event(), "cutover not performed: no answer within 24 h"),  # the form's default confirm_timeout
        ({"chosen_options": ["Reject"], "params_input": {}, "responded_at": dt.datetime(2026, 1, 1),
          "responded_by_user": {"id": "u", "name": "engineer"}},
         "cutover not performed: engineer rejected \"Confirm that every old-protocol writer"),
    ],
)
def test_confirmation_never_passes_on_timeout_or_reject(airflow_db, event, needle):
    from nexus_airflow.base import TaskStopped
    from nexus_airflow.hitl import ConfirmWritersStoppedOperator

    op = ConfirmWritersStoppedOperator(task_id="confirm_writers_stopped")
    assert op.defaults is None and op.retries == 0
    with pytest.raises(TaskStopped, match=needle) as stopped:
        op.execute_complete({"params": {"tenant": NS}}, event)
    # a person reading the stop learns how to retry and how to back out, not the confirm step's advice
    assert "clear check_old_writers" in str(stopped.value) and "Rollback stance" in str(stopped.value)


def test_confirmation_passes_only_on_confirm(airflow_db):
    """The approve option is the only pass (the writer-stop step then re-checks its evidence: test_cutover_dag_guards)."""
    from nexus_airflow.hitl import StartNewHostOperator

    op = StartNewHostOperator(task_id="start_new_host")
    out = op.execute_complete({"params": {"tenant": NS}}, {"chosen_options": [op.approve_option], "params_input": {},
                                   "responded_at": dt.datetime(2026, 1, 1), "responded_by_user": {"id": "u", "name": "e"}})
    assert out["chosen_options"] == [op.approve_option]


class CountingPoller:
    """Waiting for its first ``waits`` polls, then done; records when each poll ran (monotonic seconds)."""

    def __init__(self, waits: int):
        self.waits, self.at = waits, []

    def poll(self):
        import time

        self.at.append(time.monotonic())
        if len(self.at) <= self.waits:
            return {"state": "waiting", "message": f"poll {len(self.at)}"}
        return {"state": "done", "message": "done", "at": self.at}

    def close(self):
        pass


def test_trigger_looks_again_soon_then_backs_off_towards_the_interval(airflow_db):
    """A wait that ends seconds after it started (a host ready in 3 s) is seen then, not a whole interval later:
    the gaps between looks are 1 s, 2 s, ... (never below them), far under a 30 s poll_interval."""
    from nexus_airflow.triggers import StatusPollTrigger

    async def collect():
        trigger = StatusPollTrigger(f"{__name__}.CountingPoller", {"waits": 2}, poll_interval=30)
        return [e async for e in trigger.run()]

    (event,) = asyncio.run(asyncio.wait_for(collect(), timeout=25))
    at = event.payload["at"]
    gaps = [round(b - a, 2) for a, b in zip(at, at[1:], strict=False)]
    assert len(gaps) == 2 and 1.0 <= gaps[0] < 15 and 2.0 <= gaps[1] < 15 and gaps[1] > gaps[0], gaps


def test_a_stuck_drains_stop_names_each_cause_with_its_count(airflow_db, tmp_path):
    """Issue 34.7: the STOPPED line of a stuck drain named no cause."""
    from nexus_airflow.sensors import TenantWaitSensor
    from nexus_cutover.projection.drain import drain_report

    (tmp_path / "t.db").touch()
    engine = make_engine(f"sqlite:///{tmp_path / 't.db'}")
    make_cutover_ready(engine)
    sc = TenantScenario(namespace=NS)
    lane = sc.pack("pk-a").lane("lane-1")
    lane.generation(1, status="processing", lease_owner="gone", lease_expires_at=sc.now - dt.timedelta(minutes=5))
    for _ in range(4):
        lane.generation(1, status="pending")
    sc.write(engine)
    report = drain_report(engine, NS, deadline=utcnow() + dt.timedelta(hours=1), stale_heartbeat=dt.timedelta(seconds=30))
    engine.dispose()
    message = TenantWaitSensor(task_id="wait_for_drain").stop_message(report.as_json())
    assert message.startswith("the drain of old projection work cannot finish within drain_timeout")
    assert message.endswith("Now: the drain is stuck: 1 processing items whose lease expired (their worker is gone); "
                            "4 pending items while no live old-protocol projection_worker heartbeats")
    writers = TenantWaitSensor(task_id="check_old_writers").stop_message({"live": ["w-1", "w-2"]})
    assert writers.endswith("Now: 2 live old writer(s) to be stopped (w-1, w-2), then a person's confirmation")


class ReportingPoller:
    """Waits ``waits`` polls, then ends in ``final`` with a report and its text."""

    def __init__(self, waits: int, final: str):
        self.waits, self.final = waits, final

    def poll(self):
        if self.waits:
            self.waits -= 1
            return {"state": "waiting", "message": "2 old projection WorkItems remaining", "report": {"left": 2}}
        return {"state": self.final, "message": self.final, "report": {"left": 0, "state": self.final},
                "report_text": f"the drain: {self.final}"}

    def close(self):
        pass


END_TASK = {"state": "drained", "xcoms": {"return_value": "report", "report_text": "report_text"}}


def _fired(trigger) -> list:
    async def collect():
        return [e async for e in trigger.run()]

    return asyncio.run(asyncio.wait_for(collect(), timeout=30))


def test_a_wait_that_passes_ends_its_task_in_the_triggerer_with_the_sensors_xcoms(airflow_db):
    """Told how its task ends, the trigger ends it itself on the passing state (Airflow's TaskSuccessEvent, the
    XComs the sensor's finish would push: the report as the task's value, the text under its key), so the task
    does not go back to a worker; serialized with that, as the triggerer re-creates it."""
    from airflow.triggers.base import TaskSuccessEvent

    from nexus_airflow.triggers import StatusPollTrigger

    trigger = StatusPollTrigger(f"{__name__}.ReportingPoller", {"waits": 1, "final": "drained"}, 0, end_task=END_TASK)
    path, kwargs = trigger.serialize()
    assert kwargs["end_task"] == END_TASK
    (event,) = _fired(StatusPollTrigger(**kwargs))
    assert isinstance(event, TaskSuccessEvent)
    assert event.xcoms == {"return_value": {"left": 0, "state": "drained"}, "report_text": "the drain: drained"}


@pytest.mark.parametrize("end_task", [END_TASK, None], ids=["told", "not told"])
def test_a_wait_that_stops_resumes_on_a_worker_with_the_pollers_result(airflow_db, end_task):
    """Any other final state (a stuck drain), or a trigger not told how its task ends (the switch off, an older
    sensor), fires the poller's result for the sensor to finish on a worker (its stop, with its report)."""
    from airflow.triggers.base import TaskSuccessEvent

    from nexus_airflow.triggers import StatusPollTrigger

    final = "stuck" if end_task else "drained"
    (event,) = _fired(StatusPollTrigger(f"{__name__}.ReportingPoller", {"waits": 1, "final": final}, 0,
                                         end_task=end_task))
    assert not isinstance(event, TaskSuccessEvent)
    assert event.payload["state"] == final and event.payload["report"] == {"left": 0, "state": final}
    assert "end_task" not in StatusPollTrigger("p", {}, 1).serialize()[1]  # a trigger serialized before stays as it was


def test_a_wait_ends_in_the_triggerer_only_when_switched_on(monkeypatch):
    from nexus_airflow.sensors import END_IN_TRIGGERER_ENV, waits_end_in_triggerer

    monkeypatch.delenv(END_IN_TRIGGERER_ENV, raising=False)
    assert waits_end_in_triggerer() is False  # measured, it did not pay: off by default
    monkeypatch.setenv(END_IN_TRIGGERER_ENV, "1")
    assert waits_end_in_triggerer() is True
    monkeypatch.setenv(END_IN_TRIGGERER_ENV, "0")
    assert waits_end_in_triggerer() is False

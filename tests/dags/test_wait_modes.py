"""The cutover's waits as Airflow sensors: poke and reschedule modes pass on the done state and stop with the
wait's own report when their timeout runs out (the deadline fixed at the wait's first poke, never reset by a
reschedule); the deferrable default defers to the trigger with the sensor's timeout, and a deferral that times
out stops with the same report.

Real MariaDB tenants, real ``dag.test()`` runs of the cutover DAG: the steps before the wait run for real, the
steps after it are marked success by ``dag.test`` (``mark_success_pattern``), so no person is asked anything.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import signal
import threading
import time

import pytest
from sqlalchemy import update

from nexus_cutover import catalog
from nexus_cutover.projection.transition import CUTOVER
from nexus_sim.scenario import utcnow
from tests.dags.airflow_harness import collect, next_logical_date
from tests.dags.cutover_support import DAG_ID, NS, base_conf, drained_tenant, draining_tenant, history_bytes

LATE_WRITER = "old-late-writer"
MODES = ["reschedule", "poke"]


class Hung(BaseException):
    """A run that did not end in time (a BaseException: ``dag.test()`` swallows ordinary ones)."""


@contextlib.contextmanager
def at_most(seconds: int):
    def hung(*_):
        raise Hung(f"the run did not end within {seconds} s")

    previous = signal.signal(signal.SIGALRM, hung)
    signal.alarm(seconds)
    try:
        yield
    finally:
        signal.alarm(0)
        signal.signal(signal.SIGALRM, previous)


def run_until(dag, conf: dict, step: str, *, mode: str, deferrable: bool = False):
    """Run the cutover with ``step`` in ``mode``; the steps after it are marked success, not run."""
    task = dag.task_dict[step]
    task.mode, task.deferrable = mode, deferrable
    after = CUTOVER.names[CUTOVER.names.index(step) + 1:]
    with at_most(240):
        dr = dag.test(logical_date=next_logical_date(), run_conf=conf, mark_success_pattern="|".join(after))
    return collect(DAG_ID, dr.run_id)


def ti_of(run_id: str, task_id: str):
    """``(state, try_number, start_date, [reschedule start dates])`` of a task instance, from the metadata DB."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        ti = session.scalar(select(TaskInstance).where(TaskInstance.dag_id == DAG_ID, TaskInstance.run_id == run_id,
                                                       TaskInstance.task_id == task_id))
        starts = session.scalars(select(TaskReschedule.start_date).where(TaskReschedule.ti_id == ti.id)
                                 .order_by(TaskReschedule.id)).all()
        return str(ti.state), ti.try_number, ti.start_date, list(starts)


def in_state(task_id: str, state: str) -> bool:
    """Whether a task instance of ``task_id`` of the cutover is in ``state`` now (earlier runs' are finished)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session
    from sqlalchemy import func, select

    with create_session() as session:
        return bool(session.scalar(select(func.count()).select_from(TaskInstance).where(
            TaskInstance.dag_id == DAG_ID, TaskInstance.task_id == task_id, TaskInstance.state == state)))


def stop_writer_once_waiting(engine, waiting_state: str, seen: list[float]) -> threading.Thread:
    """Stop the late old writer 2 s after check_old_writers was seen ``waiting_state`` (a poke said waiting)."""

    def run():
        deadline = time.monotonic() + 200
        while time.monotonic() < deadline:
            try:
                if in_state("check_old_writers", waiting_state):
                    break
            except Exception:  # noqa: BLE001 - SQLite busy while dag.test writes: look again
                pass
            time.sleep(0.2)
        else:
            return
        seen.append(time.monotonic())
        time.sleep(2)
        with engine.begin() as conn:
            conn.execute(update(catalog.ProcessRegistry).where(catalog.ProcessRegistry.c.ProcessId == LATE_WRITER)
                         .values(StoppedAt=utcnow()))

    thread = threading.Thread(target=run, daemon=True)
    thread.start()
    return thread


@pytest.mark.parametrize("mode", MODES)
def test_writer_wait_passes_once_the_last_old_writer_stops(dag, tenant, mode):
    engine, conn_id = tenant
    sc = drained_tenant()
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id=LATE_WRITER)  # live: a fresh heartbeat, not stopped
    sc.write(engine)
    seen: list[float] = []
    stopper = stop_writer_once_waiting(engine, "up_for_reschedule" if mode == "reschedule" else "running", seen)
    result = run_until(dag, base_conf(conn_id, stale_heartbeat=600, writers_stop_timeout=120), "check_old_writers",
                       mode=mode)
    stopper.join(timeout=5)
    ended = time.monotonic()

    assert seen, "check_old_writers never waited"
    assert result.state_of("check_old_writers") == "success", result.task_states
    evidence = result.xcom("check_old_writers")
    assert evidence["live"] == [] and evidence["all_stopped_or_silent"] is True, evidence
    assert {p["process_id"]: p["state"] for p in evidence["processes"]}.get(LATE_WRITER) == "stopped", evidence
    assert result.xcom("check_old_writers", key="evidence_md")
    assert ended - seen[0] >= 2  # it passed on a later poke, after the writer stopped
    _, tries, _, reschedules = ti_of(result.run_id, "check_old_writers")
    assert tries == 1
    if mode == "reschedule":
        assert len(reschedules) >= 1  # the worker was given back between pokes
    else:
        assert reschedules == []  # poke mode: one execution, the base class sleeping between pokes


@pytest.mark.parametrize("mode", MODES)
def test_drain_wait_stops_with_its_report_when_drain_timeout_runs_out(dag, tenant, mode):
    engine, conn_id = tenant
    draining_tenant().write(engine)  # a live old worker would take the pending item, in time
    before = history_bytes(engine)
    drain_timeout = 4

    result = run_until(dag, base_conf(conn_id, drain_timeout=drain_timeout, stale_heartbeat=600), "wait_for_drain",
                       mode=mode)

    assert result.state == "failed"
    assert result.state_of("wait_for_drain") == "failed", result.task_states  # a stop fails: never skipped
    assert result.state_of("check_old_writers") == "upstream_failed"
    report = result.xcom("wait_for_drain", key="report")
    assert report["state"] == "stuck" and report["timed_out"] is True, report
    assert report["remaining"] == 1 and "drain_timeout" in report["message"], report
    assert "cannot finish within drain_timeout" in report["message"]
    # the STOPPED line names the cause with its count (issue 34.7)
    assert "Now: the drain is stuck: 1 items still live when the drain timeout passed" in report["message"], report
    assert result.xcom("wait_for_drain", key="report_text")
    state, tries, started, reschedules = ti_of(result.run_id, "wait_for_drain")
    assert tries == 1
    deadline = dt.datetime.fromisoformat(report["deadline"]).replace(tzinfo=dt.UTC)
    if mode == "reschedule":
        assert len(reschedules) >= 1, reschedules  # the report came from a later poke than the first
        # the deadline is the first poke's, not the last reschedule's: a reschedule never extends the wait
        assert abs((deadline - reschedules[0]).total_seconds() - drain_timeout) < 0.01, (deadline, reschedules)
    else:
        assert reschedules == []
        assert 0 <= (deadline - started).total_seconds() - drain_timeout < 3, (deadline, started)
    assert history_bytes(engine) == before  # nothing was changed to pass


def test_the_default_defers_to_the_trigger_with_the_sensor_timeout(dag, tenant, monkeypatch):
    from airflow.sdk.exceptions import TaskDeferred

    from nexus_airflow.sensors import END_IN_TRIGGERER_ENV
    from nexus_airflow.triggers import StatusPollTrigger

    monkeypatch.setenv(END_IN_TRIGGERER_ENV, "1")
    engine, conn_id = tenant
    draining_tenant().write(engine)
    sensor = dag.task_dict["wait_for_drain"]
    assert sensor.deferrable is True and sensor.soft_fail is False

    started = utcnow()
    with pytest.raises(TaskDeferred) as deferred:
        sensor.execute({"params": base_conf(conn_id, drain_timeout=900, poll_interval=7, stale_heartbeat=600)})

    trigger = deferred.value.trigger
    assert isinstance(trigger, StatusPollTrigger) and trigger.poller == "nexus_airflow.pollers.DrainPoller"
    assert trigger.poll_interval == 7 == sensor.poke_interval
    assert sensor.timeout == 900
    kwargs = trigger.poller_kwargs
    assert kwargs["conn_id"] == conn_id and kwargs["initial_remaining"] == 1
    assert "password" not in repr(trigger.serialize()).lower()
    deadline = dt.datetime.fromisoformat(kwargs["deadline"])
    assert abs((deadline - started).total_seconds() - 900) < 5
    # what is left of the sensor's own timeout, plus two polls: the trigger's verdict past the deadline comes first
    assert 890 + 2 * 7 < deferred.value.timeout.total_seconds() <= 900 + 2 * 7
    # switched on, drained, the trigger ends the task itself with what the sensor's finish would push, and its metric
    assert trigger.end_task == {"state": "drained", "tenant": NS, "step": "wait_for_drain", "started_at": None,
                                "xcoms": {"return_value": "report", "report_text": "report_text"}}


@pytest.mark.parametrize("switch", ["0", None], ids=["off", "unset (the default)"])
def test_switched_off_a_wait_resumes_on_a_worker_whatever_its_trigger_sees(dag, tenant, monkeypatch, switch):
    from airflow.sdk.exceptions import TaskDeferred

    from nexus_airflow.sensors import END_IN_TRIGGERER_ENV

    if switch is None:
        monkeypatch.delenv(END_IN_TRIGGERER_ENV, raising=False)
    else:
        monkeypatch.setenv(END_IN_TRIGGERER_ENV, switch)
    engine, conn_id = tenant
    draining_tenant().write(engine)
    with pytest.raises(TaskDeferred) as deferred:
        dag.task_dict["wait_for_drain"].execute({"params": base_conf(conn_id, drain_timeout=900, poll_interval=7)})
    assert deferred.value.trigger.end_task is None


def test_a_deferral_that_times_out_stops_with_the_waits_report(dag, tenant):
    """The scheduler resumes a deferral past its timeout with ``__fail__`` (a lost trigger): one more look, then
    the wait's own stop, not Airflow's bare sensor timeout."""
    from nexus_airflow.base import TaskStopped

    engine, conn_id = tenant
    drained_tenant().write(engine)  # no new host registered: never ready
    with pytest.raises(TaskStopped) as stopped:
        _resume_timed_out(dag, conn_id)
    assert "did not become ready within readiness_timeout" in str(stopped.value)


def test_a_deferral_that_times_out_with_the_database_down_stops_naming_the_error(dag, tenant_connection):
    from nexus_airflow.base import TaskStopped

    down = tenant_connection("nexus_tenant_down", "mysql+pymysql://nexus:secret@127.0.0.1:9/acme")  # nothing listens
    with pytest.raises(TaskStopped) as stopped:
        _resume_timed_out(dag, down)
    text = str(stopped.value)
    assert "verify_readiness: readiness_timeout ran out and polling the tenant database failed: Unreachable" in text
    assert "Connection refused" in text
    assert "secret" not in text


def _resume_timed_out(dag, conn_id: str):
    """``verify_readiness`` resumed as the scheduler resumes a deferral past its trigger timeout."""
    from airflow.models.trigger import TriggerFailureReason

    sensor = dag.task_dict["resume_admission"]  # its first step is verify_readiness
    context = {"params": base_conf(conn_id, readiness_timeout=60)}
    return sensor.resume_execution("__fail__", {"error": TriggerFailureReason.TRIGGER_TIMEOUT.value}, context)


@pytest.mark.parametrize("flag", ["soft_fail", "never_fail", "silent_fail"])
def test_a_wait_is_never_skipped_or_silenced(airflow_db, flag):
    from nexus_airflow.sensors import TenantWaitSensor

    with pytest.raises(ValueError, match="never skipped"):
        TenantWaitSensor(task_id="wait_for_drain", **{flag: True})

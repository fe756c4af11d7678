"""Arm only what the workers can carry (issue 50, item 4): with ``[nexus] armed_slots``, a cutover run arms its fence
only while fewer runs are armed; it waits before arming (rescheduled, admission open, nothing written), arms once a
slot frees, and stops and reports past ``pre_arm_timeout``. The tasks of the admission pause run in the pool
``nexus_armed`` when it exists.

Real runs (``dag.test()``, the real Execution API's task states) against a MariaDB tenant. The armed run holding the
slot is a real earlier run of the DAG whose Airflow state is set to "armed, its release still to run" (a run waiting
in its pause, e.g. for its question); the barrier is the waiting run's own ``up_for_reschedule``, never a sleep.
"""

from __future__ import annotations

import threading
import time

import pytest
from sqlalchemy import select, update

from nexus_airflow.armed_slots import ARMED_POOL, runs_before, slots
from nexus_airflow.declared import ARMED_WINDOWS, CUTOVER
from nexus_airflow.policies import armed_pool_of
from nexus_cutover import catalog
from tests.dags.airflow_harness import run_dag
from tests.dags.cutover_support import base_conf, drained_tenant, snapshot

FENCE_TASK, RELEASE_TASK, WINDOW = ARMED_WINDOWS[CUTOVER.name]


# --- the rule, from task states as the Task SDK returns them ---------------------------------------------------------

def test_a_run_is_armed_from_its_fence_until_its_release_finishes_and_arming_while_its_fence_task_runs():
    states = {
        "me": {FENCE_TASK: "running", RELEASE_TASK: None},
        "armed-waiting": {FENCE_TASK: "success", RELEASE_TASK: None},
        "armed-releasing": {FENCE_TASK: "success", RELEASE_TASK: "running"},
        "released": {FENCE_TASK: "success", RELEASE_TASK: "success"},
        "stopped-armed": {FENCE_TASK: "success", RELEASE_TASK: "upstream_failed"},  # paused, but no slot used
        "arming": {FENCE_TASK: "running", RELEASE_TASK: None},
        "not-yet": {FENCE_TASK: "up_for_reschedule", RELEASE_TASK: None},
        "failed-to-arm": {FENCE_TASK: "failed", RELEASE_TASK: "upstream_failed"},
    }
    seen = slots(states, fence_task=FENCE_TASK, release_task=RELEASE_TASK, me="me", bound=4)
    assert seen.armed_runs == ("armed-releasing", "armed-waiting") and seen.arming_runs == ("arming",)
    assert (seen.armed, seen.arming) == (2, 1)
    assert seen.taken == 3 and seen.free
    assert not slots(states, fence_task=FENCE_TASK, release_task=RELEASE_TASK, me="me", bound=3).free
    assert slots(states, fence_task=FENCE_TASK, release_task=RELEASE_TASK, me="me", bound=0).free  # 0: no bound
    assert seen.text() == "2 of 4 armed slots taken, 1 arming now (runs: armed-releasing, armed-waiting, arming (arming))"


def test_a_wave_arms_its_waiting_tenants_in_its_declared_order():
    order = ["t1", "t2", "t3", "t4"]
    run_of = {t: f"rollout__r__{t}" for t in order}.__getitem__
    states = {run_of("t1"): {FENCE_TASK: "success", RELEASE_TASK: "running"},  # armed
              run_of("t2"): {FENCE_TASK: "deferred", RELEASE_TASK: None},  # not ready yet: holds nobody back
              run_of("t3"): {FENCE_TASK: "up_for_reschedule", RELEASE_TASK: None},  # waits for a slot
              run_of("t4"): {FENCE_TASK: "running", RELEASE_TASK: None}}  # me, looking
    before = runs_before(order, "t4", run_of)
    assert before == [run_of("t1"), run_of("t2"), run_of("t3")]
    seen = slots(states, fence_task=FENCE_TASK, release_task=RELEASE_TASK, me=run_of("t4"), bound=2, before_me=before)
    assert seen.ahead == (run_of("t3"),) and not seen.free  # 1 armed + 1 ahead of it: t3 takes the free slot
    assert "1 of its wave ahead of it wait too" in seen.text()
    states[run_of("t4")][FENCE_TASK] = "up_for_reschedule"  # t4 waits; t3 looks
    states[run_of("t3")][FENCE_TASK] = "running"
    t3 = slots(states, fence_task=FENCE_TASK, release_task=RELEASE_TASK, me=run_of("t3"), bound=2,
               before_me=runs_before(order, "t3", run_of))
    assert t3.free and t3.ahead == ()  # t2, before it, is not waiting for a slot; t4, after it, does not count
    assert runs_before(order, "elsewhere", run_of) == []


def test_the_armed_window_is_the_pause_from_after_the_fence_to_the_release():
    names = CUTOVER.names
    assert CUTOVER.with_role("fence").name == FENCE_TASK
    assert WINDOW[0] == names[names.index(FENCE_TASK) + 1] and WINDOW[-1] == RELEASE_TASK
    assert names[0] not in WINDOW and FENCE_TASK not in WINDOW  # the fence task itself queues before arming


@pytest.mark.parametrize("task_id, conf, pool", [
    (WINDOW[0], {}, ARMED_POOL),
    (RELEASE_TASK, {"dry_run": False}, ARMED_POOL),
    (RELEASE_TASK, {"dry_run": True}, None),  # a dry run arms nothing
    (FENCE_TASK, {}, None),
    (CUTOVER.names[0], {}, None),
])
def test_the_tasks_of_the_pause_go_to_the_armed_pool(task_id, conf, pool):
    assert armed_pool_of(CUTOVER.name, task_id, conf) == pool
    assert armed_pool_of("another_dag", task_id, conf) is None


# --- on real runs ------------------------------------------------------------------------------------------------------

def _stuck_after_arming():
    """A drained tenant plus one pending old item and no old worker: the drain stops at its first look, after the
    fence step (so a run is quick and its fence step's outcome is what the test reads)."""
    sc = drained_tenant()
    sc.packs[0].lane("lane-left").generation(1, status="pending")
    return sc


def _set(run_id: str, task_id: str, state) -> None:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        session.execute(update(TaskInstance).where(TaskInstance.dag_id == CUTOVER.name, TaskInstance.run_id == run_id,
                                                   TaskInstance.task_id == task_id).values(state=state))


def _armed_elsewhere(dag, conn_id: str) -> str:
    """A run of the DAG that Airflow sees armed and still in its pause: a real (dry) run, its release set back to
    "not run yet" and the run to running. Its run id."""
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    other = run_dag(dag, base_conf(conn_id, dry_run=True))
    assert other.state_of(FENCE_TASK) == "success", other.task_states
    _set(other.run_id, RELEASE_TASK, None)
    with create_session() as session:
        session.execute(update(DagRun).where(DagRun.dag_id == CUTOVER.name, DagRun.run_id == other.run_id)
                        .values(state="running"))
    return other.run_id


def _reschedules(besides: set[str]) -> list[str]:
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        return [ti.run_id for ti in session.scalars(select(TaskInstance).where(
            TaskInstance.dag_id == CUTOVER.name, TaskInstance.task_id == FENCE_TASK,
            TaskInstance.state == "up_for_reschedule"))
            if ti.run_id not in besides]


def _rescheduled(run_id: str) -> int:
    """How often the run's fence task was rescheduled (Airflow's ``task_reschedule`` rows of its task instance)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.taskreschedule import TaskReschedule
    from airflow.utils.session import create_session

    with create_session() as session:
        return len(session.scalars(select(TaskReschedule.id).join(TaskInstance, TaskInstance.id == TaskReschedule.ti_id)
                                   .where(TaskInstance.dag_id == CUTOVER.name, TaskInstance.run_id == run_id,
                                          TaskInstance.task_id == FENCE_TASK)).all())


def _fences_armed(engine) -> int:
    with engine.connect() as conn:
        return len(conn.execute(select(catalog.AdmissionFence.c.FenceId).where(
            catalog.AdmissionFence.c.ReleasedAt.is_(None))).all())


def test_a_run_waits_before_arming_while_the_slots_are_taken_and_arms_once_one_frees(dag, tenant, monkeypatch):
    engine, conn_id = tenant
    _stuck_after_arming().write(engine)
    armed = _armed_elsewhere(dag, conn_id)
    monkeypatch.setenv("NEXUS_ARMED_SLOTS", "1")
    seen: dict = {}

    def free_the_slot_once_it_waits() -> None:  # the barrier: the run's own up_for_reschedule
        deadline = time.monotonic() + 120
        while not (waiting := _reschedules({armed})):
            if time.monotonic() > deadline:
                seen["error"] = "the run never waited for a slot"
                return
            time.sleep(0.1)
        seen["waiting"], seen["fences_while_waiting"] = waiting, _fences_armed(engine)
        _set(armed, RELEASE_TASK, "success")  # the armed run released: its slot is free

    freer = threading.Thread(target=free_the_slot_once_it_waits, daemon=True)
    freer.start()
    result = run_dag(dag, base_conf(conn_id))
    freer.join(timeout=30)

    assert "error" not in seen, seen
    assert seen["waiting"] == [result.run_id]
    assert seen["fences_while_waiting"] == 0  # it waited with admission open: nothing armed, nothing written
    assert result.state_of(FENCE_TASK) == "success", result.task_states  # then it armed
    assert _rescheduled(result.run_id) >= 1
    assert result.xcom(FENCE_TASK)["outcome"] == "armed"
    assert result.state_of("wait_for_drain") == "failed"  # the tenant's own stop, after arming
    assert snapshot(engine)["fences"] == [("*", True, False)]


def test_no_slot_within_pre_arm_timeout_stops_before_arming_naming_the_armed_runs(dag, tenant, monkeypatch):
    engine, conn_id = tenant
    _stuck_after_arming().write(engine)
    armed = _armed_elsewhere(dag, conn_id)
    monkeypatch.setenv("NEXUS_ARMED_SLOTS", "1")

    result = run_dag(dag, base_conf(conn_id, pre_arm_timeout=2))

    assert result.state_of(FENCE_TASK) == "failed", result.task_states
    report = result.xcom(FENCE_TASK, key="report")
    assert report["armed"] == [armed] and report["armed_slots"] == 1, report
    assert "no armed slot was free within pre_arm_timeout" in report["message"], report["message"]
    assert "armed_slots" in report["message"]  # what to change
    assert snapshot(engine)["fences"] == [] and snapshot(engine)["protocol_rows"] == []
    _set(armed, RELEASE_TASK, "success")


def test_a_tenant_fenced_already_never_waits_for_a_slot(dag, tenant, monkeypatch):
    engine, conn_id = tenant
    _stuck_after_arming().write(engine)
    first = run_dag(dag, base_conf(conn_id))  # arms, then stops at the drain: the tenant is fenced
    assert first.xcom(FENCE_TASK)["outcome"] == "armed" and _fences_armed(engine) == 1
    armed = _armed_elsewhere(dag, conn_id)
    monkeypatch.setenv("NEXUS_ARMED_SLOTS", "1")

    again = run_dag(dag, base_conf(conn_id, adopt=None))  # a new run of the fenced tenant

    assert _rescheduled(again.run_id) == 0, again.task_states  # it went on at once
    assert _fences_armed(engine) == 1  # nothing new armed
    _set(armed, RELEASE_TASK, "success")

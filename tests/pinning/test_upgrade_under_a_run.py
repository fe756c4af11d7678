"""A release deployed while a cutover waits at the confirmation does not run the rest of it (issue 37, item 4).

Real components: two builds of the product wheel (this tree at two versions), a venv of its own that a team's install
would be (``nexus-cutover[airflow]`` with the release's ``constraints.txt`` and the dev lock standing in for
Airflow's constraints, no checkout on ``sys.path``), ``airflow standalone`` running from it, a MariaDB tenant. A
cutover run starts on the old build and parks at the writer-stop confirmation with the tenant fenced; the new build
is installed into the venv and Airflow restarted on it (a deploy); the person's answer resumes the step on the new
code, which stops before it touches the tenant, naming both versions: no checkpoint row, the fence still armed, the
history unchanged. Going on with the new version is the ordinary adoption: a new run takes over the fence the failed
run left, and the fence records the new version.
A wait deferred across the same deploy is stopped by its trigger in the restarted triggerer before it polls the
tenant, then by the resumed step.
"""

from __future__ import annotations

import uuid

import pytest
from sqlalchemy import select

from nexus_cutover import catalog, code_version
from nexus_cutover.db import make_engine
from nexus_cutover.holders import holder_of_airflow_run, stored_holder
from nexus_cutover.schema import create_legacy_schema
from scripts.demo_airflow import AirflowStack
from scripts.stack_processes import wait_for
from scripts.stack_services import mariadb_tenant
from tests.dags.cutover_support import NS, drained_tenant, draining_tenant
from tests.pinning import releases
from tests.support import history_checksum

pytestmark = pytest.mark.airflow  # a real `airflow standalone`, from a venv of its own

DAG = "connector_projection_cutover"
CONFIRM_TASK = "confirm_writers_stopped"
CONFIRM = "Confirm: all old writers stopped"
CONN_ID = "nexus_tenant_pinned"


@pytest.fixture(scope="session")
def builds(tmp_path_factory):
    """(old version, its wheel, new version, its wheel): this tree built twice, at two versions."""
    work = tmp_path_factory.mktemp("releases")
    base = releases.static_version()
    old, new = f"{base}+pin.old", f"{base}+pin.new"
    return old, releases.build_wheel(work, old), new, releases.build_wheel(work, new)


@pytest.fixture(scope="session")
def team_venv_once(tmp_path_factory, builds):
    """A venv with the old build installed as a team installs it (created once per test session); its ``bin/``."""
    _, old_wheel, _, _ = builds
    return releases.make_venv(tmp_path_factory.mktemp("team") / "venv", old_wheel)


@pytest.fixture
def team_venv(team_venv_once, builds):
    """The session's venv with the old build installed (again, after a test upgraded it); its ``bin/``."""
    old, old_wheel, _, _ = builds
    if releases.installed_version(team_venv_once) != old:
        releases.pip(team_venv_once, "install", "--no-deps", "--force-reinstall", str(old_wheel))
    assert releases.installed_version(team_venv_once) == old
    return team_venv_once


def _deploy(stack, bin_dir, wheel, version: str) -> None:
    """A deploy while runs are in flight: Airflow stopped, ``wheel`` installed into its venv, Airflow started."""
    stack.stop()
    releases.pip(bin_dir, "install", "--no-deps", "--force-reinstall", str(wheel))
    assert releases.installed_version(bin_dir) == version
    stack.start(timeout_s=300)


def _fence(engine) -> dict:
    with engine.connect() as conn:
        (row,) = conn.execute(select(catalog.AdmissionFence).where(catalog.AdmissionFence.c.Namespace == NS)).all()
        return dict(row._mapping)


def _checkpoints(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(select(catalog.ConnectorProjectionProtocol)).all()


def _parked(stack, run_id: str) -> bool:
    if stack.dag_run(DAG, run_id)["state"] in ("success", "failed"):
        raise AssertionError(f"run {run_id} ended before the confirmation: "
                             f"{[(t['task_id'], t['state']) for t in stack.task_instances(DAG, run_id)]}")
    # parked, and the scheduler has handled the parked try's exit: a deploy (a restart) before that leaves the exit
    # unhandled, and the answer's step is then never resumed (the run's wait is the executor's, not the product's)
    return (any(d["task_instance"]["task_id"] == CONFIRM_TASK for d in stack.pending_hitl(DAG, run_id))
            and stack.park_handled(DAG, run_id, CONFIRM_TASK))


def _conf(**more) -> dict:
    return {"tenant": NS, "conn_id": CONN_ID, "host_controller": "manual", "arm_when_drain_below": 0,
            "poll_interval": 10, "stale_heartbeat": 30, "confirm_timeout": 1800, **more}


def _state(stack, run_id: str, task_id: str) -> str | None:
    return next((t["state"] for t in stack.task_instances(DAG, run_id) if t["task_id"] == task_id), None)


def _logged(home, text: str) -> list:
    """The log files under Airflow's ``home`` (tasks', triggers') that contain ``text``."""
    return [p for p in (home / "logs").rglob("*.log") if text.encode() in p.read_bytes()]


def test_a_release_deployed_while_a_run_waits_at_the_confirmation_stops_its_next_step(
        request, tmp_path, builds, team_venv, mysql_server_url):
    request.node._nexus_uses_mysql = True  # counted in the terminal summary (tests/conftest.py)
    old, _, new, new_wheel = builds
    made = mariadb_tenant(mysql_server_url, f"nx_pin_{uuid.uuid4().hex[:8]}",
                          lambda engine: (create_legacy_schema(engine), drained_tenant().write(engine)))
    engine = make_engine(made["dsn"])
    stack = AirflowStack(tmp_path / "airflow", parallelism=4, bin_dir=team_venv)
    try:
        stack.start(timeout_s=300)
        stack.put_connection(CONN_ID, **made["conn"])
        stack.wait_for_dag(DAG, timeout_s=300)
        run_a = stack.trigger(DAG, _conf(), run_id=f"pinned_a_{uuid.uuid4().hex[:6]}")["dag_run_id"]
        wait_for("run A parked at the confirmation", lambda: _parked(stack, run_a), 600, every_s=3)

        # started on the old build: its first step recorded it, and so did the fence it armed
        assert stack.xcom(DAG, run_a, "resolve_packs", key="product_version") == old
        fence = _fence(engine)
        holder_a = stored_holder(holder_of_airflow_run(DAG, run_a))
        assert (fence["ArmedBy"], fence["ReleasedAt"]) == (holder_a, None)
        assert code_version.version_in_reason(fence["Reason"]) == old
        history, checkpoints = history_checksum(engine), _checkpoints(engine)
        assert checkpoints == []

        # a deploy while it waits: the new build installed into the venv Airflow runs from, Airflow restarted on it
        _deploy(stack, team_venv, new_wheel, new)

        # the person confirms: the step resumes on the new code and stops before it touches the tenant
        stack.answer_hitl(DAG, run_a, CONFIRM_TASK, CONFIRM)
        wait_for("run A ended", lambda: stack.dag_run(DAG, run_a)["state"] in ("success", "failed"), 600, every_s=3)
        states = {t["task_id"]: t["state"] for t in stack.task_instances(DAG, run_a)}
        assert stack.dag_run(DAG, run_a)["state"] == "failed", states
        assert states[CONFIRM_TASK] == "failed" and states["history_digest"] == "upstream_failed", states
        report = stack.xcom(DAG, run_a, CONFIRM_TASK, key="report")
        assert report is not None, states
        assert (report["version_changed"], report["started_on"], report["running"]) == (True, old, new), report
        message = report["message"]
        assert f"ran on nexus-cutover {old} (recorded by" in message and f"runs nexus-cutover {new}" in message, message
        assert f"redeploy nexus-cutover {old}" in message and "it adopts the fence this failed run left" in message
        assert stack.xcom(DAG, run_a, CONFIRM_TASK, key="recheck") is None  # the answer's re-check never ran

        # nothing written: no checkpoint row, the fence still armed by run A, the history as it was
        assert _checkpoints(engine) == []
        fence = _fence(engine)
        assert (fence["ArmedBy"], fence["ReleasedAt"]) == (holder_a, None)
        assert code_version.version_in_reason(fence["Reason"]) == old
        assert history_checksum(engine) == history

        # going on with the new version: a new run adopts the fence the failed run left, recording the new version
        run_b = stack.trigger(DAG, _conf(), run_id=f"pinned_b_{uuid.uuid4().hex[:6]}")["dag_run_id"]
        wait_for("run B parked at the confirmation", lambda: _parked(stack, run_b), 600, every_s=3)
        assert stack.xcom(DAG, run_b, "resolve_packs", key="product_version") == new
        assert stack.xcom(DAG, run_b, "arm_fence")["outcome"] == "adopted"
        fence = _fence(engine)
        assert fence["ArmedBy"] == stored_holder(holder_of_airflow_run(DAG, run_b)) and fence["ReleasedAt"] is None
        assert code_version.version_in_reason(fence["Reason"]) == new
        assert f"adopted from {holder_a} (its run finished)" in fence["Reason"]
        assert _checkpoints(engine) == [] and history_checksum(engine) == history
    finally:
        stack.stop()
        engine.dispose()


def test_a_wait_deferred_across_a_release_is_stopped_by_its_trigger_before_it_polls(
        request, tmp_path, builds, team_venv, mysql_server_url):
    """The run waits, deferred, at ``wait_for_drain`` (an old item pending, its old worker live) when the new build
    is deployed: the restarted triggerer runs the wait's trigger on the new code, which ends the wait at once
    (its message in the trigger's log) without making its poller; the step resumed on a worker stops naming both
    versions; the pending WorkItem, the fence and the history are as they were."""
    request.node._nexus_uses_mysql = True
    old, _, new, new_wheel = builds
    made = mariadb_tenant(mysql_server_url, f"nx_pin_{uuid.uuid4().hex[:8]}",
                          lambda engine: (create_legacy_schema(engine), draining_tenant().write(engine)))
    engine = make_engine(made["dsn"])
    stack = AirflowStack(tmp_path / "airflow", parallelism=4, bin_dir=team_venv)
    try:
        stack.start(timeout_s=300)
        stack.put_connection(CONN_ID, **made["conn"])
        stack.wait_for_dag(DAG, timeout_s=300)
        # the live old worker stays live for the whole test: the drain waits, it never stops as stuck
        run = stack.trigger(DAG, _conf(stale_heartbeat=86400, drain_timeout=3600),
                            run_id=f"pinned_w_{uuid.uuid4().hex[:6]}")["dag_run_id"]
        wait_for("the drain deferred", lambda: _state(stack, run, "wait_for_drain") == "deferred", 600, every_s=3)
        assert stack.xcom(DAG, run, "resolve_packs", key="product_version") == old
        holder = stored_holder(holder_of_airflow_run(DAG, run))
        assert _fence(engine)["ArmedBy"] == holder
        history = history_checksum(engine)

        _deploy(stack, team_venv, new_wheel, new)

        wait_for("the run ended", lambda: stack.dag_run(DAG, run)["state"] in ("success", "failed"), 600, every_s=3)
        states = {t["task_id"]: t["state"] for t in stack.task_instances(DAG, run)}
        assert states["wait_for_drain"] == "failed" and states["check_old_writers"] == "upstream_failed", states
        report = stack.xcom(DAG, run, "wait_for_drain", key="report")
        assert report is not None and (report["started_on"], report["running"]) == (old, new), (states, report)
        # the triggerer, restarted on the new build, ended the wait before it made its poller
        said = f"the task that deferred) and the triggerer runs nexus-cutover {new}"
        assert _logged(stack.home, said), f"no log under {stack.home / 'logs'} says: {said}"
        fence = _fence(engine)
        assert (fence["ArmedBy"], fence["ReleasedAt"]) == (holder, None)
        assert history_checksum(engine) == history and _checkpoints(engine) == []
    finally:
        stack.stop()
        engine.dispose()

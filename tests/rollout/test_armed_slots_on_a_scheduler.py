"""Arm only what the workers can carry, on a real scheduler (issue 50, item 4): a ``per_wave`` rollout wave wider than
the armed slots arms its tenants one slot at a time, those that waited in the wave's declared order, their pauses'
tasks in the pool ``nexus_armed``; the wave's question asks the tenant that is armed and ready and never waits for
one waiting for a slot (which waits for the armed one's release, after that answer): each of those asks its own
question once armed, and every tenant is cut over.

Real ``airflow standalone`` (LocalExecutor, its scheduler and triggerer) with ``[nexus] armed_slots`` 1 and the pool
``nexus_armed`` of 1 slot created through the REST API; production-shaped SQLite tenants (``nexus_sim``'s, one active
pack); the new host started by the ``command`` controller; every question answered through the REST API, as a
person's browser does. What is asserted is read where it happened: each tenant's fence row (armed and released at),
Airflow's task instances (their pool) and the fence tasks' logs.
"""

from __future__ import annotations

import datetime as dt
import itertools
import time
import uuid

import pytest
from sqlalchemy import select

from nexus_airflow.armed_slots import ARMED_POOL
from nexus_airflow.declared import ARMED_WINDOWS
from nexus_airflow.rollout import run_id_for
from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_sim.scenario import TenantScenario
from nexus_sim.scenario.production import build_production_tenant
from scripts.demo import stop_pid_if_ours
from scripts.demo_airflow import AirflowStack, ApiError

pytestmark = pytest.mark.airflow

CUTOVER, ROLLOUT = "connector_projection_cutover", "tenant_rollout"
FENCE_TASK, RELEASE_TASK, WINDOW = ARMED_WINDOWS[CUTOVER]
CONFIRM = "Confirm: all old writers stopped"
WAVE_CONFIRM = "Confirm: every old writer of every tenant of this wave stopped"
TENANTS = 3  # wider than the one armed slot
SIZES = {"active_packs": 1, "plain_lanes": 2, "generations": 2, "greenfield_pack": False}


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    s = AirflowStack(tmp_path_factory.mktemp("airflow"), parallelism=4, extra_env={"NEXUS_ARMED_SLOTS": "1"})
    try:
        s.start()
        s.wait_for_dag(CUTOVER)
        s.wait_for_dag(ROLLOUT)
        s.put("/api/v2/pools", ARMED_POOL, {"name": ARMED_POOL, "slots": 1, "include_deferred": False,
                                            "description": "nexus-cutover: tasks of tenants' admission pauses"})
        yield s
    finally:
        s.stop()


def _tenant(stack, folder, seed: int) -> tuple[str, str]:
    name = f"a{uuid.uuid4().hex[:5]}"
    path = folder / f"{name}.db"
    path.touch()
    engine = make_engine(f"sqlite:///{path}")
    build_production_tenant(engine, namespace=name, seed=seed, **SIZES)
    sc = TenantScenario(namespace=name)
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id="old-writer-silent", heartbeat_age_s=3600)
    sc.write(engine)
    engine.dispose()
    stack.put_connection(f"nexus_tenant_{name}", "sqlite", host=str(path))
    return name, f"sqlite:///{path}"


def _fence(dsn: str, name: str) -> tuple[dt.datetime, dt.datetime | None]:
    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:
            f = catalog.AdmissionFence
            (row,) = conn.execute(select(f.c.ArmedAt, f.c.ReleasedAt).where(f.c.Namespace == name)).all()
            return row.ArmedAt, row.ReleasedAt
    finally:
        engine.dispose()


def _started(stack, run_id: str) -> bool:
    try:
        stack.dag_run(CUTOVER, run_id)
    except ApiError as exc:
        if exc.status == 404:
            return False
        raise
    return True


def _log(stack, run_id: str, task_id: str) -> str:
    ti = stack.request("GET", f"/api/v2/dags/{CUTOVER}/dagRuns/{run_id}/taskInstances/{task_id}")
    content = stack.request("GET", f"/api/v2/dags/{CUTOVER}/dagRuns/{run_id}/taskInstances/{task_id}/logs/"
                                   f"{ti['try_number']}?full_content=true")["content"]
    return "\n".join(str(line.get("event", line)) if isinstance(line, dict) else str(line) for line in content)


def test_a_wave_wider_than_the_armed_slots_arms_one_at_a_time_in_its_declared_order(stack, tmp_path):
    tenants = dict(_tenant(stack, tmp_path, seed) for seed in range(70, 70 + TENANTS))
    order = list(tenants)
    rollout = stack.trigger(ROLLOUT, {"tenants": order, "canary": 0, "wave_size": TENANTS, "max_parallel": TENANTS,
                                      "approval": "per_wave", "max_failed": 0,
                                      "cutover_conf": {"host_controller": "command", "poll_interval": 3,
                                                       "stale_heartbeat": 20, "readiness_timeout": 300,
                                                       "confirm_timeout": 900, "pre_arm_timeout": 900}})["dag_run_id"]
    runs = {run_id_for(rollout, name): name for name in order}
    answered: set[str] = set()  # the runs that asked their own question, and the rollout's wave question
    deadline = time.monotonic() + 900
    try:
        while stack.dag_run(ROLLOUT, rollout)["state"] not in ("success", "failed"):
            assert time.monotonic() < deadline, stack.task_instances(ROLLOUT, rollout)
            if rollout not in answered and stack.pending_hitl(ROLLOUT, rollout):
                stack.answer_hitl(ROLLOUT, rollout, "wave_00.confirm", WAVE_CONFIRM)
                answered.add(rollout)
            for run_id in runs:
                if run_id not in answered and _started(stack, run_id) and stack.pending_hitl(CUTOVER, run_id):
                    stack.answer_hitl(CUTOVER, run_id, "confirm_writers_stopped", CONFIRM)
                    answered.add(run_id)
            time.sleep(2)
        assert {r: stack.dag_run(CUTOVER, r)["state"] for r in runs} == dict.fromkeys(runs, "success")
        assert stack.dag_run(ROLLOUT, rollout)["state"] == "success"
        # the wave's question showed the tenant armed and ready; the ones waiting for its slot asked their own
        shown = stack.xcom(ROLLOUT, rollout, "wave_00.confirm", key="shown") or {}
        assert len(shown) == 1 and rollout in answered, shown
        assert answered - {rollout} == {r for r, name in runs.items() if name not in shown}, (answered, shown)
        # one tenant's admission paused at a time: the fences' windows never overlap
        fences = {r: _fence(tenants[name], name) for r, name in runs.items()}
        windows = sorted(fences.values())
        assert all(released is not None for _, released in windows), windows
        for (_, released), (armed_next, _) in itertools.pairwise(windows):
            assert released <= armed_next, windows
        # the tenants after the first waited before arming, admission open, said so, and armed in the wave's order
        logs = {r: _log(stack, r, FENCE_TASK) for r in runs}
        waited = [r for r in runs if "waits before arming, admission open: " in logs[r]]
        assert len(waited) >= TENANTS - 1, logs
        assert all("an armed slot is free after" in logs[r] for r in waited), logs
        assert sorted(waited, key=lambda r: fences[r][0]) == waited, (waited, fences)  # waited: declared order
        # every task of the pause ran in the armed pool; the fence task itself did not
        for run_id in runs:
            pools = {t["task_id"]: t["pool"] for t in stack.task_instances(CUTOVER, run_id)}
            assert {pools[t] for t in WINDOW} == {ARMED_POOL} and pools[FENCE_TASK] != ARMED_POOL, pools
    finally:
        for run_id in runs:
            host = stack.xcom(CUTOVER, run_id, "start_new_host") or {}
            if host.get("pid"):
                stop_pid_if_ours(int(host["pid"]), "nexus")

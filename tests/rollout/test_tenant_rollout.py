"""``tenant_rollout`` on a running Airflow: one per-tenant cutover run per tenant, a failure isolated.

Real ``airflow standalone`` (LocalExecutor, triggerer), the pool created over
REST with ``include_deferred``; three tenants: ``alpha`` on SQLite, ``gamma`` on
MariaDB (both drained, cut over for real, new host started by the ``command``
controller) and ``ghost``, whose connection does not exist. The writer-stop
confirmations are answered over REST as a person would in the UI.
"""

from __future__ import annotations

import random
import time

import pytest
from sqlalchemy.engine import make_url

from nexus_cutover.db import make_engine
from nexus_cutover.protocol_row import read_protocol_row
from nexus_cutover.schema import create_legacy_schema
from nexus_sim.scenario import TenantScenario, drained_pack_history
from scripts.demo import stop_pid_if_ours
from scripts.demo_airflow import AirflowStack

pytestmark = pytest.mark.airflow  # a real `airflow standalone` (mysql: set from mysql_url by tests/conftest.py)

ROLLOUT = "tenant_rollout"
CUTOVER = "connector_projection_cutover"
CONFIRM = "Confirm: all old writers stopped"


def _tenant(url: str, namespace: str, pack: str) -> None:
    engine = make_engine(url)
    try:
        create_legacy_schema(engine)
        sc = TenantScenario(namespace=namespace)
        drained_pack_history(sc.pack(pack), random.Random(5), lanes=2, generations=3)
        sc.write(engine)
    finally:
        engine.dispose()


def _checkpoint(url: str, pack: str):
    engine = make_engine(url)
    try:
        with engine.connect() as conn:
            return read_protocol_row(conn, pack)
    finally:
        engine.dispose()


@pytest.fixture
def stack(tmp_path):
    s = AirflowStack(tmp_path / "airflow", parallelism=4)
    s.start()
    yield s
    for run in s.request("GET", f"/api/v2/dags/{CUTOVER}/dagRuns?limit=50")["dag_runs"]:
        host = s.xcom(CUTOVER, run["dag_run_id"], "start_new_host") or {}
        if host.get("pid"):
            stop_pid_if_ours(int(host["pid"]), "nexus")
    s.stop()


def test_rollout_isolates_a_failed_tenant(stack, sqlite_url, mysql_url):


    _tenant(sqlite_url, "alpha", "pk-alpha")
    _tenant(mysql_url, "gamma", "pk-gamma")
    stack.put_connection("nexus_tenant_alpha", "sqlite", host=make_url(sqlite_url).database)
    g = make_url(mysql_url)
    secret = {"password": g.password} if g.password else {}
    stack.put_connection("nexus_tenant_gamma", "mysql", host=g.host, port=g.port or 3306, login=g.username,
                         schema=g.database, **secret)
    stack.request("POST", "/api/v2/pools", {"name": "nexus_tenant_rollout", "slots": 2, "include_deferred": True})
    stack.wait_for_dag(ROLLOUT)
    stack.wait_for_dag(CUTOVER)

    run = stack.trigger(ROLLOUT, {"tenants": ["alpha", "ghost", "gamma"], "cutover_conf": {
        "host_controller": "command", "poll_interval": 10, "stale_heartbeat": 20, "readiness_timeout": 300}})
    run_id = run["dag_run_id"]
    first_seen: dict[str, float] = {}
    deadline = time.monotonic() + 600
    while stack.dag_run(ROLLOUT, run_id)["state"] not in ("success", "failed"):
        assert time.monotonic() < deadline, "rollout did not finish in 10 minutes"
        pending = stack.request("GET", "/api/v2/dags/~/dagRuns/~/hitlDetails")["hitl_details"]
        for d in pending:
            ti = d["task_instance"]
            key = ti["dag_run_id"]
            if d.get("response_received") or ti["task_id"] != "confirm_writers_stopped":
                continue
            first_seen.setdefault(key, time.monotonic())
            if time.monotonic() - first_seen[key] >= 5:  # apache/airflow#71172: not within ~1 s of parking
                stack.answer_hitl(CUTOVER, key, "confirm_writers_stopped", CONFIRM)
        time.sleep(3)

    assert stack.dag_run(ROLLOUT, run_id)["state"] == "failed"  # ghost failed, so the rollout reports failure
    summary = stack.xcom(ROLLOUT, run_id, "summary", key="summary")
    tenants = summary["tenants"]
    assert tenants["alpha"]["state"] == "success" and tenants["gamma"]["state"] == "success"
    assert tenants["ghost"]["state"] == "failed" and tenants["ghost"]["failed_tasks"] == ["resolve_packs"]
    assert summary["not_succeeded"] == ["ghost"]
    # one per-tenant run each, named after the rollout run
    cutover_runs = {r["dag_run_id"] for r in stack.request("GET", f"/api/v2/dags/{CUTOVER}/dagRuns?limit=50")["dag_runs"]}
    assert {o["run_id"] for o in tenants.values()} == cutover_runs
    mapped = [t for t in stack.task_instances(ROLLOUT, run_id) if t["task_id"] == "cutover"]
    assert len(mapped) == 3 and {t["pool"] for t in mapped} == {"nexus_tenant_rollout"}
    assert sorted(t["state"] for t in mapped) == ["failed", "success", "success"]
    # the real effect: each good tenant has its checkpoint
    assert _checkpoint(sqlite_url, "pk-alpha").protocol_version == 1
    assert _checkpoint(mysql_url, "pk-gamma").protocol_version == 1

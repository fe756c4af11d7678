"""The writer-stop controller in the cutover DAG (issue 50, item 1): ``writers_stop_controller`` ``command`` stops a
real old-runtime process (the Variable ``nexus_writers_stop_command``), the person is shown its answer with the
registry evidence, the ledger keeps it; a failing command stops the run at the step with the fence held."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import threading

import pytest

from nexus_cutover import ledger as L
from nexus_cutover.projection.transition import CUTOVER
from tests.dags.airflow_harness import HitlAnswerer, run_dag
from tests.dags.cutover_support import DAG_ID, NS, Deployer, base_conf, drained_tenant, snapshot
from tests.projection.test_writers_stop_controller import SIM_PROCESSES, STOP_SCRIPT, _live, _until

CONFIRM = "Confirm: all old writers stopped"


@pytest.fixture
def old_runtime_process(tenant, mysql_url, tmp_path):
    """A real old-runtime simulator process of the tenant, live; its pid in ``<tmp>/<tenant>.pid``."""
    engine, conn_id = tenant
    drained_tenant().write(engine)
    proc = subprocess.Popen([sys.executable, "-m", "nexus_sim.old_runtime", "--namespace", NS, "--process-id", "old-rt",
                             "--poll", "0.1"], env={**os.environ, "NEXUS_TENANT_DSN": mysql_url},
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (tmp_path / f"{NS}.pid").write_text(str(proc.pid))
    reaper = threading.Thread(target=proc.wait, daemon=True)
    reaper.start()
    try:
        _until(lambda: sorted(_live(engine)) == SIM_PROCESSES, "the old runtime registers and heartbeats")
        yield engine, conn_id, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        reaper.join(timeout=30)


def _ledger(tenant_connection, tmp_path, monkeypatch):
    monkeypatch.setenv("NEXUS_LEDGER_SPOOL_DIR", str(tmp_path / "spool"))
    path = tmp_path / "ledger" / "nexus-ledger.db"
    tenant_connection("nexus_ledger", raw_json=json.dumps({"conn_type": "sqlite", "host": str(path)}))
    return path


def _rows(path) -> list[dict]:
    engine = L.ledger_engine(f"sqlite:///{path}")
    try:
        return L.history(engine, NS)
    finally:
        engine.dispose()


def test_a_command_controller_stops_the_real_old_runtime_and_its_answer_is_shown_and_kept(
        dag, old_runtime_process, tenant_connection, tmp_path, monkeypatch):
    engine, conn_id, sim = old_runtime_process
    monkeypatch.setenv("AIRFLOW_VAR_NEXUS_WRITERS_STOP_COMMAND",
                       json.dumps([sys.executable, "-c", STOP_SCRIPT, str(tmp_path)]))
    ledger = _ledger(tenant_connection, tmp_path, monkeypatch)
    with Deployer(engine) as deployer, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}) as hitl:
        tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
        result = run_dag(dag, base_conf(conn_id, writers_stop_controller="command", stale_heartbeat=5))
    assert not hitl.errors, hitl.errors
    assert result.state == "success", result.task_states
    assert sim.poll() is not None  # the controller stopped the real process
    answer = result.xcom("stop_old_writers")
    assert answer["ok"] and answer["exit_code"] == 0 and sorted(answer["stopped"]) == SIM_PROCESSES
    assert "no dsn" in answer["output_tail"]
    asked = [json.dumps(d) for d in hitl.seen if "stop every old writer before the cutover checkpoint" in json.dumps(d)]
    assert asked and all("What the writer-stop controller did" in q and "no dsn" in q for q in asked)  # + the registry
    rows = [r for r in _rows(ledger) if r["run_id"] == result.run_id]
    kinds = [r["kind"] for r in rows]
    assert kinds.index(L.DRAIN_DONE) < kinds.index(L.WRITERS_STOPPED) < kinds.index(L.EVIDENCE_SHOWN)
    (shown,) = [r for r in rows if r["kind"] == L.EVIDENCE_SHOWN]
    assert shown["detail"]["evidence"]["writers_stop"]["exit_code"] == 0


def test_a_failing_command_stops_the_run_at_the_step_with_the_fence_held(dag, old_runtime_process, tenant_connection,
                                                                         tmp_path, monkeypatch):
    engine, conn_id, sim = old_runtime_process
    monkeypatch.setenv("AIRFLOW_VAR_NEXUS_WRITERS_STOP_COMMAND",
                       json.dumps([sys.executable, "-c", "print('kubectl: forbidden'); raise SystemExit(5)"]))
    ledger = _ledger(tenant_connection, tmp_path, monkeypatch)
    result = run_dag(dag, base_conf(conn_id, writers_stop_controller="command", stale_heartbeat=5))
    assert result.state == "failed" and result.state_of("stop_old_writers") == "failed", result.task_states
    assert all(state == "upstream_failed" for task, state in result.task_states.items()
               if task.startswith(("check_old_writers", "confirm_writers_stopped", "audit_and_checkpoint",
                                   "start_new_host"))), result.task_states
    report = result.xcom("stop_old_writers", key="report")
    assert report["exit_code"] == 5 and "kubectl: forbidden" in report["output_tail"]
    snap = snapshot(engine)
    assert snap["fences"] == [("*", True, False)] and snap["protocol_rows"] == []  # fence held, nothing written
    assert sim.poll() is None
    rows = [r for r in _rows(ledger) if r["run_id"] == result.run_id]
    assert (rows[-1]["step"], rows[-1]["kind"]) == ("stop_old_writers", L.STOPPED)
    assert "exited with 5" in rows[-1]["reason"]


@pytest.mark.parametrize("controller", ["command", "http"])
def test_a_controller_the_deployment_has_not_configured_is_refused_before_any_write(dag, tenant, monkeypatch,
                                                                                   controller):
    """Without the Variable (command) or the connection (http) the run's first task refuses, naming what is missing:
    no fence armed, no schema created (it used to stop at stop_old_writers with the fence held)."""
    engine, conn_id = tenant
    drained_tenant().write(engine)
    monkeypatch.delenv("AIRFLOW_VAR_NEXUS_WRITERS_STOP_COMMAND", raising=False)
    result = run_dag(dag, base_conf(conn_id, writers_stop_controller=controller,
                                    writers_stop_http_conn_id="nexus_deployer_nowhere"))
    first = CUTOVER.names[0]
    assert result.state == "failed" and result.state_of(first) == "failed", result.task_states
    assert result.state_of("arm_fence") == "upstream_failed"
    report = json.dumps(result.xcom(first, key="report") or {})
    named = "nexus_writers_stop_command" if controller == "command" else "nexus_deployer_nowhere"
    assert named in report, report
    snap = snapshot(engine)
    assert snap["fences"] == [] and snap["protocol_rows"] is None  # not even the additive schema

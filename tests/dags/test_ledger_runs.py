"""The delivery ledger through real cutover runs (dag.test, real tasks, the HITL answered over REST) on the
production-shaped tenant: every event of a run in order (holder, evidence digest, who answered, cutoffs, the digest
verified); a ledger outage in the middle of a run (PostgreSQL stopped: the run's safety unchanged, it completes, the
events spooled, caught up once the ledger is back, counted as metrics on a real StatsD listener); and the report (CLI
JSON/CSV, the status view's page) after Airflow's own API deleted the run's metadata."""

from __future__ import annotations

import csv
import io
import json
import os
import subprocess
import sys
import time

import pytest
from sqlalchemy import select

from nexus_cutover import catalog
from nexus_cutover import ledger as L
from nexus_cutover.db import make_engine
from nexus_cutover.ledger_spool import HOST
from nexus_cutover.metrics import name_safe
from nexus_sim.scenario.production import build_production_tenant
from tests.dags.airflow_harness import HitlAnswerer, run_dag
from tests.dags.cutover_support import DAG_ID, NS, Deployer, base_conf, old_runtime
from tests.ledger_support import ledger_postgres
from tests.statsd_listener import StatsdListener
from tests.support import mysql_database

CONFIRM = "Confirm: all old writers stopped"
#: A full run's events, in order (one checkpoint per pack where ``checkpoint`` stands).
RUN_KINDS = [L.FENCE_ARMED, L.DRAIN_DONE, L.EVIDENCE_SHOWN, L.ANSWER, L.DIGEST_TAKEN, "checkpoint", L.HOST_STARTED,
             L.FENCE_RELEASED, L.DIGEST_VERIFIED]


@pytest.fixture
def production_tenant(request, mysql_server_url, tenant_connection):
    """``(engine, conn_id)``: the production-shaped tenant on a MariaDB database of utf8mb4 (its default collation)."""
    request.node._nexus_uses_mysql = True
    with mysql_database(mysql_server_url, charset="utf8mb4") as url:
        engine = make_engine(url)
        try:
            build_production_tenant(engine, namespace=NS, in_flight_generations=2)
            yield engine, tenant_connection("nexus_tenant_acme_ledger", url)
        finally:
            engine.dispose()


@pytest.fixture
def spool(tmp_path, monkeypatch):
    folder = tmp_path / "spool"
    monkeypatch.setenv("NEXUS_LEDGER_SPOOL_DIR", str(folder))
    return folder


def cutover(engine, conn_id, tenant_connection, *, answer=CONFIRM):
    """One real run of the cutover DAG on the tenant: old runtime draining, a person answering over REST, the new
    host started by the deployer endpoint."""
    with Deployer(engine) as deployer, old_runtime(engine, fail_attempts=1, retry_delay_s=0.3), \
            HitlAnswerer(DAG_ID, {"confirm_writers_stopped": answer}) as hitl:
        tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
        result = run_dag(_dag(), base_conf(conn_id))
    assert not hitl.errors, hitl.errors
    assert result.state == "success", result.task_states
    return result


def _dag():
    from tests.dags.airflow_harness import load_dag

    return load_dag(DAG_ID)


def expected_kinds(result) -> list[str]:
    packs = result.xcom("resolve_packs")
    return [k for kind in RUN_KINDS for k in ([L.CHECKPOINT] * len(packs) if kind == "checkpoint" else [kind])]


def assert_the_runs_record(rows: list[dict], result) -> None:
    """The run's rows, in order, say what the run's own results say."""
    mine = [r for r in rows if r["run_id"] == result.run_id]
    assert [r["kind"] for r in mine] == expected_kinds(result), [(r["step"], r["kind"]) for r in mine]
    by_kind = {}
    for r in mine:
        by_kind.setdefault(r["kind"], []).append(r)
    holder = result.xcom("arm_fence")["holder"]
    assert holder and result.run_id in holder
    assert by_kind[L.FENCE_ARMED][0]["holder"] == holder and by_kind[L.FENCE_ARMED][0]["outcome"] == "armed"
    assert by_kind[L.FENCE_RELEASED][0]["holder"] == holder
    release = result.xcom("resume_admission")
    assert by_kind[L.FENCE_RELEASED][0]["detail"]["admission_pause_s"] == release["admission_pause_s"]
    # the evidence the person saw, its digest on the question and on the answer; who answered, when
    evidence = result.xcom("confirm_writers_stopped", key="evidence")
    shown, answer = by_kind[L.EVIDENCE_SHOWN][0], by_kind[L.ANSWER][0]
    assert shown["digest"] == answer["digest"] == L.digest_of(evidence)
    assert shown["detail"]["evidence_checked_at"] == evidence["checked_at"]
    # the evidence itself, not only its digest: the writer table as the person saw it (issue 51, item 3)
    kept = shown["detail"]["evidence"]
    assert [p["process_id"] for p in kept["processes"]] == [p["process_id"] for p in evidence["processes"]]
    assert [p["state"] for p in kept["processes"]] == [p["state"] for p in evidence["processes"]]
    assert kept["rows_kept"] == kept["rows_total"] == len(evidence["processes"])
    confirmation = result.xcom("confirm_writers_stopped")
    assert answer["actor"] == confirmation["responded_by"] and answer["outcome"] == "confirmed"
    assert answer["detail"]["chosen_options"] == [CONFIRM]
    assert shown["recorded_at"] <= answer["recorded_at"]
    # the cutoffs, per pack
    outs = [result.xcom("audit_and_checkpoint", map_index=i) for i in range(len(result.xcom("resolve_packs")))]
    assert {r["pack"]: r["cutoff"] for r in by_kind[L.CHECKPOINT]} == {o["pack_install_id"]: o["legacy_max_ordinal"]
                                                                     for o in outs}
    assert all(r["outcome"] == "written" for r in by_kind[L.CHECKPOINT])
    # the digest taken and verified
    digest = result.xcom("history_digest")["hash"]
    assert by_kind[L.DIGEST_TAKEN][0]["digest"] == digest
    verified = by_kind[L.DIGEST_VERIFIED][0]
    assert verified["digest"] == digest and verified["outcome"] == "verified"
    assert result.xcom("final_old_writer_check")["history_digest"]["verified"] is True
    assert by_kind[L.HOST_STARTED][0]["outcome"] == "started"
    assert all(r["tenant"] == NS and r["dag_id"] == DAG_ID for r in mine)


def delete_the_run(result) -> None:
    """The run's metadata deleted through Airflow's own REST API (what `airflow db clean` does to an old run)."""
    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    client = TestClient(create_app(apps="core"))
    resp = client.delete(f"/api/v2/dags/{DAG_ID}/dagRuns/{result.run_id}")
    assert resp.status_code == 204, resp.text
    from airflow.models.dagrun import DagRun
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session

    with create_session() as session:
        assert session.scalar(select(DagRun.id).where(DagRun.run_id == result.run_id)) is None
        assert session.scalars(select(XComModel.key).where(XComModel.run_id == result.run_id)).all() == []


def cli_report(dsn: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, L.DSN_ENV_LEDGER: dsn}
    env.pop("NEXUS_TENANT_DSN", None)
    return subprocess.run([os.path.join(os.path.dirname(sys.executable), "nexus-cutover"), "report", "-namespace", NS,
                           *args], env=env, capture_output=True, text=True, timeout=120)


def test_a_cutover_run_is_on_the_ledger_and_its_report_survives_the_metadata(airflow_db, production_tenant,
                                                                             tenant_connection, spool, tmp_path):
    engine, conn_id = production_tenant
    path = tmp_path / "ledger" / "nexus-ledger.db"
    tenant_connection("nexus_ledger", raw_json=json.dumps({"conn_type": "sqlite", "host": str(path)}))

    result = cutover(engine, conn_id, tenant_connection)

    ledger = L.ledger_engine(f"sqlite:///{path}")
    try:
        rows = L.history(ledger, NS)
    finally:
        ledger.dispose()
    assert_the_runs_record(rows, result)
    assert not spool.exists() or not list(spool.glob("*.jsonl"))  # nothing waited: the ledger was up

    delete_the_run(result)

    # the report, from the ledger alone: the command line (JSON, CSV) and the status view (page, JSON, CSV)
    as_json = cli_report(f"sqlite:///{path}", "-json")
    assert as_json.returncode == 0, as_json.stderr
    assert json.loads(as_json.stdout)["events"] == rows
    as_csv = cli_report(f"sqlite:///{path}", "-csv")
    assert as_csv.returncode == 0, as_csv.stderr
    kept = list(csv.DictReader(io.StringIO(as_csv.stdout)))
    assert [(r["kind"], r["actor"], r["digest"], r["cutoff"]) for r in kept] == [
        (r["kind"], r["actor"] or "", r["digest"] or "", "" if r["cutoff"] is None else str(r["cutoff"])) for r in rows]

    from airflow.api_fastapi.app import create_app
    from fastapi.testclient import TestClient

    client = TestClient(create_app(apps="core"))
    page = client.get(f"/nexus-status/report?tenant={NS}")
    assert page.status_code == 200, page.text
    answer = next(r for r in rows if r["kind"] == L.ANSWER)
    assert answer["actor"] in page.text and answer["digest"] in page.text and result.run_id in page.text
    assert page.text.count('<tr class="event ') == len(rows)
    api = client.get(f"/nexus-status/api/report?tenant={NS}&format=json")
    assert api.status_code == 200 and api.json()["events"] == rows
    download = client.get(f"/nexus-status/api/report?tenant={NS}&format=csv")
    assert download.status_code == 200 and "attachment" in download.headers["content-disposition"]
    assert download.text.replace("\r\n", "\n") == as_csv.stdout  # the subprocess read its CSV in text mode
    listing = client.get("/nexus-status/")
    assert 'class="report-link" href="report?tenant=' in listing.text


def test_a_ledger_outage_mid_run_changes_nothing_of_the_cutover_and_is_caught_up(
        airflow_db, production_tenant, tenant_connection, spool, monkeypatch):
    from nexus_airflow import ledger as recorder
    from nexus_airflow import metrics

    engine, conn_id = production_tenant
    with ledger_postgres() as pg, StatsdListener() as statsd:
        url = L.ledger_url(pg.database_url())
        tenant_connection("nexus_ledger", raw_json=json.dumps({
            "conn_type": "postgres", "host": url.host, "port": url.port, "login": url.username,
            "password": url.password, "schema": url.database}))
        for key, value in {"STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(statsd.port),
                           "STATSD_PREFIX": "ledgertest"}.items():
            monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
        monkeypatch.setattr(metrics, "_initialized_in", None)  # this process's client again, from [metrics] now

        def down_then_confirm(detail):  # the ledger goes down while the person reads the question
            pg.pause()
            return CONFIRM

        try:
            result = cutover(engine, conn_id, tenant_connection, answer=down_then_confirm)
            # the run's safety is the same as with a ledger: re-checked answer, every pack checkpointed, released
            assert result.xcom("confirm_writers_stopped")["evidence_age_s"] is not None
            packs = result.xcom("resolve_packs")
            with engine.connect() as conn:
                p = catalog.ConnectorProjectionProtocol
                assert sorted(conn.execute(select(p.c.PackInstallId)).scalars()) == sorted(packs)
                f = catalog.AdmissionFence
                assert conn.execute(select(f.c.ReleasedAt).where(f.c.Namespace == NS)).scalar_one() is not None
            spooled = sum(len(x.read_text().splitlines()) for x in spool.glob("*.jsonl"))
            assert spooled == len(expected_kinds(result)) - 3  # all but the fence, the drain and the question

            pg.resume()  # the ledger is back: what it has is only what was written before the outage
            ledger = L.ledger_engine(str(url.render_as_string(hide_password=False)))
            try:
                before = L.history(ledger, NS)
                assert [r["kind"] for r in before] == [L.FENCE_ARMED, L.DRAIN_DONE, L.EVIDENCE_SHOWN]
                # the next record call on this machine (any run's step) writes the spool first
                assert recorder.record([]) == "nothing"
                assert not list(spool.glob("*.jsonl")) and not list(spool.glob("*claimed*"))
                assert recorder.record([]) == "nothing"  # caught up once: a second call writes nothing again
                rows = L.history(ledger, NS)
            finally:
                ledger.dispose()
            assert_the_runs_record(rows, result)
            assert len(rows) == len(expected_kinds(result))

            deadline = time.monotonic() + 10
            while time.monotonic() < deadline:
                got = statsd.values("ledgertest")
                if sum(got.get((f"nexus.ledger.caught_up.{NS}", "c"), [])) >= spooled:
                    break
                time.sleep(0.2)
            assert sum(got.get((f"nexus.ledger.spooled.{NS}", "c"), [])) == spooled
            assert sum(got.get((f"nexus.ledger.caught_up.{NS}", "c"), [])) == spooled
            assert got.get(("nexus.ledger.pending", "g"), [None])[-1] == 0
            assert max(got.get(("nexus.ledger.pending", "g"), [0])) == spooled
            mine = got.get((f"nexus.ledger.pending.{name_safe(HOST)}", "g"), [])  # this machine's own series
            assert mine and (max(mine), mine[-1]) == (spooled, 0), mine
        finally:
            monkeypatch.setattr(metrics, "_initialized_in", None)

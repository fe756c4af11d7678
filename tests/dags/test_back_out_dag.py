"""The back-out DAG (issue 51, item 7) through real runs (dag.test, real tasks, the question answered over REST):
a cutover rejected at its writer-stop question, then backed out (its fence released without a cutover, recorded in
the delivery ledger, BACKED OUT told to the run's channel); the back-out's own question rejected (the fence kept);
and a tenant already checkpointed, which the back-out refuses before asking anyone."""

from __future__ import annotations

import json

import pytest
from sqlalchemy import select

from nexus_cutover import catalog
from nexus_cutover import ledger as L
from nexus_cutover.projection.transition import BACK_OUT
from tests.dags.airflow_harness import HitlAnswerer, load_dag, run_dag
from tests.dags.cutover_support import DAG_ID, NS, base_conf, drained_tenant, history_bytes
from tests.notify_sinks import SlackWebhookSink

APPROVE = "Back out: release the fence without a cutover"


@pytest.fixture
def ledger_file(tmp_path, tenant_connection):
    path = tmp_path / "ledger.db"
    tenant_connection("nexus_ledger", raw_json=json.dumps({"conn_type": "sqlite", "host": str(path)}))
    return path


@pytest.fixture
def channel(tenant_connection):
    with SlackWebhookSink() as hook:
        tenant_connection("nexus_notify_back_out", raw_json=hook.connection_json())
        yield hook


def fences(engine) -> list[tuple]:
    f = catalog.AdmissionFence
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(f.c.FenceId, f.c.ArmedBy, f.c.ReleasedBy, f.c.ReleasedAt))]


def rejected_cutover(dag, engine, conn_id):
    drained_tenant().write(engine)
    with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": "Reject"}) as hitl:
        result = run_dag(dag, base_conf(conn_id))
    assert not hitl.errors and result.state == "failed", result.task_states
    [(fence_id, armed_by, released_by, released_at)] = fences(engine)
    assert released_at is None and result.run_id in armed_by
    return result, fence_id


def back_out_conf(conn_id: str) -> dict:
    return {"tenant": NS, "conn_id": conn_id, "notify_conn_id": "nexus_notify_back_out", "confirm_timeout": 300}


def test_a_rejected_cutover_is_backed_out_from_the_ui_and_recorded(dag, tenant, ledger_file, channel):
    engine, conn_id = tenant
    cutover, fence_id = rejected_cutover(dag, engine, conn_id)
    before = history_bytes(engine)
    with HitlAnswerer(BACK_OUT.name, {"confirm_back_out": APPROVE}) as hitl:
        result = run_dag(load_dag(BACK_OUT.name), back_out_conf(conn_id))
    assert not hitl.errors, hitl.errors
    assert result.state == "success", result.task_states
    look = result.xcom("look_before_back_out")
    assert look["fence_id"] == fence_id and look["holder_state"] == "finished" and look["checkpointed"] == []
    done = result.xcom("back_out")
    assert (done["outcome"], done["fence_id"], done["previous_holder"]) == ("backed_out", fence_id, fences(engine)[0][1])
    [(_, armed_by, released_by, released_at)] = fences(engine)
    assert cutover.run_id in armed_by and result.run_id in released_by and released_at is not None
    assert history_bytes(engine) == before
    engine_l = L.ledger_engine(f"sqlite:///{ledger_file}")
    try:
        rows = [r for r in L.history(engine_l, NS) if r["run_id"] == result.run_id]
    finally:
        engine_l.dispose()
    assert [(r["step"], r["kind"], r["outcome"]) for r in rows] == [
        ("confirm_back_out", L.EVIDENCE_SHOWN, "asked"), ("confirm_back_out", L.ANSWER, "confirmed"),
        ("back_out", L.BACKED_OUT, "backed_out")]
    assert rows[0]["digest"] == rows[1]["digest"] and rows[0]["detail"]["evidence"]["fence"]["FenceId"] == fence_id
    assert rows[2]["detail"]["admission_pause_s"] == done["admission_pause_s"]
    backed = [t for t in channel.texts() if "BACKED OUT" in t]
    assert len(backed) == 1 and f"cutover fence {fence_id}" in backed[0] and "without a cutover" in backed[0], \
        channel.subjects()
    # the cutover can start over: a new run arms a new fence (the old one stays released)
    assert not any("FAILED" in s and BACK_OUT.name in s for s in channel.subjects())


def test_keeping_the_fence_fails_the_back_out_and_releases_nothing(dag, tenant, ledger_file, channel):
    engine, conn_id = tenant
    _, fence_id = rejected_cutover(dag, engine, conn_id)
    with HitlAnswerer(BACK_OUT.name, {"confirm_back_out": "Keep the fence"}) as hitl:
        result = run_dag(load_dag(BACK_OUT.name), back_out_conf(conn_id))
    assert not hitl.errors and result.state == "failed", result.task_states
    assert result.state_of("confirm_back_out") == "failed" and result.state_of("back_out") == "upstream_failed"
    assert fences(engine)[0][3] is None


def test_a_checkpointed_tenant_is_refused_before_anyone_is_asked(dag, tenant, ledger_file, channel):
    engine, conn_id = tenant
    _, fence_id = rejected_cutover(dag, engine, conn_id)
    with engine.begin() as conn:  # a checkpoint, as a later run of the cutover would have written it
        pack = conn.execute(select(catalog.PackInstall.c.PackInstallId)).scalars().first()
        conn.execute(catalog.ConnectorProjectionProtocol.insert().values(
            PackInstallId=pack, ProtocolVersion=1, LegacyMaxOrdinal=1, WrittenAt=fences_armed_at(engine),
            WrittenBy="airflow:test"))
    with HitlAnswerer(BACK_OUT.name, {"confirm_back_out": APPROVE}) as hitl:
        result = run_dag(load_dag(BACK_OUT.name), back_out_conf(conn_id))
    assert result.state == "failed" and result.state_of("look_before_back_out") == "failed", result.task_states
    assert hitl.responses == []  # nobody was asked
    assert "already have their one-time checkpoint" in json.dumps(result.xcom("look_before_back_out", key="report"))
    assert fences(engine)[0][3] is None


def fences_armed_at(engine):
    with engine.connect() as conn:
        return conn.execute(select(catalog.AdmissionFence.c.ArmedAt)).scalar()

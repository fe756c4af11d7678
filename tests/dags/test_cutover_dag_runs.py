"""Real runs of the cutover DAG (dag.test, real tasks) against real tenant databases on MariaDB."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import time

import pytest
from sqlalchemy import select, update
from sqlalchemy.engine import make_url

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.projection import drain
from nexus_cutover.projection.digest import HistoryDigest
from nexus_cutover.projection.steps import verify_history
from nexus_cutover.schema import create_legacy_schema
from nexus_sim.checks import live_ordinary_work, projection_owners_after_cutoff, receipt_outcomes
from nexus_sim.scenario import utcnow
from nexus_sim.scenario.production import FUTURE_COLLISION, build_production_tenant
from nexus_sim.traffic import LiveTraffic
from tests.dags.airflow_harness import HitlAnswerer, run_dag
from tests.dags.cutover_support import (
    DAG_ID,
    NS,
    PACKS,
    Deployer,
    base_conf,
    drained_tenant,
    draining_tenant,
    history_bytes,
    max_ordinal,
    no_range_starts,
    old_runtime,
    snapshot,
)
from tests.support import mysql_database, table_checksum

CONFIRM = "Confirm: all old writers stopped"
DOWNSTREAM_OF_DRAIN = ("check_old_writers", "confirm_writers_stopped", "start_new_host", "resume_admission")


def asset_events(uri: str) -> list[dict]:
    from airflow.models.asset import AssetEvent, AssetModel
    from airflow.utils.session import create_session

    with create_session() as session:
        rows = session.execute(
            select(AssetEvent.extra).join(AssetModel, AssetModel.id == AssetEvent.asset_id).where(AssetModel.uri == uri)
        ).all()
        return [r[0] for r in rows]


@pytest.fixture
def production_tenant(request, mysql_server_url, tenant_connection):
    """``(engine, conn_id, url)``: a MariaDB tenant database of the server's utf8mb4 default collation
    (case-insensitive, PAD SPACE: case-variant lanes are one identity, case-variant receipt ids collide)."""
    request.node._nexus_uses_mysql = True  # counted in the terminal summary
    with mysql_database(mysql_server_url, charset="utf8mb4") as url:
        engine = make_engine(url)
        try:
            yield engine, tenant_connection("nexus_tenant_acme_prod", url), url
        finally:
            engine.dispose()


def test_end_to_end_on_the_production_tenant_with_live_traffic_and_the_reference_host(dag, production_tenant,
                                                                                       monkeypatch):
    """The production-shaped tenant (ordinary work in every status, hostile lanes and receipt ids, 10,000 stopped
    registry rows, old projection work in flight): old workers drain it in a thread while ordinary work keeps
    arriving; a person confirms over REST; the reference host (started by the run) takes over and admits the
    receipts the traffic sends from the release on. Nothing waited for ordinary work, every pack is checkpointed,
    the history digest verifies at the end of the run and again after more traffic."""
    engine, conn_id, url = production_tenant
    t0 = time.monotonic()
    tenant = build_production_tenant(engine, namespace=NS, in_flight_generations=3)
    built_s = time.monotonic() - t0
    planted, sc = tenant.planted, tenant.scenario
    monkeypatch.setenv("NEXUS_HOST_HEARTBEAT_S", "0.5")
    monkeypatch.setenv("NEXUS_HOST_POLL_S", "0.2")
    conf = base_conf(conn_id, host_controller="command")
    traffic = LiveTraffic(engine, planted, receipts_after_release=True, future_per_tick=2, interval_s=0.3)
    with old_runtime(engine, fail_attempts=1, retry_delay_s=0.3) as sim, HitlAnswerer(
        DAG_ID, {"confirm_writers_stopped": CONFIRM}
    ) as hitl, traffic:
        result = run_dag(dag, conf)
        deadline = time.monotonic() + 60
        while traffic.report.ticks_after_release < 3 and time.monotonic() < deadline:
            time.sleep(0.3)  # more traffic after the run, for the host to admit and the digest to survive
    host = result.xcom("start_new_host") or {}
    try:
        assert built_s < 30, f"building the production tenant took {built_s:.1f}s"
        assert not hitl.errors, hitl.errors
        assert result.state == "success", result.task_states
        # issue 36, item 4: the readiness wait and the release are one task inside the pause, each step its record
        assert "verify_readiness" not in result.task_states and result.state_of("resume_admission") == "success"
        assert result.xcom("resume_admission", key="verify_readiness")["ready"] is True
        assert result.xcom("resume_admission", key="resume_admission") == result.xcom("resume_admission")
        assert result.xcom("resume_admission")["outcome"] == "released"
        assert [code for code, _ in hitl.responses] == [200]
        body = hitl.seen[0]["body"]
        assert "old-rt/projection_worker" in body and "**stopped**" in body  # the evidence the person saw
        assert sim.live_old_work() == 0
        assert result.xcom("wait_for_drain")["state"] == "drained"
        report = traffic.report
        assert not report.errors, report.errors
        assert report.receipts_held > 0 and report.ticks_after_release >= 3  # receipts only for the new host

        packs = planted.active_packs
        outs = [result.xcom("audit_and_checkpoint", map_index=i) for i in range(len(packs))]
        assert sorted(o["pack_install_id"] for o in outs) == sorted(packs)
        assert all(o["outcome"] == "written" for o in outs), outs
        cutoffs = {o["pack_install_id"]: o["legacy_max_ordinal"] for o in outs}
        for pack in packs:  # ordinary and old-runtime ordinals before the checkpoint count; traffic after it is above
            assert planted.last_ordinal.get(pack, 0) <= cutoffs[pack] <= max_ordinal(engine, pack)
        snap = snapshot(engine)
        assert snap["protocol_rows"] == sorted((p, 1, cutoffs[p]) for p in packs)
        assert snap["fences"] == [("*", True, True)]
        extras = asset_events(f"nexus://{NS}/connector-projection-ranges")
        assert any(e.get("cutoffs") == cutoffs for e in extras), extras
        assert result.xcom("final_old_writer_check")["history_digest"]["verified"] is True

        # after the release: the new host admits what the traffic sends (hostile lanes, case-variant receipt ids)
        collisions = [(f.pack_install_id, f.source_lane, f.receipt_id) for f in report.collisions_stored]
        admissible = report.receipts + [(f.pack_install_id, f.source_lane, f.receipt_id)
                                        for f, outcome in report.future_sent
                                        if outcome == "stored" and f.kind != FUTURE_COLLISION]
        assert report.receipts and collisions, report  # a case-insensitive tenant: the planned collisions arrive
        deadline = time.monotonic() + 90
        while not all(receipt_outcomes(engine, admissible).values()) and time.monotonic() < deadline:
            time.sleep(0.5)
        assert all(receipt_outcomes(engine, admissible).values()), receipt_outcomes(engine, admissible)
        assert set(receipt_outcomes(engine, collisions).values()) == {False}  # left for review, never acknowledged
        owners = projection_owners_after_cutoff(engine, cutoffs)
        assert owners["not_exactly_one"] == [] and owners["checked"] >= len(admissible), owners
        assert owners["ordinary_above_cutoff"] > 0
        held = live_ordinary_work(engine, sc.work_items)
        assert held and all(was == now for was, now in held.values()), held  # nothing waited for ordinary work
        verification = verify_history(engine, HistoryDigest.from_json(result.xcom("history_digest", key="digest")),
                                      timeout_s=60)
        assert verification.ok, verification.summary()
    finally:
        if host.get("pid"):
            os.kill(host["pid"], signal.SIGTERM)
            for _ in range(100):
                try:
                    os.waitpid(host["pid"], os.WNOHANG)
                    os.kill(host["pid"], 0)
                except (ChildProcessError, ProcessLookupError):
                    break
                time.sleep(0.1)


STUCK_CASES = {
    "retry_not_due": drain.CAUSE_RETRY_NOT_DUE,
    "blocked_external": drain.CAUSE_BLOCKED_EXTERNAL,
    "no_live_old_worker": drain.CAUSE_NO_LIVE_OLD_WORKER,
}


@pytest.mark.parametrize("case", list(STUCK_CASES))
def test_stuck_drain_stops_and_reports(dag, tenant, case):
    engine, conn_id = tenant
    now = utcnow()
    sc = drained_tenant()
    lane = sc.packs[0].lane("lane-stuck")
    if case == "retry_not_due":
        _, item = lane.generation(1, status="retry", attempt=2, next_attempt_at=now + dt.timedelta(hours=3))
    elif case == "blocked_external":
        _, item = lane.generation(1, status="blocked", blocked_on="erp://invoices/77")
    else:
        _, item = lane.generation(2, status="pending")
    if case != "no_live_old_worker":
        sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-live")  # heartbeat fresh for this run
    sc.write(engine)
    before = history_bytes(engine)

    result = run_dag(dag, base_conf(conn_id, drain_timeout=600, stale_heartbeat=600))

    assert result.state == "failed"
    assert result.state_of("wait_for_drain") == "failed"
    for task_id in DOWNSTREAM_OF_DRAIN:
        assert result.state_of(task_id) == "upstream_failed", (task_id, result.task_states)
    report = result.xcom("wait_for_drain", key="report")
    assert report["state"] == "stuck"
    assert list(report["blockers"]) == [STUCK_CASES[case]], report
    assert [i["work_id"] for i in report["blockers"][STUCK_CASES[case]]] == [item["WorkId"]]
    assert "Do not change WorkItem status" in result.xcom("wait_for_drain", key="report_text")
    assert history_bytes(engine) == before and no_range_starts(engine)
    snap = snapshot(engine)
    assert snap["fences"] == [("*", True, False)]  # the fence stays armed
    assert snap["protocol_rows"] == []


def test_rejected_confirmation_fails_the_run_and_keeps_the_fence(dag, tenant):
    engine, conn_id = tenant
    drained_tenant().write(engine)
    before = history_bytes(engine)
    with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": "Reject"}) as hitl:
        result = run_dag(dag, base_conf(conn_id))
    assert not hitl.errors and [c for c, _ in hitl.responses] == [200]
    assert result.state == "failed"
    assert result.state_of("confirm_writers_stopped") == "failed"
    assert all(state == "upstream_failed" for task, state in result.task_states.items()
               if task.startswith(("audit_and_checkpoint", "start_new_host", "resume_admission",
                                   "final_old_writer_check"))), result.task_states
    assert "skipped" not in result.task_states.values()
    snap = snapshot(engine)
    assert snap["fences"] == [("*", True, False)]
    assert snap["protocol_rows"] == []
    assert history_bytes(engine) == before and no_range_starts(engine)


def test_active_override_stops_arm_fence_and_revokes_nothing(dag, tenant):
    engine, conn_id = tenant
    sc = drained_tenant()
    fence = sc.fence(scope="pk-a")
    sc.fence_override(fence, "pk-a/lane-000")
    sc.write(engine)
    before = table_checksum(engine, catalog.AdmissionFenceOverride), table_checksum(engine, catalog.AdmissionFence)
    result = run_dag(dag, base_conf(conn_id))
    assert result.state == "failed" and result.state_of("arm_fence") == "failed"
    assert [o["Scope"] for o in result.xcom("arm_fence", key="report")["active_overrides"]] == ["pk-a/lane-000"]
    assert (table_checksum(engine, catalog.AdmissionFenceOverride), table_checksum(engine, catalog.AdmissionFence)) == before


def test_missing_v2_prerequisite_refuses_before_any_ddl(dag, mysql_url, tenant_connection):
    engine = make_engine(mysql_url)
    try:
        create_legacy_schema(engine)
        drained_tenant().write(engine)
        with engine.begin() as conn:
            conn.exec_driver_sql("ALTER TABLE `_System_WorkItem` DROP COLUMN `ReplayOfWorkId`")
        conn_id = tenant_connection("nexus_tenant_acme_v1", mysql_url)
        result = run_dag(dag, base_conf(conn_id))
        assert result.state == "failed" and result.state_of("apply_schema") == "failed"
        assert snapshot_columns(engine) == (False, False)
    finally:
        engine.dispose()


def snapshot_columns(engine):
    from nexus_cutover.schema import has_column, has_table

    return has_column(engine, catalog.INPUT_START_ORDINAL), has_table(engine, catalog.ConnectorProjectionProtocol.name)


def rendered_map_indexes(run_id: str, task_id: str) -> list[str]:
    """What the UI shows for each mapped instance of ``task_id`` (Airflow's ``rendered_map_index``)."""
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        return sorted(session.scalars(select(TaskInstance.rendered_map_index).where(
            TaskInstance.dag_id == DAG_ID, TaskInstance.run_id == run_id, TaskInstance.task_id == task_id)))


def test_dry_run_checks_everything_and_writes_nothing(dag, tenant):
    engine, conn_id = tenant
    draining_tenant().write(engine)
    tables = [catalog.WorkItem, catalog.Event, catalog.AdmissionFence, catalog.ProcessRegistry, catalog.Lock]
    before = [table_checksum(engine, t) for t in tables]
    events_before = len(asset_events(f"nexus://{NS}/connector-projection-ranges"))
    result = run_dag(dag, base_conf(conn_id, dry_run=True))
    assert result.state == "success", result.task_states
    assert [table_checksum(engine, t) for t in tables] == before
    assert snapshot_columns(engine) == (False, False)
    assert any("ALTER TABLE" in line for line in result.xcom("apply_schema")["plan"])
    assert result.xcom("arm_fence")["outcome"] == "would_arm"
    verdict = result.xcom("final_old_writer_check")["verdict"]
    # the same verdict `nexus-cutover plan` gives: each declared step's verdict on its dry run's result
    assert verdict.startswith("wait: the drain (1 old projection WorkItems remaining); 1 live old writer(s)"), verdict
    assert result.xcom("wait_for_drain")["state"] == "draining"  # one look, no wait
    assert result.xcom("audit_and_checkpoint", map_index=0)["outcome"] == "not_audited"
    assert rendered_map_indexes(result.run_id, "audit_and_checkpoint") == sorted(PACKS)  # the UI names the packs
    assert result.xcom("confirm_writers_stopped")["dry_run"] is True
    digest = result.xcom("history_digest")  # read only, but it needs the schema apply_schema would add
    assert digest["taken"] is False and "InputStartOrdinal" in " ".join(digest["missing_schema"])
    assert len(asset_events(f"nexus://{NS}/connector-projection-ranges")) == events_before


def test_dry_run_after_the_schema_step_audits_without_writing(dag, tenant):
    engine, conn_id = tenant
    from tests.support import make_cutover_ready

    make_cutover_ready(engine)
    sc = drained_tenant()
    sc.packs[1].lane("lane-live").generation(1, status="pending")  # pk-b would be refused: live work
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-live")
    sc.write(engine)
    result = run_dag(dag, base_conf(conn_id, dry_run=True))
    assert result.state == "failed"
    assert result.xcom("history_digest")["rows"]["_System_WorkItem"] == len(sc.work_items)  # taken on a dry run too
    assert result.xcom("audit_and_checkpoint", map_index=0)["outcome"] == "would_write"
    assert result.state_of("audit_and_checkpoint[1]") == "failed"
    assert result.xcom("audit_and_checkpoint", map_index=1, key="findings")[0]["finding"] == "live_work"
    assert snapshot(engine)["protocol_rows"] == [] and snapshot(engine)["fences"] == []


def test_embedded_sqlite_tenant_with_manual_host_controller(dag, sqlite_url, tenant_connection):
    """The embedded default: a SQLite tenant; the engineer starts the host by hand and says so in the HITL form."""
    engine = make_engine(sqlite_url)
    create_legacy_schema(engine)
    drained_tenant().write(engine)
    initial = history_bytes(engine)
    conn_id = tenant_connection("nexus_tenant_acme_sqlite", sqlite_url)
    with Deployer(engine) as by_hand:

        def start_then_answer(detail):
            assert "start the matching new host" in detail["body"]
            by_hand.start_host(NS)
            return "Host started"

        with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM, "start_new_host": start_then_answer}) as hitl:
            result = run_dag(dag, base_conf(conn_id, host_controller="manual"))
    assert not hitl.errors, hitl.errors
    assert result.state == "success", result.task_states
    assert result.xcom("start_new_host").get("chosen_options") == ["Host started"], result.xcom("start_new_host")
    snap = snapshot(engine)
    assert snap["protocol_rows"] == [(p, 1, max_ordinal(engine, p)) for p in PACKS]
    assert snap["fences"] == [("*", True, True)]
    assert history_bytes(engine) == initial
    engine.dispose()


def test_aborted_manual_host_start_fails_and_keeps_the_fence(dag, tenant, mysql_url, capfd):
    engine, conn_id = tenant
    drained_tenant().write(engine)
    with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM, "start_new_host": "Abort"}) as hitl:
        result = run_dag(dag, base_conf(conn_id, host_controller="manual"))
    assert not hitl.errors
    password = make_url(mysql_url).password
    out, err = capfd.readouterr()
    assert [d["task_instance"]["task_id"] for d in hitl.seen] == ["confirm_writers_stopped", "start_new_host"]
    asked = hitl.seen[1]
    assert asked["subject"] == f"Start the new (ProjectionProtocol 1) host for tenant {NS}"  # Required actions: whose
    assert f"--namespace {NS}" in asked["body"] and "NEXUS_TENANT_DSN=" in asked["body"]  # the line to run, ...
    assert "***" in asked["body"] and password not in asked["body"]  # ... its password masked
    assert password and password not in out and password not in err, "the tenant password reached the logs"
    assert password not in json.dumps(list(result.xcoms.values()), default=str) and password not in json.dumps(result.conf)
    assert result.state == "failed" and result.state_of("start_new_host") == "failed"
    snap = snapshot(engine)
    assert snap["fences"] == [("*", True, False)]
    assert [r[0] for r in snap["protocol_rows"]] == list(PACKS)  # checkpoints are kept


def test_audit_refusal_fails_with_findings_and_writes_nothing(dag, tenant):
    engine, conn_id = tenant
    sc = drained_tenant()
    lane = sc.packs[1].lane("lane-mixed")
    legacy_events, _ = lane.generation(2, legacy=True)  # a coalesced ordinal-0 input without a direct task...
    lane.generation(1)  # ...in a lane that also has positive ordinals: mixed_history_indirect
    sc.write(engine)
    before = history_bytes(engine)
    with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}) as hitl:
        result = run_dag(dag, base_conf(conn_id))
    assert not hitl.errors
    assert result.state == "failed"
    assert result.state_of("audit_and_checkpoint[0]") == "success"
    assert result.state_of("audit_and_checkpoint[1]") == "failed"
    findings = result.xcom("audit_and_checkpoint", map_index=1, key="findings")
    assert findings and findings[0]["finding"] == "mixed_history_indirect"
    assert legacy_events[0]["EventId"] in findings[0]["event_ids"], findings
    assert result.xcom("audit_and_checkpoint", map_index=1, key="report")["outcome"] == "refused"
    snap = snapshot(engine)
    assert [r[0] for r in snap["protocol_rows"]] == ["pk-a"]  # pk-b: nothing written
    assert snap["fences"] == [("*", True, False)]
    assert history_bytes(engine) == before


def test_old_writer_seen_after_the_release_fails_the_final_check(dag, tenant, tenant_connection):
    engine, conn_id = tenant
    sc = drained_tenant()
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id="old-writer-restarted", stopped=True)
    sc.write(engine)

    class WriterReturnsWithTheNewHost(Deployer):
        """When the new host is started (after the confirmation passed its re-check and the checkpoints were
        written), the old writer heartbeats again -- stamped an hour ahead, so certainly after the release."""

        def start_host(self, tenant: str) -> None:
            with engine.begin() as conn:
                conn.execute(update(catalog.ProcessRegistry).where(catalog.ProcessRegistry.c.ProcessId == "old-writer-restarted")
                             .values(LastHeartbeatAt=utcnow() + dt.timedelta(hours=1)))
            super().start_host(tenant)

    with WriterReturnsWithTheNewHost(engine) as deployer, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}):
        tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
        events_before = len(asset_events(f"nexus://{NS}/connector-projection-ranges"))
        result = run_dag(dag, base_conf(conn_id))
    assert result.state_of("resume_admission") == "success"
    assert result.state_of("final_old_writer_check") == "failed"
    report = result.xcom("final_old_writer_check", key="report")
    assert [p["process_id"] for p in report["old_writers_after_release"]] == ["old-writer-restarted"]
    assert len(asset_events(f"nexus://{NS}/connector-projection-ranges")) == events_before

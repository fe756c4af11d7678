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
from nexus_cutover.schema import create_legacy_schema
from nexus_sim.scenario import utcnow
from tests.dags.airflow_harness import HitlAnswerer, run_dag
from tests.dags.cutover_support import (
    DAG_ID,
    NS,
    PACKS,
    Deployer,
    base_conf,
    drained_tenant,
    history_bytes,
    max_ordinal,
    no_range_starts,
    old_runtime,
    snapshot,
)
from tests.support import table_checksum

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


def test_end_to_end_with_old_workers_draining_and_the_reference_host(dag, tenant, monkeypatch):
    """Old workers drain real work in a thread; a person confirms over REST; the reference host takes over."""
    engine, conn_id = tenant
    sc = drained_tenant(old_writers_stopped=True)
    now = utcnow()
    for pack in sc.packs:
        lane = pack.lane("lane-live")
        lane.generation(2, status="completed")
        lane.generation(3, status="pending")
        lane.generation(1, status="retry", attempt=1, next_attempt_at=now + dt.timedelta(seconds=2))
    sc.receipt("pk-a", "lane-001", "pre-cutover-1")  # a durable receipt the old runtime may admit before the fence
    sc.write(engine)
    monkeypatch.setenv("NEXUS_HOST_HEARTBEAT_S", "0.5")
    monkeypatch.setenv("NEXUS_HOST_POLL_S", "0.2")
    conf = base_conf(conn_id, host_controller="command")
    with old_runtime(engine, fail_attempts=1, retry_delay_s=0.3) as sim, HitlAnswerer(
        DAG_ID, {"confirm_writers_stopped": CONFIRM}
    ) as hitl:
        result = run_dag(dag, conf)
    host = result.xcom("start_new_host") or {}
    try:
        assert not hitl.errors, hitl.errors
        assert result.state == "success", result.task_states
        assert [code for code, _ in hitl.responses] == [200]
        body = hitl.seen[0]["body"]
        assert "old-rt/projection_worker" in body and "**stopped**" in body  # the evidence the person saw
        assert sim.live_old_work() == 0
        drain_result = result.xcom("wait_for_drain")
        assert drain_result["state"] == "drained"

        cutoffs = {}
        for i, pack in enumerate(PACKS):
            out = result.xcom("audit_and_checkpoint", map_index=i)
            assert out["outcome"] == "written" and out["pack_install_id"] == pack
            cutoffs[pack] = out["legacy_max_ordinal"]
            assert cutoffs[pack] == max_ordinal(engine, pack)
        snap = snapshot(engine)
        assert snap["protocol_rows"] == [(p, 1, cutoffs[p]) for p in PACKS]
        assert snap["fences"] == [("*", True, True)]
        extras = asset_events(f"nexus://{NS}/connector-projection-ranges")
        assert any(e.get("cutoffs") == cutoffs for e in extras), extras

        # post-cutover admissions: the new host materializes new receipts above the cutoff, as range work
        with engine.begin() as conn:
            for i in range(3):
                conn.execute(catalog.IngressReceipt.insert().values(
                    PackInstallId="pk-a", SourceLane="lane-001", ReceiptId=f"post-{i}", EventKind="contact.changed",
                    Payload="{}", ReceivedAt=utcnow()))
        deadline = time.monotonic() + 60
        while time.monotonic() < deadline:
            with engine.connect() as conn:
                events = conn.execute(
                    select(catalog.Event.c.EventId, catalog.Event.c.EnqueueOrdinal).where(
                        catalog.Event.c.ReceiptId.like("post-%"))
                ).all()
            if len(events) == 3:
                break
            time.sleep(0.3)
        assert len(events) == 3, "the new host did not admit the post-cutover receipts"
        assert all(ordinal > cutoffs["pk-a"] for _, ordinal in events)
        with engine.connect() as conn:
            starts = conn.execute(
                select(catalog.WorkItem.c.InputStartOrdinal).where(
                    catalog.WorkItem.c.SelectedEventId.in_([e for e, _ in events]) |
                    catalog.WorkItem.c.InputStartOrdinal.isnot(None))
            ).scalars().all()
        assert starts and all(s is not None and s > cutoffs["pk-a"] for s in starts)
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
               if task.startswith(("audit_and_checkpoint", "start_new_host", "verify_readiness", "resume_admission",
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


def test_dry_run_checks_everything_and_writes_nothing(dag, tenant):
    engine, conn_id = tenant
    sc = drained_tenant()
    sc.packs[0].lane("lane-live").generation(1, status="pending")
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-live")
    sc.write(engine)
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

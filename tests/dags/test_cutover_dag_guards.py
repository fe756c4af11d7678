"""Guards re-checked where they are relied on: the writer evidence at the answer, one cutover per tenant (real runs)."""

from __future__ import annotations

import datetime as dt
import json
import os
import re
import subprocess
import sys

from sqlalchemy import func, select, update

from nexus_cutover import catalog
from tests.dags.airflow_harness import HitlAnswerer, collect, next_logical_date, run_dag
from tests.dags.cutover_support import DAG_ID, NS, PACKS, Deployer, base_conf, drained_tenant, history_bytes, max_ordinal, snapshot

CONFIRM = "Confirm: all old writers stopped"
Registry = catalog.ProcessRegistry


def _heartbeat_now(engine, process_id: str) -> None:
    with engine.begin() as conn:
        now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        conn.execute(update(Registry).where(Registry.c.ProcessId == process_id).values(LastHeartbeatAt=now))


def test_a_writer_that_comes_back_before_the_answer_fails_the_run_and_nothing_is_written(dag, tenant):
    """The engineer confirms evidence that was true when shown; the writer heartbeats before the answer arrives."""
    engine, conn_id = tenant
    sc = drained_tenant()
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-silent", heartbeat_age_s=3600)  # silent, not stopped
    sc.write(engine)
    before = history_bytes(engine)

    def writer_returns_then_confirm(detail):
        assert "old-worker-silent" in detail["body"] and "read again" in detail["body"]
        _heartbeat_now(engine, "old-worker-silent")  # the old binary resumed
        return CONFIRM

    with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": writer_returns_then_confirm}) as hitl:
        result = run_dag(dag, base_conf(conn_id))
    assert not hitl.errors and [c for c, _ in hitl.responses] == [200]
    assert result.state == "failed" and result.state_of("confirm_writers_stopped") == "failed"
    recheck = result.xcom("confirm_writers_stopped", key="recheck")
    assert recheck["came_back"] == ["old-worker-silent"] and recheck["evidence_age_s"] >= 0
    assert "evidence_taken_at" in recheck
    snap = snapshot(engine)
    assert snap["protocol_rows"] == [] and snap["fences"] == [("*", True, False)]  # nothing confirmed, fence armed
    assert history_bytes(engine) == before


def test_an_answer_on_unchanged_evidence_records_its_age(dag, tenant, tenant_connection):
    engine, conn_id = tenant
    drained_tenant().write(engine)
    with Deployer(engine) as deployer, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}) as hitl:
        tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
        result = run_dag(dag, base_conf(conn_id))
    assert not hitl.errors
    assert result.state == "success", result.task_states
    answer = result.xcom("confirm_writers_stopped")
    assert answer["chosen_options"] == [CONFIRM] and answer["evidence_age_s"] >= 0
    assert result.xcom("confirm_writers_stopped", key="recheck")["came_back"] == []
    digest = result.xcom("history_digest")  # the proof of "nothing changed", taken after the confirmation
    with engine.connect() as conn:
        works = conn.execute(select(func.count()).select_from(catalog.WorkItem)).scalar()
    assert digest["rows"]["_System_WorkItem"] == works and digest["rows"]["_System_Event"] > 0
    final = result.xcom("final_old_writer_check")
    assert final["history_digest"]["verified"] is True and final["history_digest"]["hash"] == digest["hash"]
    from nexus_status.proofs import latest_proofs  # what the status view shows for the tenant

    proof = latest_proofs([NS])[NS]["cutover"]
    assert proof["run_id"] == result.run_id and proof["verified"] is True and proof["digest"]["hash"] == digest["hash"]
    assert "verified: no history row changed" in proof["text"]


def test_only_a_named_approver_may_confirm_and_anyone_else_is_refused_like_a_rejection(dag, tenant):
    """``approvers`` becomes HITL's assigned users; an answer from anyone else (here the in-process API's
    user, which the all-admins test auth manager lets through) is refused when it arrives: nothing written."""
    engine, conn_id = tenant
    drained_tenant().write(engine)
    with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}) as hitl:
        result = run_dag(dag, base_conf(conn_id, approvers=["release-lead"]))
    assert not hitl.errors and [c for c, _ in hitl.responses] == [200]
    assert [u["id"] for u in hitl.seen[0]["assigned_users"]] == ["release-lead"]
    assert result.state == "failed" and result.state_of("confirm_writers_stopped") == "failed"
    report = result.xcom("confirm_writers_stopped", key="report")
    assert report["refused"] is True and "is not an approver (release-lead)" in report["message"]
    assert report["answered_by"] != "release-lead"
    snap = snapshot(engine)
    assert snap["protocol_rows"] == [] and snap["fences"] == [("*", True, False)]  # nothing confirmed, fence armed


def test_a_run_not_started_by_the_rollout_it_names_cannot_take_a_wave_answer(dag, tenant):
    """``approval=per_wave`` is the rollout's own: a run triggered by hand that names a rollout run (which did
    not start it) stops at the confirmation, asks nothing and writes nothing."""
    engine, conn_id = tenant
    drained_tenant().write(engine)
    result = run_dag(dag, base_conf(conn_id, approval="per_wave", rollout={"run_id": "someone-elses-rollout", "wave": 0}))
    assert result.state == "failed" and result.state_of("confirm_writers_stopped") == "failed", result.task_states
    report = result.xcom("confirm_writers_stopped", key="report")
    assert "names rollout run someone-elses-rollout, which did not start this run" in report["message"]
    snap = snapshot(engine)
    assert snap["protocol_rows"] == [] and snap["fences"] == [("*", True, False)]


class HistoryChangingDeployer(Deployer):
    """Starts the new host, but first changes one history row: what a buggy new runtime or a rogue script would do."""

    def __init__(self, engine, work_id: int):
        super().__init__(engine)
        self.work_id = work_id

    def start_host(self, tenant: str) -> None:
        with self.engine.begin() as conn:
            conn.execute(update(catalog.WorkItem).where(catalog.WorkItem.c.WorkId == self.work_id)
                         .values(Status="pending", Attempt=7))
        super().start_host(tenant)


def test_a_history_row_changed_after_the_digest_fails_the_final_check_naming_it(dag, tenant, tenant_connection):
    engine, conn_id = tenant
    drained_tenant().write(engine)
    with engine.connect() as conn:
        work_id = conn.execute(select(func.min(catalog.WorkItem.c.WorkId))).scalar()
    with HistoryChangingDeployer(engine, work_id) as deployer, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}):
        tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
        result = run_dag(dag, base_conf(conn_id))
    assert result.state == "failed" and result.state_of("final_old_writer_check") == "failed", result.task_states
    assert result.state_of("resume_admission") == "success"  # the cutover itself happened; the proof failed
    report = result.xcom("final_old_writer_check", key="report")
    (difference,) = report["history"]["differences"]
    assert (difference["kind"], difference["key"], difference["columns"]) == ("changed", work_id, ["Attempt", "Status"])
    assert f"_System_WorkItem WorkId {work_id} changed" in report["message"]
    assert "Next:" in report["message"]
    from nexus_status.proofs import latest_proofs

    proof = latest_proofs([NS])[NS]["cutover"]
    assert proof["verified"] is False and proof["differences"] == 1 and f"WorkId {work_id} changed" in proof["text"]


def test_a_second_run_for_the_same_tenant_stops_at_once_naming_the_holder_and_the_first_completes(
    dag, tenant, tenant_connection, airflow_db
):
    """Run 1 waits for its writer-stop confirmation; run 2 (a separate `airflow dags test` process) stops at arm_fence."""
    engine, conn_id = tenant
    drained_tenant().write(engine)
    conf = base_conf(conn_id)
    second_date = next_logical_date()
    second: dict = {}

    def run_second_then_confirm(detail):
        fences_before = snapshot(engine)["fences"]
        proc = subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "airflow"), "dags", "test", DAG_ID, second_date.isoformat(),
             "-c", json.dumps(conf)],
            env=dict(os.environ), capture_output=True, text=True, timeout=300,
        )
        second.update(returncode=proc.returncode, output=proc.stdout + proc.stderr, fences_before=fences_before,
                      fences_after=snapshot(engine)["fences"])
        return CONFIRM

    with Deployer(engine) as deployer, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": run_second_then_confirm},
                                                   timeout=600) as hitl:
        tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
        first = run_dag(dag, conf)
    assert not hitl.errors, hitl.errors
    assert first.state == "success", first.task_states
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        run_id = session.scalar(select(DagRun.run_id).where(DagRun.dag_id == DAG_ID, DagRun.logical_date == second_date))
    assert run_id is not None, second["output"][-3000:]
    other = collect(DAG_ID, run_id)
    # one cutover per tenant refuses before any write: at the first task, before apply_schema (issue 23, item 4)
    assert other.state == "failed" and other.state_of("resolve_packs") == "failed", other.task_states
    held = other.xcom("resolve_packs", key="report")
    assert held["held_by"] == f"airflow:{DAG_ID}:{first.run_id}"
    assert "has not finished" in held["message"] and "overrides" not in held["message"]
    assert all(state == "upstream_failed" for task, state in other.task_states.items()
               if task.startswith(("apply_schema", "arm_fence", "wait_for_drain", "confirm_writers_stopped",
                                   "audit_and_checkpoint"))), other.task_states
    assert second["fences_after"] == second["fences_before"] == [("*", True, False)]  # the second run wrote nothing
    snap = snapshot(engine)
    assert snap["protocol_rows"] == [(p, 1, max_ordinal(engine, p)) for p in PACKS]
    assert snap["fences"] == [("*", True, True)]
    with engine.connect() as conn:
        released_by = conn.execute(select(catalog.AdmissionFence.c.ReleasedBy).where(catalog.AdmissionFence.c.Namespace == NS)).scalar()
    assert released_by == f"airflow:{DAG_ID}:{first.run_id}"


def test_a_later_run_adopts_the_fence_a_failed_run_left(dag, tenant, tenant_connection):
    """... and tells no PAUSE AHEAD: the tenant has been paused since the failed run armed its fence."""
    from tests.notify_sinks import SmtpSink

    engine, conn_id = tenant
    drained_tenant().write(engine)
    with SmtpSink() as mail:
        tenant_connection("nexus_notify_adopt", raw_json=mail.connection_json())
        with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": "Reject"}):
            rejected = run_dag(dag, base_conf(conn_id, notify_conn_id="nexus_notify_adopt"))
        assert rejected.state == "failed"
        first = [m["Subject"] for m in mail.messages]
        with Deployer(engine) as deployer, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}):
            tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
            later = run_dag(dag, base_conf(conn_id, notify_conn_id="nexus_notify_adopt"))
        second = [m["Subject"] for m in mail.messages][len(first):]
    assert later.state == "success", later.task_states
    assert sum("PAUSE AHEAD" in s for s in first) == 1 and not any("PAUSE AHEAD" in s for s in second), (first, second)
    assert later.xcom("wait_for_short_drain")["fenced_by"] == f"airflow:{DAG_ID}:{rejected.run_id}"
    assert any("ADMISSION RESUMED" in s for s in second), second
    armed = later.xcom("arm_fence")
    assert armed["outcome"] == "adopted" and armed["previous_holder"] == f"airflow:{DAG_ID}:{rejected.run_id}"
    assert snapshot(engine)["fences"] == [("*", True, True)]


def test_a_reject_states_the_tenants_real_state(dag, tenant):
    engine, conn_id = tenant
    drained_tenant().write(engine)
    with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": "Reject"}):
        result = run_dag(dag, base_conf(conn_id))
    message = result.xcom("confirm_writers_stopped", key="report")["message"]
    fence_id = result.xcom("arm_fence")["fence_id"]
    assert re.match(r'cutover not performed: \w+ rejected "Confirm that every old-protocol writer', message), message
    assert f"cutover fence {fence_id} in force (held by airflow:{DAG_ID}:{result.run_id}); 0 of 2 pack(s) checkpointed" in message
    assert "{" not in message and "[" not in message  # no Python reprs


def test_a_rerun_of_a_cut_over_tenant_ends_success_without_asking(dag, tenant, tenant_connection, capfd, caplog):
    """A rerun of a cut-over tenant asks nothing and writes nothing; it says when and by which run the tenant was cut
    over, sends no cut-over notice and emits no Asset event (issue 51, item 4)."""
    from tests.dags.test_cutover_dag_runs import asset_events
    from tests.notify_sinks import SmtpSink

    engine, conn_id = tenant
    drained_tenant().write(engine)
    uri = f"nexus://{NS}/connector-projection-ranges"
    with Deployer(engine) as deployer, SmtpSink() as mail:
        tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
        tenant_connection("nexus_notify_rerun", raw_json=mail.connection_json())
        with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}):
            first = run_dag(dag, base_conf(conn_id, notify_conn_id="nexus_notify_rerun"))
        assert first.state == "success", first.task_states
        logged = "".join(capfd.readouterr()) + caplog.text
        # what a person reads in the task logs: one fact per line, no Python dict (issue 51, item 9)
        for start in ("cutover complete for ", "asking the deployer"):
            lines = [line for line in logged.splitlines() if start in line]
            assert lines and not any("{'" in line or "':" in line for line in lines), (start, lines)
        assert f"cutover complete for {NS}: cutoffs (LegacyMaxOrdinal per pack) " in logged
        cut_over_notices = [m["Subject"] for m in mail.messages if "CUT OVER" in m["Subject"]]
        assert len(cut_over_notices) == 1, [m["Subject"] for m in mail.messages]  # the first run's, once
        before, events_before, sent_before = snapshot(engine), len(asset_events(uri)), len(mail.messages)
        # a question, if one parked, would be seen and left unanswered (the run would then fail at its timeout)
        with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": lambda detail: None}) as nobody:
            again = run_dag(dag, base_conf(conn_id, confirm_timeout=60, notify_conn_id="nexus_notify_rerun"))
        sent_by_rerun = [m["Subject"] for m in mail.messages[sent_before:]]
    assert again.state == "success", again.task_states
    assert nobody.seen == []
    assert again.xcom("arm_fence")["outcome"] == "not_needed"
    assert again.xcom("confirm_writers_stopped")["outcome"] == "nothing_to_confirm"
    assert again.xcom("resume_admission")["outcome"] == "already_released"
    assert snapshot(engine) == before
    said = again.xcom("final_old_writer_check")["already_cut_over"]
    released_at = first.xcom("resume_admission")["released_at"].replace("T", " ")[:19]
    assert said.startswith(f"already cut over at {released_at} UTC by airflow:{DAG_ID}:{first.run_id}"), said
    assert sent_by_rerun == [] and len(asset_events(uri)) == events_before


def test_the_form_refuses_unknown_keys_before_reading_anything(dag, tenant):
    engine, conn_id = tenant
    drained_tenant().write(engine)
    result = run_dag(dag, {**base_conf(conn_id), "dryrun": True})
    assert result.state == "failed" and result.state_of("resolve_packs") == "failed"
    message = result.xcom("resolve_packs", key="report")["message"]
    assert "unknown field(s) dryrun" in message and "dry_run" in message
    assert snapshot(engine)["fences"] == [] and snapshot(engine)["input_start_ordinal"] is False


def test_a_missing_connection_says_which_one_to_create(dag, tenant):
    result = run_dag(dag, base_conf("nexus_tenant_ghost"))
    assert result.state_of("resolve_packs") == "failed"
    message = result.xcom("resolve_packs", key="report")["message"]
    assert "no Airflow connection 'nexus_tenant_ghost'" in message and "airflow connections add" in message


def test_a_connection_to_another_tenants_database_is_hinted(dag, tenant):
    engine, conn_id = tenant
    drained_tenant().write(engine)  # namespace acme
    result = run_dag(dag, base_conf(conn_id, tenant="globex"))
    message = result.xcom("resolve_packs", key="report")["message"]
    assert "no active pack" in message and "another tenant's database" in message
    assert "This database has the namespaces 'acme'" in message and "Next: check the tenant name" in message
    assert "A tenant another run or command holds" not in message  # no advice that does not apply (issue 34)


def test_a_fence_a_cli_invocation_holds_is_never_taken_silently_and_is_taken_when_named(dag, tenant, tenant_connection):
    """A CLI run holds the tenant mid-cutover: a DAG run stops at its first task, naming it and how to take it over,
    with nothing written (not even the additive schema); a run naming it in ``adopt`` takes it over."""
    from nexus_cutover.schema import missing_projection_schema

    engine, conn_id = tenant
    drained_tenant().write(engine)
    cli_holder = "cli:alice@jump-host:pid4242:20261202T080000.000000Z.beef"
    with engine.begin() as conn:  # the CLI armed it (Part A table: its apply-schema has not run yet either)
        conn.execute(catalog.AdmissionFence.insert().values(
            Namespace=NS, Scope="*", Reason="connector projection range cutover", ArmedBy=cli_holder,
            ArmedAt=dt.datetime(2026, 12, 2, 8)))
    missing = missing_projection_schema(engine)
    before = snapshot(engine)
    refused = run_dag(dag, base_conf(conn_id))
    assert refused.state == "failed" and refused.state_of("resolve_packs") == "failed", refused.task_states
    report = refused.xcom("resolve_packs", key="report")
    assert report["held_by"] == cli_holder and "not adopted silently" in report["message"]
    assert f"adopt = {cli_holder}" in report["message"] and "overrides" not in report["message"]
    assert snapshot(engine) == before and missing_projection_schema(engine) == missing  # nothing written
    with Deployer(engine) as deployer, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}):
        tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
        taken = run_dag(dag, base_conf(conn_id, adopt=cli_holder))
    assert taken.state == "success", taken.task_states
    armed = taken.xcom("arm_fence")
    assert (armed["outcome"], armed["previous_holder"]) == ("adopted", cli_holder)
    with engine.connect() as conn:
        reason, released_by = conn.execute(select(catalog.AdmissionFence.c.Reason, catalog.AdmissionFence.c.ReleasedBy)).one()
    assert f"adopted from {cli_holder}" in reason and released_by == f"airflow:{DAG_ID}:{taken.run_id}"


def test_an_unreachable_tenant_database_fails_the_first_step_with_its_reason_in_the_report(dag, tenant_connection):
    """Nothing listens on port 1: ``resolve_packs`` fails (not a stop: a database may come back, clear it then)
    and its XCom ``report`` names why, which the rollout's summary and the status view show."""
    conn_id = tenant_connection("nexus_tenant_gone", "mysql+pymysql://cutover:s3cret@127.0.0.1:1/tenant_gone")
    result = run_dag(dag, base_conf(conn_id))
    assert result.state == "failed" and result.state_of("resolve_packs") == "failed"
    report = result.xcom("resolve_packs", key="report")
    assert report["error"] == "Unreachable" and report["message"].startswith("Unreachable: ")
    assert "s3cret" not in json.dumps(report)  # the DSN's password never in XCom

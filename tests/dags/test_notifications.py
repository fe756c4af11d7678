"""Notifications of the tenant DAGs through a real SMTP server on loopback (and none without a connection)."""

from __future__ import annotations

import datetime as dt
import html
import json
import re
import socket
from urllib.parse import quote

import pytest
from sqlalchemy.engine import make_url

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.projection import drain
from nexus_cutover.schema import create_legacy_schema
from nexus_sim.scenario import utcnow
from tests.dags.airflow_harness import HitlAnswerer, load_dag, run_dag
from tests.dags.cutover_support import DAG_ID, NS, base_conf, drained_tenant, old_runtime
from tests.notify_sinks import SmtpSink

NOTIFY_CONN = "nexus_notify_test"
BLOCKED_ON = "erp://invoices/77"
CONFIRM = "Confirm: all old writers stopped"
#: The heads-up every run that arms the fence sends first (issue 50, item 3): the pause ahead.
PAUSE_AHEAD = f"[nexus] PAUSE AHEAD: tenant {NS}, {DAG_ID}.wait_for_short_drain"


def smtp_connection_json(port: int) -> str:
    """An Airflow ``smtp`` connection to 127.0.0.1:``port``, plain SMTP, two recipients."""
    return json.dumps({
        "conn_type": "smtp", "host": "127.0.0.1", "port": port,
        "extra": {"to": "delivery@example.test, l2@example.test", "from_email": "airflow@example.test",
                  "disable_ssl": True, "disable_tls": True, "timeout": 5, "retry_limit": 0},
    })


def text_of(msg) -> str:
    body = msg.get_body(preferencelist=("html", "plain")).get_content()
    return f"{msg['Subject']}\n{html.unescape(body)}"


def closed_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]  # closed again on exit: connecting is refused


@pytest.fixture
def dag(airflow_db):
    return load_dag(DAG_ID)


@pytest.fixture
def tenant(mysql_url, tenant_connection):
    engine = make_engine(mysql_url)
    create_legacy_schema(engine)
    conn_id = tenant_connection("nexus_tenant_acme_test", mysql_url)
    yield engine, conn_id, make_url(mysql_url).password
    engine.dispose()


def stuck_drain_tenant(engine) -> str:
    """A drained tenant plus one item blocked on an external dependency; returns its WorkId."""
    sc = drained_tenant()
    _, item = sc.packs[0].lane("lane-stuck").generation(1, status="blocked", blocked_on=BLOCKED_ON)
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-live")
    sc.write(engine)
    return item["WorkId"]


def assert_stuck_drain_outcome(result) -> None:
    assert result.state == "failed"
    assert result.state_of("wait_for_drain") == "failed"
    assert result.state_of("check_old_writers") == "upstream_failed"
    assert list(result.xcom("wait_for_drain", key="report")["blockers"]) == [drain.CAUSE_BLOCKED_EXTERNAL]


@pytest.mark.parametrize("configured_by", ["param", "variable"])
def test_stuck_drain_sends_exactly_one_failure_mail(dag, tenant, tenant_connection, monkeypatch, configured_by):
    engine, conn_id, password = tenant
    work_id = stuck_drain_tenant(engine)
    with SmtpSink() as sink:
        tenant_connection(NOTIFY_CONN, raw_json=sink.connection_json())
        if configured_by == "variable":
            monkeypatch.setenv("AIRFLOW_VAR_NEXUS_NOTIFY_CONN_ID", NOTIFY_CONN)
        notify = NOTIFY_CONN if configured_by == "param" else ""
        result = run_dag(dag, base_conf(conn_id, drain_timeout=600, stale_heartbeat=600, notify_conn_id=notify))
    assert_stuck_drain_outcome(result)
    subjects = [m["Subject"] for m in sink.messages]
    assert len(subjects) == 2 and subjects[0] == PAUSE_AHEAD, subjects  # the heads-up, then exactly one failure
    ahead, failure = sink.messages
    assert "admission is paused in a few seconds (the fence is armed next)" in text_of(ahead)
    text = text_of(failure)
    assert sink.recipients == [["delivery@example.test", "l2@example.test"]] * 2
    assert "FAILED" in failure["Subject"] and f"tenant {NS}" in failure["Subject"]
    assert "wait_for_drain" in failure["Subject"] and result.run_id in text
    assert "cannot finish within drain_timeout" in text  # the cause ...
    assert f"{drain.CAUSE_BLOCKED_EXTERNAL}: 1 ({work_id})" in text  # ... and the grouped blockers
    assert password and password not in text and "mysql" not in text


def test_rejected_confirmation_sends_one_confirmation_and_one_failure_mail(dag, tenant, tenant_connection, monkeypatch):
    engine, conn_id, password = tenant
    drained_tenant().write(engine)
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", "http://airflow.example:8080")  # as every deployment sets it
    with SmtpSink() as sink, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": "Reject"}) as hitl:
        tenant_connection(NOTIFY_CONN, raw_json=sink.connection_json())
        result = run_dag(dag, base_conf(conn_id, notify_conn_id=NOTIFY_CONN))
    assert not hitl.errors and [c for c, _ in hitl.responses] == [200]
    assert result.state == "failed" and result.state_of("confirm_writers_stopped") == "failed"
    subjects = [m["Subject"] for m in sink.messages]
    assert subjects == [PAUSE_AHEAD, f"[nexus] NEEDS CONFIRMATION: tenant {NS}, {DAG_ID}.confirm_writers_stopped",
                        f"[nexus] FAILED: tenant {NS}, {DAG_ID}.confirm_writers_stopped"], subjects
    ahead, asked, failed = (text_of(m) for m in sink.messages)
    assert f"the tenant: http://airflow.example:8080/nexus-status/?search={NS}" in ahead  # the heads-up's links too
    question = f"Confirm that every old-protocol writer of tenant {NS} is stopped"  # Required actions names the tenant
    assert question in asked and [d["subject"] for d in hitl.seen] == [question]
    run_page = f"/dags/{DAG_ID}/runs/{quote(result.run_id, safe='')}"  # the pages a person clicks (issue 38, item 1)
    required = f"answer it: http://airflow.example:8080/dags/{DAG_ID}/runs/{result.run_id}/tasks/confirm_writers_stopped"
    assert f"{required}/required_actions" in asked, asked
    assert f"the run: http://airflow.example:8080{run_page}" in asked and run_page in failed, failed
    assert f"the tenant: http://airflow.example:8080/nexus-status/?search={NS}" in failed
    assert "cutover not performed" in failed and "Reject" in failed
    assert password not in asked + failed


def test_without_a_notification_connection_nothing_is_sent_and_the_outcome_is_the_same(
        dag, tenant, tenant_connection, capfd):
    engine, conn_id, _ = tenant
    stuck_drain_tenant(engine)
    with SmtpSink() as sink:
        tenant_connection(NOTIFY_CONN, raw_json=sink.connection_json())  # exists, but the run does not name it
        result = run_dag(dag, base_conf(conn_id, drain_timeout=600, stale_heartbeat=600, notify_conn_id=""))
    assert_stuck_drain_outcome(result)
    assert sink.messages == []
    out, err = capfd.readouterr()
    assert "NOTIFY [nexus] FAILED" in out + err  # still written to the task log


def test_unreachable_smtp_server_does_not_change_the_outcome(dag, tenant, tenant_connection, capfd):
    engine, conn_id, _ = tenant
    stuck_drain_tenant(engine)
    tenant_connection(NOTIFY_CONN, raw_json=smtp_connection_json(closed_port()))
    result = run_dag(dag, base_conf(conn_id, drain_timeout=600, stale_heartbeat=600, notify_conn_id=NOTIFY_CONN))
    assert_stuck_drain_outcome(result)
    out, err = capfd.readouterr()
    assert f"notification NOT sent through connection {NOTIFY_CONN}" in out + err


def test_a_successful_dry_run_sends_nothing(dag, tenant, tenant_connection):
    engine, conn_id, _ = tenant
    drained_tenant().write(engine)
    with SmtpSink() as sink:
        tenant_connection(NOTIFY_CONN, raw_json=sink.connection_json())
        result = run_dag(dag, base_conf(conn_id, dry_run=True, notify_conn_id=NOTIFY_CONN))
    assert result.state == "success", result.task_states
    assert sink.messages == []


@pytest.mark.parametrize("dag_id", [DAG_ID, "field_history_eligibility"])
def test_every_task_notifies_on_failure_and_the_form_has_notify_conn_id(airflow_db, dag_id):
    from nexus_airflow.base import step_ended, step_failed, step_started
    from nexus_airflow.notify import CutoverNotifier

    dag = load_dag(dag_id)
    assert "notify_conn_id" in dag.params and dag.params["notify_conn_id"] is None  # empty: Variable, else the log
    for task in dag.tasks:
        # one notifier, and the step metrics' failure hook (issue 27) beside it; their step hooks on every task too
        assert [type(cb) for cb in task.on_failure_callback][:1] == [CutoverNotifier], task.task_id
        assert task.on_failure_callback[1:] == [step_failed], task.task_id
        given = getattr(task, "partial_kwargs", None)  # a mapped task keeps them for its instances
        hooks = ((given.get("pre_execute"), given.get("post_execute")) if given is not None
                 else (task._pre_execute_hook, task._post_execute_hook))
        assert hooks == (step_started, step_ended), task.task_id


def test_the_notifiers_event_names_are_the_domains():
    """The DAG files name their notifier's event by nexus_airflow.notify's literals (no domain import at parse time):
    they are nexus_cutover.notices' names, and each has its words."""
    from nexus_airflow import notify
    from nexus_cutover import notices

    for name in ("FAILURE", "NEEDS_CONFIRMATION", "SUCCESS", "FENCE_WAITING"):
        assert getattr(notify, name) == getattr(notices, name) and getattr(notices, name) in notices.WORDS


def test_credentials_in_urls_are_masked():
    from nexus_cutover.notices import scrub

    assert scrub("cannot reach mysql+pymysql://cutover:s3cr3t@tidb:4000/t (x)") == (
        "cannot reach mysql+pymysql://cutover:***@tidb:4000/t (x)")
    assert scrub("no credentials here: http://host/x") == "no credentials here: http://host/x"


def test_a_drain_over_several_polls_and_the_manual_host_ask_notify_per_event_not_per_poll(
        dag, tenant, tenant_connection, capfd, caplog):
    """Old workers drain real work over several polls (no mail); both HITL steps ask once; Abort fails once."""
    engine, conn_id, _ = tenant
    sc = drained_tenant()
    now = utcnow()
    for pack in sc.packs:
        lane = pack.lane("lane-live")
        lane.generation(2, status="completed")
        lane.generation(3, status="pending")
        lane.generation(1, status="retry", attempt=1, next_attempt_at=now + dt.timedelta(seconds=2))
    sc.write(engine)
    answers = {"confirm_writers_stopped": CONFIRM, "start_new_host": "Abort"}
    # new work keeps arriving until the fence is armed, and each item fails twice: the sensor has to wait
    with SmtpSink() as sink, old_runtime(engine, synthetic_inputs_per_step=3, fail_attempts=2, retry_delay_s=1.0), \
            HitlAnswerer(DAG_ID, answers) as hitl:
        tenant_connection(NOTIFY_CONN, raw_json=sink.connection_json())
        result = run_dag(dag, base_conf(conn_id, host_controller="manual", notify_conn_id=NOTIFY_CONN))
    assert not hitl.errors
    assert result.xcom("wait_for_drain")["state"] == "drained"
    assert result.state == "failed" and result.state_of("start_new_host") == "failed", result.task_states
    out, err = capfd.readouterr()
    waited = re.search(r"\b[1-9]\d* old projection WorkItems remaining", out + err + caplog.text)
    assert waited, "the drain was over before the sensor's first poll: this test proves nothing"
    assert [m["Subject"] for m in sink.messages] == [
        PAUSE_AHEAD,
        f"[nexus] NEEDS CONFIRMATION: tenant {NS}, {DAG_ID}.confirm_writers_stopped",
        f"[nexus] NEEDS CONFIRMATION: tenant {NS}, {DAG_ID}.start_new_host",
        f"[nexus] FAILED: tenant {NS}, {DAG_ID}.start_new_host",
    ]

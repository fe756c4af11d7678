"""Issue 38, items 1 and 2, on the production-shaped tenant: what a real SMTP server (aiosmtpd) and an HTTP listener
standing in for a Slack incoming webhook receive from a real cutover run (``dag.test()``: real tasks, triggers and
HITL answered over REST): the question, the stop or the end, each once, each with the links a person clicks; and
the alert of a tenant still fenced ``fence_alert_after`` after its fence was armed, once."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import threading
import time
from urllib.parse import quote

import pytest
from sqlalchemy.engine import make_url

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.runtime.registry import heartbeat, mark_stopped
from nexus_sim.scenario import TenantScenario
from nexus_sim.scenario.production import build_production_tenant
from tests.dags.airflow_harness import HitlAnswerer, load_dag, run_dag
from tests.dags.cutover_support import DAG_ID, NS, base_conf
from tests.notify_sinks import SLACK_TOKEN, SlackWebhookSink, SmtpSink
from tests.support import mysql_database

NOTIFY_CONN = "nexus_notify_channel_test"
BASE = "http://airflow.example:8080"
CONFIRM = "Confirm: all old writers stopped"
#: One active pack (one audit task), drained projection history, every ordinary status, hostile lanes and receipt
#: ids, the 10,000 stopped registry rows, an uninstalled incarnation.
SIZES = {"active_packs": 1, "plain_lanes": 2, "generations": 2, "greenfield_pack": False}
LIVE_WRITER = "old-writer-live"


@pytest.fixture
def dag(airflow_db):
    return load_dag(DAG_ID)


@pytest.fixture
def production(request, mysql_server_url, tenant_connection, monkeypatch):
    """``(engine, conn_id, password)``: the production-shaped tenant on MariaDB (utf8mb4, case-insensitive)."""
    request.node._nexus_uses_mysql = True
    monkeypatch.setenv("AIRFLOW__API__BASE_URL", BASE)  # as every deployment sets it: the messages' links
    monkeypatch.setenv("NEXUS_HOST_HEARTBEAT_S", "0.5")
    monkeypatch.setenv("NEXUS_HOST_POLL_S", "0.2")
    with mysql_database(mysql_server_url, charset="utf8mb4") as url:
        engine = make_engine(url)
        try:
            build_production_tenant(engine, namespace=NS, seed=38, **SIZES)
            yield engine, tenant_connection("nexus_tenant_acme_notify", url), make_url(url).password
        finally:
            engine.dispose()


@contextlib.contextmanager
def channel(kind: str, tenant_connection):
    """The run's one channel: a real SMTP server or a Slack webhook listener, as the connection ``NOTIFY_CONN``."""
    sink = SmtpSink() if kind == "smtp" else SlackWebhookSink()
    with sink:
        tenant_connection(NOTIFY_CONN, raw_json=sink.connection_json())
        yield sink


def stop_host(result) -> None:
    host = (result.xcom("start_new_host") or {}) if result is not None else {}
    if not host.get("pid"):
        return
    os.kill(host["pid"], signal.SIGTERM)
    for _ in range(100):
        try:
            os.waitpid(host["pid"], os.WNOHANG)
            os.kill(host["pid"], 0)
        except (ChildProcessError, ProcessLookupError):
            return
        time.sleep(0.1)


def links_of(run_id: str, task: str | None = None) -> list[str]:
    """The links a message about ``run_id`` carries: its question's Required-actions page (``task``), the run,
    the tenant's row in the status view."""
    question = [f"answer it: {BASE}/dags/{DAG_ID}/runs/{run_id}/tasks/{task}/required_actions?map_index=-1"] if task else []
    return [*question, f"the run: {BASE}/dags/{DAG_ID}/runs/{quote(run_id, safe='')}",
            f"the tenant: {BASE}/nexus-status/?search={NS}"]


def assert_redacted(sink, texts: list[str], password: str) -> None:
    for text in texts:
        assert password not in text and SLACK_TOKEN not in text and "mysql" not in text, text
    if isinstance(sink, SlackWebhookSink):
        assert sink.paths() == [f"/{SLACK_TOKEN}"] * len(texts)  # posted to the webhook, never shown in a message
    else:
        assert sink.recipients == [["delivery@example.test", "l2@example.test"]] * len(texts)


@pytest.mark.parametrize("kind", ["smtp", "slack"])
def test_a_run_sends_its_question_and_its_success_once_each_with_their_links(dag, production, tenant_connection, kind):
    engine, conn_id, password = production
    result = None
    try:
        with channel(kind, tenant_connection) as sink, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}) as hitl:
            result = run_dag(dag, base_conf(conn_id, host_controller="command", notify_conn_id=NOTIFY_CONN))
        assert not hitl.errors and result.state == "success", result.task_states
        texts = sink.texts()
        assert sink.subjects() == [f"[nexus] PAUSE AHEAD: tenant {NS}, {DAG_ID}.wait_for_short_drain",
                                   f"[nexus] NEEDS CONFIRMATION: tenant {NS}, {DAG_ID}.confirm_writers_stopped",
                                   f"[nexus] ADMISSION RESUMED: tenant {NS}, {DAG_ID}.resume_admission",
                                   f"[nexus] CUT OVER: tenant {NS}, {DAG_ID}.final_old_writer_check"]
        ahead, asked, resumed, done = texts
        assert "admission is paused in a few seconds (the fence is armed next)" in ahead  # issue 50, item 3
        for link in links_of(result.run_id):
            assert link in ahead and link in resumed, (link, ahead, resumed)
        assert f"Confirm that every old-protocol writer of tenant {NS} is stopped" in asked
        for link in links_of(result.run_id, "confirm_writers_stopped"):
            assert link in asked, (link, asked)
        for link in links_of(result.run_id):
            assert link in done, (link, done)
        assert "required_actions" not in done
        pack = result.xcom("audit_and_checkpoint", map_index=0)
        paused = result.xcom("resume_admission")["admission_pause_s"]
        assert f"{pack['pack_install_id']} {pack['legacy_max_ordinal']}" in done
        assert f"admission paused {paused:.1f} s" in done
        assert f"admission paused {paused:.1f} s (fence " in resumed  # the pause it lasted, told at the release
        assert_redacted(sink, texts, password)
    finally:
        stop_host(result)


@pytest.mark.parametrize("kind", ["smtp", "slack"])
def test_a_rejected_question_sends_the_question_and_the_stop_once_each(dag, production, tenant_connection, kind):
    engine, conn_id, password = production
    with channel(kind, tenant_connection) as sink, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": "Reject"}) as hitl:
        result = run_dag(dag, base_conf(conn_id, host_controller="command", notify_conn_id=NOTIFY_CONN))
    assert not hitl.errors and result.state == "failed", result.task_states
    texts = sink.texts()
    assert sink.subjects() == [f"[nexus] PAUSE AHEAD: tenant {NS}, {DAG_ID}.wait_for_short_drain",
                               f"[nexus] NEEDS CONFIRMATION: tenant {NS}, {DAG_ID}.confirm_writers_stopped",
                               f"[nexus] FAILED: tenant {NS}, {DAG_ID}.confirm_writers_stopped"]  # never resumed
    stopped = texts[2]
    assert "cutover not performed" in stopped and "rejected" in stopped and "fence" in stopped, stopped
    for link in links_of(result.run_id):
        assert link in stopped, (link, stopped)
    assert_redacted(sink, texts, password)


def test_a_tenant_fenced_past_fence_alert_after_alerts_once_naming_its_step(dag, production, tenant_connection):
    """A live old writer keeps ``check_old_writers`` waiting inside the fenced window; with ``fence_alert_after``
    3 s the run alerts once (the deferred wait is woken by its trigger), naming the tenant, the step, the pause
    and the links. The writer stops only once the alert has arrived; the run then asks, is confirmed and ends
    cut over: the alert, the question and the end, one message each."""
    from airflow.models.variable import Variable

    from nexus_airflow.fence_watch import marker

    engine, conn_id, password = production
    sc = TenantScenario(namespace=NS)
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id=LIVE_WRITER)  # live: it heartbeats until the alert arrives
    sc.write(engine)
    result, done = None, threading.Event()
    with channel("smtp", tenant_connection) as sink:
        def old_writer() -> None:
            while not any("FENCED AND WAITING" in s for s in sink.subjects()) and not done.wait(1):
                heartbeat(engine, LIVE_WRITER)
            mark_stopped(engine, LIVE_WRITER)

        writer = threading.Thread(target=old_writer, daemon=True)
        writer.start()
        try:
            with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}) as hitl:
                result = run_dag(dag, base_conf(conn_id, host_controller="command", notify_conn_id=NOTIFY_CONN,
                                                fence_alert_after=3, stale_heartbeat=30))
            assert not hitl.errors and result.state == "success", result.task_states
            subjects, texts = sink.subjects(), sink.texts()
            assert [s.split(":")[0] for s in subjects] == [
                "[nexus] PAUSE AHEAD", "[nexus] FENCED AND WAITING", "[nexus] NEEDS CONFIRMATION",
                "[nexus] ADMISSION RESUMED", "[nexus] CUT OVER"], subjects
            alert = texts[1]
            assert subjects[1].startswith(f"[nexus] FENCED AND WAITING: tenant {NS} for ")
            assert subjects[1].endswith(", at check_old_writers"), subjects[1]
            assert "waits at: check_old_writers" in alert and "admission paused: " in alert
            assert "fence_alert_after: 3 s" in alert
            for link in links_of(result.run_id):
                assert link in alert, (link, alert)
            record = json.loads(Variable.get(marker(DAG_ID, result.run_id)))  # the once-per-run record
            assert record["step"] == "check_old_writers" and record["paused_s"] >= 3, record
            released = result.xcom("resume_admission")
            assert released["admission_pause_s"] > record["paused_s"]  # it alerted while the pause went on
            assert_redacted(sink, texts, password)
        finally:
            done.set()
            writer.join(timeout=30)
            stop_host(result)

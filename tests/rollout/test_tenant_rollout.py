"""``tenant_rollout`` on a running Airflow: waves, canary first, per-wave approvals, the failure budget, rerun.

Real ``airflow standalone`` (LocalExecutor, triggerer), three SimpleAuthManager
users: ``lead`` triggers the rollouts, ``approver`` may answer, ``admin`` watches.
Tenants are production-shaped (``nexus_sim.scenario.production``: ordinary work in every
status beside drained projection history, hostile lanes and receipt ids, 10,000 stopped
registry rows and an uninstalled incarnation; old writers stopped), half on
SQLite and half on MariaDB (utf8mb4, case-insensitive); the MariaDB ones get live traffic during
the rollout (ordinary work throughout, receipts from their release on). The new host is started by
the ``command`` controller. Every answer goes through the REST API, as a person's in the UI would.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import threading
import time
import uuid

import pytest
from sqlalchemy import update

from nexus_airflow.metrics import name_safe
from nexus_airflow.rollout import control_variable, run_id_for
from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.protocol_row import read_protocol_row
from nexus_cutover.runtime.registry import heartbeat as registry_heartbeat
from nexus_cutover.schema import has_table
from nexus_sim.checks import receipt_outcomes
from nexus_sim.old_runtime import OldRuntimeSimulator
from nexus_sim.scenario import TenantScenario
from nexus_sim.scenario.production import Planted, build_production_tenant
from nexus_sim.traffic import LiveTraffic
from scripts.demo import stop_pid_if_ours
from scripts.demo_airflow import AirflowStack, ApiError
from scripts.stack import mariadb_tenant, wait_for
from tests.notify_sinks import SLACK_TOKEN, SlackWebhookSink, SmtpSink
from tests.statsd_listener import StatsdListener

pytestmark = pytest.mark.airflow  # a real `airflow standalone` (mysql: set from mysql_server_url by tests/conftest.py)

ROLLOUT = "tenant_rollout"
CUTOVER = "connector_projection_cutover"
WAVE_CONFIRM = "Confirm: every old writer of every tenant of this wave stopped"
WAVE_REJECT = "Reject the wave"
CONFIRM = "Confirm: all old writers stopped"
USERS = "admin:admin,lead:admin,approver:admin"
STATSD_PREFIX = "nexus_rollout_test"


class Stack(AirflowStack):
    """The test's Airflow; REST calls wait up to 2 min (a loaded 2-core machine answers slowly, never wrongly)."""

    def request(self, method, path, body=None, *, auth=True, timeout=120.0):
        return super().request(method, path, body, auth=auth, timeout=timeout)


class As(Stack):
    """The REST API as one of the stack's users."""

    def __init__(self, stack: AirflowStack, user: str):  # the API only: no process of its own
        self.home, self.base_url = stack.home, stack.base_url
        password = json.loads((stack.home / "simple_auth_manager_passwords.json.generated").read_text())[user]
        self.token = self.request("POST", "/auth/token", {"username": user, "password": password}, auth=False)[
            "access_token"]


#: The production tenant's knobs here: one active pack (one audit task per tenant, as the wave timings assume; the
#: greenfield pack is left to the other end-to-end tests) beside an uninstalled incarnation, every ordinary status,
#: hostile lanes and receipt ids, the full 10,000 stopped registry rows.
SIZES = {"active_packs": 1, "plain_lanes": 2, "generations": 2, "greenfield_pack": False}


def _build(engine, namespace: str, seed: int) -> Planted:
    tenant = build_production_tenant(engine, namespace=namespace, seed=seed, **SIZES)
    sc = TenantScenario(namespace=namespace)
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id="old-writer-silent", heartbeat_age_s=3600)  # silent
    sc.write(engine)
    return tenant.planted


@pytest.fixture(scope="module")
def statsd():
    """A real StatsD listener every process of the stack sends its metrics to (``[metrics]`` from the env)."""
    with StatsdListener() as listener:
        yield listener


@pytest.fixture(scope="module")
def stack(tmp_path_factory, statsd):
    s = Stack(tmp_path_factory.mktemp("airflow"), parallelism=6,
              extra_env={"AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": USERS, "AIRFLOW__METRICS__STATSD_ON": "True",
                         "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1", "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port),
                         "AIRFLOW__METRICS__STATSD_PREFIX": STATSD_PREFIX})
    try:
        s.start()
        s.login()
        s.wait_for_dag(ROLLOUT)
        s.wait_for_dag(CUTOVER)
        yield s
        for run in s.request("GET", f"/api/v2/dags/{CUTOVER}/dagRuns?limit=100")["dag_runs"]:
            host = s.xcom(CUTOVER, run["dag_run_id"], "start_new_host") or {}
            if host.get("pid"):
                stop_pid_if_ours(int(host["pid"]), "nexus")
    finally:
        s.stop()


MAIL, SLACK = "nexus_notify_mail", "nexus_notify_slack"


@pytest.fixture(scope="module")
def channels(stack):
    """A real SMTP server and a Slack webhook listener, as the stack's connections ``MAIL`` and ``SLACK`` (a
    rollout names one in its ``notify_conn_id``; its tenants' runs use the same)."""
    with SmtpSink() as mail, SlackWebhookSink() as slack:
        for conn_id, sink in ((MAIL, mail), (SLACK, slack)):
            stack.put_connection(conn_id, **sink.rest_connection())
        yield mail, slack


def _about(sink, rollout_run: str) -> list[str]:
    """The messages ``sink`` received about ``rollout_run`` (its own, and its tenants' runs': their ids contain it)."""
    return [t for t in sink.texts() if rollout_run in t]


def _subjects(texts: list[str]) -> list[str]:
    """The subjects of ``texts``, sorted, but the pause notices (:func:`_paused`)."""
    return sorted(s for s in (t.split("\n", 1)[0].strip("*") for t in texts) if not s.startswith(PAUSE_NOTICES))


#: The notices of a tenant's pause (issue 50, item 3): the heads-up before its fence is armed, and its release.
PAUSE_NOTICES = ("[nexus] PAUSE AHEAD:", "[nexus] ADMISSION RESUMED:")


def _paused(texts: list[str], cut_over: list[str]) -> None:
    """Each tenant cut over (``cut_over``) was told its pause ahead and its end, once each; admission resumed for
    no other tenant (a tenant stopped while fenced stays paused); a heads-up only for a tenant of the rollout."""
    subjects = [t.split("\n", 1)[0].strip("*") for t in texts]
    resumed = sorted(s.split("tenant ", 1)[1].split(",", 1)[0] for s in subjects if s.startswith(PAUSE_NOTICES[1]))
    ahead = [s.split("tenant ", 1)[1].split(",", 1)[0] for s in subjects if s.startswith(PAUSE_NOTICES[0])]
    assert resumed == sorted(cut_over), subjects
    assert all(ahead.count(n) == 1 for n in cut_over) and len(ahead) == len(set(ahead)), subjects


#: The fewest tenants that still hold every case of the wave test: t01 the canary; wave 1 = t02 (succeeds beside
#: the two failures, so they fail alone), t03 (its silent old writer comes back), t04 (no connection yet); silent in
#: wave 2, never started by the halted rollout and run by the rerun. Both backends in the first rollout's waves.
TENANTS = 5
NO_CONNECTION = 4  # t04


@pytest.fixture(scope="module")
def tenants(stack, tmp_path_factory, mysql_server_url):
    """t01..silent (odd on SQLite, even on MariaDB), each with its connection; t04 has none yet. name -> DSN
    (and ``_no_conn``: t04's connection, created by the test; ``_planted``: name -> what was planted)."""
    folder = tmp_path_factory.mktemp("tenants")
    dsns: dict = {"_planted": {}}
    for i in range(1, TENANTS + 1):
        name = f"t{i:02d}{uuid.uuid4().hex[:4]}"
        if i % 2:
            path = folder / f"{name}.db"
            path.touch()
            engine = make_engine(f"sqlite:///{path}")
            dsns["_planted"][name] = _build(engine, name, i)
            engine.dispose()
            dsns[name] = f"sqlite:///{path}"
            conn = {"conn_type": "sqlite", "host": str(path)}
        else:
            made = mariadb_tenant(mysql_server_url, f"nx_roll_{name}",
                                  lambda e, n=name, k=i: dsns["_planted"].__setitem__(n, _build(e, n, k)))
            dsns[name], conn = made["dsn"], made["conn"]
        if i != NO_CONNECTION:
            stack.put_connection(f"nexus_tenant_{name}", **conn)
        else:
            dsns["_no_conn"] = conn
    return dsns


@contextlib.contextmanager
def _traffic(tenants: dict, names: list[str]):
    """Live traffic on the MariaDB tenants of ``names`` (ordinary work now, receipts once each is released):
    name -> (engine, LiveTraffic); stopped and disposed afterwards."""
    running = {}
    try:
        for n in names:
            if tenants[n].startswith("mysql"):
                engine = make_engine(tenants[n])
                running[n] = (engine, LiveTraffic(engine, tenants["_planted"][n], receipts_after_release=True,
                                                  interval_s=2.0).start())
        yield running
    finally:
        for engine, traffic in running.values():
            traffic.stop()
            engine.dispose()


def _conf(**form):
    return {"cutover_conf": {"host_controller": "command", "poll_interval": 10, "stale_heartbeat": 20,
                             "readiness_timeout": 300, "confirm_timeout": 900}, **form}


def _state(stack, dag_id: str, run_id: str) -> str | None:
    try:
        return stack.dag_run(dag_id, run_id)["state"]
    except ApiError as exc:
        if exc.status == 404:
            return None
        raise


def _reports(stack, tenant_run: str) -> dict:
    """Every XCom ``report`` of a tenant's run, by task: the message of an assertion on one of them."""
    return {t["task_id"]: stack.xcom(CUTOVER, tenant_run, t["task_id"], key="report")
            for t in stack.task_instances(CUTOVER, tenant_run)}


def _where(stack, rollout_run: str, tenant_run: str) -> dict:
    """Where a rollout and one tenant's run stand (every task's state): the message of a wait that ran out."""
    where = {}
    for dag_id, run_id in ((ROLLOUT, rollout_run), (CUTOVER, tenant_run)):
        if _state(stack, dag_id, run_id) is not None:
            where[run_id] = {t["task_id"]: t["state"] for t in stack.task_instances(dag_id, run_id)}
    return where


def _pending_wave(stack, run_id: str) -> dict | None:
    return next((d for d in stack.pending_hitl(ROLLOUT, run_id) if d["task_instance"]["task_id"].endswith(".confirm")),
                None)


def _drive(stack, run_id: str, on_question, timeout_s: float = 900) -> str:
    """Wait for the rollout run to end, calling ``on_question(detail)`` once per wave question that parks
    (>= 5 s after it parked: apache/airflow#71172)."""
    seen: dict[str, float] = {}
    deadline = time.monotonic() + timeout_s
    while (state := _state(stack, ROLLOUT, run_id)) not in ("success", "failed"):
        assert time.monotonic() < deadline, f"rollout {run_id} did not end within {timeout_s:.0f}s"
        detail = _pending_wave(stack, run_id)
        if detail:
            task = detail["task_instance"]["task_id"]
            seen.setdefault(task, time.monotonic())
            if time.monotonic() - seen[task] >= 5 and seen[task] > 0:
                on_question(detail)
                seen[task] = -1.0  # answered (or refused) once
        time.sleep(3)
    return state


def _answer(api, run_id: str, task_id: str, option: str):
    return api.answer_hitl(ROLLOUT, run_id, task_id, option)


def _checkpointed(dsn: str, packs: list[str]) -> bool | None:
    """True when every pack of ``packs`` has its checkpoint, False when none has (a tenant never started has not even
    the new table), None when only some have."""
    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:
            if not has_table(conn, catalog.ConnectorProjectionProtocol.name):
                return False
            written = {read_protocol_row(conn, pack) is not None for pack in packs}
            return written.pop() if len(written) == 1 else None
    finally:
        engine.dispose()


def _packs(tenants: dict, name: str) -> list[str]:
    return tenants["_planted"][name].active_packs


def _heartbeat(dsn: str, process_id: str, *, stopped: bool = False) -> None:
    engine = make_engine(dsn)
    try:
        with engine.begin() as conn:
            now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
            values = {"StoppedAt": now} if stopped else {"LastHeartbeatAt": now}
            conn.execute(update(catalog.ProcessRegistry).where(catalog.ProcessRegistry.c.ProcessId == process_id)
                         .values(**values))
    finally:
        engine.dispose()


def test_waves_with_per_wave_approval_halt_past_the_budget_and_a_rerun_skips_what_succeeded(stack, tenants, statsd,
                                                                                            channels):
    """5 tenants, canary 1, waves of 3, per-wave approval by ``approver`` only (the triggering ``lead`` is
    refused by the API: self-approval). Wave 1 has a tenant without a connection and a tenant whose silent old
    writer heartbeats after the wave's evidence was shown: both fail alone (the third tenant of the wave
    succeeds), the budget (0) is passed, the rollout halts and wave 2 is never started. The rerun
    (``retry_failed``, canary 2) skips the 2 tenants already cut over; its canary (the two that failed) is
    rejected (that wave fails alone) and its next wave runs and succeeds."""
    names = [n for n in tenants if not n.startswith("_")]
    assert len(names) == TENANTS
    with _traffic(tenants, names) as traffic:
        lead, approver = As(stack, "lead"), As(stack, "approver")
        silent, unconnected = names[2], names[NO_CONNECTION - 1]  # t03: its old writer comes back; t04: no connection
        # on_preflight_stop run: t04's preflight says stop (no connection), it starts anyway and fails in its wave
        run1 = lead.trigger(ROLLOUT, _conf(tenants=names, canary=1, wave_size=3, max_parallel=3, max_failed=0,
                                           approval="per_wave", approvers=["approver", "lead"],
                                           on_preflight_stop="run", notify_conn_id=MAIL))["dag_run_id"]
        refused: list[int] = []

        def first_rollout(detail):
            task = detail["task_instance"]["task_id"]
            assert "| tenant |" in detail["body"] and "password" not in detail["body"].lower()
            assert {u["name"] for u in detail["assigned_users"]} == {"approver"}  # lead triggered it: not assigned
            try:
                _answer(lead, run1, task, WAVE_CONFIRM)
            except ApiError as exc:
                refused.append(exc.status)
            if task == "wave_01.confirm":
                assert f"`{unconnected}` | run failed" in detail["body"], detail["body"]  # no connection: ended before
                _heartbeat(tenants[silent], "old-writer-silent")  # its old writer resumes after the evidence was shown
            _answer(approver, run1, task, WAVE_CONFIRM)

        assert _drive(stack, run1, first_rollout) == "failed"
        assert refused == [403, 403]  # self-approval refused by the API for both questions it was asked
        preflight = {r["tenant"]: r for r in stack.xcom(ROLLOUT, run1, "preflight", key="preflight")}
        assert list(preflight) == names and preflight[unconnected]["verdict"] == "stop"
        assert f"nexus_tenant_{unconnected}" in preflight[unconnected]["reason"]
        assert all(preflight[n]["verdict"] != "stop" for n in names if n != unconnected), preflight
        summary = stack.xcom(ROLLOUT, run1, "summary", key="summary")
        assert summary["halted"] == "halted after wave 1", summary
        t = summary["tenants"]
        assert [n for n in names if t[n]["state"] == "success"] == names[:2]
        assert t[silent]["state"] == "failed" and t[silent]["task"] == "confirm_writers_stopped"
        assert "old-writer-silent" in t[silent]["reason"]
        assert t[unconnected]["state"] == "failed" and t[unconnected]["task"] == "resolve_packs"
        assert {n: t[n]["state"] for n in names[4:]} == {n: "not run" for n in names[4:]}
        for n in names[4:]:  # later waves untouched: no run, no checkpoint
            assert _state(stack, CUTOVER, run_id_for(run1, n)) is None
            assert _checkpointed(tenants[n], _packs(tenants, n)) is False
        wave0 = stack.xcom(ROLLOUT, run1, "wave_00.close", key="wave")
        assert wave0["state"] == "succeeded" and wave0["approval"]["by"] == "approver"
        assert wave0["approval"]["answer"] == "approved"
        for n in names[:2]:  # the approver is recorded in every tenant's run (canary and wave 1), and in the summary
            assert stack.xcom(CUTOVER, run_id_for(run1, n), "confirm_writers_stopped")["responded_by"] == "approver"
            assert t[n]["approved_by"] == "approver"
            released = stack.xcom(CUTOVER, run_id_for(run1, n), "resume_admission")  # its pause, as its release recorded it
            assert t[n]["admission_pause_s"] == released["admission_pause_s"] > 0
        assert t[silent]["admission_pause_s"] is None  # stopped before its release
        pauses = sorted(t[n]["admission_pause_s"] for n in names[:2])
        assert summary["admission_pause"] == {"tenants": 2, "median_s": round((pauses[0] + pauses[1]) / 2, 3),
                                              "p95_s": round(pauses[1], 3), "max_s": round(pauses[1], 3)}
        assert "admission pause over 2 tenant(s)" in stack.xcom(ROLLOUT, run1, "summary", key="summary_text")
        _assert_metrics_of_the_first_rollout(statsd, run1, names, t)
        _assert_mail_of_the_first_rollout(stack, channels[0], run1, names, silent, unconnected)

        # the rerun: t04's connection now exists, t03's writer is stopped again
        stack.put_connection(f"nexus_tenant_{unconnected}", **tenants["_no_conn"])
        _heartbeat(tenants[silent], "old-writer-silent", stopped=True)
        run2 = lead.trigger(ROLLOUT, _conf(tenants=names, canary=2, wave_size=3, max_parallel=3, max_failed=0,
                                           approval="per_wave", approvers=["approver"], retry_failed=True,
                                           notify_conn_id=SLACK))["dag_run_id"]

        def second_rollout(detail):
            task = detail["task_instance"]["task_id"]
            _answer(approver, run2, task, WAVE_REJECT if task == "wave_00.confirm" else WAVE_CONFIRM)

        assert _drive(stack, run2, second_rollout) == "failed"  # the rejected canary's tenants did not succeed
        plan = stack.xcom(ROLLOUT, run2, "plan", key="rollout")
        assert sorted(plan["skipped"]) == sorted(names[:2])
        assert all("already cut over" in why for why in plan["skipped"].values())
        assert [w["tenants"] for w in plan["waves"]] == [[silent, unconnected], names[4:]]
        s2 = stack.xcom(ROLLOUT, run2, "summary", key="summary")
        assert s2["halted"] is None and s2["succeeded"] == names[4:]
        assert stack.xcom(ROLLOUT, run2, "wave_00.close", key="wave")["state"] == "rejected"
        for n in (silent, unconnected):
            assert s2["tenants"][n]["state"] == "failed" and _checkpointed(tenants[n], _packs(tenants, n)) is False
            assert "rejected" in s2["tenants"][n]["reason"]
        for n in names[4:]:
            assert _checkpointed(tenants[n], _packs(tenants, n)) is True
        # the rerun spoke through Slack: each wave's question once, the rejected tenants in the rollout's end only
        slack = _about(channels[1], run2)
        assert _subjects(slack) == sorted([
            f"[nexus] NEEDS CONFIRMATION: rollout wave 0, 2 tenant(s): {silent}, {unconnected}",
            f"[nexus] NEEDS CONFIRMATION: rollout wave 1, 1 tenant(s): {names[4]}",
            f"[nexus] CUT OVER: tenant {names[4]}, {CUTOVER}.final_old_writer_check",
            f"[nexus] ROLLOUT FAILED: {run2}: 1 of 3 tenant(s) cut over"]), _subjects(slack)
        _paused(slack, names[4:])
        assert channels[1].paths() == [f"/{SLACK_TOKEN}"] * len(channels[1].texts())
        end = next(t for t in slack if "ROLLOUT FAILED" in t)
        assert f"done: {names[4]}" in end and "rejected" in end and f"the rollout run: {stack.base_url}" in end
        assert not any(SLACK_TOKEN in t for t in slack)
        for n in names[:2] + names[4:]:  # every tenant cut over: its live traffic reached the new host after the release
            if n in traffic:
                engine, live = traffic[n]
                report = live.report
                assert not report.errors and report.receipts_held > 0 and report.ticks_after_release > 0, (n, report)
                wait_for("the receipts sent after the release admitted", lambda e=engine, r=report: all(
                    receipt_outcomes(e, r.receipts).values()), 120)
                assert report.ordinary and report.ordinary_completed, (n, report)  # ordinary work ran throughout


def _assert_mail_of_the_first_rollout(stack, mail, run1: str, names: list[str], silent: str, unconnected: str) -> None:
    """The first rollout's mail: each wave's question once (one message naming its tenants, the link to that
    question), each tenant's own end (cut over, or its stop), the rollout's halt as its end with its summary."""
    texts = _about(mail, run1)
    assert _subjects(texts) == sorted([
        f"[nexus] NEEDS CONFIRMATION: rollout wave 0, 1 tenant(s): {names[0]}",
        f"[nexus] NEEDS CONFIRMATION: rollout wave 1, 2 tenant(s): {names[1]}, {silent}",
        f"[nexus] CUT OVER: tenant {names[0]}, {CUTOVER}.final_old_writer_check",
        f"[nexus] CUT OVER: tenant {names[1]}, {CUTOVER}.final_old_writer_check",
        f"[nexus] FAILED: tenant {silent}, {CUTOVER}.confirm_writers_stopped",
        f"[nexus] FAILED: tenant {unconnected}, {CUTOVER}.resolve_packs",
        f"[nexus] ROLLOUT HALTED: {run1}: 2 of 5 tenant(s) cut over, halted after wave 1"]), _subjects(texts)
    _paused(texts, names[:2])
    wave1 = next(t for t in texts if "rollout wave 1" in t)
    assert f"answer it: {stack.base_url}/dags/{ROLLOUT}/runs/{run1}/tasks/wave_01.confirm/required_actions" in wave1
    assert f"not in it: {unconnected} (run failed)" in wave1, wave1
    end = next(t for t in texts if "ROLLOUT HALTED" in t)
    assert f"done: {names[0]}; {names[1]}" in end, end
    assert f"{silent} (confirm_writers_stopped: " in end and f"{unconnected} (resolve_packs: " in end
    assert f"not run: {names[4]} (halted after wave 1)" in end
    assert f"rollouts: {stack.base_url}/nexus-status/rollouts" in end
    stopped = next(t for t in texts if f"FAILED: tenant {silent}" in t)
    assert f"the tenant: {stack.base_url}/nexus-status/?search={silent}" in stopped


def _assert_metrics_of_the_first_rollout(statsd, run_id: str, names: list[str], outcomes: dict) -> None:
    """What the stack's task processes sent to the StatsD listener (issue 27): each wave's close counts the
    tenants done / failed / waiting (5 tenants: canary 1 done; wave 1 one done, two failed; one never run) with
    an ETA while one waits; each succeeded tenant's run sends its admission pause and its steps' durations."""
    got = statsd.values(STATSD_PREFIX)
    rollout = name_safe(run_id)
    counts = {state: got.get((f"nexus.rollout.tenants.{rollout}.{state}", "g")) for state in ("done", "failed", "waiting")}
    assert counts == {"done": [1, 2], "failed": [0, 2], "waiting": [4, 1]}, counts
    eta = got.get((f"nexus.rollout.wave.eta.{rollout}", "g"))
    assert eta and len(eta) == 2 and all(e > 0 for e in eta), eta
    for n in names[:2]:
        assert got[(f"nexus.admission.pause.{n}", "ms")] == [pytest.approx(outcomes[n]["admission_pause_s"] * 1000,
                                                                          abs=0.01)]
        assert got[(f"nexus.drain.remaining.{n}", "g")][-1] == 0  # drained: its drain poll says so
    # the step durations are fleet-wide (issue 49, item 5): one per run that ran the step, whichever process ended
    # it (a wait that ended in the triggerer or in a worker is counted once); no tenant in their names
    done = [n for n in names if outcomes[n]["state"] == "success"]
    assert len(got[("nexus.step.duration.final_old_writer_check.success", "ms")]) == len(done) == 2
    assert len(got[("nexus.step.duration.verify_readiness.success", "ms")]) == len(done)
    # the drain passed for the done tenants and for names[2], which stopped later, at its confirmation
    assert len(got[("nexus.step.duration.wait_for_drain.success", "ms")]) == len(done) + 1
    assert len(got[("nexus.step.duration.confirm_writers_stopped.failed", "ms")]) == 1
    assert not [k for k in got if k[0].startswith("nexus.step.duration.") and any(n in k[0] for n in names)]
    assert got[(f"nexus.step.failed.{names[2]}.confirm_writers_stopped.refused", "c")] == [1]  # a stop, by its reason
    assert got.get((f"nexus.rollout.halted.{rollout}", "g")) == [0, 1]  # the second close halted the rollout


def _sqlite_tenant(stack, tmp_path, prefix: str, seed: int, backlog: int = 0,
                   read_pool: str | None = None) -> tuple[str, str, list[str]]:
    """A production-shaped SQLite tenant with its connection (its extra naming ``read_pool``, its cluster's pool);
    ``backlog`` pending old projection WorkItems in a pack of their own (one generation per lane). (name, DSN,
    its active packs)."""
    name = f"{prefix}{uuid.uuid4().hex[:5]}"
    path = str(tmp_path / f"{name}.db")
    open(path, "a").close()
    engine = make_engine(f"sqlite:///{path}")
    packs = _build(engine, name, seed).active_packs
    if backlog:
        more = TenantScenario(namespace=name, event_id_start=500_000, work_id_start=500_000)
        pack = more.pack("pk-backlog")
        for lane in range(backlog):
            pack.lane(f"backlog-{lane:03d}").generation(1, status="pending")
        more.write(engine)
        packs = [*packs, "pk-backlog"]
    engine.dispose()
    extra = {"extra": json.dumps({"nexus_read_pool": read_pool})} if read_pool else {}
    stack.put_connection(f"nexus_tenant_{name}", "sqlite", host=path, **extra)
    return name, f"sqlite:///{path}", packs


def test_per_wave_asks_the_ready_tenants_and_a_late_one_asks_its_own_follow_up(stack, tmp_path, channels):
    """Per-wave approval, one wave of two: ``quick`` is drained; ``slow`` has an old backlog its live old worker
    is not finishing, so it waits before arming (``wait_for_short_drain``). The wave's question is asked for
    ``quick`` alone (``slow`` named as late, not in it) and its answer cuts ``quick`` over while ``slow`` is
    still unfenced. Then the old worker drains ``slow``'s backlog and stops: ``slow`` arms, drains and asks its
    own follow-up question in its run (the wave's answer did not confirm it); answered, it is cut over too.

    Both tenants' connections name their cluster's pool (extra ``nexus_read_pool``): ``quick``'s heavy reads (the
    history digest and its verification) ran in it, every other task in Airflow's default pool; ``slow``'s names a
    pool that does not exist, so its heavy reads ran in their own pool (Airflow never schedules a task of a missing
    pool, which would have held the fenced tenant for ever)."""
    pool = f"nexus_reads_{uuid.uuid4().hex[:6]}"
    stack.request("POST", "/api/v2/pools", {"name": pool, "slots": 1, "description": "one test cluster's heavy reads"})
    quick, quick_dsn, quick_packs = _sqlite_tenant(stack, tmp_path, "q", 60, read_pool=pool)
    slow, slow_dsn, slow_packs = _sqlite_tenant(stack, tmp_path, "s", 61, backlog=6, read_pool=f"{pool}_typo")
    engine = make_engine(slow_dsn)
    sim = OldRuntimeSimulator(engine, slow, process_id="old-rt", work_per_step=50)
    sim.register()
    beating, go = threading.Event(), threading.Event()

    def old_runtime():  # heartbeats without finishing anything until ``go``, then drains the backlog and stops
        while not go.wait(3):
            for pid in (sim.writer_id, sim.worker_id, sim.resolver_id):
                registry_heartbeat(engine, pid)
            beating.set()
        sim.run(exit_when_drained=True)

    worker = threading.Thread(target=old_runtime, daemon=True)
    worker.start()
    try:
        approver = As(stack, "approver")
        run_id = stack.trigger(ROLLOUT, _conf(tenants=[quick, slow], canary=2, wave_size=2, max_parallel=2,
                                              approval="per_wave", approvers=["approver"],
                                              notify_conn_id=MAIL))["dag_run_id"]
        slow_run = run_id_for(run_id, slow)
        deadline = time.monotonic() + 600
        while not (wave := _pending_wave(stack, run_id)):
            assert time.monotonic() < deadline and _state(stack, ROLLOUT, run_id) in ("queued", "running"), \
                _where(stack, run_id, slow_run)
            time.sleep(3)
        assert f"`{slow}` | late: waiting for its old backlog" in wave["body"] and "(not in this question)" in wave["body"]
        assert f"`{quick}` | 0 / " in wave["body"], wave["body"]
        assert stack.xcom(ROLLOUT, run_id, "wave_00.confirm", key="shown").keys() == {quick}
        time.sleep(5)  # apache/airflow#71172: answered >= 5 s after it parked
        _answer(approver, run_id, "wave_00.confirm", WAVE_CONFIRM)
        while _state(stack, CUTOVER, run_id_for(run_id, quick)) != "success":
            assert time.monotonic() < deadline, _where(stack, run_id, run_id_for(run_id, quick))
            time.sleep(3)
        slow_states = {t["task_id"]: t["state"] for t in stack.task_instances(CUTOVER, slow_run)}
        assert slow_states.get("arm_fence") is None, slow_states  # quick was cut over while slow was not yet fenced
        assert _checkpointed(slow_dsn, slow_packs) is False
        go.set()  # the old worker finishes the backlog and stops: slow arms, drains, and asks its own question
        deadline = time.monotonic() + 600
        while not (own := stack.pending_hitl(CUTOVER, slow_run)):
            assert time.monotonic() < deadline and _state(stack, CUTOVER, slow_run) in ("queued", "running"), \
                _where(stack, run_id, slow_run)
            time.sleep(3)
        assert own[0]["task_instance"]["task_id"] == "confirm_writers_stopped"
        assert "Follow-up to wave 0's question" in own[0]["body"] and f"`{slow}`" in own[0]["body"]
        assert {u["name"] for u in own[0]["assigned_users"]} == {"approver"}  # the rollout's approvers, unchanged
        time.sleep(5)
        approver.answer_hitl(CUTOVER, slow_run, "confirm_writers_stopped", CONFIRM)
        deadline = time.monotonic() + 600
        while _state(stack, ROLLOUT, run_id) not in ("success", "failed"):
            assert time.monotonic() < deadline, _where(stack, run_id, slow_run)
            time.sleep(3)
        summary = stack.xcom(ROLLOUT, run_id, "summary", key="summary")
        assert _state(stack, ROLLOUT, run_id) == "success", summary
        assert {t: summary["tenants"][t]["approved_by"] for t in (quick, slow)} == {quick: "approver", slow: "approver"}
        assert _checkpointed(quick_dsn, quick_packs) is True and _checkpointed(slow_dsn, slow_packs) is True
        quick_release = stack.xcom(CUTOVER, run_id_for(run_id, quick), "resume_admission")
        slow_release = stack.xcom(CUTOVER, slow_run, "resume_admission")
        # quick's pause ended before slow's began: no tenant's pause held another's backlog
        assert dt.datetime.fromisoformat(str(quick_release["released_at"])) < dt.datetime.fromisoformat(
            str(slow_release["armed_at"]))
        assert beating.is_set()
        # one message per question: the wave's (quick in it, slow named as not in it), slow's follow-up once
        mail = _about(channels[0], run_id)
        assert _subjects(mail) == sorted([
            f"[nexus] NEEDS CONFIRMATION: rollout wave 0, 1 tenant(s): {quick}",
            f"[nexus] NEEDS CONFIRMATION: tenant {slow}, {CUTOVER}.confirm_writers_stopped",
            f"[nexus] CUT OVER: tenant {quick}, {CUTOVER}.final_old_writer_check",
            f"[nexus] CUT OVER: tenant {slow}, {CUTOVER}.final_old_writer_check",
            f"[nexus] ROLLOUT SUCCEEDED: {run_id}: 2 of 2 tenant(s) cut over"]), _subjects(mail)
        _paused(mail, [quick, slow])
        wave = next(t for t in mail if "rollout wave 0" in t)
        assert f"not in it: {slow} (late: waiting for its old backlog" in wave, wave
        follow_up = next(t for t in mail if f"NEEDS CONFIRMATION: tenant {slow}" in t)
        assert f"answer it: {stack.base_url}/dags/{CUTOVER}/runs/{slow_run}/tasks/confirm_writers_stopped/" \
               "required_actions" in follow_up, follow_up
        for run, heavy_pool in ((run_id_for(run_id, quick), pool), (slow_run, "default_pool")):
            pools = {t["task_id"]: t["pool"] for t in stack.task_instances(CUTOVER, run)}
            assert pools["history_digest"] == pools["final_old_writer_check"] == heavy_pool, pools
            assert {p for task, p in pools.items() if task not in ("history_digest", "final_old_writer_check")} \
                == {"default_pool"}, pools
    finally:
        go.set()
        worker.join(timeout=120)
        engine.dispose()


def test_pause_holds_new_tenants_resume_starts_them_and_cancel_stops_before_the_checkpoint(stack, tmp_path):
    """Per-tenant approval. Paused from the start: the plan runs, no tenant starts. Resumed: the canary
    starts; cancelled while its confirmation waits: the answer no longer confirms (the tenant stops before its
    checkpoint, fence armed), and the next wave never starts."""
    created = []
    for i in range(2):
        name = f"c{i}{uuid.uuid4().hex[:5]}"
        path = str(tmp_path / f"{name}.db")
        open(path, "a").close()
        engine = make_engine(f"sqlite:///{path}")
        packs = _build(engine, name, 40 + i).active_packs
        engine.dispose()
        stack.put_connection(f"nexus_tenant_{name}", "sqlite", host=path)
        created.append((name, f"sqlite:///{path}", packs))
    run_id = f"ctl-{uuid.uuid4().hex[:8]}"
    variable = control_variable(run_id)
    stack.request("POST", "/api/v2/variables", {"key": variable, "value": "pause"})
    stack.trigger(ROLLOUT, _conf(tenants=[n for n, _, _ in created], canary=1, wave_size=1, approvers=["approver"]),
                  run_id=run_id)
    first = run_id_for(run_id, created[0][0])
    deadline = time.monotonic() + 300
    while True:  # paused: the plan ran, the canary's wave waits to open
        states = {t["task_id"]: t["state"] for t in stack.task_instances(ROLLOUT, run_id)}
        if states.get("plan") == "success" and states.get("wave_00.open") == "up_for_reschedule":
            break
        assert time.monotonic() < deadline, states
        time.sleep(3)
    time.sleep(15)
    assert _state(stack, CUTOVER, first) is None  # still paused after another poll: nothing started
    stack.request("PATCH", f"/api/v2/variables/{variable}", {"key": variable, "value": "resume"})
    deadline = time.monotonic() + 400
    while not stack.pending_hitl(CUTOVER, first):
        assert time.monotonic() < deadline and _state(stack, ROLLOUT, run_id) == "running", _where(stack, run_id, first)
        time.sleep(3)
    time.sleep(5)
    stack.request("PATCH", f"/api/v2/variables/{variable}", {"key": variable, "value": "cancel"})
    As(stack, "approver").answer_hitl(CUTOVER, first, "confirm_writers_stopped", CONFIRM)
    deadline = time.monotonic() + 300
    while _state(stack, ROLLOUT, run_id) not in ("success", "failed"):
        assert time.monotonic() < deadline, _where(stack, run_id, first)
        time.sleep(3)
    assert _state(stack, ROLLOUT, run_id) == "failed", _where(stack, run_id, first)
    assert _state(stack, CUTOVER, first) == "failed", _where(stack, run_id, first)
    # The answer no longer confirms: the confirmation reads the cancel and stops, naming the rollout, fence armed.
    # (CI found no report there twice: Airflow 3.3.2 had failed the task for an answer given before the scheduler
    # handled the question's park; answer_hitl now waits for that. Every task's state and report if it recurs.)
    reports = _reports(stack, first)
    stops = {task: r for task, r in reports.items() if isinstance(r, dict) and r.get("cancelled_by_rollout") == run_id}
    assert list(stops) == ["confirm_writers_stopped"], (_where(stack, run_id, first), reports)
    report = next(iter(stops.values()))
    assert "fence stays armed" in report["message"] and "before its checkpoint" in report["message"], report
    assert _checkpointed(created[0][1], created[0][2]) is False
    summary = stack.xcom(ROLLOUT, run_id, "summary", key="summary")
    assert summary["halted"] == "cancelled after wave 0", summary
    assert summary["tenants"][created[1][0]]["state"] == "not run"
    assert _state(stack, CUTOVER, run_id_for(run_id, created[1][0])) is None


def test_an_unanswered_question_alerts_once_past_fence_alert_after_and_stays_the_same_question(stack, tmp_path,
                                                                                                channels):
    """Issue 38, item 2, where no code runs: a tenant's writer-stop question parked (``awaiting_input``) while its
    run holds the fence, ``fence_alert_after`` 90 s (longer than the steps before the question take). The question
    parks until the alert is due; Airflow's timeout sweep resumes it then: it alerts once (its step, the question's
    Required-actions link) and parks again on the same question, nothing asked again. Answered after the alert,
    the run is cut over: the question, the alert and the end, one message each, in that order."""
    mail = channels[0]
    name, _, _ = _sqlite_tenant(stack, tmp_path, "f", 62)
    run_id = stack.trigger(CUTOVER, {"tenant": name, "host_controller": "command", "poll_interval": 10,
                                     "stale_heartbeat": 20, "readiness_timeout": 300, "confirm_timeout": 900,
                                     "fence_alert_after": 90, "notify_conn_id": MAIL})["dag_run_id"]
    deadline = time.monotonic() + 600
    while not any("FENCED AND WAITING" in t for t in _about(mail, run_id)):
        assert time.monotonic() < deadline and _state(stack, CUTOVER, run_id) in ("queued", "running"), \
            stack.task_instances(CUTOVER, run_id)
        time.sleep(3)
    pending = stack.pending_hitl(CUTOVER, run_id)
    assert [d["task_instance"]["task_id"] for d in pending] == ["confirm_writers_stopped"], pending  # the same one
    time.sleep(5)  # apache/airflow#71172: answered >= 5 s after it parked again
    stack.answer_hitl(CUTOVER, run_id, "confirm_writers_stopped", CONFIRM)
    while _state(stack, CUTOVER, run_id) not in ("success", "failed"):
        assert time.monotonic() < deadline, stack.task_instances(CUTOVER, run_id)
        time.sleep(3)
    assert _state(stack, CUTOVER, run_id) == "success", stack.task_instances(CUTOVER, run_id)
    texts = _about(mail, run_id)
    assert [t.split("\n", 1)[0].split(":")[0] for t in texts] == [
        "[nexus] PAUSE AHEAD", "[nexus] NEEDS CONFIRMATION", "[nexus] FENCED AND WAITING", "[nexus] ADMISSION RESUMED",
        "[nexus] CUT OVER"], texts
    alert = texts[2]
    assert alert.split("\n", 1)[0].endswith(", at confirm_writers_stopped") and f"tenant: {name}" in alert
    assert f"answer it: {stack.base_url}/dags/{CUTOVER}/runs/{run_id}/tasks/confirm_writers_stopped/" \
           "required_actions" in alert, alert
    assert f"the tenant: {stack.base_url}/nexus-status/?search={name}" in alert  # (its host: stopped by `stack`)

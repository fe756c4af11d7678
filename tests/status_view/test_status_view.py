"""The status view in a real headless Chromium against a running Airflow API server.

One ``airflow standalone`` (the demo's stack, its own SQLite metadata DB) with
the ``nexus_status`` plugin, an admin and an unprivileged ``viewer`` user
(SimpleAuthManager role VIEWER: reads DAGs, not connections). First two tenant
connections created through the REST API: the demo tenant on SQLite (fence
armed, old work still in flight) and a tenant on MariaDB whose checkpoint is
written, reached through a MariaDB user with a password and only SELECT. The
page must show both tenants' state, draw the drain chart, and never show the
password. Then two rollout runs in every state (a plan, a succeeded wave, a
halted wave with a failed tenant and its reason, a rejected approval, a wave
running with a tenant draining and one waiting for its confirmation, a paused
control) written into the metadata DB (``seed_runs``: the rollout DAG is being
rewritten): the rollout page and each tenant row's "what now?" must show them,
with the drain ETA measured while the test drains a tenant. Screenshots are
saved under ``test-artifacts/``. The viewer gets 403 on every route.
"""

from __future__ import annotations

import json
import pathlib
import random
import subprocess
import sys
import time
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.projection.checkpoint import run_checkpoint
from nexus_cutover.projection.cutover_fence import arm_fence
from nexus_cutover.schema import apply_steps, create_legacy_schema, projection_steps
from nexus_sim.scenario import TenantScenario, drained_pack_history
from scripts.demo_airflow import AirflowStack, ApiError
from scripts.demo_seed import seed

from .chromium import Browser, chromium_path

pytestmark = pytest.mark.airflow  # a real `airflow standalone` (mysql: set from mysql_url by tests/conftest.py)

REPO = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


def tenant_text(tenant: str) -> str:
    """The page's text of one tenant: its state row and the row under it (what now, proofs)."""
    return (f"Array.from(document.querySelectorAll('tr[data-tenant=\"{tenant}\"]'))"
            ".map(r => r.innerText).join('\\n')")


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if chromium_path() is None:
        pytest.fail("chromium is not installed: scripts/bootstrap.sh installs it (apt-get install -y chromium)")
    s = AirflowStack(tmp_path_factory.mktemp("airflow-status"), parallelism=2, extra_env={
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin,viewer:viewer",
        "NEXUS_STATUS_REFRESH_S": "5"})
    try:
        s.start(timeout_s=600)  # a loaded 2-core machine: the stack took 3 min to be healthy here
        yield s
    finally:
        s.stop()  # also when start() gave up: it leaves the stack's processes running


def _demo_tenant_fenced(tmp_path) -> tuple[str, int]:
    path = tmp_path / "tenant-demo.db"
    info = seed(str(path), "demo", production=False)  # the clean tenant: the row below names its two packs
    engine = make_engine(f"sqlite:///{path}")
    try:
        apply_steps(engine, projection_steps(engine))
        fence = arm_fence(engine, "demo", armed_by="status-view-test", timeout_s=30)
    finally:
        engine.dispose()
    return str(path), fence.fence_id, info["live_old_work"]


def _mariadb_tenant_cut_over(url: str) -> tuple[dict, int]:
    """Tenant 'acme' on MariaDB: drained history, schema, checkpoint; a SELECT-only user with a password."""
    engine = make_engine(url)
    try:
        create_legacy_schema(engine)
        sc = TenantScenario(namespace="acme")
        drained_pack_history(sc.pack("pk-acme"), random.Random(3), lanes=3, generations=4)
        sc.write(engine)
        apply_steps(engine, projection_steps(engine))
        arm_fence(engine, "acme", armed_by="status-view-test", timeout_s=30)
        result = run_checkpoint(engine, "pk-acme", timeout_s=30, written_by="status-view-test")
        assert result.outcome == "written", result.as_json()
        u = make_url(url)
        user, password = f"nxv_{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
        with engine.begin() as conn:
            conn.execute(text(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'"))
            conn.execute(text(f"GRANT SELECT ON `{u.database}`.* TO '{user}'@'%'"))
    finally:
        engine.dispose()
    conn = {"conn_type": "mysql", "host": u.host, "port": u.port or 3306, "login": user, "password": password,
            "schema": u.database}
    return conn, result.legacy_max_ordinal


def test_status_page_in_chromium(stack, tmp_path, mysql_url):
    demo_path, fence_id, live = _demo_tenant_fenced(tmp_path)
    acme, acme_cutoff = _mariadb_tenant_cut_over(mysql_url)
    stack.put_connection("nexus_tenant_demo", "sqlite", host=demo_path)
    stack.put_connection("nexus_tenant_acme", **acme)

    # registered as an Airflow 3 plugin: a FastAPI app and a nav entry
    plugins = stack.request("GET", "/api/v2/plugins")["plugins"]
    mine = next(p for p in plugins if p["name"] == "nexus_status")
    assert mine["fastapi_apps"][0]["url_prefix"] == "/nexus-status"
    assert mine["external_views"][0]["href"] == "/nexus-status/"

    # the JSON needs a logged-in user, like the REST API
    token, stack.token = stack.token, None
    with pytest.raises(ApiError) as denied:
        stack.request("GET", "/nexus-status/api/tenants")
    assert denied.value.status in (401, 403)
    stack.token = token
    body = stack.request("GET", "/nexus-status/api/tenants")
    raw = json.dumps(body)
    assert acme["password"] not in raw
    by_tenant = {t["tenant"]: t for t in body["tenants"]}
    assert by_tenant["demo"]["fence"]["armed"] is True
    assert by_tenant["demo"]["drain"]["remaining"] == live
    assert by_tenant["acme"]["packs"] == [{"pack_install_id": "pk-acme", "checkpoint": {
        "protocol_version": 1, "legacy_max_ordinal": acme_cutoff,
        "written_at": by_tenant["acme"]["packs"][0]["checkpoint"]["written_at"], "written_by": "status-view-test"},
        "old_work_above_cutoff": None}]
    assert by_tenant["acme"]["database"].startswith("mysql")
    assert by_tenant["acme"]["proofs"] == {} and by_tenant["demo"]["proofs"] == {}  # no run of either DAG yet

    with Browser() as browser:
        browser.set_cookie(stack.base_url, "_token", stack.token)
        browser.goto(f"{stack.base_url}/nexus-status/")
        browser.wait_for("document.querySelectorAll('tr[data-tenant]').length >= 2")
        # two refreshes at least 4 s apart give the drain chart its first line
        browser.wait_for("document.querySelector('tr[data-tenant=\"demo\"] svg.drain-chart') !== null", timeout_s=40)
        demo_row = browser.eval(tenant_text("demo"))
        acme_row = browser.eval(tenant_text("acme"))
        html = browser.eval("document.documentElement.outerHTML")
        shot = browser.screenshot(ARTIFACTS / "status_view.png")
        # the nav entry: the Airflow UI embeds the same page
        browser.goto(f"{stack.base_url}/plugin/nexus-tenants")
        frame_src = browser.wait_for(
            "Array.from(document.querySelectorAll('iframe')).map(f => f.src).find(s => s.endsWith('/nexus-status/'))")
        browser.wait_for("document.body.innerText.includes('Browse')")
        browser.wait_for("(document.querySelector('iframe').contentDocument || {querySelectorAll: () => []})"
                         ".querySelectorAll('tr[data-tenant]').length >= 2")
        browser.screenshot(ARTIFACTS / "status_view_in_airflow_ui.png")

    assert "draining" in demo_row
    assert f"fence {fence_id} '*'" in demo_row
    assert f"{live}\n" in demo_row or f"{live} " in demo_row
    assert "pk-crm-sync: no checkpoint" in demo_row and "pk-billing: no checkpoint" in demo_row
    assert "stage 1" in demo_row
    assert "no cutover run recorded" in demo_row and "no cutover run recorded" in acme_row  # proofs column
    assert f"pk-acme: LegacyMaxOrdinal {acme_cutoff}" in acme_row
    assert "checkpointed" in acme_row
    assert acme["password"] not in html
    assert shot.stat().st_size > 10_000
    assert frame_src == f"{stack.base_url}/nexus-status/"


# ---------------------------------------------------------------------------
# Rollouts in every state, each tenant's "what now?", the drain ETA, and 403
# ---------------------------------------------------------------------------

CUTOVER, ROLLOUT = "connector_projection_cutover", "tenant_rollout"
LEAKED = "mysql://cutover:s3cret-pw@tidb.internal:4000/t_r03"  # what a careless driver message could contain
REASON_R03 = f"Refused: the audit found 2 admissions after the fence on {LEAKED}"


def _cutover_run(rollout_id: str, tenant: str, state: str, tis: list, xcoms: list | None = None, **kw) -> dict:
    from nexus_airflow.rollout import run_id_for

    return {"dag_id": CUTOVER, "run_id": run_id_for(rollout_id, tenant), "state": state,
            "conf": {"tenant": tenant, "rollout": {"run_id": rollout_id}},
            "tis": [{"task_id": t, "state": st} for t, st in tis], "xcoms": xcoms or [], **kw}


def _wave_xcom(k: int, value: dict) -> dict:
    from nexus_airflow.rollout import WAVE_KEY, wave_group

    return {"task_id": f"{wave_group(k)}.close", "key": WAVE_KEY, "value": {"wave": k, **value}}


def _rollout_spec() -> dict:
    """Rollout A (failed): canary succeeded and approved, wave 1 halted (r03 failed, r05 never started), wave 2
    never started. Rollout B (running, paused): wave 0's approval rejected, wave 1 running (s02 draining, s03
    waiting for its writer-stop confirmation)."""
    from nexus_airflow.rollout import PLAN_KEY, SUMMARY_KEY, control_variable

    plan_a = {"waves": [{"wave": 0, "name": "canary", "tenants": ["r01", "r02"]},
                        {"wave": 1, "name": "wave 1", "tenants": ["r03", "r04", "r05"]},
                        {"wave": 2, "name": "wave 2", "tenants": ["r06", "r07"]}],
              "approval": "per_wave", "approvers": ["lead-anna"], "max_failed": 0, "skipped": {"r00": "already cut over"}}
    plan_b = {"waves": [{"wave": 0, "name": "canary", "tenants": ["s01"]},
                        {"wave": 1, "name": "wave 1", "tenants": ["s02", "s03"]}],
              "approval": "per_wave", "approvers": ["lead-bob"], "max_failed": 1, "skipped": {}}
    rollout_a = {"dag_id": ROLLOUT, "run_id": "rollout-a", "state": "failed", "conf": {}, "tis": [], "xcoms": [
        {"task_id": "plan", "key": PLAN_KEY, "value": plan_a},
        _wave_xcom(0, {"state": "succeeded", "succeeded": ["r01", "r02"], "failed": {},
                       "approval": {"by": "lead-anna", "at": "2026-12-01T09:12:00Z", "answer": "approved"}}),
        _wave_xcom(1, {"state": "halted", "succeeded": ["r04"],
                       "failed": {"r03": {"task": "audit_and_checkpoint", "reason": REASON_R03}},
                       "approval": {"by": "lead-anna", "at": "2026-12-01T09:40:00Z", "answer": "approved"}}),
        {"task_id": "summary", "key": SUMMARY_KEY, "value": {"succeeded": ["r01", "r02", "r04"], "failed": ["r03"],
                                                             "halted_at_wave": 1, "not_run": ["r05", "r06", "r07"]}},
        {"task_id": "summary", "key": "summary_text", "value": "halted at wave 1\nsucceeded: r01, r02, r04\nfailed: r03"}]}
    rollout_b = {"dag_id": ROLLOUT, "run_id": "rollout-b", "state": "running", "conf": {},
                 "tis": [{"task_id": "wave_01.confirm", "state": "awaiting_input"}], "xcoms": [
        {"task_id": "plan", "key": PLAN_KEY, "value": plan_b},
        _wave_xcom(0, {"state": "halted", "succeeded": [],
                       "failed": {"s01": {"task": "confirm_writers_stopped", "reason": "wave approval rejected"}},
                       "approval": {"by": "lead-bob", "at": "2026-12-01T10:05:00Z", "answer": "rejected"}})]}
    done = [("resolve_packs", "success")]
    runs = [rollout_a,
            _cutover_run("rollout-a", "r01", "success", done, minutes=12),
            _cutover_run("rollout-a", "r02", "success", done, minutes=18),
            _cutover_run("rollout-a", "r03", "failed", [("audit_and_checkpoint", "failed"),
                                                         ("start_new_host", "upstream_failed")],
                         [{"task_id": "audit_and_checkpoint", "key": "report", "value": {"message": REASON_R03}}]),
            _cutover_run("rollout-a", "r04", "success", done, minutes=15),
            rollout_b,
            _cutover_run("rollout-b", "s01", "failed", [("confirm_writers_stopped", "failed")]),
            _cutover_run("rollout-b", "s02", "running", [("wait_for_drain", "deferred")]),
            _cutover_run("rollout-b", "s03", "running", [("confirm_writers_stopped", "awaiting_input")])]
    return {"runs": runs, "variables": {control_variable("rollout-b"): "pause"}}


def _pause(stack, dag_id: str) -> None:
    """No scheduler acts on the runs written below: their DAGs are paused (a paused DAG's runs are not examined)."""
    stack.wait_for_dag(dag_id, timeout_s=180)
    stack.request("PATCH", f"/api/v2/dags/{dag_id}", {"is_paused": True})


def _draining_tenant(tmp_path, tenant: str, items: int):
    from tests.support import make_cutover_ready

    path = tmp_path / f"tenant-{tenant}.db"
    path.touch()
    engine = make_engine(f"sqlite:///{path}")
    make_cutover_ready(engine)
    sc = TenantScenario(namespace=tenant)
    lane = sc.pack(f"pk-{tenant}").lane("l")
    work = [lane.generation(1, status="pending")[1]["WorkId"] for _ in range(items)]
    sc.write(engine)
    return str(path), engine, work


@pytest.fixture(scope="module")
def rollouts_seeded(stack, tmp_path_factory):
    tmp = tmp_path_factory.mktemp("rollout-tenants")
    for dag_id in (CUTOVER, ROLLOUT):
        _pause(stack, dag_id)
    s02_path, s02, work = _draining_tenant(tmp, "s02", 8)
    r03_path, r03, _ = _draining_tenant(tmp, "r03", 0)
    r03.dispose()
    stack.put_connection("nexus_tenant_s02", "sqlite", host=s02_path)
    stack.put_connection("nexus_tenant_r03", "sqlite", host=r03_path)
    subprocess.run([sys.executable, "-m", "tests.status_view.seed_runs"], input=json.dumps(_rollout_spec()),
                   text=True, env=stack.env, cwd=REPO, check=True, timeout=120, capture_output=True)
    yield s02, work
    s02.dispose()


def _drain_until_eta(stack, s02, work) -> dict:
    """The old runtime (simulated) completes s02's work two items at a time until the rollout shows its ETA."""
    deadline = time.monotonic() + 90
    done = 0
    while time.monotonic() < deadline:
        body = stack.request("GET", "/nexus-status/api/rollouts", timeout=120)
        b = next(r for r in body["rollouts"] if r["run_id"] == "rollout-b")
        t = next(t for t in b["waves"][1]["tenants"] if t["tenant"] == "s02")
        if t["eta"] and t["eta"]["eta_min"]:
            return body
        if done < len(work) - 2:
            with s02.begin() as conn:
                conn.execute(catalog.WorkItem.update().where(catalog.WorkItem.c.WorkId.in_(work[done:done + 2]))
                             .values(Status="completed"))
            done += 2
        time.sleep(3)
    raise AssertionError(f"no ETA for s02 after 90 s: {t}")


def test_rollout_page_and_what_now_in_chromium(stack, rollouts_seeded):
    s02, work = rollouts_seeded
    body = _drain_until_eta(stack, s02, work)
    raw = json.dumps(body)
    assert "s3cret" not in raw and "tidb.internal" not in raw and "://" not in raw
    by_run = {r["run_id"]: r for r in body["rollouts"]}
    a, b = by_run["rollout-a"], by_run["rollout-b"]
    assert [w["state"] for w in a["waves"]] == ["succeeded", "halted", "pending"]
    assert a["waves"][0]["approval"] == {"by": "lead-anna", "at": "2026-12-01T09:12:00Z", "answer": "approved"}
    r03 = {t["tenant"]: t for t in a["waves"][1]["tenants"]}
    assert r03["r03"]["task"] == "audit_and_checkpoint" and r03["r03"]["state"] == "failed"
    assert r03["r03"]["reason"] == "Refused: the audit found 2 admissions after the fence on [DSN hidden]"
    assert r03["r05"]["state"] == "not started" and a["skipped"] == {"r00": "already cut over"}
    assert a["eta"]["text"] == "halted at wave 1: no later wave starts (failed)" and a["summary"]["failed"] == ["r03"]
    assert a["eta"]["final"] == "failed" and b["eta"].get("final") is None  # a finished rollout's state, not an ETA
    assert a["summary_text"].splitlines() == ["halted at wave 1", "succeeded: r01, r02, r04", "failed: r03"]  # lines
    assert b["control"]["state"] == "pause" and b["waves"][0]["approval"]["answer"] == "rejected"
    assert b["waves"][1]["step"] == {"task": "wave_01.confirm", "state": "awaiting_input"}
    assert b["waves"][0]["step"] is None and a["waves"][1]["step"] is None
    assert b["waves"][0]["tenants"][0]["reason"] == "wave approval rejected"  # the run left none: the wave's record
    wave1 = {t["tenant"]: t for t in b["waves"][1]["tenants"]}
    assert b["waves"][1]["state"] == "running"
    assert (wave1["s02"]["task"], wave1["s02"]["task_state"]) == ("wait_for_drain", "deferred")
    assert (wave1["s03"]["task"], wave1["s03"]["task_state"]) == ("confirm_writers_stopped", "awaiting_input")
    eta = wave1["s02"]["eta"]
    assert eta["rate_per_min"] > 0 and eta["eta_min"] >= 1 and eta["text"].endswith(f"ETA ~{eta['eta_min']} min")
    assert wave1["s03"]["eta"]["text"] == "waits for a person (its confirmation)"
    # the wave's question waits for its approver: the ETA says for whom, not "unknown" (issue 51, item 8)
    assert b["waves"][1]["eta_min"] is None and b["eta"]["text"] == "wave 1: waiting for lead-bob to answer the wave's question"

    tenants = stack.request("GET", "/nexus-status/api/tenants?search=r03", timeout=120)["tenants"]
    what_now = tenants[0]["runs"]["cutover"]
    assert what_now["task"] == "audit_and_checkpoint" and "[DSN hidden]" in what_now["reason"]
    assert what_now["link"] == "/dags/connector_projection_cutover/runs/rollout__rollout-a__r03"
    from nexus_cutover.projection.next_actions import next_action

    assert what_now["next_action"] == next_action("audit_and_checkpoint")

    with Browser() as browser:
        browser.set_cookie(stack.base_url, "_token", stack.token)
        browser.goto(f"{stack.base_url}/nexus-status/rollouts")
        browser.wait_for("document.querySelectorAll('[data-rollout]').length >= 2")
        page_a = browser.eval("document.querySelector('[data-rollout=\"rollout-a\"]').innerText")
        page_b = browser.eval("document.querySelector('[data-rollout=\"rollout-b\"]').innerText")
        rollout_html = browser.eval("document.documentElement.outerHTML")
        eta_a = browser.eval("document.querySelector('[data-rollout=\"rollout-a\"] .rollout-eta').className")
        browser.screenshot(ARTIFACTS / "rollouts.png")
        browser.goto(f"{stack.base_url}/nexus-status/")
        browser.wait_for("document.querySelector('tr[data-tenant=\"s02\"] svg.drain-chart') !== null", timeout_s=40)
        r03_row = browser.eval(tenant_text("r03"))
        s02_row = browser.eval(tenant_text("s02"))
        link = browser.eval("document.querySelector('tr[data-tenant=\"r03\"] a.run-link').getAttribute('href')")
        tenants_html = browser.eval("document.documentElement.outerHTML")
        browser.screenshot(ARTIFACTS / "status_view_what_now.png")

    assert "Wave 0 · canary succeeded" in page_a and "approved by lead-anna" in page_a
    assert "Wave 1 · wave 1 halted" in page_a and "Wave 2 · wave 2 pending" in page_a
    assert "audit_and_checkpoint" in page_a and "[DSN hidden]" in page_a and "Next: a fence finding" in page_a
    assert "skipped: r00 (already cut over)" in page_a and "succeeded: r01, r02, r04" in page_a  # the summary's lines
    assert "halted_at_wave" not in page_a  # its JSON is one click away, not the summary a person reads (issue 34)
    assert eta_a == "st failed rollout-eta"  # a finished rollout in its state's colour, not the ETA's warning colour
    assert "rejected by lead-bob" in page_b and "control pause" in page_b
    assert "waiting for approval: wave_01.confirm awaiting_input" in page_b
    assert "wait_for_drain deferred" in page_b and "items/min, ETA ~" in page_b
    assert "confirm_writers_stopped awaiting_input" in page_b and "Next: confirm only when no old binary" in page_b
    assert "audit_and_checkpoint failed" in r03_row and "Next: a fence finding" in r03_row
    assert link == what_now["link"]
    assert "wait_for_drain deferred" in s02_row and "items/min, ETA ~" in s02_row
    for html in (rollout_html, tenants_html):
        assert "s3cret" not in html and "tidb.internal" not in html
    steer_from_the_page(stack)


def steer_from_the_page(stack) -> None:
    """Issue 51, item 8: a running rollout's Pause, Resume and Cancel buttons set its control Variable through
    Airflow's REST API with the person's login (Cancel asks for a second click); a finished one has none."""
    from nexus_airflow.rollout import control_variable

    key = control_variable("rollout-b")
    value = lambda: stack.request("GET", f"/api/v2/variables/{key}")["value"]  # noqa: E731
    button = "document.querySelector('[data-rollout=\"rollout-b\"] button[data-value=\"{}\"]')"
    with Browser() as browser:
        browser.set_cookie(stack.base_url, "_token", stack.token)
        browser.goto(f"{stack.base_url}/nexus-status/rollouts")
        browser.wait_for(button.format("resume") + " !== null")
        assert browser.eval("document.querySelectorAll('[data-rollout=\"rollout-a\"] button.control').length") == 0
        assert browser.eval(button.format("pause") + ".disabled") is True  # it is paused already
        browser.eval(button.format("resume") + ".click()")
        browser.wait_for("document.querySelector('[data-rollout=\"rollout-b\"]').innerText.includes('= resume')")
        assert value() == "resume"
        browser.screenshot(ARTIFACTS / "rollout_controls_running.png")
        browser.eval(button.format("cancel") + ".click()")
        assert value() == "resume"  # one click arms it, and asks again
        assert "Really cancel" in browser.eval(button.format("cancel") + ".textContent")
        browser.eval(button.format("cancel") + ".click()")
        browser.wait_for("document.querySelector('[data-rollout=\"rollout-b\"]').innerText.includes('= cancel')")
        assert value() == "cancel"
        browser.wait_for("document.querySelector('[data-rollout=\"rollout-b\"] .controls').innerText"
                         ".startsWith('cancelled')")  # no button un-cancels it
        assert browser.eval("document.querySelectorAll('[data-rollout=\"rollout-b\"] button.control').length") == 0
        browser.screenshot(ARTIFACTS / "rollout_controls.png")
    assert value() == "cancel"


def _login(stack, user: str) -> str:
    password = json.loads((stack.home / "simple_auth_manager_passwords.json.generated").read_text())[user]
    return stack.request("POST", "/auth/token", {"username": user, "password": password}, auth=False)["access_token"]


def test_a_user_without_permission_gets_403(stack):
    admin, viewer = stack.token, _login(stack, "viewer")
    routes = ["/nexus-status/api/tenants", "/nexus-status/api/rollouts", "/nexus-status/", "/nexus-status/rollouts"]
    try:
        stack.token = viewer
        assert stack.request("GET", "/api/v2/dags?limit=1")["total_entries"] >= 1  # logged in, may read DAGs
        with pytest.raises(ApiError) as no_conn:
            stack.request("GET", "/api/v2/connections?limit=1")
        assert no_conn.value.status == 403  # ...but not the connections: the auth manager's own rule
        for route in routes:
            with pytest.raises(ApiError) as denied:
                stack.request("GET", route)
            assert denied.value.status == 403, route
    finally:
        stack.token = admin
    for route in routes[:2]:
        assert isinstance(stack.request("GET", route, timeout=120), dict)

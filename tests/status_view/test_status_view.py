"""The status view in a real headless Chromium against a running Airflow API server.

One ``airflow standalone`` (the demo's stack, its own SQLite metadata DB) with
the ``nexus_status`` plugin; two tenant connections created through the REST
API: the demo tenant on SQLite (fence armed, old work still in flight) and a
tenant on MariaDB whose checkpoint is written, reached through a MariaDB user
with a password and only SELECT. The page must show both tenants' state, draw
the drain chart, and never show the password; a screenshot is saved under
``test-artifacts/``.
"""

from __future__ import annotations

import json
import pathlib
import random
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from nexus_cutover.db import make_engine
from nexus_cutover.projection.checkpoint import run_checkpoint
from nexus_cutover.projection.fence import arm_fence
from nexus_cutover.schema import apply_steps, create_legacy_schema, projection_steps
from nexus_sim.scenario import TenantScenario, drained_pack_history
from scripts.demo_airflow import AirflowStack, ApiError
from scripts.demo_seed import seed

from .chromium import Browser, chromium_path

pytestmark = pytest.mark.airflow  # a real `airflow standalone` (mysql: set from mysql_url by tests/conftest.py)

REPO = pathlib.Path(__file__).resolve().parents[2]
ARTIFACTS = REPO / "test-artifacts"


@pytest.fixture(scope="module")
def stack(tmp_path_factory):
    if chromium_path() is None:
        pytest.fail("chromium is not installed: scripts/bootstrap.sh installs it (apt-get install -y chromium)")
    s = AirflowStack(tmp_path_factory.mktemp("airflow-status"), parallelism=2)
    s.start()
    yield s
    s.stop()


def _demo_tenant_fenced(tmp_path) -> tuple[str, int]:
    path = tmp_path / "tenant-demo.db"
    info = seed(str(path), "demo")
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
        "written_at": by_tenant["acme"]["packs"][0]["checkpoint"]["written_at"], "written_by": "status-view-test"}}]
    assert by_tenant["acme"]["database"].startswith("mysql")
    assert by_tenant["acme"]["proofs"] == {} and by_tenant["demo"]["proofs"] == {}  # no run of either DAG yet

    with Browser() as browser:
        browser.set_cookie(stack.base_url, "_token", stack.token)
        browser.goto(f"{stack.base_url}/nexus-status/")
        browser.wait_for("document.querySelectorAll('tr[data-tenant]').length >= 2")
        # two refreshes at least 4 s apart give the drain chart its first line
        browser.wait_for("document.querySelector('tr[data-tenant=\"demo\"] svg.drain-chart') !== null", timeout_s=40)
        demo_row = browser.eval("document.querySelector('tr[data-tenant=\"demo\"]').innerText")
        acme_row = browser.eval("document.querySelector('tr[data-tenant=\"acme\"]').innerText")
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

"""The status view's settings page (issue 51, item 6): every ``[nexus]`` setting as the API server reads it, with
its value and where it came from; a secret never shown; a bad value shown as its error, not a crash."""

from __future__ import annotations

import html

import pytest

from nexus_cutover import settings
from tests.dags.conftest import airflow_db  # noqa: F401 - the metadata DB the Variables are read from

#: The page reads the product's Variables from Airflow's metadata DB.
pytestmark = pytest.mark.usefixtures("airflow_db")
LEDGER_PASSWORD = "ledger-pw-3f9a"


@pytest.fixture
def client():
    """The plugin's app with the configuration-read permission passed (the test has no Airflow user)."""
    from fastapi.testclient import TestClient
    from nexus_status.app import SETTINGS_READS, app

    for dependency in SETTINGS_READS:
        app.dependency_overrides[dependency.dependency] = lambda: None
    try:
        yield TestClient(app)
    finally:
        app.dependency_overrides.clear()


def test_each_setting_shows_its_value_and_its_source_and_no_secret(client, monkeypatch):
    for s in settings.SETTINGS:  # this process's own environment, then the cases of the test
        monkeypatch.delenv(s.airflow_env, raising=False)
        monkeypatch.delenv(s.alias, raising=False)
    monkeypatch.setenv("AIRFLOW__NEXUS__STATUS_READERS", "7")
    monkeypatch.setenv("NEXUS_HOST_POLL_S", "0.25")
    monkeypatch.setenv("NEXUS_LEDGER_DSN", f"postgresql://nexus:{LEDGER_PASSWORD}@db/ledger")
    monkeypatch.setenv("NEXUS_AIRFLOW_URL", "https://airflow.example.test")
    monkeypatch.setenv("NEXUS_STATUS_WAIT_S", "soon")  # a bad value: shown as such
    rows = {r["name"]: r for r in client.get("/api/settings").json()}
    assert set(rows) == {s.name for s in settings.SETTINGS}
    assert (rows["status_readers"]["value"], rows["status_readers"]["source"]) == ("7", "AIRFLOW__NEXUS__STATUS_READERS")
    assert (rows["host_poll_s"]["value"], rows["host_poll_s"]["source"]) == ("0.25", "NEXUS_HOST_POLL_S")
    assert (rows["ledger_dsn"]["value"], rows["ledger_dsn"]["source"]) == ("set (secret: not shown)", "NEXUS_LEDGER_DSN")
    assert (rows["notify_webhook"]["value"], rows["notify_webhook"]["source"]) == ("unset", "default")
    assert (rows["fused_tasks"]["value"], rows["fused_tasks"]["source"]) == ("True", "default")
    assert rows["airflow_url"]["value"] == "https://airflow.example.test"  # a URL without credentials stays readable
    assert rows["status_wait_s"]["value"].startswith("bad value: setting nexus.status_wait_s (NEXUS_STATUS_WAIT_S)")
    page = client.get("/settings")
    assert page.status_code == 200 and "<h1>Nexus settings</h1>" in page.text
    for name in ("status_readers", "AIRFLOW__NEXUS__STATUS_READERS", "NEXUS_HOST_POLL_S", "set (secret: not shown)"):
        assert name in page.text, name
    assert LEDGER_PASSWORD not in page.text + client.get("/api/settings").text


def test_the_products_variables_are_listed_with_their_values_and_what_they_set(client):
    """Issue 51, item 6: every Variable the product reads is on the page, set or unset, with what it sets; a
    per-run Variable is one row counting its runs; a credential in a value is masked."""
    from airflow.models.variable import Variable
    from nexus_status.settings_page import variable_rows

    from nexus_airflow.compat import session
    from nexus_airflow.rollout import control_variable
    from nexus_airflow.variables import VARIABLES

    notify, host, stop, control, alert = VARIABLES
    Variable.set(notify.key, "nexus_notify_demo")
    Variable.set(host.key, f'["deploy", "--dsn", "mysql://deployer:{LEDGER_PASSWORD}@db/x"]')
    Variable.delete(stop.key)
    for run in ("manual__1", "manual__2:x"):
        Variable.set(control_variable(run), "pause")
    Variable.set(control.key.replace("_", "x") + "lookalike", "pause")  # "_" is not a wildcard in the count
    try:
        with session() as metadata:
            rows = {r["variable"]: r for r in variable_rows(metadata)}
        assert (rows[notify.key]["value"], rows[notify.key]["source"]) == ("nexus_notify_demo", "Variable")
        assert LEDGER_PASSWORD not in rows[host.key]["value"] and "deploy" in rows[host.key]["value"]
        assert (rows[stop.key]["value"], rows[stop.key]["source"]) == (None, "unset")
        assert rows[control.key + "<run>"]["value"] == "2 run(s)"
        assert rows[alert.key + "<run>"]["source"] in {"unset", "Variable"}  # other tests' runs may have alerted
        page = client.get("/settings").text
        assert "<h2>Airflow Variables</h2>" in page and LEDGER_PASSWORD not in page
        for v in VARIABLES:
            assert v.key in page and html.escape(v.description.split(":")[0]) in page, v.key
    finally:
        for key in (notify.key, host.key, control_variable("manual__1"), control_variable("manual__2:x"),
                    control.key.replace("_", "x") + "lookalike"):
            Variable.delete(key)


def test_the_status_page_links_to_the_settings(client):
    from nexus_status.app import HERE

    assert '<a href="settings">Settings</a>' in (HERE / "page.html").read_text()


def test_the_pages_load_the_one_frame_script_the_app_serves(client):
    """The link fix for Airflow's sandboxed frame lives in one file both pages load (issue 51, item 1)."""
    from nexus_status.app import HERE

    for page in ("page.html", "rollouts.html"):
        assert '<script src="embedded.js"></script>' in (HERE / page).read_text(), page
    served = client.get("/embedded.js")
    assert served.status_code == 200 and served.headers["content-type"].startswith("text/javascript")
    assert "PopStateEvent" in served.text and 'a[target="_top"]' in served.text

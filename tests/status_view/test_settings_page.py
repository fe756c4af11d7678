"""The status view's settings page (issue 51, item 6): every ``[nexus]`` setting as the API server reads it, with
its value and where it came from; a secret never shown; a bad value shown as its error, not a crash."""

from __future__ import annotations

import pytest

from nexus_cutover import settings

LEDGER_PASSWORD = "ledger-pw-3f9a"


@pytest.fixture
def client():
    """The plugin's app with the configuration-read permission passed (the test has no Airflow user)."""
    from fastapi.testclient import TestClient
    from nexus_status.app import CONFIG_READS, app

    for dependency in CONFIG_READS:
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

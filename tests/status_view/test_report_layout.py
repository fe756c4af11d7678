"""The report page fits the frame it is shown in (issue 51, item 9): in Airflow's iframe a laptop gives the page
about 1000 px, and a ledger row carries ids, holders and digests tens of characters long with no space to break at.
Read in Debian's Chromium (the browser the UI walk uses): the page never scrolls sideways and no cell's text is cut.

The page comes from the plugin's own route over a real SQLite ``nexus_ledger`` (as ``test_report_csv.py``)."""

from __future__ import annotations

import datetime as dt
import hashlib

from nexus_cutover import ledger as L
from tests.dags.airflow_harness import connection_json
from tests.ui.browser import Person

T0 = dt.datetime(2026, 12, 7, 8, 0, 0, tzinfo=dt.UTC)
TENANT = "tenant-with-a-rather-long-name-0042"
RUN = f"rollout__manual__2026-12-07T08:00:00.123456+00:00__{TENANT}"
HOLDER = f"airflow:connector_projection_cutover:{RUN}"


def _events() -> list[L.LedgerEvent]:
    writers = [{"process_id": f"projection-writer-{i:04d}-{'x' * 30}", "role": "connector_projection_writer",
                "binary_version": "4.11.0", "state": "stopped", "last_heartbeat_at": "2026-12-07T07:59:00",
                "stopped_at": "2026-12-07T07:59:30"} for i in range(3)]
    evidence = {"evidence": {"checked_at": "2026-12-07 08:00:00 UTC", "rows_total": 3, "rows_kept": 3, "live": [],
                             "processes": writers}}
    return [L.LedgerEvent(tenant=TENANT, dag_id="connector_projection_cutover", run_id=RUN, step=step, kind=kind,
                          recorded_at=T0 + dt.timedelta(seconds=i), holder=HOLDER, actor="delivery.engineer@example.test",
                          digest=hashlib.sha256(step.encode()).hexdigest(), pack="connector-projection-" + "p" * 40,
                          reason=reason, detail=detail)
            for i, (step, kind, reason, detail) in enumerate([
                ("arm_fence", L.FENCE_ARMED, None, {}),
                ("confirm_writers_stopped", L.EVIDENCE_SHOWN, "every old writer stopped", evidence),
                ("checkpoint", L.STOPPED, "a_reason_without_any_space_" * 8, {})])]


def test_the_report_table_fits_the_frame_of_a_laptop(client, monkeypatch, tmp_path):
    url = f"sqlite:///{tmp_path / 'ledger.db'}"
    monkeypatch.setenv("AIRFLOW_CONN_NEXUS_LEDGER", connection_json(url))
    engine = L.ledger_engine(url)
    try:
        L.append(engine, _events())
    finally:
        engine.dispose()
    page = client.get("/report", params={"tenant": TENANT})
    assert page.status_code == 200 and HOLDER in page.text
    (tmp_path / "report.html").write_text(page.text)

    person = Person(f"file://{tmp_path}", tmp_path / "screens")
    try:
        person.driver.set_window_size(1000, 800)  # Airflow's frame on a laptop: the window less its navigation
        person.open("/report.html")
        widths = person.driver.execute_script(
            "const d = document.documentElement, t = document.querySelector('table');"
            "const cut = [...document.querySelectorAll('td')].filter(c => c.scrollWidth > c.clientWidth + 1).length;"
            "return {page: d.scrollWidth, view: d.clientWidth, table: t.getBoundingClientRect().width, cut: cut};")
        person.screenshot("report_at_1000px")
    finally:
        person.driver.quit()
    assert widths["page"] <= widths["view"], widths  # the page never scrolls sideways
    assert widths["table"] <= widths["view"], widths
    assert widths["cut"] == 0, widths  # every cell shows its whole text, wrapped
    assert "projection-writer-0002" in page.text  # the evidence row is there to wrap

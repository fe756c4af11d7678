"""The status view's report download (``GET /nexus-status/api/report?tenant=&format=csv``) hands a reviewer's
spreadsheet no formula: a ledger row whose step, actor or reason starts with ``=``, ``+``, ``-``, ``@``, a tab or a
carriage return comes out with a leading ``'`` (the domain's one rule, ``nexus_cutover.spreadsheet``, as the
preflight CSV and ``nexus-cutover report -csv``), on each database a ledger may live in (SQLite, MariaDB,
PostgreSQL), read through the real ``nexus_ledger`` Airflow connection and the plugin's own route.

In process: the route's permission checks are replaced by a pass (the auth manager's answers are the Chromium test's
subject, ``test_status_view.py``); everything behind them -- the connection, the ledger read, the redaction, the
CSV -- is the product's.
"""

from __future__ import annotations

import csv
import datetime as dt
import io
import json

import pytest
from sqlalchemy.engine import make_url

from nexus_cutover import ledger as L
from tests.dags.airflow_harness import connection_json
from tests.ledger_support import assert_neutralised, hostile_events, ledger_postgres

T0 = dt.datetime(2026, 12, 6, 8, 0, 0, 250000, tzinfo=dt.UTC)
TENANT = "csv-tenant"


@pytest.fixture(scope="module")
def postgres_server():
    with ledger_postgres() as server:
        yield server


def _postgres_connection(url: str) -> str:
    u = make_url(url)
    return json.dumps({"conn_type": "postgres", "host": u.host, "port": u.port, "login": u.username,
                       "password": u.password, "schema": u.database})


@pytest.fixture(params=["sqlite", "mysql", "postgres"])
def ledger_url(request, tmp_path):
    """``(url, its nexus_ledger connection as JSON)`` on each database a ledger may live in."""
    if request.param == "sqlite":
        url = f"sqlite:///{tmp_path / 'ledger.db'}"
        return url, connection_json(url)
    if request.param == "mysql":
        url = request.getfixturevalue("mysql_url")
        return url, connection_json(url)
    url = request.getfixturevalue("postgres_server").database_url()
    return url, _postgres_connection(url)


def test_the_report_download_neutralises_every_formula_cell(ledger_url, client, monkeypatch):
    url, conn = ledger_url
    monkeypatch.setenv("AIRFLOW_CONN_NEXUS_LEDGER", conn)
    engine = L.ledger_engine(url)
    try:
        L.append(engine, [*hostile_events(TENANT, T0),
                          L.LedgerEvent(tenant=TENANT, dag_id="connector_projection_cutover", run_id="r-plain",
                                        step="arm_fence", kind=L.FENCE_ARMED, recorded_at=T0 + dt.timedelta(hours=1),
                                        holder="h1", actor="ana", reason="plain - text = fine")])
    finally:
        engine.dispose()

    download = client.get("/api/report", params={"tenant": TENANT, "format": "csv"})
    assert download.status_code == 200, download.text
    assert download.headers["content-type"].startswith("text/csv")
    assert 'filename="ledger_csv-tenant.csv"' in download.headers["content-disposition"]
    rows = list(csv.DictReader(io.StringIO(download.content.decode("utf-8"), newline="")))
    assert_neutralised(rows[:-1], TENANT)
    assert (rows[-1]["actor"], rows[-1]["holder"], rows[-1]["reason"]) == ("ana", "h1", "plain - text = fine")

    # the JSON of the same route is data, not a spreadsheet: the text as the ledger holds it
    events = client.get("/api/report", params={"tenant": TENANT, "format": "json"}).json()["events"]
    assert [e["actor"][0] for e in events[:-1]] == [r["actor"][1] for r in rows[:-1]]

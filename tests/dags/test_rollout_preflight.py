"""``tenant_rollout``'s preflight under ``dag.test()`` (real tasks, real MariaDB tenants, production-shaped).

``mode: preflight`` reads every tenant's plan verdict and ends there: the rollout succeeds with the table, no
fence is armed, no tenant run is triggered. A real rollout halts before any wave on a stop when the form says
``halt``, and skips (naming the reason) what would stop when it says ``skip``.
"""

from __future__ import annotations

import pytest
from sqlalchemy import func, inspect, select

from nexus_airflow.rollout import CUTOVER_DAG, run_id_for, unused_wave_tasks
from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_sim.scenario import TenantScenario
from nexus_sim.scenario.production import build_production_tenant
from tests.dags.airflow_harness import load_dag, run_dag

SIZES = {"active_packs": 1, "plain_lanes": 2, "generations": 2, "greenfield_pack": False}
UNREACHABLE = "mysql+pymysql://cutover:s3cret@127.0.0.1:1/tenant_gone"
#: A live old writer's id the CSV must carry exactly: quotes, a comma, a newline, non-ASCII, a trailing space.
HOSTILE_WRITER = 'old "ingress", zwei\nüß '


@pytest.fixture
def rollout(airflow_db):
    return load_dag("tenant_rollout")


@pytest.fixture
def fleet(request, mysql_server_url, tenant_connection):
    """pf_go proceeds, pf_wait waits on its old work and live writers, pf_gone is unreachable, pf_none has no
    connection at all; name -> engine (the reachable ones)."""
    from tests.support import mysql_database

    request.node._nexus_uses_mysql = True
    engines = {}
    with mysql_database(mysql_server_url) as go, mysql_database(mysql_server_url) as wait:
        for name, url, knobs in (("pf_go", go, {}), ("pf_wait", wait, {"in_flight_generations": 1,
                                                                        "live_old_writers": True})):
            engines[name] = make_engine(url)
            build_production_tenant(engines[name], namespace=name, seed=len(name), **SIZES, **knobs)
            if knobs:
                sc = TenantScenario(namespace=name)
                sc.process(catalog.ROLE_INGRESS_WRITER, process_id=HOSTILE_WRITER)
                sc.write(engines[name])
            tenant_connection(f"nexus_tenant_{name}", url)
        tenant_connection("nexus_tenant_pf_gone", UNREACHABLE)
        yield engines
        for engine in engines.values():
            engine.dispose()


def _cutover_runs(run_id: str, tenants) -> int:
    from airflow.models.dagrun import DagRun
    from airflow.utils.session import create_session

    with create_session() as session:
        return session.scalar(select(func.count()).select_from(DagRun).where(
            DagRun.dag_id == CUTOVER_DAG, DagRun.run_id.in_([run_id_for(run_id, t) for t in tenants])))


def _fences(engine) -> int:
    if not inspect(engine).has_table(catalog.AdmissionFence.name):
        return 0
    with engine.connect() as conn:
        return conn.scalar(select(func.count()).select_from(catalog.AdmissionFence))


def test_mode_preflight_reads_every_tenant_and_starts_nothing(rollout, fleet):
    tenants = ["pf_go", "pf_wait", "pf_gone", "pf_none"]
    result = run_dag(rollout, {"tenants": tenants, "mode": "preflight", "preflight_concurrency": 2,
                               "cutover_conf": {"stale_heartbeat": 3600}})
    assert result.state == "success", result.task_states
    assert result.state_of("preflight") == "success" and result.state_of("summary") == "success"
    assert result.state_of("plan") == "skipped"
    assert {result.state_of(t) for t in unused_wave_tasks(0) if result.state_of(t)} == {"skipped"}
    rows = {r["tenant"]: r for r in result.xcom("preflight", key="preflight")}
    assert list(rows) == tenants
    assert rows["pf_go"]["verdict"] == "proceed" and rows["pf_wait"]["verdict"] == "wait"
    assert rows["pf_wait"]["old_work_remaining"] > 0 and rows["pf_wait"]["live_old_writers"]
    assert rows["pf_gone"]["verdict"] == "stop" and "cannot reach the tenant database" in rows["pf_gone"]["reason"]
    assert rows["pf_none"]["verdict"] == "stop" and "nexus_tenant_pf_none" in rows["pf_none"]["reason"]
    assert "s3cret" not in str(result.xcoms)
    summary = result.xcom("summary", key="summary")
    assert summary["mode"] == "preflight" and summary["preflight"] == {"proceed": 1, "wait": 1, "stop": 2, "done": 0}
    assert set(summary["would_skip"]) == {"pf_gone", "pf_none"}
    assert _cutover_runs(result.run_id, tenants) == 0
    _the_page_and_its_csv_show_the_table(result.run_id, rows)
    for engine in fleet.values():  # read only: no fence armed, no additive schema created
        assert _fences(engine) == 0 and not inspect(engine).has_table("_System_ConnectorProjectionProtocol")


def test_halt_stops_the_rollout_before_any_wave_naming_every_stop(rollout, fleet):
    tenants = ["pf_go", "pf_gone", "pf_none"]
    result = run_dag(rollout, {"tenants": tenants, "on_preflight_stop": "halt"})
    assert result.state == "failed", result.task_states
    assert result.state_of("preflight") == "success" and result.state_of("plan") == "failed"
    refusal = result.xcom("summary", key="summary")["refusal"]
    assert "on_preflight_stop is halt" in refusal and "pf_gone (" in refusal and "pf_none (" in refusal
    assert _cutover_runs(result.run_id, tenants) == 0


def test_skip_names_each_stopped_tenant_with_its_reason(rollout, fleet):
    """Every tenant of this rollout stops at the preflight: none runs, each is skipped with the reason."""
    result = run_dag(rollout, {"tenants": ["pf_gone", "pf_none"]})
    plan = result.xcom("plan", key="rollout")
    assert plan["waves"] == [] and set(plan["skipped"]) == {"pf_gone", "pf_none"}
    assert plan["skipped"]["pf_gone"].startswith("preflight: stop: ") and "cannot reach" in plan["skipped"]["pf_gone"]
    summary = result.xcom("summary", key="summary")
    assert summary["skipped"] == plan["skipped"] and summary["tenants"] == {}
    assert _cutover_runs(result.run_id, ["pf_gone", "pf_none"]) == 0


def _the_page_and_its_csv_show_the_table(run_id: str, rows: dict) -> None:
    """The rollout page's data and the CSV endpoint (the route's own function, on this run's metadata DB)."""
    import csv
    import io

    from fastapi import HTTPException
    from nexus_status import app as status_app
    from nexus_status.rollouts import rollouts

    route = next(r for r in status_app.app.routes if getattr(r, "path", "") == "/api/rollouts/preflight.csv")
    assert [d.dependency for d in route.dependencies] == [d.dependency for d in status_app.ROLLOUT_READS]
    shown = next(r for r in rollouts(20)["rollouts"] if r["run_id"] == run_id)["preflight"]
    assert [r["tenant"] for r in shown["rows"]] == list(rows) and shown["counts"]["stop"] == 2
    assert shown["csv"].startswith("api/rollouts/preflight.csv?run_id=") and ":" not in shown["csv"].split("=", 1)[1]
    response = status_app.preflight_csv(run_id=run_id)
    assert response.media_type.startswith("text/csv")
    assert response.headers["content-disposition"].startswith('attachment; filename="preflight_')
    parsed = list(csv.DictReader(io.StringIO(response.body.decode(), newline="")))
    assert [r["tenant"] for r in parsed] == list(rows)
    waits = next(r for r in parsed if r["tenant"] == "pf_wait")
    assert HOSTILE_WRITER in waits["live_old_writers"] and waits["verdict"] == "wait"
    assert waits["old_work_remaining"] == str(rows["pf_wait"]["old_work_remaining"])
    assert "s3cret" not in response.body.decode()
    with pytest.raises(HTTPException) as missing:
        status_app.preflight_csv(run_id="no-such-rollout-run")
    assert missing.value.status_code == 404


def test_a_large_preflight_shows_its_wait_and_stop_rows_on_the_page_and_counts_them_all(airflow_db):
    from nexus_status.rollouts import PAGE_ROWS, preflight_view

    verdicts = ["proceed", "proceed", "wait", "proceed", "stop"]
    rows = [{"tenant": f"t{i:04d}", "verdict": verdicts[i % 5]} for i in range(PAGE_ROWS + 50)]
    view = preflight_view("manual__2026-12-02T10:00:00+00:00", rows)
    assert view["total"] == len(rows) and sum(view["counts"].values()) == len(rows)
    assert view["rows"] == [r for r in rows if r["verdict"] != "proceed"]
    assert view["csv"] == "api/rollouts/preflight.csv?run_id=manual__2026-12-02T10%3A00%3A00%2B00%3A00"
    small = rows[:10]
    assert preflight_view("r", small)["rows"] == small  # a small fleet: every row


def test_the_plan_reads_every_standing_from_a_bounded_pool_and_an_unreadable_one_is_none(fleet, caplog):
    """The plan's standing reads (one per tenant, ``preflight_concurrency`` at a time): each reachable tenant's
    standing as ``nexus_cutover.standing`` defines it; an unreachable database or a missing connection is None
    (its own run reports why), logged without its DSN, and never hides the others."""
    import logging

    from nexus_airflow.rollout_plan import standings
    from nexus_cutover.projection import steps

    names = ["pf_go", "pf_gone", "pf_wait", "pf_none"]
    log = logging.getLogger("test.standings")
    log.addHandler(caplog.handler)  # also when run alone, before any DAG run set up Airflow's logging
    try:
        with caplog.at_level(logging.WARNING, logger="test.standings"):
            got = standings(names, log, concurrency=2)
    finally:
        log.removeHandler(caplog.handler)
    assert list(got) == names
    for name in ("pf_go", "pf_wait"):
        assert got[name] == steps.cutover_standing(fleet[name], name)
        assert got[name]["cut_over"] is False
    assert got["pf_gone"] is None and got["pf_none"] is None
    warned = caplog.text
    assert "pf_gone" in warned and "pf_none" in warned and "s3cret" not in warned
    assert standings([], log, concurrency=2) == {}


def test_every_line_the_preflight_logs_for_a_tenant_names_it(fleet, caplog):
    """Issue 51, item 8: the preflight reads tenants several at a time, so their lines interleave in the task log;
    each line about one tenant's database starts with its name (and still never shows a DSN's password)."""
    import logging

    from nexus_airflow.rollout_preflight import run_preflight

    tenants = ["pf_go", "pf_wait", "pf_gone", "pf_none"]
    log = logging.getLogger("test.preflight")
    log.addHandler(caplog.handler)  # whatever Airflow's logging setup did to propagation before this test
    try:
        with caplog.at_level(logging.INFO, logger="test.preflight"):
            rows = run_preflight({"tenants": tenants, "preflight_concurrency": 3}, "manual__lines", {"ti": None}, log)
    finally:
        log.removeHandler(caplog.handler)
    assert [r["tenant"] for r in rows] == tenants
    # a set: with propagation on as well, the handler sees each record twice
    per_tenant = {r.getMessage() for r in caplog.records if "tenant database:" in r.getMessage()
                  and not r.getMessage().startswith("preflight of")}
    assert len(per_tenant) == 3, per_tenant  # pf_none has no connection: its row says so
    for line in per_tenant:
        named = line.split(":", 1)[0]
        assert named in {f"tenant {t}" for t in tenants} and f"nexus_tenant_{named.split()[1]}" in line, line
    table = caplog.records[-1].getMessage()
    assert table.startswith("preflight of 4 tenant(s)") and all(t in table for t in tenants)
    assert "s3cret" not in caplog.text

"""The Field History eligibility DAG: real runs (dag.test, real tasks) on MariaDB tenants, gate by gate."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
import threading

import pytest
from sqlalchemy import select

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.field_history.gates import FAILED_OUTBOX_NEXT
from nexus_cutover.field_history.transition import FIELD_HISTORY
from nexus_cutover.schema import create_legacy_schema
from nexus_sim import outbox_worker
from nexus_sim.producers import AuditTarget, FieldDiff, record_legacy_audit_field_changes
from nexus_sim.scenario import TenantScenario
from tests.dags.airflow_harness import DAGS_FOLDER, PLUGINS_FOLDER, load_dag, run_dag
from tests.dags.test_cutover_dag_integrity import DECLARATIONS
from tests.field_history.helpers import audit_table, compat_set, mixed_history, upgraded_outbox_row
from tests.support import history_checksum

DAG_ID = "field_history_eligibility"
ORDER = FIELD_HISTORY.names  # tests/dags/test_cutover_dag_integrity.py: the DAG follows the declaration
STAGE1, CUTOVER = "4.12.0", "4.13.0"
FINAL = {"FieldHistoryReadMode": "boolean_only", "FieldHistorySequenceReservationEnabled": "false"}


@pytest.fixture(scope="module")
def dag(airflow_db):
    return load_dag(DAG_ID)


@pytest.fixture
def tenant(mysql_url, tenant_connection):
    engine = make_engine(mysql_url)
    create_legacy_schema(engine)
    tenant_connection("nexus_tenant_acme", mysql_url)  # the default conn_id of tenant "acme"
    yield engine
    engine.dispose()


def legacy(engine, *, api=CUTOVER, manager=CUTOVER, worker=CUTOVER, outbox_rows=0, failed_outbox=False):
    """A pre-stage-1 tenant: the mixed legacy history (all NULL), producers at the given releases."""
    sc = mixed_history(TenantScenario())
    for row in sc.audit_changes:
        row.pop("FieldHistoryEligible", None)
    sc.process(catalog.ROLE_RUNTIME_API, version=api, process_id="api-1")
    sc.process(catalog.ROLE_SERVICE_MANAGER, version=manager, process_id="sm-1")
    sc.process(catalog.ROLE_AUDIT_OUTBOX_WORKER, version=worker, process_id="worker-1")
    sc.process(catalog.ROLE_RUNTIME_API, version="4.0.0", process_id="api-retired", stopped=True)
    if failed_outbox:
        sc.outbox_row(producer_version="4.11.0", status="failed")
    sc.write(engine)
    target = AuditTarget(audit_id=900, object_name="Contact", record_id="c-9", producer_version="4.11.0")
    for i in range(outbox_rows):  # pre-cutover Audit V2 work, as an old binary left it
        with engine.begin() as conn:
            record_legacy_audit_field_changes(conn, [FieldDiff(1, "a", "b")], [5000 + i], target, via_outbox=100 + i)


def conf(**extra):
    return {"tenant": "acme", "stage1_release": STAGE1, "producer_release": CUTOVER, "poll_interval": 1, **extra}


def settings(engine) -> dict[str, str]:
    s = catalog.RuntimeSetting
    with engine.connect() as conn:
        return dict(conn.execute(select(s.c.Name, s.c.Value)).all())


def outbox_statuses(engine) -> dict[int, str]:
    o = catalog.AuditOutbox
    with engine.connect() as conn:
        return dict(conn.execute(select(o.c.OutboxId, o.c.Status)).all())


class OutboxWorker(threading.Thread):
    """The reference outbox worker delivering in the background while the DAG's drain sensor waits."""

    def __init__(self, engine, delay_s: float = 1.5):
        super().__init__(daemon=True)
        self.engine, self.delay_s, self.halt = engine, delay_s, threading.Event()

    def run(self):
        self.halt.wait(self.delay_s)  # the sensor sees open work first and defers
        while not self.halt.is_set():
            outbox_worker.run_once(self.engine)
            self.halt.wait(0.3)

    def __enter__(self):
        self.start()
        return self

    def __exit__(self, *exc):
        self.halt.set()
        self.join(10)


def test_tasks_in_order_with_docs_and_a_deferrable_drain(dag):
    assert dag.task_ids == ORDER or set(dag.task_ids) == set(ORDER)
    for upstream, downstream in zip(ORDER, ORDER[1:], strict=False):
        assert downstream in dag.get_task(upstream).downstream_task_ids
    assert dag.doc_md and "target_stage" in dag.doc_md
    assert all(t.doc_md and len(t.doc_md) > 60 for t in dag.tasks)
    drain = dag.get_task("stage_2_drain_outbox")
    assert drain.deferrable is True and drain.soft_fail is False


def test_the_form_names_its_sections_for_what_they_hold(dag):
    """No "Connections, packs and fence takeover" on a form with no pack or fence field (issue 34)."""
    from nexus_airflow.params import CONNECTIONS, CONNECTIONS_ONLY

    sections = {n: dag.params.get_param(n).schema.get("section") for n in dag.params}
    assert sections["conn_id"] == sections["notify_conn_id"] == CONNECTIONS_ONLY
    assert CONNECTIONS not in sections.values(), sections


@pytest.mark.parametrize(("form", "stage"), [({}, 3), ({"producer_release": None}, 1), ({"target_stage": 2}, 2)])
def test_an_empty_target_stage_goes_as_far_as_the_releases_given_allow(dag, form, stage):
    """Issue 51, item 2: a first run given both releases goes to stage 3 instead of looking done after stage 1;
    the form's empty choice says so instead of naming a number."""
    from airflow.sdk.definitions.param import ParamsDict

    from nexus_airflow.field_history import STAGE_BY_RELEASES, FieldHistoryParams

    params = ParamsDict(dag.params)
    for name, value in {**conf(), **form}.items():
        params[name] = value
    assert FieldHistoryParams.from_context({"params": params.validate()}).target_stage == stage
    shown = dag.params.get_param("target_stage").schema["values_display"]["null"]
    assert shown == f"(default: {STAGE_BY_RELEASES})" and not any(c.isdigit() for c in shown)  # typing 3 picks 3


def test_parse_does_no_database_work_and_imports_no_domain_code():
    code = textwrap.dedent(
        f"""
        import json, os, runpy, sys
        os.environ["AIRFLOW_CONN_NEXUS_TENANT_ACME"] = "mysql://u:p@192.0.2.1:1/nowhere"
        sys.path[:0] = [{str(PLUGINS_FOLDER)!r}]
        import airflow.sdk
        before = set(sys.modules)
        ns = runpy.run_path({str(DAGS_FOLDER / "field_history_eligibility.py")!r})
        print(json.dumps({{"tasks": len(ns["dag"].task_ids),
                          "domain": sorted(m for m in sys.modules if m.startswith("nexus_cutover")),
                          "pymysql": "pymysql" in sys.modules,
                          "sqlalchemy_by_dag": sorted(m for m in set(sys.modules) - before if m.startswith("sqlalchemy"))}}))
        """
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120, check=True)
    result = json.loads(out.stdout.strip().splitlines()[-1])
    # the declarations only (standard library), no database driver, no SQLAlchemy
    assert result == {"tasks": len(ORDER), "domain": sorted(DECLARATIONS), "pymysql": False, "sqlalchemy_by_dag": []}


@pytest.mark.parametrize(
    ("key", "value"),
    [("tenant", "Acme;x"), ("target_stage", 4), ("stage1_release", "4.x"), ("producer_release", "latest"),
     ("batch_size", 50_000), ("conn_id", "x y")],
)
def test_params_reject_bad_values(dag, key, value):
    from airflow.sdk.definitions.param import ParamsDict

    params = ParamsDict(dag.params)
    params["tenant"], params["stage1_release"] = "acme", STAGE1
    with pytest.raises(Exception):  # noqa: B017 - ParamValidationError's module moves between versions
        params[key] = value
        params.validate()


def test_stage_2_without_producer_release_is_refused_before_stage_1_runs(dag, tenant):
    legacy(tenant)
    result = run_dag(dag, conf(target_stage=2, producer_release=""))
    assert result.state_of("stage_1") == "failed" and result.state_of("stage_2_producers") == "upstream_failed"
    assert "needs producer_release" in result.xcom("stage_1", key="report")["message"]
    from nexus_cutover.schema import has_column

    assert not has_column(tenant, catalog.FIELD_HISTORY_ELIGIBLE)  # nothing ran: not even the stage-1 DDL


def test_unknown_form_keys_are_refused_with_the_known_ones(dag, tenant):
    legacy(tenant)
    result = run_dag(dag, conf(target=3))
    message = result.xcom("stage_1", key="report")["message"]
    assert result.state_of("stage_1") == "failed" and "unknown field(s) target" in message and "target_stage" in message


def test_happy_path_through_stage_3_then_rerun_reverifies(dag, tenant):
    legacy(tenant, outbox_rows=3)
    history = history_checksum(tenant)
    with OutboxWorker(tenant):
        result = run_dag(dag, conf(target_stage=3))
    assert result.state == "success", result.task_states
    assert all(result.state_of(t) == "success" for t in ORDER)
    assert outbox_statuses(tenant) == {100: "delivered", 101: "delivered", 102: "delivered"}
    assert result.xcom("stage_1")["actions"] == ["added column _System_AuditFieldChange.FieldHistoryEligible"]
    mat = result.xcom("stage_2_materialize")
    assert mat["counts"]["eligible_null_rows"] == 0 and mat["counts"]["set_true"] == 12 + 3  # + delivered rows
    final = result.xcom("stage_3")
    # reservation off first (issue 25: stage 3 against live producers), then, settled and compared, the reads
    assert final["actions"] == [f"set {k} = {FINAL[k]}" for k in ("FieldHistorySequenceReservationEnabled", "FieldHistoryReadMode")]
    assert any("emergency breaker" in r for r in final["removable"])
    assert settings(tenant) == FINAL
    table = audit_table(tenant)
    assert {cid for cid, v in table.items() if v[2] is True} == compat_set(tenant)
    from nexus_status.proofs import latest_proofs  # what the status view shows for the tenant

    proof = latest_proofs([result.conf["tenant"]])[result.conf["tenant"]]["field_history"]
    assert proof["run_id"] == result.run_id
    decided = proof["stage_2_materialize"]
    assert decided["decided_rows"] == mat["counts"]["decided_rows"] > 0
    assert decided["decided_digest"] == mat["counts"]["decided_digest"]
    assert proof["stage_3"]["equal"] is True and proof["stage_3"]["differences"] == 0

    again = run_dag(dag, conf())  # no target_stage: with a producer-cutover release it means 3 (issue 51, item 2)
    assert again.state == "success"
    assert again.xcom("stage_1")["already_done"] and again.xcom("stage_3")["already_done"]
    assert again.xcom("stage_2_materialize")["already_done"] and again.xcom("stage_3")["actions"] == []
    assert audit_table(tenant) == table and settings(tenant) == FINAL
    assert history_checksum(tenant) == history


@pytest.mark.parametrize("stage", [{"target_stage": 1}, {}], ids=["target_stage_1", "no_target_no_producer_release"])
def test_target_stage_1_skips_the_later_stages(dag, tenant, stage):
    """An empty target_stage without a producer-cutover release means stage 1 (stages 2 and 3 need one)."""
    legacy(tenant)
    result = run_dag(dag, {**conf(producer_release=""), **stage})
    assert result.state_of("stage_1") == "success"
    assert all(result.state_of(t) == "skipped" for t in ORDER[1:])
    assert settings(tenant) == {}


def test_stage_1_stops_and_lists_the_lagging_processes(dag, tenant):
    legacy(tenant, worker="4.11.2")
    result = run_dag(dag, conf(target_stage=3))
    assert result.state == "failed" and result.state_of("stage_1") == "failed"
    assert all(result.state_of(t) == "upstream_failed" for t in ORDER[1:])
    report = result.xcom("stage_1", "report")
    assert [f["process_id"] for f in report["findings"]] == ["worker-1"]
    assert report["actions"] == ["added column _System_AuditFieldChange.FieldHistoryEligible"]  # additive, kept
    assert settings(tenant) == {}


def test_stage_1_names_the_deployments_producer_upgrade_and_passes_after_it(dag, tenant, monkeypatch):
    """Issue 34, item 1: the stop says how to upgrade the producers (make airflow names the demo's control,
    ``python -m nexus_sim.upgrade``); after that control ran, the same form passes the producer gates."""
    legacy(tenant, worker="4.11.2")
    command = "python -m nexus_sim.upgrade --namespace acme --release " + CUTOVER
    monkeypatch.setenv("NEXUS_PRODUCER_UPGRADE_COMMAND", command)
    stopped = run_dag(dag, conf(target_stage=2))
    assert stopped.state_of("stage_1") == "failed"
    message = stopped.xcom("stage_1", "report")["message"]
    assert "Next: upgrade the lagging producers" in message and f"in this deployment: {command}" in message, message
    assert "listed above" not in message and "(worker-1 (audit_outbox_worker 4.11.2 < " in message, message  # named
    env = {**os.environ, "NEXUS_TENANT_DSN": tenant.url.render_as_string(hide_password=False)}
    done = subprocess.run([sys.executable, "-m", "nexus_sim.upgrade", "--namespace", "acme", "--release", CUTOVER],
                          env=env, capture_output=True, text=True, timeout=120)
    stopped_line = next(line for line in done.stdout.splitlines() if line.startswith("upgrade: stopped"))
    assert done.returncode == 0 and "worker-1" in stopped_line, done.stdout + done.stderr
    after = run_dag(dag, conf(target_stage=1))
    assert after.state_of("stage_1") == "success", after.task_states
    from nexus_cutover.field_history import gates

    assert gates.stage_2_producers(tenant, producer_release=CUTOVER, namespace="acme").counts["lagging_processes"] == 0


def test_stage_2_stops_when_a_new_producer_is_not_stamping(dag, tenant):
    legacy(tenant)
    sc = TenantScenario()
    sc.change_ids = iter(range(7000, 7010))
    sc.audit_change(2, history_sequence=None, producer_version="4.13.2")
    run_dag(dag, conf(target_stage=1))  # stage 1 adds the column the new producer writes
    sc.write(tenant)
    result = run_dag(dag, conf(target_stage=2))
    assert result.state_of("stage_1") == "success" and result.state_of("stage_2_producers") == "failed"
    report = result.xcom("stage_2_producers", "report")
    assert report["counts"]["unstamped_rows"] == 1
    assert [f["change_id"] for f in report["findings"]] == [7000]
    assert all(v[2] is None for v in audit_table(tenant).values())  # nothing materialized


def test_drain_stops_and_reports_failed_outbox_work_without_changing_it(dag, tenant):
    legacy(tenant, failed_outbox=True)
    result = run_dag(dag, conf(target_stage=3))
    assert result.state_of("stage_2_producers") == "success"
    assert result.state_of("stage_2_drain_outbox") == "failed"
    assert result.state_of("stage_2_materialize") == "upstream_failed"
    report = result.xcom("stage_2_drain_outbox", "report")
    assert report["failed_rows"] == 1 and report["examples"][0]["outbox_id"] == 1
    assert outbox_statuses(tenant) == {1: "failed"}


def test_stage_3_refuses_with_counts_and_switches_nothing(dag, tenant):
    """A lagging outbox worker, and an upgraded producer's outbox row that failed (not pre-cutover work: the drain lets
    it pass): stage 3 stops naming both, the failed row by its OutboxId with what to do next (the task's Next: line)."""
    legacy(tenant, worker="4.12.5")  # enough for stages 1 and 2, not for stage 3
    upgraded_outbox_row(tenant, 60, 6000, status="failed")
    result = run_dag(dag, conf(target_stage=3))
    assert result.state_of("stage_2_materialize") == "success"
    assert result.state_of("stage_3") == "failed"
    report = result.xcom("stage_3", "report")
    assert report["counts"] == {"lagging_processes": 1, "pre_cutover_outbox_rows": 0, "failed_outbox_rows": 1, "eligible_null_rows": 0}
    assert report["summary"].startswith("refused, nothing switched: 1 deployed producer(s) older than 4.13.0; 1 outbox "
                                        "row(s) failed (OutboxId 60)")
    assert {"finding": "outbox_failed", "outbox_id": 60} in report["findings"]
    assert report["message"] == f"stage_3: {report['summary']}" and report["message"].endswith(f"Next: {FAILED_OUTBOX_NEXT}.")
    assert settings(tenant) == {} and outbox_statuses(tenant) == {60: "failed"}

"""The three stage gates as domain functions, on MariaDB and SQLite: refusals with their reports, and the happy path."""

from __future__ import annotations

from sqlalchemy import select, update

from nexus_cutover import catalog
from nexus_cutover.db import Deadline, make_engine
from nexus_cutover.field_history import gates
from nexus_cutover.field_history.status import read_status
from nexus_cutover.field_history.switch import Hooks
from nexus_cutover.schema import create_legacy_schema
from nexus_sim import outbox_worker
from nexus_sim.scenario import TenantScenario
from tests.support import history_checksum

from .helpers import mixed_history, upgraded_outbox_row

STAGE1, CUTOVER = "4.12.0", "4.13.0"


def legacy_tenant(url, *, api="4.12.0", worker="4.12.0", manager="4.13.0"):
    engine = make_engine(url)
    create_legacy_schema(engine)
    sc = mixed_history(TenantScenario())
    sc.process(catalog.ROLE_RUNTIME_API, version=api, process_id="api-1")
    sc.process(catalog.ROLE_AUDIT_OUTBOX_WORKER, version=worker, process_id="worker-1")
    sc.process(catalog.ROLE_SERVICE_MANAGER, version=manager, process_id="sm-1")
    sc.process(catalog.ROLE_RUNTIME_API, version="4.0.0", process_id="api-old", stopped=True)  # stopped: ignored
    for row in sc.audit_changes:
        row.pop("FieldHistoryEligible", None)  # Part A has no column yet: every row is NULL (12 eligible)
    sc.write(engine)
    return engine


def settings_rows(engine) -> dict[str, str]:
    s = catalog.RuntimeSetting
    with engine.connect() as conn:
        return dict(conn.execute(select(s.c.Name, s.c.Value)).all())


def test_stage_1_adds_the_column_once_and_lists_lagging_processes(tenant_url):
    engine = legacy_tenant(tenant_url, api="4.11.9")
    first = gates.stage_1(engine, stage1_release=STAGE1)
    assert not first.passed and first.actions == ["added column _System_AuditFieldChange.FieldHistoryEligible"]
    assert [f["process_id"] for f in first.findings] == ["api-1"]
    assert "api-1" in first.render() and "older than 4.12.0" in first.summary
    again = gates.stage_1(engine, stage1_release="4.11")
    assert again.passed and again.already_done and again.actions == []
    engine.dispose()


def test_stage_2_refuses_lagging_producers_and_unstamped_rows(tenant_url):
    engine = legacy_tenant(tenant_url, api="4.12.0")
    gates.stage_1(engine, stage1_release=STAGE1)
    sc = TenantScenario()
    sc.change_ids = iter(range(1000, 1010))
    sc.audit_change(1, history_sequence=None, producer_version="4.13.1")  # a new producer that did not stamp
    sc.audit_change(None, history_sequence=None, producer_version="4.13.1")  # no FieldId: allowed to be NULL
    sc.write(engine)
    report = gates.stage_2_producers(engine, producer_release=CUTOVER)
    assert not report.passed
    assert report.counts == {"lagging_processes": 1, "unstamped_rows": 1}
    assert {f["finding"] for f in report.findings} == {"lagging_process", "unstamped_row"}
    assert [f["change_id"] for f in report.findings if f["finding"] == "unstamped_row"] == [1000]
    engine.dispose()


def test_outbox_drain_state_reports_open_failed_and_stuck(tenant_url):
    engine = legacy_tenant(tenant_url)
    sc = TenantScenario()
    sc.outbox_row(producer_version="4.11.0", status="pending")
    sc.outbox_row(producer_version="4.12.0", status="failed")
    sc.outbox_row(producer_version="4.13.0", status="pending")  # post-cutover: not part of the drain
    sc.outbox_row(producer_version="4.11.0", status="delivered")
    sc.write(engine)
    state = gates.outbox_drain_state(engine, producer_release=CUTOVER)
    assert (state.remaining, state.failed_rows, state.live_workers, state.drained) == (1, 1, 1, False)
    assert [e["outbox_id"] for e in state.examples] == [1, 2]
    assert len(state.stuck_reasons) == 1 and "failed" in state.stuck_reasons[0]
    engine.dispose()


def test_stage_3_refuses_with_counts_and_switches_nothing(tenant_url):
    engine = legacy_tenant(tenant_url, api="4.13.0", worker="4.12.0")
    gates.stage_1(engine, stage1_release=STAGE1)
    TenantScenario().write(engine)
    sc = TenantScenario()
    sc.outbox_row(producer_version="4.11.0", status="pending")
    sc.write(engine)
    report = gates.stage_3(engine, producer_release=CUTOVER, updated_by="test")
    assert not report.passed and report.summary.startswith("refused, nothing switched")
    assert report.counts == {"lagging_processes": 1, "pre_cutover_outbox_rows": 1, "failed_outbox_rows": 0, "eligible_null_rows": 12}
    assert settings_rows(engine) == {}
    engine.dispose()


def test_happy_path_through_stage_3_then_reverified(tenant_url):
    engine = legacy_tenant(tenant_url, api="4.13.0", worker="4.13.0")
    before = history_checksum(engine)
    assert gates.stage_1(engine, stage1_release=STAGE1).passed
    assert gates.stage_2_producers(engine, producer_release=CUTOVER).passed
    assert gates.outbox_drain_state(engine, producer_release=CUTOVER).drained
    mat = gates.stage_2_materialize(engine, batch_size=7)
    assert mat.passed and mat.counts["set_true"] == 12 and mat.counts["eligible_null_rows"] == 0
    final = gates.stage_3(engine, producer_release=CUTOVER, updated_by="test")
    assert final.passed and final.actions == [  # reservation off first, then (settled, compared) the reads
        "set FieldHistorySequenceReservationEnabled = false",
        "set FieldHistoryReadMode = boolean_only",
    ]
    assert any("AtomicHistoryPrelocks" in r for r in final.removable)
    assert settings_rows(engine) == {"FieldHistoryReadMode": "boolean_only", "FieldHistorySequenceReservationEnabled": "false"}
    st = read_status(engine)
    assert (st.settings.read_mode, st.settings.sequence_reservation_enabled) == ("boolean_only", False)

    again = gates.stage_3(engine, producer_release=CUTOVER, updated_by="test")
    assert again.passed and again.already_done and again.actions == []
    assert gates.stage_2_materialize(engine).already_done
    assert history_checksum(engine) == before  # Event/WorkItem history untouched
    engine.dispose()


def test_a_lagging_producer_behind_1200_stopped_registry_rows_is_found(tenant_url):
    """A long-lived registry (contract, "Process registry"): the gates read the deployed producers in SQL, every one."""
    engine = legacy_tenant(tenant_url)
    sc = TenantScenario()
    for i in range(1200):  # every restart of years, stopped, sorting before the live one
        sc.process(catalog.ROLE_RUNTIME_API, version="4.0.0", process_id=f"api-restart-{i:05d}", stopped=True)
    sc.process(catalog.ROLE_RUNTIME_API, version="4.11.0", process_id="zz-api-Ä ")
    sc.write(engine)
    report = gates.stage_1(engine, stage1_release=STAGE1)
    assert not report.passed and [f["process_id"] for f in report.findings] == ["zz-api-Ä "]
    engine.dispose()


def materialized_tenant(url):
    """Every producer upgraded, stages 1 and 2 passed: what stage 3 meets."""
    engine = legacy_tenant(url, api=CUTOVER, worker=CUTOVER)
    assert gates.stage_1(engine, stage1_release=STAGE1).passed
    assert gates.stage_2_materialize(engine).passed
    return engine


def set_outbox_status(engine, outbox_id: int, status: str) -> None:
    """What a worker (``failed``) or an operator's reviewed redelivery (``pending``) does to a row; the pipeline never."""
    with engine.begin() as conn:
        conn.execute(update(catalog.AuditOutbox).where(catalog.AuditOutbox.c.OutboxId == outbox_id).values(Status=status))


def test_stage_3_refuses_a_failed_outbox_row_of_an_upgraded_producer_naming_it_and_the_check_agrees(tenant_url):
    """A row that failed before stage 3 started: stage 3 used to switch over it, and its redelivery then wrote an
    eligible NULL row the boolean-only reader never returns. Refused before anything is switched, naming it, with what
    to do next; ``-check`` gives the same verdict; redelivered (that next step), it is found and materialized."""
    engine = materialized_tenant(tenant_url)
    upgraded_outbox_row(engine, 50, 900, status="failed")
    report = gates.stage_3(engine, producer_release=CUTOVER, updated_by="test")
    assert not report.passed, report.render()
    assert report.summary.startswith("refused, nothing switched: 1 outbox row(s) failed (OutboxId 50): a failed row can be "
                                     "redelivered"), report.summary
    assert report.summary.endswith(f"Next: {gates.FAILED_OUTBOX_NEXT}.")
    assert {"finding": "outbox_failed", "outbox_id": 50} in report.findings and report.counts["failed_outbox_rows"] == 1
    assert settings_rows(engine) == {}  # refused at its first step: reservation still on, reads compat
    check = gates.stage_3_check(engine, producer_release=CUTOVER)
    assert (check.would, check.exit_code) == ("refuse", 3) and check.summary.endswith(report.summary)
    assert check.as_json()["failed_outbox_examples"] == [50] and check.report.findings == report.findings

    set_outbox_status(engine, 50, "pending")  # redelivered, as a reviewed decision
    assert outbox_worker.run_once(engine).delivered == [50]
    assert read_status(engine).eligible_null_rows == 1  # what the switch would have hidden
    refused = gates.stage_3(engine, producer_release=CUTOVER, updated_by="test")
    assert not refused.passed and [(f["finding"], f["change_id"]) for f in refused.findings] == [("read_flip", 900)]
    assert gates.stage_2_materialize(engine).passed and gates.stage_3(engine, producer_release=CUTOVER, updated_by="t").passed
    engine.dispose()


def test_an_outbox_row_failing_after_the_preconditions_refuses_the_switch_under_its_lock(tenant_url):
    """Pending when stage 3 checked its preconditions, failed before its barrier (so the barrier does not wait for it):
    the switch's own rules, read in its locked transaction, find it and refuse; reservation stays off."""
    engine = materialized_tenant(tenant_url)
    upgraded_outbox_row(engine, 60, 901)
    report = gates.stage_3(engine, producer_release=CUTOVER, updated_by="test", deadline=Deadline(30),
                           hooks=Hooks(after_reservation_off=lambda: set_outbox_status(engine, 60, "failed")))
    assert not report.passed, report.render()
    assert report.summary.startswith("refused, reads not switched (sequence reservation is off and stays off): 1 outbox "
                                     "row(s) failed (OutboxId 60)"), report.summary
    assert "Next: redeliver them" in report.summary and {"finding": "outbox_failed", "outbox_id": 60} in report.findings
    assert settings_rows(engine) == {"FieldHistorySequenceReservationEnabled": "false"}
    engine.dispose()

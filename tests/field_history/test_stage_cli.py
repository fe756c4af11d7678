"""``field-history-eligibility stage1|stage2|stage3``: the DAG's gates from the command line (real processes)."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

from sqlalchemy import update

from nexus_cutover import catalog
from nexus_cutover.clock import utcnow
from nexus_cutover.db import make_engine
from nexus_cutover.field_history import gates
from nexus_sim import outbox_worker
from nexus_sim.scenario import TenantScenario
from nexus_sim.scenario.production import LIVE_PRODUCER_IDS, build_production_tenant
from tests.field_history.helpers import upgraded_outbox_row
from tests.field_history.test_gates import CUTOVER, STAGE1, legacy_tenant, settings_rows

PROD = "prod"
#: The production-shaped tenant, smaller (one active pack, 200 stopped registry rows), with its Field History rows.
PROD_SIZES = {"active_packs": 1, "plain_lanes": 2, "generations": 2, "greenfield_pack": False, "registry_stopped_rows": 200}
PROD_SETTINGS = {"FieldHistoryReadMode": "compat", "FieldHistorySequenceReservationEnabled": "true"}
WORKER = LIVE_PRODUCER_IDS[catalog.ROLE_AUDIT_OUTBOX_WORKER]


def fh(dsn: str, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nexus_cutover.cli.field_history", *args],
                          env={**os.environ, "NEXUS_TENANT_DSN": dsn}, capture_output=True, text=True, timeout=120)


def out(proc: subprocess.CompletedProcess) -> dict:
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_stages_in_order_with_their_exit_codes(tenant_url):
    engine = legacy_tenant(tenant_url, api="4.11.0", worker="4.13.0")
    lagging = fh(tenant_url, "stage1", "-stage1-release", STAGE1, "-json")
    assert lagging.returncode == 3, lagging.stderr
    report = out(lagging)["reports"][0]
    assert report["actions"] == ["added column _System_AuditFieldChange.FieldHistoryEligible"]
    assert [f["process_id"] for f in report["findings"]] == ["api-1"]
    early = fh(tenant_url, "stage3", "-producer-release", CUTOVER, "-json")
    assert early.returncode == 3 and "nothing switched" in out(early)["summary"]
    with engine.begin() as conn:  # the runtime API is upgraded
        from sqlalchemy import update

        from nexus_cutover import catalog

        conn.execute(update(catalog.ProcessRegistry).where(catalog.ProcessRegistry.c.ProcessId == "api-1")
                     .values(BinaryVersion="4.13.0"))
    text = fh(tenant_url, "stage1", "-stage1-release", STAGE1)
    assert text.returncode == 0 and text.stdout.startswith("stage 1: PASSED")
    stage2 = fh(tenant_url, "stage2", "-producer-release", CUTOVER, "-batch-size", "5", "-json")
    assert stage2.returncode == 0, stage2.stderr
    reports = out(stage2)["reports"]
    assert [r["stage"] for r in reports] == [2, 2] and reports[1]["counts"]["set_true"] == 12
    stage3 = fh(tenant_url, "stage3", "-producer-release", CUTOVER, "-json")
    assert stage3.returncode == 0, stage3.stderr
    assert settings_rows(engine) == {"FieldHistoryReadMode": "boolean_only", "FieldHistorySequenceReservationEnabled": "false"}
    again = fh(tenant_url, "stage3", "-producer-release", CUTOVER, "-json")
    assert again.returncode == 0 and out(again)["reports"][0]["already_done"]
    engine.dispose()


def test_stage_2_waits_for_the_outbox_and_stops_on_failed_outbox_work(tenant_url):
    engine = legacy_tenant(tenant_url, api="4.13.0", worker="4.13.0")
    assert fh(tenant_url, "stage1", "-stage1-release", STAGE1).returncode == 0
    sc = TenantScenario()
    sc.outbox_row(producer_version="4.11.0", status="pending")
    sc.write(engine)
    pending = fh(tenant_url, "stage2", "-producer-release", CUTOVER, "-json")
    assert pending.returncode == 4 and "still being delivered" in out(pending)["summary"]
    failed = TenantScenario()
    failed.outbox_ids = iter([50])
    failed.outbox_row(producer_version="4.11.0", status="failed")
    failed.write(engine)
    stuck = fh(tenant_url, "stage2", "-producer-release", CUTOVER, "-json")
    assert stuck.returncode == 3 and "failed" in out(stuck)["summary"]
    engine.dispose()


def test_a_gate_needs_its_release(sqlite_url):
    proc = fh(sqlite_url, "stage2")
    assert proc.returncode == 2 and "-producer-release" in proc.stderr


def test_stage3_check_says_what_stage_3_would_find_and_switches_nothing(tenant_url):
    """``stage3 --check``: the comparison, the reservation switch it would turn off, the outbox rows it would wait for,
    a field no lock can hold back, and (with a release) the producers it would refuse; read-only."""
    from sqlalchemy import delete

    from nexus_cutover import catalog

    engine = legacy_tenant(tenant_url, api="4.11.0", worker="4.13.0")
    assert fh(tenant_url, "stage1", "-stage1-release", STAGE1).returncode == 3  # the column is added; api-1 lags
    sc = TenantScenario()
    sc.outbox_row(producer_version="4.13.0", status="pending")
    sc.field(9, intervals=[(0, None)])
    sc.write(engine)
    with engine.begin() as conn:
        conn.execute(delete(catalog.FieldHistorySequence).where(catalog.FieldHistorySequence.c.FieldId == 9))
    check = fh(tenant_url, "stage3", "--check", "-producer-release", CUTOVER, "--json")
    assert check.returncode == 3, check.stderr
    found = out(check)
    assert found["check"] is True and found["passed"] is False
    assert found["sequence_reservation_enabled"] is True and found["open_outbox_rows"] == 1
    assert found["fields_at_risk"] == [9] and found["comparison"]["rows_only_compat_accepts"] == 12
    assert found["would"] == "refuse" and [f["process_id"] for f in found["findings"] if "process_id" in f] == ["api-1"]
    # stage 3 would refuse at its first step, for the lagging producer and the rows that would flip (its own words)
    assert "would refuse (exit 3): refused, nothing switched: 1 deployed producer(s) older than" in found["summary"]
    assert "12 eligible NULL row(s) would stop being read" in found["summary"]
    text = fh(tenant_url, "stage3", "-check")  # no release: the step-4 rules decide (worker-1 is live: it waits first)
    assert text.returncode == 3 and "stage 3 would turn it off first" in text.stdout and "outbox row(s) open now" in text.stdout
    assert "which 1 live audit_outbox_worker(s) deliver" in text.stdout and "field(s) have an interval proving" in text.stdout
    assert settings_rows(engine) == {}  # nothing switched
    engine.dispose()


def production_at_stage_3(url):
    """The production-shaped tenant (nexus_sim.scenario.production) with Field History, its live runtime API and outbox
    worker upgraded to the producer-cutover release, stages 1 and 2 passed: where stage 3 runs."""
    engine = make_engine(url)
    build_production_tenant(engine, namespace=PROD, field_history=True, **PROD_SIZES)
    process = catalog.ProcessRegistry
    with engine.begin() as conn:
        conn.execute(update(process).where(process.c.ProcessId.in_(LIVE_PRODUCER_IDS.values())).values(BinaryVersion=CUTOVER))
    assert gates.stage_1(engine, stage1_release=STAGE1, namespace=PROD).passed
    assert gates.stage_2_producers(engine, producer_release=CUTOVER, namespace=PROD).passed
    assert gates.stage_2_materialize(engine).passed
    assert settings_rows(engine) == PROD_SETTINGS
    return engine


def heartbeat(engine, process_id: str, age_s: float) -> None:
    process = catalog.ProcessRegistry
    with engine.begin() as conn:
        conn.execute(update(process).where(process.c.ProcessId == process_id)
                     .values(LastHeartbeatAt=utcnow() - dt.timedelta(seconds=age_s)))


def test_stage3_over_a_failed_outbox_row_is_refused_naming_it_and_the_check_agrees(collated_tenant_url):
    """An upgraded producer's outbox row failed before stage 3 started (it carries a reserved HistorySequence): stage 3
    refuses (exit 3) naming its OutboxId and what to do next, switching nothing; ``--check`` exits 3 with the same reason."""
    url = collated_tenant_url
    engine = production_at_stage_3(url)
    upgraded_outbox_row(engine, 9001, 990001, field_id=101, status="failed")
    check = fh(url, "stage3", "--check", "-producer-release", CUTOVER, "-namespace", PROD, "--json")
    stage3 = fh(url, "stage3", "-producer-release", CUTOVER, "-namespace", PROD, "-json")
    assert (check.returncode, stage3.returncode) == (3, 3), (check.stdout, check.stderr, stage3.stdout, stage3.stderr)
    refusal = out(stage3)["reports"][0]
    assert refusal["summary"].startswith(
        "refused, nothing switched: 1 outbox row(s) failed (OutboxId 9001): a failed row can be redelivered, and an "
        "upgraded producer's row then writes its NULL rows after the switch, where the boolean-only reader never returns them"
    ), refusal["summary"]
    assert refusal["summary"].endswith(
        "Next: redeliver them through the outbox worker, or retire them by a separately reviewed decision (stage 3 never "
        "changes an outbox row's status), then run stage 3 again."
    )
    assert {"finding": "outbox_failed", "outbox_id": 9001} in refusal["findings"] and refusal["counts"]["failed_outbox_rows"] == 1
    found = out(check)
    assert found["would"] == "refuse" and found["exit_code"] == 3 and found["summary"].endswith(refusal["summary"])
    assert found["findings"] == refusal["findings"] and found["failed_outbox_examples"] == [9001]
    text = fh(url, "stage3", "-producer-release", CUTOVER, "-namespace", PROD)
    assert text.returncode == 3 and text.stdout.startswith("stage 3: STOPPED: refused, nothing switched: 1 outbox row(s) failed")
    assert "finding outbox_failed: outbox_id=9001" in text.stdout and "Next: redeliver them" in text.stdout
    assert settings_rows(engine) == PROD_SETTINGS  # nothing switched, reservation still on
    engine.dispose()


def test_stage3_check_and_the_switch_agree_on_a_pending_outbox_row_with_no_outbox_worker(collated_tenant_url):
    """A pending row of an upgraded producer and no live outbox worker (its heartbeat an hour old): ``--check`` says the
    switch would wait and time out (exit 4), and the switch does (exit 4), for the same reason; the worker back, the
    check says stage 3 would wait for it (exit 0); delivered, the row is an eligible NULL row: both refuse (exit 3)."""
    url = collated_tenant_url
    engine = production_at_stage_3(url)
    upgraded_outbox_row(engine, 9002, 990002, field_id=101)
    heartbeat(engine, WORKER, 3600)
    release = ("-producer-release", CUTOVER, "-namespace", PROD)
    reason = "1 pending/processing outbox row(s) (OutboxId 9002) and no live audit_outbox_worker to deliver them"
    check = fh(url, "stage3", "--check", *release, "--json")
    assert check.returncode == 4, (check.stdout, check.stderr)
    assert out(check)["would"] == "time out" and f"would wait: {reason}: the switch would time out" in out(check)["summary"]
    stage3 = fh(url, "stage3", *release, "-timeout", "1s", "-json")
    assert stage3.returncode == 4, (stage3.stdout, stage3.stderr)
    assert out(stage3)["error_class"] == "LockTimeout" and f"waiting: {reason};" in out(stage3)["error"] and reason in stage3.stderr
    assert settings_rows(engine) == {**PROD_SETTINGS, "FieldHistorySequenceReservationEnabled": "false"}  # reads not switched

    heartbeat(engine, WORKER, 0)
    waiting = fh(url, "stage3", "--check", *release, "--json")
    assert waiting.returncode == 0 and out(waiting)["would"] == "wait", waiting.stdout
    assert "(OutboxId 9002), which 1 live audit_outbox_worker(s) deliver" in out(waiting)["summary"]
    assert outbox_worker.run_once(engine).delivered == [9002]
    check, stage3 = fh(url, "stage3", "--check", *release, "--json"), fh(url, "stage3", *release, "-json")
    assert (check.returncode, stage3.returncode) == (3, 3), (check.stdout, stage3.stdout)
    refusal = out(stage3)["reports"][0]
    assert "1 eligible NULL row(s) would stop being read" in refusal["summary"] and out(check)["summary"].endswith(refusal["summary"])
    assert settings_rows(engine) == {**PROD_SETTINGS, "FieldHistorySequenceReservationEnabled": "false"}
    engine.dispose()


def test_the_stages_record_their_gates_and_stops_in_the_delivery_ledger(tenant_url, tmp_path):
    """As the DAG's gates do (issue 48): each stage's gate passed, a refused gate's stop with its reason."""
    from nexus_cutover import ledger as L

    engine = legacy_tenant(tenant_url, api="4.11.0", worker="4.13.0")
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"

    def recorded(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "nexus_cutover.cli.field_history", *args, "-namespace", "acme",
                               "-actor", "dana"], env={**os.environ, "NEXUS_TENANT_DSN": tenant_url,
                                                       "NEXUS_LEDGER_DSN": ledger},
                              capture_output=True, text=True, timeout=120)

    assert recorded("stage1", "-stage1-release", STAGE1).returncode == 3  # api-1 lags: a stop, with its reason
    with engine.begin() as conn:
        conn.execute(update(catalog.ProcessRegistry).where(catalog.ProcessRegistry.c.ProcessId == "api-1")
                     .values(BinaryVersion="4.13.0"))
    assert recorded("stage1", "-stage1-release", STAGE1).returncode == 0
    assert recorded("stage2", "-producer-release", CUTOVER, "-batch-size", "5").returncode == 0
    ledger_engine = L.ledger_engine(ledger)
    try:
        rows = L.history(ledger_engine, "acme")
    finally:
        ledger_engine.dispose()
        engine.dispose()
    assert [(r["step"], r["kind"]) for r in rows] == [
        ("stage_1", L.STOPPED), ("stage_1", L.GATE_PASSED), ("stage_2_producers", L.GATE_PASSED),
        ("stage_2_materialize", L.GATE_PASSED)]
    assert f"older than {STAGE1}" in rows[0]["reason"] and {r["actor"] for r in rows} == {"dana"}
    assert {r["dag_id"] for r in rows} == {"field-history-eligibility"}

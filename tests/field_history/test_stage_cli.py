"""``field-history-eligibility stage1|stage2|stage3``: the DAG's gates from the command line (real processes)."""

from __future__ import annotations

import json
import os
import subprocess
import sys

from nexus_sim.scenario import TenantScenario
from tests.field_history.test_gates import CUTOVER, STAGE1, legacy_tenant, settings_rows


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
    assert [f["process_id"] for f in found["producers"]["findings"]] == ["api-1"]
    assert "12 row(s) would read differently" in found["summary"] and "deployed producer(s) older than" in found["summary"]
    text = fh(tenant_url, "stage3", "-check")
    assert text.returncode == 3 and "stage 3 would turn it off first" in text.stdout and "outbox row(s) open now" in text.stdout
    assert settings_rows(engine) == {}  # nothing switched
    engine.dispose()

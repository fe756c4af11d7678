"""A stop's report as the task log shows it (issue 51, item 9): one fact per line, a table one row per line, never a
Python value or a JSON block; the whole report stays in XCom."""

from __future__ import annotations

import re

from nexus_airflow.base import fact_lines

PYTHON_OR_JSON = re.compile(r"\{'|\['|^\s*[{}\[\]],?$")


def test_a_stop_report_reads_one_fact_per_line():
    report = {
        "stage": 1, "passed": False, "summary": "2 process(es) run a release older than 4.12.0",
        "counts": {"lagging_processes": 2, "eligible_null_rows": None},
        "findings": [{"finding": "lagging_process", "process_id": f"worker-{i}", "binary_version": "4.11.2"}
                     for i in range(60)],
        "actions": ["added column _System_AuditFieldChange.FieldHistoryEligible"],
        "held_by": "airflow:connector_projection_cutover:manual__1",
        "fence": {"FenceId": 1, "Namespace": "demo", "ArmedAt": "2026-12-07 21:40:25"},
        "nested": {"deeper": {"a": 1}},
    }
    text = fact_lines(report)
    lines = text.splitlines()
    assert not [line for line in lines if PYTHON_OR_JSON.search(line)], text
    assert "stage: 1" in lines and "passed: False" in lines and "actions: added column _System_AuditFieldChange." \
        "FieldHistoryEligible" in lines
    assert lines[lines.index("counts:") + 1:][:2] == ["  lagging_processes: 2", "  eligible_null_rows: none"]
    assert "findings: 60" in lines
    rows = [line for line in lines if line.startswith("  - ")]
    assert len(rows) == 50 and rows[0] == "  - finding lagging_process; process_id worker-0; binary_version 4.11.2"
    assert "  ... and 10 more (XCom report)" in lines
    assert "  FenceId: 1" in lines and '  deeper: {"a": 1}' in lines  # deeper than a table: one compact line


def test_a_report_that_is_not_a_dict_is_one_line():
    assert fact_lines(["a", "b"]) == "a, b" and fact_lines(None) == "none" and fact_lines("text") == "text"

"""The next action of every stop has one source: the runbook's task table shows exactly projection.next_actions."""

from __future__ import annotations

import pathlib
import re

from nexus_cutover.projection.next_actions import NEXT_ACTION, next_action
from nexus_cutover.projection.transition import CUTOVER

RUNBOOK = pathlib.Path(__file__).resolve().parents[1] / "docs" / "runbook.md"
ROW = re.compile(r"^\| `([a-z_]+)`(?: \(one per pack\))? \|")


SECTION = "## Connector projection cutover: step by step"


def runbook_actions() -> dict[str, str]:
    """The task table's rows: every row of the section that holds it (other sections' tables are not steps)."""
    text = RUNBOOK.read_text()
    assert SECTION in text, f"docs/runbook.md has no section {SECTION!r}"
    section = text.split(SECTION, 1)[1].split("\n## ", 1)[0]
    actions = {}
    for line in section.splitlines():
        match = ROW.match(line)
        if match:
            actions[match.group(1)] = [c.strip() for c in line.strip().strip("|").split("|")][-1]
    return actions


def test_the_runbook_table_shows_the_one_source():
    assert runbook_actions() == NEXT_ACTION


def test_every_declared_step_has_a_next_action():
    """Keyed by step (the DAG's task ids are the step names: tests/dags/test_cutover_dag_integrity.py)."""
    assert list(NEXT_ACTION) == CUTOVER.names and all(text.strip() for text in NEXT_ACTION.values())


def test_plain_text_for_messages():
    assert next_action("wait_for_drain").count("Never change WorkItem status to proceed.") == 1
    assert "**" not in next_action("wait_for_drain") and "`" not in next_action("confirm_writers_stopped")
    assert next_action("no_such_task") is None

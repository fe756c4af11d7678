"""What every Field History stage gate returns (:class:`GateReport`), and the finding the three gates share.

Split out of :mod:`.gates`, which re-exports every name here (importers may keep ``from .gates import ...``); the
stage-3 gate (:mod:`.stage3_gate`) reports through it too.

Invariants:

* A gate never raises for a failed check: it returns a report with ``passed`` false, the findings naming the
  rows or processes in the way (at most :data:`EXAMPLES` rows each), and a summary saying what to do; callers
  decide (the DAG stops the run with :meth:`GateReport.render`).
* A lagging process (:func:`lagging_findings`) is a deployed (not stopped) producer of the gate's roles whose
  release compares numerically below the gate's release (:mod:`.inventory`, :mod:`.versions`).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection

from .inventory import lagging, producer_processes
from .status import render_comparison

#: Most rows a finding names as examples (its count says how many there are).
EXAMPLES = 10


@dataclass
class GateReport:
    stage: int
    passed: bool
    summary: str
    findings: list[dict] = field(default_factory=list)
    counts: dict = field(default_factory=dict)
    actions: list[str] = field(default_factory=list)
    already_done: bool = False
    removable: list[str] = field(default_factory=list)
    comparison: dict = field(default_factory=dict)  # stage 3: the read comparison (ReadComparison.as_json())

    def as_json(self) -> dict:
        return {
            "stage": self.stage,
            "passed": self.passed,
            "summary": self.summary,
            "already_done": self.already_done,
            "findings": self.findings,
            "counts": self.counts,
            "actions": self.actions,
            "removable": self.removable,
            "comparison": self.comparison,
        }

    def render(self) -> str:
        lines = [f"stage {self.stage}: {'PASSED' if self.passed else 'STOPPED'}: {self.summary}"]
        lines += [f"  did: {a}" for a in self.actions]
        lines += [f"  count {k} = {v}" for k, v in self.counts.items()]
        if self.comparison:
            lines += ["  " + line for line in render_comparison(self.comparison).splitlines()]
        for f in self.findings:
            detail = ", ".join(f"{k}={v}" for k, v in f.items() if k != "finding")
            lines.append(f"  finding {f['finding']}: {detail}")
        lines += [f"  now removable: {r}" for r in self.removable]
        return "\n".join(lines)


def lagging_findings(conn: Connection, roles: tuple[str, ...], release: str, namespace: str | None) -> list[dict]:
    """A ``lagging_process`` finding for each deployed process of ``roles`` older than ``release``."""
    return [
        {"finding": "lagging_process", "release": release, **p.as_json()}
        for p in lagging(producer_processes(conn, namespace, deployed_only=True), roles, release)
    ]

"""``wait_for_drain``: one look at the drain of old projection work, and what its end means as events."""

from __future__ import annotations

import datetime as dt

from ...clock import utcnow
from ...transition import StepResult
from .. import actions
from .context import CutoverRun, _judged


def wait_for_drain(run: CutoverRun) -> StepResult:
    """One look at the drain of old projection work: drained, stuck (a stop, blockers by cause) or still draining.

    Read only: no WorkItem is ever changed."""
    deadline = run.deadline or utcnow() + dt.timedelta(seconds=run.drain_timeout_s)
    report = actions.drain(run.engine, run.namespace, deadline=deadline, stale_heartbeat=run.stale,
                           range_column=run.range_column, sample_limit=run.drain_sample_limit)
    run.say(f"drain: {report.state}: {report.counts_text()}")
    if report.state == "stuck":
        run.say(report.report_text())
    return _judged("wait_for_drain", report.as_json(), keyed={"report_text": report.report_text()}, domain=report)


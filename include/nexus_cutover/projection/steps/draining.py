"""``wait_for_drain``: one look at the drain of old projection work, and what its end means as events."""

from __future__ import annotations

import datetime as dt

from ... import events as E
from ...clock import utcnow
from ...events import Event
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


def events(step: str, r: dict) -> list[Event]:
    """The drain done (a look that is still draining, or stuck, means nothing yet: its stop is recorded as one)."""
    if r.get("state") != "drained":
        return []
    return [Event(E.DRAIN_DONE, step, outcome="drained",
                  detail={k: r.get(k) for k in ("remaining", "counts", "checked_at") if k in r})]

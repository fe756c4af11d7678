"""``wait_for_drain``: one look at the drain of old projection work, how the run watches it (counts, trend, rate
and ETA), and what its end means as events."""

from __future__ import annotations

import datetime as dt
import time
from collections import deque
from typing import Any

from ... import catalog
from ... import events as E
from ...clock import utcnow
from ...events import Event, drain_looked
from ...polling import eta_seconds, measured_rate
from ...schema import has_column
from ...transition import StepResult
from ...watch import eta_minutes, eta_text
from .. import actions
from .context import CutoverRun, _judged
from .watching import CutoverWatch

#: The drain rate is measured over the last this many looks (a moving window: an old burst does not skew the ETA).
RATE_SAMPLES = 20


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


class DrainWatch(CutoverWatch):
    """Old projection work of the tenant: ``drained``, ``stuck`` (with blockers) or ``waiting`` (the drain's own
    deadline makes a drain that cannot finish ``stuck``: it never reports ``timed_out``).

    Each look's message ends with the measured drain rate and ETA (:func:`~nexus_cutover.watch.eta_text`) over the
    last ``RATE_SAMPLES`` looks of this watch (a restarted trigger measures again from its first look); each look
    records its figures (a ``drain_looked`` event: remaining, rate, ETA)."""

    done, text_key = "drained", "report_text"

    def __init__(self, engine, namespace: str, step: str, deadline, *, initial_remaining: int | None = None,
                 sample_limit: int = 200, **kwargs: Any) -> None:
        super().__init__(engine, namespace, step, deadline, drain_sample_limit=sample_limit, **kwargs)
        self.initial = initial_remaining
        self.previous: int | None = initial_remaining
        self.samples: deque[tuple[float, int]] = deque(maxlen=RATE_SAMPLES)  # (monotonic s, remaining)

    def poll(self) -> dict[str, Any]:
        if not self.run.range_column:  # probed once: the column never disappears
            self.run.range_column = has_column(self.engine, catalog.INPUT_START_ORDINAL)
        looked = self.look()
        report = looked.domain
        remaining = report.remaining
        trend = []
        if self.previous is not None:
            trend.append(f"{remaining - self.previous:+d} since last poll")
        if self.initial is not None:
            trend.append(f"{remaining - self.initial:+d} since start")
        if self.initial is None:
            self.initial = remaining
        self.previous = remaining
        message = report.counts_text() + (f"; {', '.join(trend)}" if trend else "")
        if report.live_old_workers:
            message += f"; live old projection_workers: {len(report.live_old_workers)}"
        self.samples.append((time.monotonic(), remaining))
        rate = measured_rate(list(self.samples))
        message += f"; {eta_text(remaining, rate)}"
        if self.record is not None:
            self.record([drain_looked(remaining, rate, eta_seconds(remaining, rate), step=self.step)])
        return self.looked(looked, message, expires=False, remaining=remaining, rate_per_min=rate,
                           eta_min=eta_minutes(remaining, rate), progress=progress(report),
                           report_text=report.report_text())


def progress(report) -> list:
    """What a drain's progress is, for the trigger's log: old projection work by status and its live workers
    (ordinary work, which moves with the tenant's traffic, is not progress of the drain)."""
    return [report.counts.get(s, 0) for s in catalog.WORK_LIVE_STATUSES] + [len(report.live_old_workers)]

"""``wait_for_short_drain``: the old backlog's drain before the fence is armed, and its measured rate."""

from __future__ import annotations

import datetime as dt
import time

from ... import events as E
from ...clock import utcnow
from ...events import Event
from ...polling import eta_seconds, measured_rate
from ...transition import StepResult
from .. import actions
from ..drain import live_old_work_ids
from .context import CutoverRun, _judged
from .watching import CutoverWatch

#: How many looks the old backlog's drain rate is measured over (an old burst does not skew the ETA for long).
RATE_SAMPLES = 20


def wait_for_short_drain(run: CutoverRun) -> StepResult:
    """One look at the old projection backlog before the fence is armed, and its drain rate over the looks so
    far: the run arms once the rest would drain within ``arm_when_drain_below_s`` (so the admission pause holds
    only a short residual drain), and stops, arming nothing, when the backlog cannot drain. Read only; the
    seed's order is unchanged: ``wait_for_drain`` still waits, fenced, for every old projection WorkItem."""
    report = actions.drain(run.engine, run.namespace, deadline=utcnow() + dt.timedelta(seconds=run.drain_timeout_s),
                           stale_heartbeat=run.stale, range_column=run.range_column, sample_limit=run.drain_sample_limit)
    rate = _backlog_rate(run, report.remaining)
    look = {"remaining": report.remaining, "rate_per_min": rate, "eta_s": eta_seconds(report.remaining, rate),
            "arm_when_drain_below_s": run.arm_when_drain_below_s, "state": report.state,
            "blocker_totals": report.blocker_totals, "counts": report.counts}
    judged = _judged("wait_for_short_drain", look, domain=report)
    if judged.verdict.proceeds and not run.dry_run:  # the heads-up's one question: will this run pause the tenant?
        standing = actions.cutover_standing(run.engine, run.namespace)
        judged.value["cut_over"] = bool(standing["cut_over"])
        judged.value["fenced_by"] = standing["fence_held_by"]  # paused already (a rerun adopts it): no heads-up
    run.say(f"before arming: {report.counts_text()}" + ("" if judged.verdict.proceeds else f"; {judged.verdict.reason}"))
    if report.state == "stuck":
        run.say(report.report_text())
    return judged


def events(step: str, r: dict) -> list[Event]:
    """The pause ahead (the fence is armed next), with the residual drain it is expected to hold; none for a tenant
    already cut over (nothing will be fenced) or already fenced (its pause began when that fence was armed: a rerun
    after a Reject, a step-by-step ``arm-fence``)."""
    if r.get("cut_over") is not False or r.get("fenced_by"):
        return []
    return [Event(E.PAUSE_AHEAD, step, detail={k: r.get(k) for k in ("remaining", "eta_s", "arm_when_drain_below_s")})]


def _backlog_rate(run: CutoverRun, remaining: int) -> float | None:
    """Items per minute the old backlog drains at, from this look and the earlier ones of ``run``: the rate the
    old runtime finishes listed items at when it is measured (new work arriving before the fence does not
    hide it: once the fence is armed, only the finishing goes on), else the drop of the remaining count."""
    now = time.monotonic()
    run.backlog_samples = [*run.backlog_samples, (now, remaining)][-RATE_SAMPLES:]
    ids = live_old_work_ids(run.engine, run.namespace, range_column=run.range_column) if remaining else frozenset()
    if ids is None or run.backlog_ids is None:
        run.backlog_finished = [] if ids is None else [(now, 0)]
    else:
        finished = run.backlog_finished[-1][1] + len(run.backlog_ids - ids) if run.backlog_finished else 0
        run.backlog_finished = [*run.backlog_finished, (now, finished)][-RATE_SAMPLES:]
    run.backlog_ids = ids
    finishing = measured_rate([(s, -n) for s, n in run.backlog_finished])
    return finishing if finishing else measured_rate(run.backlog_samples)



class PreArmWatch(CutoverWatch):
    """The old backlog before the fence is armed: ``short`` (arm now), ``stuck`` (it cannot drain), ``timed_out``
    at the deadline, else waiting. One run of the step for the watch's life: its drain rate spans its looks."""

    done, text_key = "short", "report_text"
    params = (("arm_when_drain_below_s", "arm_when_drain_below"), ("drain_timeout_s", "drain_timeout"))

    def __init__(self, engine, namespace: str, step: str, deadline, *, arm_when_drain_below_s: float = 0.0,
                 drain_timeout_s: float = 3600.0, **kwargs) -> None:
        super().__init__(engine, namespace, step, deadline, arm_when_drain_below_s=float(arm_when_drain_below_s),
                         drain_timeout_s=float(drain_timeout_s), **kwargs)

    def poll(self) -> dict:
        looked = self.look()
        message = (f"arming: {looked.domain.counts_text()}" if looked.verdict.proceeds else looked.verdict.reason)
        return self.looked(looked, message, report_text=looked.domain.report_text(),
                           progress=[looked.value["remaining"]])

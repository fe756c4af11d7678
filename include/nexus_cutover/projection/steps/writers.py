"""Stage 3's writer steps: ``check_old_writers`` (the wait for every live old writer to stop) and
``confirm_writers_stopped`` (a person confirms, shown the evidence; re-checked when the answer comes).
"""

from __future__ import annotations

import datetime as dt

from ...errors import Refused
from ...transition import StepResult
from .. import actions
from .context import CutoverRun, _judged
from .watching import CutoverWatch

#: The question a person answers at ``confirm_writers_stopped`` (``{tenant}`` filled in), on every path that asks.
QUESTION = ("Every old ingress_writer, receipt_materializer, projection_worker and dependency_resolver of {tenant} is "
            "stopped and will not be restarted?")


def check_old_writers(run: CutoverRun) -> StepResult:
    """One look at the old-protocol writers: the run waits while one is live (then a person confirms)."""
    ev = actions.writer_evidence(run.engine, run.namespace, stale_heartbeat=run.stale)
    live = [p["process_id"] for p in ev.live]
    run.say(f"writers: {len(live)} live old writer(s)" + (f": {', '.join(live)}" if live else ""))
    return _judged("check_old_writers", ev.as_json(), keyed={"evidence_md": ev.as_markdown()}, domain=ev)


def evidence_to_confirm(run: CutoverRun):
    """The first half of ``confirm_writers_stopped``: the registry read now, the evidence a person is shown.

    Refuses (Refused, report: the evidence) while an old writer is live: nobody is asked to confirm what the
    registry contradicts."""
    ev = actions.writer_evidence(run.engine, run.namespace, stale_heartbeat=run.stale)
    if not ev.all_stopped_or_silent:
        raise LiveAgain(ev)
    return ev


class LiveAgain(Refused):
    """Old writers are live again when the person would be asked: nothing is asked."""

    def __init__(self, evidence) -> None:
        self.evidence = evidence
        self.report = evidence.as_json()
        super().__init__("cutover not performed: old writers are live again: "
                         + ", ".join(x["process_id"] for x in evidence.live) + ". Stop them, then clear check_old_writers.")


def accept_confirmation(run: CutoverRun, evidence_taken_at: dt.datetime) -> StepResult:
    """The second half of ``confirm_writers_stopped``, when the answer arrives: the registry read again against
    the evidence the person was shown; the confirmation holds only if no old writer came back since."""
    check = actions.recheck_writers(run.engine, run.namespace, evidence_taken_at=evidence_taken_at,
                                    stale_heartbeat=run.stale)
    return _judged("confirm_writers_stopped", check.as_json(), domain=check)


def confirm_writers_stopped(run: CutoverRun) -> StepResult:
    """A person confirms every old writer stopped, shown the evidence; re-checked when the answer comes."""
    fence = run.fence()
    ev = actions.writer_evidence(run.engine, run.namespace, stale_heartbeat=run.stale)
    if fence is not None and fence.not_needed:
        run.say("nothing to confirm: every pack is already checkpointed and no cutover fence is in force")
        return StepResult({"outcome": "nothing_to_confirm", "evidence": ev.as_json()})
    if run.dry_run:
        run.say("dry run: would ask to confirm; evidence:\n" + ev.as_text())
        return StepResult({"dry_run": True, "evidence": ev.as_json()})
    ev = evidence_to_confirm(run)
    if run.confirm is None:
        raise RuntimeError("confirm_writers_stopped needs its caller's way to ask a person (CutoverRun.confirm)")
    shown = ev.as_json()
    run.recorder.asked("confirm_writers_stopped", QUESTION.format(tenant=run.namespace), shown)
    try:
        confirmed_by = run.confirm(ev)
    except Refused as exc:  # the person did not confirm: an answer too
        run.recorder.answered("confirm_writers_stopped", "rejected", who=None, shown=shown, reason=str(exc))
        raise
    run.recorder.answered("confirm_writers_stopped", "confirmed", who=None, shown=shown, how=confirmed_by)
    answer = accept_confirmation(run, ev.checked_at)
    return _judged("confirm_writers_stopped", {"confirmed_by": confirmed_by, **answer.value},
                   keyed={"evidence": ev.as_json()})



class WritersWatch(CutoverWatch):
    """The old-protocol writers: ``stopped`` when all are stopped or silent, ``timed_out`` at the deadline."""

    done, text_key = "stopped", "evidence_md"

    def poll(self) -> dict:
        looked = self.look()
        live = [p["process_id"] for p in looked.domain.live]
        if looked.verdict.proceeds:
            message = f"every old-protocol writer of {self.namespace!r} is stopped or silent"
        else:
            message = f"{len(live)} old-protocol writer(s) still live: {', '.join(live[:20])}; stop them (keep the fence)"
        return self.looked(looked, message, report_text=looked.keyed[self.text_key])

"""Stage 3's writer steps: ``stop_old_writers`` (the deployment's writer-stop controller, the fence held),
``check_old_writers`` (the wait for every live old writer to stop) and ``confirm_writers_stopped`` (a person
confirms, shown the evidence and the controller's answer; re-checked when the answer comes).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from ... import events as E
from ... import tx
from ...errors import Refused
from ...events import Event
from ...transition import StepResult
from .. import actions, writers_stop
from ..cutover_fence import cutover_fence_in_force
from .context import CutoverRun, _judged
from .watching import CutoverWatch

#: The question a person answers at ``confirm_writers_stopped`` (``{tenant}`` filled in), on every path that asks.
QUESTION = ("Every old ingress_writer, receipt_materializer, projection_worker and dependency_resolver of {tenant} is "
            "stopped and will not be restarted?")


def stop_old_writers(run: CutoverRun) -> StepResult:
    """Stop the old writers by the run's writer-stop controller, with the tenant's cutover fence in force: nothing
    for ``manual`` (a person stops them); its answer as evidence, a failure its ``stop`` (the fence held)."""
    c = run.writers_stop or writers_stop.WritersStopController()
    if c.manual:
        return StepResult({"controller": writers_stop.MANUAL})
    fence = run.fence()
    if fence is not None and fence.not_needed:
        run.say("nothing to stop: every pack is already checkpointed and no cutover fence is in force")
        return StepResult({"controller": c.kind, "outcome": "not_needed"})
    what = c.describe(run.namespace)
    if run.dry_run:
        run.plan(f"stop the old writers by {what} (bounded by {c.timeout_s:g} s), the fence held")
        run.say(f"dry run: would stop the old writers by {what}")
        return StepResult({"dry_run": True, "controller": c.kind})
    _require_the_fence(run, what)
    before = actions.writer_evidence(run.engine, run.namespace, stale_heartbeat=run.stale)
    live = [p["process_id"] for p in before.live]
    run.say(f"stopping the old writers by {what} (live now: {', '.join(live) or 'none'})")
    body = {"tenant": run.namespace, "holder": run.holder, "live_old_writers": live}
    answer = writers_stop.run_controller(c, run.namespace, body=body,
                                         hide=run.engine.url.render_as_string(hide_password=False))
    after = actions.writer_evidence(run.engine, run.namespace, stale_heartbeat=run.stale)
    answer.live_before, answer.still_live = live, [p["process_id"] for p in after.live]
    run.seam("stop_old_writers.after_controller")
    run.say(writers_stop.answer_text(answer.as_json()))
    return _judged("stop_old_writers", {**answer.as_json(), "failure": answer.failure()})


def _require_the_fence(run: CutoverRun, what: str) -> None:
    """The controller runs only with the tenant's cutover fence in force (seed 000, step 3: "retaining the fence")."""

    with tx.reading(run.engine, "reading the cutover fence") as conn:
        fence = cutover_fence_in_force(conn, run.namespace)
    if fence is None:
        error = Refused(f"no cutover fence is in force for {run.namespace}: the old writers are stopped only with the "
                        f"fence held; nothing was run ({what})")
        error.report = {"controller": run.writers_stop.kind, "fence": None}
        raise error


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
    shown = shown_with_the_controller(ev.as_json(), run.earlier("stop_old_writers", "return_value"))
    if "writers_stop" in shown:
        run.say(writers_stop.answer_text(shown["writers_stop"]))
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


def writers_question(tenant: str, ev, try_number: int, stopped: dict[str, Any] | None, follow_up: str = "") -> str:
    """The question's body a person reads (Markdown), on every path that shows one: the evidence ``ev`` with its time
    and the asking try's number, the writer-stop controller's answer when one ran, what confirming means and what the
    answer re-checks."""
    taken = ev.checked_at.isoformat()
    return (
        f"## Tenant `{tenant}`: stop every old writer before the cutover checkpoint\n\n"
        + follow_up
        + f"Evidence taken at {taken}Z, try {try_number} of this step.\n\n"
        + ev.as_markdown()
        + (f"\n{writers_stop.answer_markdown(stopped)}" if stopped else "")
        + "\nThe database cannot prove that an old binary will never resume. Confirm only if every old "
        "ingress_writer, receipt_materializer, projection_worker and dependency_resolver of this tenant "
        "is stopped and will not be restarted. The admission fence stays armed either way.\n\n"
        f"When you answer, the registry is read again: an old writer that is live, or that started or "
        f"heartbeated after this evidence was taken ({taken}Z), fails the run.\n\n"
        "**Reject** (or no answer in time) ends the run failed: cutover not performed."
    )


def shown_with_the_controller(evidence: dict[str, Any], stopped: Any) -> dict[str, Any]:
    """The evidence a person is shown at the confirmation: the registry's, and the writer-stop controller's answer
    when one ran (``manual``: the registry's alone, as before)."""
    if isinstance(stopped, dict) and "ok" in stopped:
        return {**evidence, "writers_stop": stopped}
    return evidence


#: What the ledger keeps of a controller's answer (its output tail is bounded where it is taken).
ANSWER_KEPT = ("ran", "ok", "started_at", "finished_at", "seconds", "exit_code", "http_status", "timed_out", "error",
               "reported_stopped", "live_before", "still_live", "stopped", "output_tail")


def events(step: str, r: Any) -> list[Event]:
    """The writer-stop controller's answer, when one ran (nothing for ``manual``, a dry run or nothing to stop)."""
    if not isinstance(r, dict) or "ok" not in r or r.get("dry_run"):
        return []
    return [Event(E.WRITERS_STOPPED, step, outcome=f"stopped by {r.get('controller')}" if r["ok"] else "failed",
                  detail={k: r.get(k) for k in ANSWER_KEPT})]


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

"""The back-out's steps (:data:`~nexus_cutover.projection.transition.BACK_OUT`): look, a person's answer, the release
without a cutover; and what their results mean as events.

The DAG ``connector_projection_back_out`` and ``nexus-cutover back-out`` run these bodies; the safety condition (no
checkpoint, the fence shown, a holder that may be taken over) is :mod:`nexus_cutover.projection.back_out`'s, checked
under the lock where the release is written. The question asks nothing the release does not check again.
"""

from __future__ import annotations

from typing import Any

from ... import events as E
from ...errors import Refused
from ...events import Event
from ...holders import airflow_run_named
from ...transition import StepResult
from .. import back_out as domain
from ..transition import BACK_OUT
from .context import RETURN, CutoverRun

#: The question's subject, ``{tenant}`` filled in (Required actions lists questions by subject).
QUESTION = "Back out tenant {tenant}: release its cutover fence without a cutover"


def question_body(tenant: str, look_md: str, *, keep: str) -> str:
    """The question's body (Markdown): the look's table (the fence, its holder, the old writers), what backing out
    does, what the answer re-checks, and what ``keep`` (the other answer) or no answer means."""
    return (
        f"## Tenant `{tenant}`: back out of the cutover\n\n"
        + look_md
        + "\n**Back out** releases this fence without a cutover: admission opens again to the old runtime. "
        "Restart the old writers you stopped. No pack has its checkpoint; when you answer, the release checks that "
        "again under the tenant's lock, and that the fence and its holder are still the ones shown.\n\n"
        f"**{keep}** (or no answer in time) ends this run failed; the fence stays armed.")


def _look_step() -> str:
    return BACK_OUT.with_role("back_out_look").name


def _answer_step() -> str:
    return BACK_OUT.with_role("back_out_answer").name


def shown_of(look: dict[str, Any]) -> dict[str, Any]:
    """The evidence a person is shown with the question (what the ledger keeps, and digests): the old writers' table
    as the registry showed it, with the fence to release and what is known of its holder."""
    return {**(look.get("evidence") or {}), "fence": look.get("fence"), "holder_state": look.get("holder_state")}


def look_before_back_out(run: CutoverRun) -> StepResult:
    """What backing out would release, read now (no lock): the fence and its holder, the checkpoints (any one
    stops: too late to back out), the old writers. Writes nothing."""
    seen = domain.look(run.engine, run.namespace, holder=run.holder, holder_state=run.holder_state,
                       stale_heartbeat=run.stale)
    run.say(seen.as_text())
    value = seen.as_json()
    return StepResult(value, BACK_OUT[_look_step()].verdict(value),
                      keyed={"question_md": seen.as_markdown()} if seen.fence is not None else {}, domain=seen)


def confirm_back_out(run: CutoverRun) -> StepResult:
    """A person confirms the back-out of the fence the look showed (``run.confirm(look)`` returns who, or raises:
    never a default). Nothing to confirm when this holder already backed it out."""
    shown = run.earlier(_look_step(), RETURN) or {}
    if shown.get("already") or shown.get("fence_id") is None:
        run.say("nothing to confirm: " + ("this holder already backed the fence out" if shown.get("already")
                                          else "no cutover fence to back out"))
        return StepResult({"outcome": "nothing_to_confirm"})
    if run.confirm is None:
        raise RuntimeError("confirm_back_out needs its caller's way to ask a person (CutoverRun.confirm)")
    step, evidence = _answer_step(), shown_of(shown)
    run.recorder.asked(step, QUESTION.format(tenant=run.namespace), evidence)
    try:
        confirmed_by = run.confirm(shown)
    except Refused as exc:
        run.recorder.answered(step, "rejected", who=None, shown=evidence, reason=str(exc))
        raise
    run.recorder.answered(step, "confirmed", who=None, shown=evidence, how=confirmed_by)
    return StepResult({"confirmed_by": confirmed_by, "fence_id": shown["fence_id"]})


def back_out(run: CutoverRun) -> StepResult:
    """Release the fence the look showed (and the person confirmed), under the namespace lock, only while no pack
    is checkpointed; the fence's holder was named by the confirmation. A rerun is a no-op success."""
    shown = run.earlier(_look_step(), RETURN) or {}
    fence_id = shown.get("fence_id") or (shown.get("already") or {}).get("fence_id")
    if fence_id is None:
        raise Refused("no fence to back out was shown: run the look again (clear the run's first task)")
    result = domain.back_out(run.engine, run.namespace, int(fence_id), holder=run.holder,
                             holder_state=run.holder_state, adopt=run.adopt or _named_by_the_answer(shown),
                             take_over=run.take_over, timeout_s=run.lock_timeout_s)
    if result.outcome == domain.ALREADY_BACKED_OUT:
        run.say(f"fence {fence_id}: already backed out by you at {result.released_at}: nothing to do")
    else:
        run.say(f"fence {fence_id}: released without a cutover (admission paused {result.admission_pause_s:.1f} s, "
                f"armed {result.armed_at} by {result.previous_holder}); no checkpoint was written. Admission is open "
                "again: restart the old writers you stopped.")
    run.seam("back_out.after_write")
    return StepResult(result.as_json(), fields={"admission_pause_s": result.admission_pause_s})


def _named_by_the_answer(shown: dict[str, Any]) -> str | None:
    """The holder the confirmed question named, taken over by the answer: a command-line invocation or a fence armed
    by hand, whose state nobody can read. Never an Airflow run: whether it still holds the tenant is Airflow's to
    say (the DAG asks it; the command line cannot, and needs -adopt naming it)."""
    holder = (shown.get("fence") or {}).get("ArmedBy")
    return holder if holder and airflow_run_named(holder) is None else None


def events(step: str, r: Any) -> list[Event]:
    """The fence released without a cutover (or found backed out by this holder), and the pause it ended."""
    if not isinstance(r, dict) or r.get("outcome") not in (domain.BACKED_OUT, domain.ALREADY_BACKED_OUT):
        return []
    return [Event(E.BACKED_OUT, step, outcome=r["outcome"], holder=r.get("holder"),
                  detail={k: r.get(k) for k in ("fence_id", "previous_holder", "armed_at", "released_at",
                                                "admission_pause_s")})]

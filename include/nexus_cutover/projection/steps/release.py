"""``resume_admission``: the release of the fence this run holds, and what it means as events."""

from __future__ import annotations

from ... import events as E
from ...events import Event
from ...transition import Outcome, StepResult, Verdict
from .. import actions, cutover_fence
from .context import CutoverRun


def resume_admission(run: CutoverRun) -> StepResult:
    """The release of the fence this run holds, readiness re-checked in the releasing transaction: admission
    resumes through the new host. Already released by this holder: a no-op success."""
    armed = run.fence()
    fence_id = armed.fence_id if armed else None
    if run.dry_run:
        r = actions.readiness(run.engine, run.namespace, stale_heartbeat=run.stale)
        run.plan(f"_System_AdmissionFence: set ReleasedAt on fence {fence_id or '(armed by arm_fence)'} once ready "
                 f"(now: {'ready' if r.ready else '; '.join(r.reasons)})")
        return StepResult({"dry_run": True})
    if armed and armed.not_needed:  # the last cutover fence was released by the run that held it
        run.say("the tenant was already cut over and no cutover fence is in force: nothing to release "
                f"(last released cutover fence: {fence_id})")
        return StepResult({"namespace": run.namespace, "outcome": "already_released" if fence_id else "nothing_to_release",
                           "fence_id": fence_id})
    if fence_id is None:
        return StepResult({}, Verdict(Outcome.STOP, "arm_fence left no fence id: clear arm_fence (it reuses the fence)"))
    result = actions.release_fence(run.engine, run.namespace, int(fence_id), holder=run.holder,
                                   stale_heartbeat=run.stale, timeout_s=run.lock_timeout_s)
    run.say(f"fence {result.fence_id}: {result.outcome}; admission resumes through the new host" + pause_text(result))
    run.seam("resume_admission.after_write")
    return StepResult(result.as_json(), fields={"admission_pause_s": result.admission_pause_s})


def pause_text(result: cutover_fence.FenceResult) -> str:
    """The admission pause of a released fence, as its row records it ("" before the release)."""
    if result.admission_pause_s is None:
        return ""
    return f" (admission paused {result.admission_pause_s:.3f} s: armed {result.armed_at}, released {result.released_at})"


def events(step: str, r: dict) -> list[Event]:
    """The fence released (or found released by this holder): admission resumed, the pause it lasted."""
    if r.get("outcome") not in ("released", "already_released"):
        return []
    return [Event(E.FENCE_RELEASED, step, outcome=r["outcome"], holder=r.get("holder"),
                  detail={k: r.get(k) for k in ("fence_id", "armed_at", "released_at", "admission_pause_s")})]

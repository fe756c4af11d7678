"""``arm_fence``: the run's non-expiring ``*`` fence, and what arming it means as events."""

from __future__ import annotations

from typing import Any

from ... import events as E
from ...events import Event
from ...transition import StepResult
from .. import actions, cutover_fence
from .context import CutoverRun, _judged


def arm_fence(run: CutoverRun) -> StepResult:
    """The run's non-expiring ``*`` fence: armed, reused, adopted, or not needed (every pack already cut over).

    A dry run also looks at what no step can proceed past: old-protocol work above a pack's cutoff (a
    separately reviewed recovery decision, never "cut over"), in its value for the declared verdict."""
    try:
        result = actions.arm_fence(run.engine, run.namespace, holder=run.holder, packs=run.packs(),
                                   timeout_s=run.lock_timeout_s, holder_state=run.holder_state, adopt=run.adopt,
                                   take_over=run.take_over, dry_run=run.dry_run)
    except (cutover_fence.ActiveOverrides, cutover_fence.FenceHeld, cutover_fence.SeveralCutoverFences,
            cutover_fence.OldWorkAboveCutoff) as exc:
        value = {"refused": str(exc), "refusal": type(exc).__name__}
        if run.dry_run:
            run.say(f"fence: {exc}")
            value["old_work_above_cutoff"] = _above_cutoff(run)
        return _judged("arm_fence", value, report=exc.report, fields=_above_field(value))
    value = result.as_json()
    if run.dry_run:
        what = {"would_arm": "arm a new non-expiring '*' fence",
                "would_adopt": f"adopt fence {result.fence_id} left by {result.previous_holder}"}.get(
            result.outcome, f"reuse fence {result.fence_id}")
        run.plan(f"_System_AdmissionFence: {what} on namespace {run.namespace!r}")
        run.say(f"fence: {result.outcome}")
        value["old_work_above_cutoff"] = _above_cutoff(run)
        return _judged("arm_fence", value, fields=_above_field(value))
    if result.not_needed:
        run.say(f"every pack of {run.namespace} is {already_cut_over(value)}: not fencing again")
        return _judged("arm_fence", value)
    run.say(f"fence {result.fence_id}: {result.outcome} on namespace {run.namespace}"
            + (f" (taken over from {result.previous_holder})" if result.previous_holder else ""))
    if result.other_fences_in_force:
        run.say(f"other fences in force (left as they are): {result.other_fences_in_force}")
    run.seam("arm_fence.after_write")
    return _judged("arm_fence", value)


def already_cut_over(fence: dict[str, Any]) -> str:
    """What a run says of a tenant cut over before it (its fence step found nothing to fence, ``not_needed``): when
    the last cutover fence was released and by which run (its holder), or that no release was found."""
    if not fence.get("released_at"):
        return "already cut over (every pack checkpointed, no cutover fence in force; no released cutover fence found)"
    at = str(fence["released_at"]).replace("T", " ")[:19]
    return (f"already cut over at {at} UTC by {fence.get('previous_holder') or 'an unrecorded holder'} "
            f"(cutover fence {fence.get('fence_id')} released; every pack checkpointed)")


def _above_field(value: dict[str, Any]) -> dict[str, Any]:
    return {"old_work_above_cutoff": value["old_work_above_cutoff"]} if "old_work_above_cutoff" in value else {}


def _above_cutoff(run: CutoverRun) -> list[dict[str, Any]]:
    above = actions.cutover_standing(run.engine, run.namespace)["old_work_above_cutoff"]
    for entry in above:
        run.say(f"STOP: {entry['text']}")
    return above


def events(step: str, r: dict) -> list[Event]:
    """A fence the run now holds: armed, reused or adopted, with its holder (a dry run's and a refusal's: none)."""
    kind = {"armed": E.FENCE_ARMED, "reused": E.FENCE_REUSED, "adopted": E.FENCE_ADOPTED}.get(r.get("outcome"))
    if kind is None:
        return []
    return [Event(kind, step, outcome=r["outcome"], holder=r.get("holder"),
                  detail={"fence_id": r.get("fence_id"), "previous_holder": r.get("previous_holder"),
                          "armed_at": r.get("armed_at")})]

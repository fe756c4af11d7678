"""The refusals of the cutover fence (:mod:`.cutover_fence`), and the words they speak of a fence's holder.

Split out of :mod:`.cutover_fence`, which re-exports every name here (importers may keep
``from .cutover_fence import ...``). Nothing here reads or writes the database: each class is the message, the
``report`` and the ``Next:`` of one refusal, raised by :mod:`.cutover_fence` or :mod:`.cutover_fence_holders`.

Invariants:

* Every refusal is a :class:`~nexus_cutover.errors.Refused` whose caller wrote nothing (or rolled back what it
  wrote): each message says so, names the fence(s), the holder(s) and the rows in the way, and ends with what to
  do next. None of them releases, revokes or adopts anything on a guess.
* What is known of a holder is one of :data:`HOLDER_ACTIVE`, :data:`HOLDER_FINISHED`, :data:`HOLDER_UNKNOWN`
  (:data:`HolderState`); :func:`unknown_holders` is the caller that can tell nothing (the CLI). How a refused
  caller takes a fence over is :data:`TAKE_OVER` unless the caller says it its own way.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from ..clock import utc_text
from ..errors import Refused
from ..holders import airflow_run_link, airflow_run_named

#: What is known of the holder named in a fence's ``ArmedBy`` (:data:`HolderState`).
HOLDER_ACTIVE = "active"  # at work (an Airflow run queued, running, deferred or waiting for a person), or unreadable
HOLDER_FINISHED = "finished"  # provably finished: an Airflow run in a final state
HOLDER_UNKNOWN = "unknown"  # nothing here can tell: a CLI invocation, a fence armed by hand
#: ``holder -> HOLDER_ACTIVE | HOLDER_FINISHED | HOLDER_UNKNOWN``.
HolderState = Callable[[str], str]

#: How to take over a fence, by default (the DAG and the CLI say it their way): ``{holder}`` is filled in.
TAKE_OVER = ("if {holder} is finished (a run that failed or was rejected, a command that ended), take its fence "
             "over by naming it: nexus-cutover run (or arm-fence) -adopt '{holder}', or adopt = {holder} in the "
             "cutover DAG's form")


def unknown_holders(_holder: str) -> str:
    """A caller that can tell nothing of other holders (the CLI): every one :data:`HOLDER_UNKNOWN`."""
    return HOLDER_UNKNOWN


class FenceHeld(Refused):
    """Another holder holds the namespace's cutover fence and may not be adopted: this caller writes nothing."""

    def __init__(self, namespace: str, fence: dict[str, Any], caller: str, *, state: str = HOLDER_ACTIVE,
                 take_over: str = TAKE_OVER, releasing: bool = False):
        self.fence = fence
        self.holder = fence["ArmedBy"]
        self.report = {"held_by": self.holder, "fence": fence}
        self.state = state
        run = airflow_run_named(self.holder)
        if releasing:
            why = "not by this caller: a run releases only the fence it armed or adopted"
            next_step = (f"Next: release it as its holder (-holder '{self.holder}'); or, "
                         + take_over.format(holder=self.holder))
        elif run is not None and state == HOLDER_UNKNOWN:  # an Airflow run this caller cannot ask about (the CLI)
            dag_id, run_id = run
            named = f"run {run_id} of DAG {dag_id}" if run_id else f"a run of DAG {dag_id} (its id too long to show)"
            link = airflow_run_link(dag_id, run_id)
            why = (f"an Airflow run ({named}{', ' + link if link else ''}) whose state this command cannot read: it "
                   "holds the tenant while it is queued, running, deferred or waiting for a person")
            next_step = ("Next: let that run finish (or fail) in Airflow; then, if it left the fence armed, trigger the "
                         "cutover again in Airflow (a finished run's fence is adopted by itself), or "
                         + take_over.format(holder=self.holder))
        elif state == HOLDER_ACTIVE:
            why = "which has not finished"
            next_step = "Next: let it finish (or fail), then run again: a finished run's fence is adopted"
        else:
            why = ("whose state cannot be read here: a fence armed by hand or by a command-line invocation is not "
                   "adopted silently")
            next_step = "Next: " + take_over.format(holder=self.holder)
        super().__init__(
            f"namespace {namespace!r} is held by {self.holder!r} (cutover fence {fence['FenceId']} armed "
            f"{utc_text(fence['ArmedAt'])}), {why}: one cutover per tenant at a time. Nothing was written by {caller!r}. "
            f"{next_step}."
        )


class SeveralCutoverFences(Refused):
    """More than one cutover fence is in force in the namespace: which one holds it is not clear; nothing written."""

    def __init__(self, namespace: str, fences: list[dict[str, Any]]):
        self.fences = fences
        self.report = {"cutover_fences": fences}
        listed = "; ".join(f"FenceId={f['FenceId']} ArmedBy={f['ArmedBy']!r} ArmedAt={utc_text(f['ArmedAt'])}" for f in fences)
        super().__init__(
            f"namespace {namespace!r} has {len(fences)} cutover fences in force (non-expiring '*'): {listed}. One "
            "cutover per tenant: which of them holds the tenant is not clear, so nothing was written. Next: find out "
            "who armed each; have the tenant's delivery owner release all but the one of the cutover in progress (this tool releases none "
            "of them on a guess), then run again."
        )


class ReleasedByAnother(Refused):
    """The fence was already released, by another holder: not a success for this caller."""

    def __init__(self, namespace: str, fence: dict[str, Any], caller: str):
        self.fence = fence
        super().__init__(
            f"cutover fence {fence['FenceId']} of namespace {namespace!r} was already released by "
            f"{fence['ReleasedBy'] or '(nobody recorded)'!r} at {utc_text(fence['ReleasedAt'])}, not by {caller!r}: admission "
            "resumed without this run. "
            "Next: find out who released it and why, and check the tenant (nexus-cutover status / verify) before "
            "treating the cutover as done."
        )


class FenceChanged(Refused):
    """The fence row changed under the lock between this transaction's check and its write, or between the look at
    its holder and the locked transaction: nothing written."""

    def __init__(self, namespace: str, fence_id: int | None, what: str, *, why: str | None = None):
        which = f"cutover fence {fence_id}" if fence_id is not None else "the cutover fence"
        why = why or "another session wrote it without the namespace lock"
        super().__init__(
            f"{which} of namespace {namespace!r} changed while it was being {what} ({why}): nothing was written. "
            "Next: look at the fence (nexus-cutover status), then run again."
        )


class ActiveOverrides(Refused):
    """Arming refused: overrides would let sources through the fence."""

    def __init__(self, namespace: str, overrides: list[dict[str, Any]]):
        self.overrides = overrides
        self.report = {"active_overrides": overrides}
        listed = "; ".join(
            f"OverrideId={o['OverrideId']} FenceId={o['FenceId']} Scope={o['Scope']!r} CreatedBy={o['CreatedBy']!r}"
            for o in overrides
        )
        super().__init__(
            f"namespace {namespace!r} has {len(overrides)} active admission fence override(s): {listed}. "
            "The cutover needs a namespace-wide fence with no active overrides; it revokes nothing. "
            "Have the tenant's delivery owner revoke or let them expire, then rerun arm_fence."
        )


class OldWorkAboveCutoff(Refused):
    """Arming refused: every pack is checkpointed and no cutover fence is in force, but a pack holds old-protocol
    work above its cutoff, so the tenant is not cut over (:mod:`nexus_cutover.standing`) and fencing it again
    changes nothing."""

    def __init__(self, namespace: str, above: list[Any]):
        self.above = [a.as_json() for a in above]
        self.report = {"old_work_above_cutoff": self.above}
        super().__init__(
            f"namespace {namespace!r} is not cut over: " + "; ".join(a.describe() for a in above)
            + ". Nothing was armed; a rerun changes nothing until that decision is made."
        )

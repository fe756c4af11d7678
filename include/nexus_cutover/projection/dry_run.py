"""The dry run of every declared step of the cutover, and its verdict: what ``nexus-cutover plan`` prints.

One function, :func:`plan`, read by ``nexus-cutover plan`` (which prints its lines)
and by the fleet preflight (:mod:`.preflight`, many tenants at once), so both
judge a tenant the same way: a loop over :data:`CUTOVER` that runs each planned
step's body (:mod:`.steps`, the bodies the DAG and ``run`` run) dry, each result
judged by the step's declared verdict, the run's verdict by
:meth:`~nexus_cutover.transition.Transition.overall`.

Invariants:

* Read only: every body runs dry (nothing armed, created or written).
* It looks at the declared steps that are :attr:`~nexus_cutover.transition.Step.planned`
  and no other: the others ask a person or act on what earlier steps did.
* A refusal of a step that the real run would also stop at (a held fence, old work
  above a cutoff) is a ``stop`` verdict; a refusal that stops the dry run itself
  (no active pack, an unreachable database) propagates as the domain error.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from ..clock import utcnow
from ..liveness import DEFAULT_STALE_HEARTBEAT_S
from ..transition import Transition, Verdict
from . import cutover_fence, steps
from .transition import CUTOVER, DEFAULT_ARM_WHEN_DRAIN_BELOW_S


@dataclass(frozen=True)
class PlanOptions:
    """What a dry run needs besides the database: the tenant, its packs, who would hold the fence, the bounds."""

    namespace: str
    holder: str
    packs: tuple[str, ...] = ()
    adopt: str | None = None
    timeout_s: float = 300.0
    drain_timeout_s: float = 3600.0
    #: The run's ``arm_when_drain_below`` (0: it arms at once), the form's and the command line's default.
    arm_when_drain_below_s: float = DEFAULT_ARM_WHEN_DRAIN_BELOW_S
    stale_heartbeat_s: float = DEFAULT_STALE_HEARTBEAT_S
    #: How the fence's dry run judges another holder (the command line: never adopted unless named).
    holder_state: cutover_fence.HolderState = cutover_fence.unknown_holders
    #: The "Next:" of a held fence (how this caller takes a fence over).
    take_over: str = cutover_fence.TAKE_OVER


def plan(engine: Engine, options: PlanOptions, say: Callable[[str], None] = lambda _line: None, *,
         transition: Transition = CUTOVER) -> dict[str, Any]:
    """Every planned step's body, dry, in the declared order (a per-pack step once per pack): the results
    (``-json``'s fields, each under its step's :attr:`~nexus_cutover.transition.Step.key`) and ``verdict``
    (``proceed``, ``wait: ...``, ``stop: ...`` or ``done: ...``); ``say`` gets each line a step says, after its
    stage's number."""
    o = options
    results = steps.Results(transition)
    run = steps.CutoverRun(engine, o.namespace, o.holder, dry_run=True, requested_packs=o.packs, adopt=o.adopt,
                           lock_timeout_s=o.timeout_s, drain_timeout_s=o.drain_timeout_s,
                           arm_when_drain_below_s=o.arm_when_drain_below_s,
                           stale_heartbeat_s=o.stale_heartbeat_s, holder_state=o.holder_state, take_over=o.take_over,
                           deadline=utcnow() + dt.timedelta(seconds=o.drain_timeout_s), earlier=results.earlier,
                           transition=transition)
    out: dict[str, Any] = {"namespace": o.namespace, "steps": []}
    verdicts: list[tuple[str, Verdict]] = []
    for step in transition:
        out["steps"].append(step.name)
        if not step.planned:
            continue
        number = transition.stage_of(step.name).number
        run.say = lambda line, n=number: say(f"{n}. {line}")
        for pack in run.packs() if step.per_pack_of else [None]:
            run.pack = pack
            result = steps.run_step(step.name, run)
            results.record(step.name, result)
            verdicts.append((step.name, result.verdict))
            out.update(result.fields)
        out[step.out_key] = results.earlier(step.name)
    out["verdict"] = transition.overall(verdicts)
    return out

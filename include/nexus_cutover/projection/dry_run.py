"""The dry run of every declared step of the cutover, and its verdict: what ``nexus-cutover plan`` prints.

One function, :func:`plan`, read by ``nexus-cutover plan`` (which prints its lines)
and by the fleet preflight (:mod:`.preflight`, many tenants at once), so both
judge a tenant the same way: each step's dry run in :data:`CUTOVER`'s order, each
result judged by the step's declared verdict, the run's verdict by
:meth:`~nexus_cutover.transition.Transition.overall`.

Invariants:

* Read only: every step is asked for its dry run (nothing armed, created or written).
* :data:`PLAN` has one look per declared step and no other (tests/test_transition.py).
* A refusal of a step that the real run would also raise (a held fence, old work
  above a cutoff) is a ``stop`` verdict; a refusal that stops the dry run itself
  (no active pack, an unreachable database) propagates as the domain error.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from ..clock import utcnow
from ..errors import Refused
from ..liveness import DEFAULT_STALE_HEARTBEAT_S
from ..transition import Outcome, Verdict
from . import fence as fences
from . import steps
from .transition import CUTOVER


@dataclass(frozen=True)
class PlanOptions:
    """What a dry run needs besides the database: the tenant, its packs, who would hold the fence, the bounds."""

    namespace: str
    holder: str
    packs: tuple[str, ...] = ()
    adopt: str | None = None
    timeout_s: float = 300.0
    drain_timeout_s: float = 3600.0
    stale_heartbeat_s: float = DEFAULT_STALE_HEARTBEAT_S
    #: How the fence's dry run judges another holder (the command line: never adopted unless named).
    holder_state: fences.HolderState = fences.unknown_holders
    #: The "Next:" of a held fence (how this caller takes a fence over).
    take_over: str = fences.TAKE_OVER


@dataclass
class _Planner:
    engine: Engine
    options: PlanOptions
    say: Callable[[str], None]
    out: dict[str, Any] = field(default_factory=dict)

    @property
    def stale(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.options.stale_heartbeat_s)


def plan(engine: Engine, options: PlanOptions, say: Callable[[str], None] = lambda _line: None) -> dict[str, Any]:
    """Every declared step's dry run, in the declared order: the results (``-json``'s fields) and ``verdict``
    (``proceed``, ``wait: ...`` or ``stop: ...``); ``say`` gets one line per step as ``plan`` prints it."""
    p = _Planner(engine, options, say, {"namespace": options.namespace, "steps": []})
    verdicts: list[tuple[str, Verdict]] = []
    for step in CUTOVER:
        p.out["steps"].append(step.name)
        verdicts += [(step.name, v) for v in PLAN[step.name](p, CUTOVER.stage_of(step.name).number)]
    p.out["verdict"] = CUTOVER.overall(verdicts)
    return p.out


def _plan_packs(p: _Planner, n: int) -> list[Verdict]:
    p.out["packs"] = steps.resolve_packs(p.engine, p.options.namespace, p.options.packs)
    p.say(f"{n}. packs: {', '.join(p.out['packs'])}")
    return []


def _plan_schema(p: _Planner, n: int) -> list[Verdict]:
    result = steps.apply_schema(p.engine, dry_run=True)
    p.out["schema"] = result.as_json()
    p.say(f"{n}. schema: " + (f"would create {', '.join(result.missing)} (the DDL: -json, schema.plan)"
                              if result.missing else "complete"))
    return []


def _plan_fence(p: _Planner, n: int) -> list[Verdict]:
    """The fence's dry run; and what no step can proceed past: old-protocol work above a pack's cutoff."""
    o = p.options
    above_refused = False
    try:
        fence = steps.arm_fence(p.engine, o.namespace, holder=o.holder, packs=p.out["packs"], timeout_s=o.timeout_s,
                                holder_state=o.holder_state, adopt=o.adopt, take_over=o.take_over,
                                dry_run=True).as_json()
        found = [CUTOVER["arm_fence"].verdict(fence)]
    except Refused as exc:
        fence, found = {"refused": str(exc)}, [Verdict(Outcome.STOP, str(exc))]
        above_refused = isinstance(exc, fences.OldWorkAboveCutoff)
    p.out["fence"] = fence
    p.say(f"{n}. fence: {fence.get('outcome', fence.get('refused'))}")
    p.out["old_work_above_cutoff"] = steps.cutover_standing(p.engine, o.namespace)["old_work_above_cutoff"]
    for above in p.out["old_work_above_cutoff"]:  # a reviewed recovery decision, never "cut over"
        p.say(f"{n}. STOP: {above['text']}")
        if not above_refused:  # the fence's refusal already named it
            found.append(Verdict(Outcome.STOP, above["text"]))
    return found


def _plan_drain(p: _Planner, n: int) -> list[Verdict]:
    deadline = utcnow() + dt.timedelta(seconds=p.options.drain_timeout_s)
    report = steps.drain(p.engine, p.options.namespace, deadline=deadline, stale_heartbeat=p.stale)
    p.out["drain"] = report.as_json()
    p.say(f"{n}. drain: {report.state}: {report.counts_text()}")
    return [CUTOVER["wait_for_drain"].verdict(p.out["drain"])]


def _plan_writers(p: _Planner, n: int) -> list[Verdict]:
    ev = steps.writer_evidence(p.engine, p.options.namespace, stale_heartbeat=p.stale)
    p.out["writers"] = ev.as_json()
    live = p.out["writers"]["live"]
    p.say(f"{n}. writers: {len(live)} live old writer(s)" + (f": {', '.join(live)}" if live else ""))
    return [CUTOVER["check_old_writers"].verdict(p.out["writers"])]


def _plan_checkpoints(p: _Planner, n: int) -> list[Verdict]:
    from ..schema import missing_projection_schema

    p.out["checkpoints"], found = [], []
    missing = missing_projection_schema(p.engine)
    planned = p.out.get("fence", {}).get("outcome") in ("would_arm", "would_adopt")
    for pack in p.out["packs"]:
        if missing:
            p.out["checkpoints"].append({"pack_install_id": pack, "outcome": "not_audited", "missing_schema": missing})
            p.say(f"{n}. checkpoint {pack}: audited once apply-schema created {', '.join(missing)}")
            continue
        result = steps.checkpoint(p.engine, pack, timeout_s=p.options.timeout_s, written_by=p.options.holder,
                                  dry_run=True, fence_planned=planned)
        p.out["checkpoints"].append(result.as_json())
        p.say(f"{n}. checkpoint {result.summary()}")
        found.append(CUTOVER["audit_and_checkpoint"].verdict(p.out["checkpoints"][-1]))
    return found


def _plan_readiness(p: _Planner, n: int) -> list[Verdict]:
    r = steps.readiness(p.engine, p.options.namespace, stale_heartbeat=p.stale)
    p.out["readiness"] = r.as_json()
    p.say(f"{n}. new host: " + ("ready" if r.ready else "; ".join(r.reasons)))
    return [CUTOVER["verify_readiness"].verdict(p.out["readiness"])]


def _plan_nothing(p: _Planner, n: int) -> list[Verdict]:
    """A step whose dry run plan does not look at: it asks a person, or acts on what the earlier steps did."""
    return []


#: Per declared step, what :func:`plan` looks at (its dry run), in the declaration's order: (planner, stage) ->
#: the step's verdicts.
PLAN: dict[str, Callable[[_Planner, int], list[Verdict]]] = {
    "resolve_packs": _plan_packs,
    "apply_schema": _plan_schema,
    "arm_fence": _plan_fence,
    "wait_for_drain": _plan_drain,
    "check_old_writers": _plan_writers,
    "confirm_writers_stopped": _plan_nothing,
    "history_digest": _plan_nothing,
    "audit_and_checkpoint": _plan_checkpoints,
    "start_new_host": _plan_nothing,
    "verify_readiness": _plan_readiness,
    "resume_admission": _plan_nothing,
    "final_old_writer_check": _plan_nothing,
}

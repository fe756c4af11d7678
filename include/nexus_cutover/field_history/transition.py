"""Field History eligibility (seed 003): the three stage gates, declared once.

:data:`FIELD_HISTORY` is the ordered list of steps: the DAG
``field_history_eligibility`` builds its tasks and their order from it, and
``field-history-eligibility stage1|stage2|stage3`` runs the steps of its stage
in the same order (tests/test_transition.py fails when one disagrees), each
running the step's body in :mod:`.steps` (over the gates of :mod:`.gates`). A stage's steps run only when the run's
target stage reaches it (the declared :class:`~nexus_cutover.transition.Stage` number).

Light to import: the DAG file reads this at parse time.
"""

from __future__ import annotations

from typing import Any

from ..transition import PROCEED, Kind, Outcome, Stage, Step, Transition, Verdict

STEPS = "nexus_cutover.field_history.steps"
NO_DRY_RUN = "none: the gate checks before it acts, and acts only when every check holds"


def gate_verdict(report: dict[str, Any]) -> Verdict:
    """A gate that passed proceeds; one that did not stops with its summary (nothing was switched)."""
    return PROCEED if report.get("passed") else Verdict(Outcome.STOP, report.get("summary") or "the gate did not pass")


def outbox_verdict(state: dict[str, Any]) -> Verdict:
    """Drained: proceed. Failed rows, or open rows without a live worker: stop. Else wait for the worker."""
    if state.get("drained"):
        return PROCEED
    if state.get("stuck"):
        return Verdict(Outcome.STOP, "; ".join(state["stuck"]))
    return Verdict(Outcome.WAIT, f"{state['remaining']} pre-cutover outbox row(s) still being delivered: rerun once "
                                 "the outbox worker drained them")


FIELD_HISTORY = Transition("field_history_eligibility", (
    Stage(1, "The column, and the stage-1 release everywhere", steps=(
        Step("stage_1", Kind.WRITES, f"{STEPS}:stage_1", records=f"{STEPS}:events", verdict=gate_verdict,
             dry_run=NO_DRY_RUN, next_action="upgrade the lagging processes (or mark gone ones stopped), then clear"),
    )),
    Stage(2, "Producers stamp, pre-cutover outbox work delivered, legacy rows decided", steps=(
        Step("stage_2_producers", Kind.READS, f"{STEPS}:stage_2_producers", records=f"{STEPS}:events", verdict=gate_verdict,
             dry_run=NO_DRY_RUN, next_action="fix the producer, then clear"),
        Step("stage_2_drain_outbox", Kind.WAITS, f"{STEPS}:stage_2_drain_outbox", verdict=outbox_verdict,
             dry_run=NO_DRY_RUN, next_action="resolve it with the outbox worker, then clear stage_2_drain_outbox",
             role="outbox"),
        Step("stage_2_materialize", Kind.WRITES, f"{STEPS}:stage_2_materialize", records=f"{STEPS}:events", verdict=gate_verdict,
             heavy_read=True, role="decisions",
             dry_run=NO_DRY_RUN, next_action="a broken read equivalence names its rows; a timeout keeps committed batches: "
             "clear to finish"),
    )),
    Stage(3, "The read switch", steps=(
        Step("stage_3", Kind.WRITES, f"{STEPS}:stage_3", records=f"{STEPS}:events", verdict=gate_verdict,
             role="read_switch",
             dry_run="`field-history-eligibility stage3 -check`: what stage 3 would find, switching nothing",
             next_action="upgrade the producers or let the outbox drain (a failed outbox row: redeliver or retire it); "
             "a flip names its rows; clear"),
    )),
))


def steps_of_stage(number: int) -> tuple[Step, ...]:
    """The declared steps of stage ``number``, in order."""
    return next(stage.steps for stage in FIELD_HISTORY.stages if stage.number == number)


def stage_number(step: str) -> int:
    """The stage a step belongs to: the run's ``target_stage`` must reach it for the step to run."""
    return FIELD_HISTORY.stage_of(step).number

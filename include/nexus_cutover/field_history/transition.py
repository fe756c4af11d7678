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

from ..transition import PROCEED, Kind, Outcome, Stage, Step, Transition, Verdict, Wait

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
             task_doc=("Adds the nullable `_System_AuditFieldChange.FieldHistoryEligible` if absent (idempotent) and checks "
             "that every deployed `runtime_api` and `audit_outbox_worker` runs at least `stage1_release`. "
             "**Stops** listing the lagging processes: upgrade them (or mark gone ones stopped), then clear."),
             dry_run=NO_DRY_RUN, next_action="upgrade the lagging processes (or mark gone ones stopped), then clear"),
    )),
    Stage(2, "Producers stamp, pre-cutover outbox work delivered, legacy rows decided", steps=(
        Step("stage_2_producers", Kind.READS, f"{STEPS}:stage_2_producers", records=f"{STEPS}:events", verdict=gate_verdict,
             task_doc=("Every deployed `runtime_api` and `service_manager` runs at least `producer_release`, and no row with "
             "a stable FieldId written by such a producer is NULL. **Stops** listing lagging processes or example "
             "unstamped rows (a producer is not stamping): fix the producer, then clear. Writes nothing."),
             dry_run=NO_DRY_RUN, next_action="fix the producer, then clear"),
        Step("stage_2_drain_outbox", Kind.WAITS, f"{STEPS}:stage_2_drain_outbox", verdict=outbox_verdict,
             task_doc=("Deferrable: waits until no outbox row older than `producer_release` is pending or processing, "
             "logging the remaining count each poll. **Stops and reports** failed pre-cutover rows, open rows "
             "without a live `audit_outbox_worker`, or `drain_timeout`. It never changes an outbox row."),
             dry_run=NO_DRY_RUN, next_action="resolve it with the outbox worker, then clear stage_2_drain_outbox",
             role="outbox",
             wait=Wait("outbox", watch=f"{STEPS}:OutboxWatch",
                       ran_out="the pre-cutover outbox work did not drain within drain_timeout: stopped and reported "
                       "(no outbox row was changed)",
                       plan="wait for the pre-cutover outbox work to drain")),
        Step("stage_2_materialize", Kind.WRITES, f"{STEPS}:stage_2_materialize", records=f"{STEPS}:events", verdict=gate_verdict,
             task_doc=("Sets NULL rows with a FieldId and a HistorySequence to TRUE where an interval proves eligibility and "
             "FALSE where none does, in keyset batches of `batch_size`, each its own transaction, never "
             "overwriting a stamped value. Resumable: a failure or timeout keeps committed batches; clear to "
             "finish."),
             heavy_read=True, role="decisions",
             dry_run=NO_DRY_RUN, next_action="a broken read equivalence names its rows; a timeout keeps committed batches: "
             "clear to finish"),
    )),
    Stage(3, "The read switch", steps=(
        Step("stage_3", Kind.WRITES, f"{STEPS}:stage_3", records=f"{STEPS}:events", verdict=gate_verdict,
             task_doc=("**Refuses with the counts** unless every deployed producer runs `producer_release` and no pre- "
             "cutover outbox work is left. Then turns `FieldHistorySequenceReservationEnabled` off (and leaves it "
             "off), waits for in-flight mutations and their outbox rows to settle (within `switch_timeout`), and "
             "in one locked transaction compares the readers over the whole table: only when no eligible NULL row "
             "exists does it set `FieldHistoryReadMode = boolean_only`. Reports what machinery is now removable."),
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

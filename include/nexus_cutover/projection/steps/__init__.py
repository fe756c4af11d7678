"""The cutover's declared steps, one module each (a body, and what its result means as events): the one door the DAG,
``nexus-cutover run`` and ``plan`` go through.

:data:`~nexus_cutover.projection.transition.CUTOVER` declares the steps and
their order; each step's ``calls`` names its body here, a function
``(CutoverRun) -> StepResult``: what the step reads or writes (through
:mod:`.actions`), what it says (``run.say``), the ``PLAN:`` of the writes it
would make when the run is dry, and the declared verdict on its result. The
three callers are loops over the declaration that run these bodies and differ
only in what is theirs:

* the DAG (``nexus_airflow.operators``): one task per step; a
  :class:`CutoverRun` over the task's params, reading earlier steps' results
  from XCom; a stop fails the task with its report; plus Airflow's own parts
  (the form check, a cancelled rollout, the human-in-the-loop questions,
  deferral, the Asset event);
* ``nexus-cutover run`` (:mod:`nexus_cutover.cli.cutover_steps`): every step in one
  process, waiting steps looked at again until they pass, the confirmation a
  prompt or a flag;
* ``nexus-cutover plan`` (:mod:`.dry_run`): every :attr:`~nexus_cutover.transition.Step.planned`
  step once, dry, every verdict combined.

The dry run is a property of the run (:attr:`CutoverRun.dry_run`): a body
asks the domain for its dry run and records the ``PLAN:`` of the writes
(:meth:`CutoverRun.plan`); no caller branches on it for a step.

Invariants:

* A body's refusal the real run would stop at is its ``stop`` verdict with the
  refusal's report (a held tenant, active overrides, old work above a cutoff,
  a refused audit): every caller stops, or, in ``plan``, reports it, the same
  way. Bad input and errors that are not this step's finding are raised.
* Nothing here UPDATEs or DELETEs an Event or WorkItem or changes a WorkItem's
  status; there is no body that skips a refusal.
"""

from __future__ import annotations

from ...errors import Refused
from ...transition import StepResult, Verdict
from .. import actions, writers_stop
from ..actions import (  # the single-step functions, for the single-step commands and the pollers
    NotReady,
    SchemaResult,
    WriterRecheck,
    checkpoint,
    cutover_standing,
    drain,
    held_by_another,
    readiness,
    recheck_writers,
    release_fence,
    verify_history,
    verify_no_old_writer,
    writer_evidence,
)
from ..checkpoint import REFUSED, pack_namespace, run_checkpoint
from ..cutover_fence import (
    HOLDER_ACTIVE,
    HOLDER_FINISHED,
    HOLDER_UNKNOWN,
    FenceHeld,
    FenceResult,
    SeveralCutoverFences,
    cutover_fence_in_force,
    fence_row,
    last_released_cutover_fence,
)
from ..digest.definition import DEFAULT_CHUNK_ROWS
from ..digest.model import HistoryDigest, load_digest
from ..drain import blockers_text
from ..greenfield import activate_pack
from ..transition import CUTOVER
from .back_out import QUESTION as BACK_OUT_QUESTION
from .back_out import question_body as back_out_question
from .back_out import shown_of as shown_before_back_out
from .checkpoints import audit_and_checkpoint
from .context import RETURN, CutoverRun, Results, fence_and_checkpoints, run_step
from .draining import wait_for_drain
from .fence import already_cut_over, arm_fence
from .final_check import complete_text, dry_run_verdict, final_old_writer_check, history_unchanged, old_writers_since_release
from .history import history_digest
from .new_host import host_question, start_new_host, verify_readiness
from .pre_arm import RATE_SAMPLES, wait_for_short_drain
from .release import pause_text, resume_admission
from .schema_and_packs import apply_schema, resolve_packs
from .writers import (
    LiveAgain,
    accept_confirmation,
    check_old_writers,
    confirm_writers_stopped,
    evidence_to_confirm,
    shown_with_the_controller,
    stop_old_writers,
    writers_question,
)

__all__ = [  # the door: the declaration, the bodies, what they return and raise, and the reads callers show
    "CUTOVER", "CutoverRun", "DEFAULT_CHUNK_ROWS", "FenceHeld", "FenceResult", "HOLDER_ACTIVE", "HOLDER_FINISHED",
    "HOLDER_UNKNOWN", "HistoryDigest", "NotReady", "REFUSED", "Refused", "Results", "SchemaResult",
    "SeveralCutoverFences", "StepResult", "Verdict", "WriterRecheck", "accept_confirmation", "actions",
    "activate_pack", "blockers_text", "checkpoint", "cutover_fence_in_force", "cutover_standing", "drain",
    "fence_and_checkpoints", "fence_row", "held_by_another", "history_unchanged", "last_released_cutover_fence",
    "load_digest", "old_writers_since_release", "pause_text", "readiness", "recheck_writers", "release_fence",
    "already_cut_over", "run_checkpoint", "run_step", "pack_namespace", "RETURN", "RATE_SAMPLES", "LiveAgain",
    "evidence_to_confirm", "dry_run_verdict", "complete_text", "writers_stop", "shown_with_the_controller",
    "BACK_OUT_QUESTION", "shown_before_back_out", "writers_question", "host_question", "back_out_question",
    # the bodies the declaration calls (CUTOVER's Step.calls)
    "resolve_packs", "apply_schema", "wait_for_short_drain", "arm_fence", "wait_for_drain", "stop_old_writers",
    "check_old_writers",
    "confirm_writers_stopped", "history_digest", "audit_and_checkpoint", "start_new_host", "verify_readiness",
    "resume_admission", "final_old_writer_check", "verify_history", "verify_no_old_writer", "writer_evidence",
]


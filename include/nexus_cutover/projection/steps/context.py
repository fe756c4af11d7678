"""What a run of the cutover's steps knows and how one step is run: :class:`CutoverRun`, :class:`Results`,
:func:`run_step`.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from ... import tx
from ...errors import Refused
from ...liveness import DEFAULT_STALE_HEARTBEAT_S
from ...protocol_row import read_protocol_row
from ...recording import NOT_RECORDING, Recorder
from ...schema import missing_projection_schema
from ...transition import Outcome, StepResult, Transition, Verdict
from .. import cutover_fence
from ..cutover_fence import (
    cutover_fence_in_force,
)
from ..digest.definition import DEFAULT_CHUNK_ROWS
from ..digest_limits import DEFAULT_DIGEST_CONNECTIONS
from ..transition import CUTOVER

RETURN = "return_value"


def _quiet(_line: str) -> None:
    return None


def _no_seam(_point: str) -> None:
    return None


@dataclass
class CutoverRun:
    """What a run of the cutover's steps knows: the tenant, who it is, its bounds, the earlier steps' results,
    whether it writes, and the few things only its caller can do (ask a person, start the host).

    ``earlier(step, key)`` reads an earlier step's result (the XCom ``key`` of its task; ``return_value``: its
    value, a per-pack step's a list). ``say`` gets every line a person reads; ``seam`` is the fault tests'
    seam (the DAG's ``fault_point``). ``confirm(evidence)`` returns who confirmed the old writers stopped (or
    raises: no confirmation is ever a default); ``start_host(run, live_hosts)`` starts the new host and returns
    what it did; ``writers_stop`` is the deployment's writer-stop controller (None: manual).
    """

    engine: Engine
    namespace: str
    holder: str
    dry_run: bool = False
    requested_packs: tuple[str, ...] = ()
    adopt: str | None = None
    #: The bound of each locked step (the fence, the checkpoint, the release): the DAG's ``lock_timeout``.
    lock_timeout_s: float = 300.0
    drain_timeout_s: float = 3600.0
    digest_timeout_s: float = 300.0
    digest_connections: int = DEFAULT_DIGEST_CONNECTIONS
    chunk_rows: int = DEFAULT_CHUNK_ROWS
    stale_heartbeat_s: float = DEFAULT_STALE_HEARTBEAT_S
    holder_state: cutover_fence.HolderState = cutover_fence.unknown_holders
    take_over: str = cutover_fence.TAKE_OVER
    #: The end of a waiting step's wait (the drain names what cannot finish by it); None: now + the wait's bound.
    deadline: dt.datetime | None = None
    #: The pack of a per-pack step's run.
    pack: str | None = None
    #: The drain's look: how many WorkIds it names per cause; whether ``InputStartOrdinal`` exists (None: probe).
    drain_sample_limit: int = 200
    range_column: bool | None = None
    #: Arm the fence only once the old backlog would drain within this many seconds (0: arm at once).
    arm_when_drain_below_s: float = 0.0
    #: The old backlog's looks so far, ``(monotonic seconds, remaining)``: its net drain rate (a moving window);
    #: and, while it is small enough to list, its WorkIds and ``(seconds, items finished so far)``: the rate the
    #: old runtime finishes items at, which new work arriving does not hide (a moving window too).
    backlog_samples: list[tuple[float, int]] = field(default_factory=list)
    backlog_ids: frozenset[int] | None = None
    backlog_finished: list[tuple[float, int]] = field(default_factory=list)
    earlier: Callable[[str, str], Any] = lambda _step, _key: None
    say: Callable[[str], None] = _quiet
    seam: Callable[[str], None] = _no_seam
    confirm: Callable[[Any], str] | None = None
    start_host: Callable[[CutoverRun, list[str]], dict[str, Any]] | None = None
    #: How ``stop_old_writers`` stops the old writers (:mod:`..writers_stop`; None: ``manual``, a person does).
    writers_stop: Any = None
    #: The ``PLAN:`` lines recorded by the step being run (dry runs only).
    planned: list[str] = field(default_factory=list)
    #: The declaration whose steps this run runs (the cutover's; a test's copy with a step added).
    transition: Transition = CUTOVER
    #: Where the events a body emits itself go (a person shown evidence, the answer): the caller's recorder.
    recorder: Recorder = NOT_RECORDING

    @property
    def stale(self) -> dt.timedelta:
        return dt.timedelta(seconds=self.stale_heartbeat_s)

    def plan(self, *lines: str) -> None:
        """Record the ``PLAN:`` of a write this dry run does not make (its caller shows it: the DAG's task log,
        ``-json``; a body says its one-line summary itself)."""
        self.planned.extend(lines)

    def packs(self) -> list[str]:
        return list(self.earlier("resolve_packs", RETURN) or [])

    def fence(self) -> cutover_fence.FenceResult | None:
        raw = self.earlier("arm_fence", RETURN)
        return cutover_fence.FenceResult.from_json(raw) if isinstance(raw, dict) and "outcome" in raw else None

    def missing_schema(self) -> list[str]:
        return missing_projection_schema(self.engine)


class Results:
    """The results of the steps run so far in one process (``run``, ``plan``): ``earlier`` of a :class:`CutoverRun`."""

    def __init__(self, transition: Transition = CUTOVER) -> None:
        self._by_step: dict[str, list[StepResult]] = {}
        self._transition = transition

    def record(self, step: str, result: StepResult) -> None:
        self._by_step.setdefault(step, []).append(result)

    def earlier(self, step: str, key: str = RETURN) -> Any:
        found = self._by_step.get(step) or []
        values = [r.value if key == RETURN else r.keyed.get(key) for r in found]
        if self._transition[step].per_pack_of is not None:
            return values
        return values[-1] if values else None


def fence_and_checkpoints(engine: Engine, namespace: str, packs: list[str]) -> tuple[dict[str, Any] | None, list[str]]:
    """Read only: the cutover fence in force (its row, or None) and which of ``packs`` are checkpointed, in one
    read: what a stop message says is true of the tenant now."""

    with tx.reading(engine, "reading the tenant's state") as conn:
        fence = cutover_fence_in_force(conn, namespace)
        return fence, [pack for pack in packs if read_protocol_row(conn, pack) is not None]


def run_step(name: str, run: CutoverRun) -> StepResult:
    """Run the body of the declared step ``name``: its result, a refusal with a report as its ``stop``."""
    run.planned = []
    try:
        result = run.transition[name].function()(run)
    except Refused as exc:
        if exc.report is None:
            raise
        result = StepResult({"refused": str(exc)}, Verdict(Outcome.STOP, str(exc)), report=exc.report)
    if run.dry_run:
        result.planned = list(run.planned)
        if isinstance(result.value, dict):
            result.value.setdefault("plan", result.planned)
    return result


def _judged(name: str, value: Any, **more: Any) -> StepResult:
    return StepResult(value, CUTOVER[name].verdict(value), **more)


def _schema_a_dry_run_lacks(run: CutoverRun) -> list[str]:
    """The objects ``apply_schema`` would create, on a dry run (which created nothing); a real run has them."""
    return run.missing_schema() if run.dry_run else []


def _once_the_schema_exists(run: CutoverRun, missing: list[str], plan: str, said: str,
                            value: dict[str, Any]) -> StepResult:
    """A dry run's step that reads what ``apply_schema`` has not created yet: what it would do once it has."""
    objects = ", ".join(missing)
    run.plan(f"{plan} once apply_schema has created {objects}")
    run.say(f"{said} once apply_schema has created {objects}")
    return StepResult({**value, "missing_schema": missing})


def _each(raw: Any) -> list[dict[str, Any]]:
    return [r for r in ([raw] if isinstance(raw, dict) else list(raw or [])) if isinstance(r, dict)]


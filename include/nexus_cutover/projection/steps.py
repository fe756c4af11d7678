"""The cutover's declared steps, one body each: the one door the DAG, ``nexus-cutover run`` and ``plan`` go through.

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

import datetime as dt
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine

from ..clock import utcnow
from ..errors import Refused
from ..liveness import DEFAULT_STALE_HEARTBEAT_S
from ..polling import eta_seconds, measured_rate
from ..transition import Outcome, StepResult, Transition, Verdict
from . import actions, cutover_fence
from .actions import (  # the single-step functions, for the single-step commands and the pollers
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
from .checkpoint import REFUSED, run_checkpoint
from .cutover_fence import (
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
from .digest.definition import DEFAULT_CHUNK_ROWS
from .digest.model import HistoryDigest, load_digest
from .digest_limits import DEFAULT_DIGEST_CONNECTIONS
from .drain import blockers_text, live_old_work_ids
from .greenfield import activate_pack
from .transition import CUTOVER

__all__ = [  # the door: the declaration, the bodies, what they return and raise, and the reads callers show
    "CUTOVER", "CutoverRun", "DEFAULT_CHUNK_ROWS", "FenceHeld", "FenceResult", "HOLDER_ACTIVE", "HOLDER_FINISHED",
    "HOLDER_UNKNOWN", "HistoryDigest", "NotReady", "REFUSED", "Refused", "Results", "SchemaResult",
    "SeveralCutoverFences", "StepResult", "Verdict", "WriterRecheck", "accept_confirmation", "actions",
    "activate_pack", "blockers_text", "checkpoint", "cutover_fence_in_force", "cutover_standing", "drain",
    "fence_and_checkpoints", "fence_row", "held_by_another", "history_unchanged", "last_released_cutover_fence",
    "load_digest", "old_writers_since_release", "pause_text", "readiness", "recheck_writers", "release_fence",
    "run_checkpoint", "run_step", "verify_history", "verify_no_old_writer", "writer_evidence",
]

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
    what it did.
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
    #: The ``PLAN:`` lines recorded by the step being run (dry runs only).
    planned: list[str] = field(default_factory=list)
    #: The declaration whose steps this run runs (the cutover's; a test's copy with a step added).
    transition: Transition = CUTOVER

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
        from ..schema import missing_projection_schema

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
    from .. import tx
    from ..protocol_row import read_protocol_row

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


# -- stage 1 ------------------------------------------------------------------------------------------------


def resolve_packs(run: CutoverRun) -> StepResult:
    """The run's packs; and its first, read-only look at who holds the tenant: a holder this run may not adopt
    stops it here, naming the holder, before ``apply_schema`` writes anything (``arm_fence`` decides again under
    the namespace lock, where it acts). As the run's first step it reports the TLS its tenant connection uses
    (:func:`nexus_cutover.tx.connection_tls`: the mode, the certificate paths, the TLS version negotiated; no key,
    no password): a line, the result keyed ``tls`` (the DAG's XCom) and the ``tls`` field (``run``/``plan -json``)."""
    from ..db import tls_line
    from ..tx import connection_tls

    packs = actions.resolve_packs(run.engine, run.namespace, run.requested_packs)
    run.say(f"packs: {', '.join(packs)}")
    tenant_tls = connection_tls(run.engine)  # the run's report says how it reached the tenant (XCom ``tls``, -json)
    run.say(tls_line(tenant_tls))
    said = {"keyed": {"tls": tenant_tls}, "fields": {"tls": tenant_tls}}
    try:
        actions.held_by_another(run.engine, run.namespace, holder=run.holder, holder_state=run.holder_state,
                                adopt=run.adopt, take_over=run.take_over)
    except (cutover_fence.FenceHeld, cutover_fence.SeveralCutoverFences) as exc:
        return StepResult(packs, Verdict(Outcome.STOP, str(exc)), report=exc.report, **said)
    return StepResult(packs, **said)


def apply_schema(run: CutoverRun) -> StepResult:
    """The additive schema, each object skipped when present; the TLS the tenant connection uses."""
    from ..tx import connection_tls

    def created(label: str) -> None:
        run.say(f"{label}: created")
        run.seam("apply_schema.after_first_write")

    result = actions.apply_schema(run.engine, dry_run=run.dry_run, on_created=created)
    tenant_tls = connection_tls(run.engine)
    value = {"created": result.created, "present": result.present, "tls": tenant_tls}
    if run.dry_run:
        run.plan(*result.plan)
        run.say("schema: " + (f"would create {', '.join(result.missing)} (the DDL: -json, schema.plan)"
                              if result.missing else "complete"))
        return StepResult({**value, "dry_run": True, "missing": result.missing})
    for label in result.present:
        run.say(f"{label}: present, skipped")
    return StepResult(value)


#: How many looks the old backlog's drain rate is measured over (an old burst does not skew the ETA for long).
RATE_SAMPLES = 20


def wait_for_short_drain(run: CutoverRun) -> StepResult:
    """One look at the old projection backlog before the fence is armed, and its drain rate over the looks so
    far: the run arms once the rest would drain within ``arm_when_drain_below_s`` (so the admission pause holds
    only a short residual drain), and stops, arming nothing, when the backlog cannot drain. Read only; the
    seed's order is unchanged: ``wait_for_drain`` still waits, fenced, for every old projection WorkItem."""
    report = actions.drain(run.engine, run.namespace, deadline=utcnow() + dt.timedelta(seconds=run.drain_timeout_s),
                           stale_heartbeat=run.stale, range_column=run.range_column, sample_limit=run.drain_sample_limit)
    rate = _backlog_rate(run, report.remaining)
    look = {"remaining": report.remaining, "rate_per_min": rate, "eta_s": eta_seconds(report.remaining, rate),
            "arm_when_drain_below_s": run.arm_when_drain_below_s, "state": report.state,
            "blocker_totals": report.blocker_totals, "counts": report.counts}
    judged = _judged("wait_for_short_drain", look, domain=report)
    run.say(f"before arming: {report.counts_text()}" + ("" if judged.verdict.proceeds else f"; {judged.verdict.reason}"))
    if report.state == "stuck":
        run.say(report.report_text())
    return judged


def _backlog_rate(run: CutoverRun, remaining: int) -> float | None:
    """Items per minute the old backlog drains at, from this look and the earlier ones of ``run``: the rate the
    old runtime finishes listed items at when it is measured (new work arriving before the fence does not
    hide it: once the fence is armed, only the finishing goes on), else the drop of the remaining count."""
    now = time.monotonic()
    run.backlog_samples = [*run.backlog_samples, (now, remaining)][-RATE_SAMPLES:]
    ids = live_old_work_ids(run.engine, run.namespace, range_column=run.range_column) if remaining else frozenset()
    if ids is None or run.backlog_ids is None:
        run.backlog_finished = [] if ids is None else [(now, 0)]
    else:
        finished = run.backlog_finished[-1][1] + len(run.backlog_ids - ids) if run.backlog_finished else 0
        run.backlog_finished = [*run.backlog_finished, (now, finished)][-RATE_SAMPLES:]
    run.backlog_ids = ids
    finishing = measured_rate([(s, -n) for s, n in run.backlog_finished])
    return finishing if finishing else measured_rate(run.backlog_samples)


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
        run.say(f"every pack of {run.namespace} is already cut over and no cutover fence is in force: not fencing "
                f"again (last released cutover fence: {result.fence_id})")
        return _judged("arm_fence", value)
    run.say(f"fence {result.fence_id}: {result.outcome} on namespace {run.namespace}"
            + (f" (taken over from {result.previous_holder})" if result.previous_holder else ""))
    if result.other_fences_in_force:
        run.say(f"other fences in force (left as they are): {result.other_fences_in_force}")
    run.seam("arm_fence.after_write")
    return _judged("arm_fence", value)


def _above_field(value: dict[str, Any]) -> dict[str, Any]:
    return {"old_work_above_cutoff": value["old_work_above_cutoff"]} if "old_work_above_cutoff" in value else {}


def _above_cutoff(run: CutoverRun) -> list[dict[str, Any]]:
    above = actions.cutover_standing(run.engine, run.namespace)["old_work_above_cutoff"]
    for entry in above:
        run.say(f"STOP: {entry['text']}")
    return above


# -- stage 2 ------------------------------------------------------------------------------------------------


def wait_for_drain(run: CutoverRun) -> StepResult:
    """One look at the drain of old projection work: drained, stuck (a stop, blockers by cause) or still draining.

    Read only: no WorkItem is ever changed."""
    deadline = run.deadline or utcnow() + dt.timedelta(seconds=run.drain_timeout_s)
    report = actions.drain(run.engine, run.namespace, deadline=deadline, stale_heartbeat=run.stale,
                           range_column=run.range_column, sample_limit=run.drain_sample_limit)
    run.say(f"drain: {report.state}: {report.counts_text()}")
    if report.state == "stuck":
        run.say(report.report_text())
    return _judged("wait_for_drain", report.as_json(), keyed={"report_text": report.report_text()}, domain=report)


# -- stage 3 ------------------------------------------------------------------------------------------------


def check_old_writers(run: CutoverRun) -> StepResult:
    """One look at the old-protocol writers: the run waits while one is live (then a person confirms)."""
    ev = actions.writer_evidence(run.engine, run.namespace, stale_heartbeat=run.stale)
    live = [p["process_id"] for p in ev.live]
    run.say(f"writers: {len(live)} live old writer(s)" + (f": {', '.join(live)}" if live else ""))
    return _judged("check_old_writers", ev.as_json(), keyed={"evidence_md": ev.as_markdown()}, domain=ev)


def evidence_to_confirm(run: CutoverRun):
    """The first half of ``confirm_writers_stopped``: the registry read now, the evidence a person is shown.

    Refuses (Refused, report: the evidence) while an old writer is live: nobody is asked to confirm what the
    registry contradicts."""
    ev = actions.writer_evidence(run.engine, run.namespace, stale_heartbeat=run.stale)
    if not ev.all_stopped_or_silent:
        raise LiveAgain(ev)
    return ev


class LiveAgain(Refused):
    """Old writers are live again when the person would be asked: nothing is asked."""

    def __init__(self, evidence) -> None:
        self.evidence = evidence
        self.report = evidence.as_json()
        super().__init__("cutover not performed: old writers are live again: "
                         + ", ".join(x["process_id"] for x in evidence.live) + ". Stop them, then clear check_old_writers.")


def accept_confirmation(run: CutoverRun, evidence_taken_at: dt.datetime) -> StepResult:
    """The second half of ``confirm_writers_stopped``, when the answer arrives: the registry read again against
    the evidence the person was shown; the confirmation holds only if no old writer came back since."""
    check = actions.recheck_writers(run.engine, run.namespace, evidence_taken_at=evidence_taken_at,
                                    stale_heartbeat=run.stale)
    return _judged("confirm_writers_stopped", check.as_json(), domain=check)


def confirm_writers_stopped(run: CutoverRun) -> StepResult:
    """A person confirms every old writer stopped, shown the evidence; re-checked when the answer comes."""
    fence = run.fence()
    ev = actions.writer_evidence(run.engine, run.namespace, stale_heartbeat=run.stale)
    if fence is not None and fence.not_needed:
        run.say("nothing to confirm: every pack is already checkpointed and no cutover fence is in force")
        return StepResult({"outcome": "nothing_to_confirm", "evidence": ev.as_json()})
    if run.dry_run:
        run.say("dry run: would ask to confirm; evidence:\n" + ev.as_text())
        return StepResult({"dry_run": True, "evidence": ev.as_json()})
    ev = evidence_to_confirm(run)
    if run.confirm is None:
        raise RuntimeError("confirm_writers_stopped needs its caller's way to ask a person (CutoverRun.confirm)")
    confirmed_by = run.confirm(ev)
    answer = accept_confirmation(run, ev.checked_at)
    return _judged("confirm_writers_stopped", {"confirmed_by": confirmed_by, **answer.value},
                   keyed={"evidence": ev.as_json()})


def history_digest(run: CutoverRun) -> StepResult:
    """The digest of every history Event / WorkItem row (read only, also on a dry run once the schema exists)."""
    if missing := _schema_a_dry_run_lacks(run):  # the digest reads InputStartOrdinal and the checkpoints
        return _once_the_schema_exists(run, missing, "(read only) take the history digest", "history digest: taken",
                                       {"dry_run": True, "taken": False})
    digest = actions.history_digest(run.engine, run.namespace, timeout_s=run.digest_timeout_s,
                                    chunk_rows=run.chunk_rows, connections=run.digest_connections,
                                    on_chunk=lambda _table, _chunk: run.seam("history_digest.mid_way"))
    run.say(f"{digest.summary_text()}; taken in {digest.seconds:.1f}s" + (" (dry run)" if run.dry_run else ""))
    return StepResult(digest.summary(), keyed={"digest": digest.as_json()}, domain=digest)


# -- stage 4 ------------------------------------------------------------------------------------------------


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


def audit_and_checkpoint(run: CutoverRun) -> StepResult:
    """One pack (``run.pack``): the lifecycle entrypoint's audit and one-time ``LegacyMaxOrdinal``, under the
    namespace and pack locks; a refusal stops with every finding."""
    pack = run.pack
    if missing := _schema_a_dry_run_lacks(run):  # the audit reads the Part B objects
        return _once_the_schema_exists(run, missing, f"audit pack {pack} and write its checkpoint",
                                       f"checkpoint {pack}: audited", {"pack_install_id": pack, "outcome": "not_audited"})
    armed = run.fence()
    result = actions.checkpoint(run.engine, pack, timeout_s=run.lock_timeout_s, written_by=run.holder,
                                dry_run=run.dry_run, fence_planned=run.dry_run and armed is not None and armed.planned)
    run.say(f"checkpoint {result.summary()}")
    for finding in result.findings:
        run.say("  " + finding.describe())
    judged = _judged("audit_and_checkpoint", result.as_json())
    if not judged.verdict.proceeds:
        judged.keyed["findings"] = judged.value["findings"]
        judged.message = (f"{result.summary()}. Old missing or ambiguous responsibility needs a separately reviewed "
                          "recovery decision; the cutoff is never used to hide it. The fence stays armed.")
        return judged
    if run.dry_run:
        if result.outcome == "would_write":
            run.plan(f"_System_ConnectorProjectionProtocol: insert ({pack}, ProtocolVersion=1, "
                     f"LegacyMaxOrdinal={result.legacy_max_ordinal})")
        return judged
    run.seam("audit_and_checkpoint.after_write")
    return judged


# -- stage 5 ------------------------------------------------------------------------------------------------


def start_new_host(run: CutoverRun) -> StepResult:
    """The matching new host, started by the caller's way (``run.start_host``) unless one already runs."""
    r = actions.readiness(run.engine, run.namespace, stale_heartbeat=run.stale)
    live_hosts = [h["process_id"] for h in r.hosts if h["state"] == "live"]
    if run.dry_run:
        run.plan(f"start the new host (live new hosts now: {', '.join(live_hosts) or 'none'})")
        return StepResult({"dry_run": True})
    if live_hosts:
        run.say(f"a new host already runs for {run.namespace} ({', '.join(live_hosts)}): not starting another")
        return StepResult({"already_running": live_hosts})
    if run.start_host is None:
        raise RuntimeError("start_new_host needs its caller's way to start the host (CutoverRun.start_host)")
    value = run.start_host(run, live_hosts)
    run.seam("start_new_host.after_write")
    return StepResult(value, fields={"host_pid": value["host_pid"]} if "host_pid" in value else {})


def verify_readiness(run: CutoverRun) -> StepResult:
    """One look at the new host: registered, activated, heartbeating, and no live old writer."""
    r = actions.readiness(run.engine, run.namespace, stale_heartbeat=run.stale)
    run.say("new host: " + (f"ready ({', '.join(h['process_id'] for h in r.ready_hosts)})" if r.ready
                            else "not ready: " + "; ".join(r.reasons)))
    return _judged("verify_readiness", r.as_json(), domain=r)


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


def final_old_writer_check(run: CutoverRun) -> StepResult:
    """No old-protocol writer after the fence release, and no history row changed since the digest.

    A dry run's is the run's verdict from every earlier step's dry run (proceed, wait for what, stop and why)."""
    if run.dry_run:
        verdict = dry_run_verdict(run.earlier)
        run.say(f"VERDICT: the real run would {verdict}" if not verdict.startswith("done:") else f"VERDICT: {verdict}")
        return StepResult({"dry_run": True, "cutoffs": _cutoffs(run), "verdict": verdict})
    released_at = _released_at(run)
    if isinstance(released_at, StepResult):
        return released_at
    judged = old_writers_since_release(run.engine, run.namespace, released_at)
    seen = judged.value
    if not judged.verdict.proceeds:
        return judged
    history = _history_unchanged(run)
    if not history.verdict.proceeds:
        history.fields.update(seen)
        return history
    fence = run.fence()
    value = {"tenant": run.namespace, "cutoffs": _cutoffs(run), "fence_id": fence.fence_id if fence else None,
             "released_at": released_at.isoformat(), "history_digest": history.value}
    return StepResult(value, fields={**seen, **history.fields})


def _cutoffs(run: CutoverRun) -> dict[str, int | None]:
    found = run.earlier("audit_and_checkpoint", RETURN) or []
    return {r["pack_install_id"]: r.get("legacy_max_ordinal") for r in _each(found)}


def _each(raw: Any) -> list[dict[str, Any]]:
    return [r for r in ([raw] if isinstance(raw, dict) else list(raw or [])) if isinstance(r, dict)]


def _released_at(run: CutoverRun) -> dt.datetime | StepResult:
    from .. import tx

    fence = run.fence()
    if fence is not None and fence.not_needed and fence.fence_id is None:
        return utcnow()  # no release to date: look at live ones
    if fence is None or fence.fence_id is None:
        return StepResult({}, Verdict(Outcome.STOP, "arm_fence left no fence id: clear arm_fence (it reuses the fence)"))
    with tx.reading(run.engine, "reading the released fence") as conn:
        row = cutover_fence.fence_row(conn, int(fence.fence_id))
    if not row or not row.get("ReleasedAt"):
        return StepResult({}, Verdict(Outcome.STOP, f"fence {fence.fence_id} is not released: clear resume_admission"))
    return dt.datetime.fromisoformat(row["ReleasedAt"])


def old_writers_since_release(engine: Engine, namespace: str, released_at: dt.datetime) -> StepResult:
    """The first half of the final check (also ``nexus-cutover verify``): the old-protocol writers that started
    or heartbeated at or after ``released_at``, judged by the final check's declared verdict (read only)."""
    seen = {"old_writers_after_release": actions.verify_no_old_writer(engine, namespace, released_at=released_at),
            "released_at": released_at.isoformat()}
    return _judged("final_old_writer_check", seen, fields=dict(seen))


def history_unchanged(engine: Engine, expected: HistoryDigest, *, timeout_s: float,
                      say: Callable[[str], None] = _quiet) -> StepResult:
    """The second half of the final check (also ``nexus-cutover verify -expect``): every history row compared
    with ``expected``, judged by the final check's declared verdict; a stop names every difference."""
    verification = actions.verify_history(engine, expected, timeout_s=timeout_s)
    history = {**verification.as_json(), "summary": verification.summary()}
    verdict = CUTOVER["final_old_writer_check"].verdict({"history": history})
    say(verification.summary())
    if not verdict.proceeds:
        return StepResult({"history": history}, verdict, fields={"history": history},
                          report={"message": verification.summary(), "history": history})
    return StepResult({"hash": verification.expected.short_hash, "rows": verification.rows_now, "verified": True,
                       "chunks": verification.expected.chunk_count, "seconds": round(verification.seconds, 3)},
                      fields={"history": history})


def _history_unchanged(run: CutoverRun) -> StepResult:
    """The digest of ``history_digest`` verified against the rows now; a stop names every difference."""
    raw = run.earlier("history_digest", "digest")
    if raw is None:
        return StepResult({}, Verdict(Outcome.STOP, "this run has no history digest (history_digest did not run, or "
                          "its result was cleared): the run cannot prove that history is unchanged. Clearing "
                          "history_digest takes a new digest, which proves only from then on"))
    return history_unchanged(run.engine, HistoryDigest.from_json(raw), timeout_s=run.digest_timeout_s, say=run.say)


def dry_run_verdict(earlier: Callable[[str, str], Any], *, but: str = "final_old_writer_check") -> str:
    """What the real run would do, from a dry run's results (every declared step's verdict on its result but
    ``but``'s, combined as :meth:`~nexus_cutover.transition.Transition.overall` combines them)."""
    verdicts = [(step.name, step.verdict(result)) for step in CUTOVER if step.name != but
                for result in _each(earlier(step.name, RETURN))]
    return CUTOVER.overall(verdicts)


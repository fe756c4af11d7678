"""The actions of the connector projection range cutover (seed 000, "Existing-data cutover"): one function each.

What each declared step does to the tenant database, as a function of the
database and plain arguments: the declared steps' bodies
(:mod:`.steps`, the one door the DAG and the command line go through) and the
single-step commands of ``nexus-cutover`` call exactly these; the modules
behind them read (drain, writers, audit) or write (schema, fence,
checkpoint). In the declared order, and why:

1. :func:`resolve_packs`, :func:`held_by_another` (a tenant another holder holds
   is refused before anything is written), :func:`apply_schema`,
   :func:`arm_fence` -- additive schema, then one non-expiring namespace-wide
   ``*`` admission fence held by the run. Old workers and dependency resolvers
   keep running.
2. :func:`drain` -- until no old projection WorkItem is pending, blocked, retry
   or processing; stuck work is reported, never changed.
3. :func:`writer_evidence`, then a person confirms every old writer stopped,
   then :func:`recheck_writers` when the answer arrives, then
   :func:`history_digest`: the chunk checksums of every history row, taken now
   that nothing old can change them.
4. :func:`checkpoint` per pack -- under the namespace/pack locks: the fence
   precondition, the audit, the one-time ``LegacyMaxOrdinal``.
5. :func:`readiness` of the new host, :func:`release_fence` (admission resumes,
   only while ready, in the releasing transaction), :func:`verify_no_old_writer`
   (no old writer ran after the release) and :func:`verify_history` (no history
   row changed since the digest).

Nothing here UPDATEs or DELETEs an Event or WorkItem or changes a WorkItem's
status; there is no step that skips a refusal.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine

from .. import schema
from ..clock import utcnow
from ..db import Deadline
from ..errors import Refused
from ..standing import read_standing
from . import cutover_fence, writers
from .checkpoint import CheckpointResult, run_checkpoint
from .digest.compute import compute_digest
from .digest.definition import DEFAULT_CHUNK_ROWS
from .digest.model import HistoryDigest
from .digest.verify import DigestVerification, verify_digest
from .digest_limits import DEFAULT_DIGEST_CONNECTIONS
from .drain import DrainReport, drain_report
from .packs import resolve_packs as _resolve_packs
from .packs import schema_plan


def resolve_packs(engine: Engine, namespace: str, requested: Iterable[str] = ()) -> list[str]:
    """Step 1a. Reads the namespace's active packs (or checks ``requested``); writes nothing.

    Refuses (BadInput) an unknown, inactive or foreign pack, or a namespace without one.
    """
    return _resolve_packs(engine, namespace, requested)


def held_by_another(
    engine: Engine, namespace: str, *, holder: str, holder_state: cutover_fence.HolderState = cutover_fence.unknown_holders,
    adopt: str | None = None, take_over: str = cutover_fence.TAKE_OVER,
) -> None:
    """Step 1a'. Read only, before any write of the run: refuses (FenceHeld, SeveralCutoverFences) a tenant that
    another holder holds and this one may not adopt (contract, "One cutover per tenant at a time": a second run
    stops at once, naming the holder, and writes nothing). :func:`arm_fence` decides again under the lock."""
    cutover_fence.held_by_another(engine, namespace, holder=holder, holder_state=holder_state, adopt=adopt, take_over=take_over)


@dataclass
class SchemaResult:
    created: list[str]
    present: list[str]
    plan: list[str]
    missing: list[str] = field(default_factory=list)  # the labels of the objects a real run would create

    def as_json(self) -> dict[str, Any]:
        return {"created": self.created, "present": self.present, "plan": self.plan}


def apply_schema(engine: Engine, *, dry_run: bool = False, on_created: Callable[[str], None] | None = None) -> SchemaResult:
    """Step 1b. Adds ``InputStartOrdinal`` and ``_System_ConnectorProjectionProtocol``, each skipped when present.

    Reads the schema; writes only that additive DDL (a concurrent identical DDL
    is tolerated). Refuses (MissingSchema) without the v2 prerequisite
    ``ReplayOfWorkId``, before any DDL: it is never manufactured. ``on_created(label)``
    is called after each object this call created (progress; the fault tests' seam).
    """
    schema.require_v2_prerequisite(engine)
    steps = schema.projection_steps(engine)
    present = [s.label for s in steps if s.present]
    plan = [line for line, s in zip(schema_plan(steps), steps, strict=True) if not s.present]
    if dry_run:
        return SchemaResult([], present, plan, [s.label for s in steps if not s.present])
    created: list[str] = []
    for step in steps:
        for label in schema.apply_steps(engine, [step]):
            created.append(label)
            if on_created is not None:
                on_created(label)
    return SchemaResult(created, present, plan)


def arm_fence(
    engine: Engine, namespace: str, *, holder: str, packs: Iterable[str], timeout_s: float,
    holder_state: cutover_fence.HolderState = cutover_fence.unknown_holders, adopt: str | None = None,
    take_over: str = cutover_fence.TAKE_OVER, dry_run: bool = False,
) -> cutover_fence.FenceResult:
    """Step 1c. Arms (or reuses, or adopts from a finished or named holder) the non-expiring ``*`` fence as ``holder``.

    Reads fences and overrides under the namespace lock; writes one fence row (or
    its ``ArmedBy`` on adoption). Refuses, writing nothing, on an active override
    (ActiveOverrides), several cutover fences (SeveralCutoverFences) or a fence
    another holder holds that may not be adopted (FenceHeld): a holder whose state
    cannot be read is adopted only when the person names it (``adopt``).
    When every pack is checkpointed and no cutover fence is in force: ``not_needed``.
    """
    return cutover_fence.arm_fence(engine, namespace, armed_by=holder, timeout_s=timeout_s, dry_run=dry_run, packs=packs,
                                   holder_state=holder_state, adopt=adopt, take_over=take_over)


def drain(
    engine: Engine, namespace: str, *, deadline: dt.datetime, stale_heartbeat: dt.timedelta,
    range_column: bool | None = None, sample_limit: int = 200,
) -> DrainReport:
    """Step 2. Counts old projection work by live status and names what cannot finish by ``deadline``.

    Read only: a stuck drain is reported with its WorkIds grouped by cause; no
    WorkItem is ever changed and nothing like ``RunUntilDrained`` is invoked.
    """
    return drain_report(engine, namespace, deadline=deadline, stale_heartbeat=stale_heartbeat,
                        range_column=range_column, sample_limit=sample_limit)


def writer_evidence(engine: Engine, namespace: str, *, stale_heartbeat: dt.timedelta) -> writers.WriterEvidence:
    """Step 3a. Every old-protocol writer of the namespace, live / silent / stopped: the evidence a person confirms.

    Read only. The database cannot prove an old binary will never resume: this
    is evidence for the confirmation, never a substitute for it.
    """
    return writers.old_writer_evidence(engine, namespace, stale_heartbeat=stale_heartbeat)


@dataclass
class WriterRecheck:
    """The registry read again when the person's answer arrived, against the evidence they were shown."""

    evidence_taken_at: dt.datetime
    rechecked_at: dt.datetime
    live: list[str]
    active_since_evidence: list[dict[str, Any]] = field(default_factory=list)

    @property
    def evidence_age_s(self) -> float:
        return round((self.rechecked_at - self.evidence_taken_at).total_seconds(), 1)

    @property
    def came_back(self) -> list[str]:
        return sorted(set(self.live) | {p["process_id"] for p in self.active_since_evidence})

    @property
    def holds(self) -> bool:
        return not self.came_back

    def as_json(self) -> dict[str, Any]:
        return {"evidence_taken_at": self.evidence_taken_at.isoformat(), "evidence_age_s": self.evidence_age_s,
                "rechecked_at": self.rechecked_at.isoformat(), "came_back": self.came_back, "live": self.live,
                "active_since_evidence": self.active_since_evidence}


def recheck_writers(
    engine: Engine, namespace: str, *, evidence_taken_at: dt.datetime, stale_heartbeat: dt.timedelta
) -> WriterRecheck:
    """Step 3b. Re-reads the registry when the confirmation arrives (read only).

    The confirmation holds only if no old writer is live now and none started
    or heartbeated since the evidence was taken; otherwise the caller confirms nothing.
    """
    now = utcnow()
    ev = writers.old_writer_evidence(engine, namespace, stale_heartbeat=stale_heartbeat, now=now)
    since = writers.old_processes_since(engine, namespace, evidence_taken_at, now=now)
    return WriterRecheck(evidence_taken_at, now, [p["process_id"] for p in ev.live], since)


def history_digest(
    engine: Engine, namespace: str, *, timeout_s: float, chunk_rows: int = DEFAULT_CHUNK_ROWS,
    connections: int = DEFAULT_DIGEST_CONNECTIONS, on_chunk: Callable[[str, Any], None] | None = None,
) -> HistoryDigest:
    """Step 3c. The digest of every history Event and WorkItem row of the namespace (read only).

    Taken after the confirmation, while the fence holds: history can no longer
    change, so any difference found by :func:`verify_history` was made after
    this point. Chunk checksums are computed in the server; an interrupted
    digest wrote nothing and is simply taken again. The chunks are read on
    ``connections`` connections at once (the same rows and verification as on
    one): it runs inside the admission pause, and a larger server shortens it.
    """
    return compute_digest(engine, namespace, chunk_rows=chunk_rows, deadline=Deadline(timeout_s), on_chunk=on_chunk,
                          connections=connections)


def checkpoint(
    engine: Engine, pack_install_id: str, *, timeout_s: float, written_by: str, dry_run: bool = False,
    fence_planned: bool = False, stale_heartbeat: dt.timedelta | None = None,
) -> CheckpointResult:
    """Step 4, per pack: ``connector-projection-cutover``, the lifecycle entrypoint.

    Under the namespace then pack lock, in one transaction: returns an existing
    protocol row unchanged; else checks the fence precondition, audits retained
    responsibility and writes only the one-time ``LegacyMaxOrdinal`` (a greenfield
    pack: cutoff 0, refused while an old runtime is live without the fence,
    ``stale_heartbeat`` its liveness window). A refusal (every finding named)
    writes nothing; no option skips one.
    """
    more = {} if stale_heartbeat is None else {"stale_heartbeat": stale_heartbeat}
    return run_checkpoint(engine, pack_install_id, timeout_s=timeout_s, written_by=written_by, dry_run=dry_run,
                          fence_planned=fence_planned, **more)


def readiness(engine: Engine, namespace: str, *, stale_heartbeat: dt.timedelta) -> writers.Readiness:
    """Step 5a. An activated ProjectionProtocol=1 integration_host with a fresh heartbeat and no live old writer.

    Read only; ``reasons`` says what is missing.
    """
    return writers.readiness(engine, namespace, stale_heartbeat=stale_heartbeat)


class NotReady(Refused):
    """The fence is not released: the new host is not ready (checked in the releasing transaction)."""

    def __init__(self, reasons: list[str]):
        self.reasons = list(reasons)
        super().__init__("not releasing the fence: the new host is not ready (" + "; ".join(self.reasons) + ")")


def release_fence(
    engine: Engine, namespace: str, fence_id: int, *, holder: str, stale_heartbeat: dt.timedelta, timeout_s: float,
    dry_run: bool = False, between_check_and_act: cutover_fence.Seam | None = None,
) -> cutover_fence.FenceResult:
    """Step 5b. Sets ``ReleasedAt`` on the fence ``holder`` holds: admission resumes through the new host.

    Readiness is verified inside the releasing transaction, under the namespace
    lock, before and again after the write (NotReady otherwise, nothing
    released); a fence held by another holder is refused (FenceHeld); a fence
    this holder already released is a no-op success, one another holder
    released is not (ReleasedByAnother). ``between_check_and_act``: a test seam only.
    """

    def ready(conn: Connection) -> None:
        r = writers.readiness(conn, namespace, stale_heartbeat=stale_heartbeat)
        if not r.ready:
            raise NotReady(r.reasons)

    return cutover_fence.release_fence(engine, namespace, fence_id, released_by=holder, timeout_s=timeout_s, dry_run=dry_run,
                                       precondition=ready, between_check_and_act=between_check_and_act)


def verify_no_old_writer(engine: Engine, namespace: str, *, released_at: dt.datetime) -> list[dict[str, Any]]:
    """Step 5c. Old-protocol writers that started or heartbeated at/after the release (empty when none; read only).

    Do not restart an old writer after this point: any one listed needs review.
    """
    return writers.old_processes_since(engine, namespace, released_at)


def verify_history(engine: Engine, expected: HistoryDigest, *, timeout_s: float) -> DigestVerification:
    """Step 5d. Every history row compared with the digest of step 3c (read only).

    Rows admitted above the cutoffs and range work are not history and may
    change; every changed, missing or extra history row is named by key (and
    the columns that differ) where one row explains its chunk.
    """
    return verify_digest(engine, expected, deadline=Deadline(timeout_s))


def cutover_standing(engine: Engine, namespace: str) -> dict[str, Any]:
    """Read only: where the tenant stands (:class:`nexus_cutover.standing.Standing` as JSON), for a fleet rollout
    deciding whether to run it again and for ``plan``. ``cut_over`` is the one definition
    (:func:`nexus_cutover.standing.is_cut_over`); ``old_work_above_cutoff``: one entry per pack that holds some,
    a stop needing a separately reviewed recovery decision, never "cut over"."""

    return read_standing(engine, namespace).as_json()

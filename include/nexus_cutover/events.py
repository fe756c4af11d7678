"""The typed events a run emits, whichever path runs it: what happened, never who listens.

A run (an Airflow task, ``nexus-cutover run``, a single-step command, the lifecycle entrypoint, a Field History
stage) emits :class:`Event` s through its :class:`~nexus_cutover.recording.Recorder`; the sinks subscribed there
(the delivery ledger, the metrics) each take what is theirs. What a step's result *means* as events is the step's
own (its :attr:`~nexus_cutover.transition.Step.records`, next to its body); the events every step has -- it passed,
it stopped, a person was shown evidence, a person answered -- are made here.

Invariants:

* A kind in :data:`LEDGER_KINDS` is written to the delivery ledger (in that order within a step); the others
  (:data:`STEP_PASSED`, :data:`DRAIN_LOOKED`) carry figures only.
* An event holds what a reviewer or a figure needs: ids, outcomes, digests, the reasons a person reads. Never a
  secret, never a DSN.
* Light to import (standard library only).
"""

from __future__ import annotations

import datetime as dt
import hashlib
import json
from dataclasses import dataclass, field
from typing import Any

FENCE_ARMED, FENCE_REUSED, FENCE_ADOPTED, FENCE_RELEASED = "fence_armed", "fence_reused", "fence_adopted", "fence_released"
DRAIN_DONE = "drain_done"
#: The writer-stop controller's answer (issue 50): what it stopped, when, its exit code or HTTP status, its output.
WRITERS_STOPPED = "writers_stopped_by_controller"
EVIDENCE_SHOWN, ANSWER = "evidence_shown", "answer"
DIGEST_TAKEN, DIGEST_VERIFIED = "digest_taken", "digest_verified"
CHECKPOINT, HOST_STARTED = "checkpoint", "host_started"
STOPPED = "stopped"
WAVE_ASKED, WAVE_ANSWER = "wave_asked", "wave_answer"
GATE_PASSED = "gate_passed"
#: The cutover fence released without a cutover, before any checkpoint (the back-out: :mod:`.projection.back_out`).
BACKED_OUT = "backed_out"

#: Every kind the delivery ledger records, in the order a run records them (a step's events are ranked so too).
LEDGER_KINDS = (FENCE_ARMED, FENCE_REUSED, FENCE_ADOPTED, DRAIN_DONE, WRITERS_STOPPED, EVIDENCE_SHOWN, WAVE_ASKED, ANSWER, WAVE_ANSWER,
                DIGEST_TAKEN, CHECKPOINT, HOST_STARTED, FENCE_RELEASED, BACKED_OUT, DIGEST_VERIFIED, GATE_PASSED, STOPPED)

#: A step passed (its duration and lock wait are figures); not a ledger row: its own events say what it did.
STEP_PASSED = "step_passed"
#: One look of a drain wait (remaining, rate, ETA: figures only).
DRAIN_LOOKED = "drain_looked"
#: The fence is armed next (the pre-arm wait passed): a heads-up's notice, not a ledger row.
PAUSE_AHEAD = "pause_ahead"
#: A run of the whole transition ended (``outcome``: ``cut_over``): what a notice tells; each step recorded its own.
RUN_ENDED = "run_ended"


@dataclass(frozen=True)
class Event:
    """One thing that happened in a step. ``tenant`` is set only when it is not the run's (a wave's question names
    each of its tenants); ``at`` only when it happened before it was emitted (an answer's time)."""

    kind: str
    step: str
    outcome: str | None = None
    actor: str | None = None
    holder: str | None = None
    digest: str | None = None
    pack: str | None = None
    cutoff: int | None = None
    reason: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)
    tenant: str | None = None
    at: dt.datetime | None = None
    #: A step's duration and the time it waited for locks (passed and stopped events), in seconds.
    seconds: float | None = None
    lock_wait_s: float | None = None
    #: Why a stopped step failed (:data:`nexus_cutover.metrics.FAILURE_REASONS`).
    failure: str | None = None

    @property
    def recorded(self) -> bool:
        """Whether the delivery ledger keeps this event."""
        return self.kind in LEDGER_KINDS


def digest_of(value: Any) -> str:
    """``sha256:<hex>`` of ``value`` in its canonical JSON (sorted keys): the digest of evidence shown to a person."""
    text = value if isinstance(value, str) else json.dumps(value, sort_keys=True, default=str, separators=(",", ":"))
    return "sha256:" + hashlib.sha256(text.encode("utf-8")).hexdigest()


def time_of(value: Any) -> dt.datetime | None:
    """An answer's time as a person's tool reported it (a datetime or ISO text; naive is UTC), or None."""
    if value in (None, "", "None"):
        return None
    if isinstance(value, str):
        try:
            value = dt.datetime.fromisoformat(value.replace("Z", "+00:00"))
        except ValueError:
            return None
    return value if value.tzinfo else value.replace(tzinfo=dt.UTC)


# -- the events every step has -----------------------------------------------------------------------------------

def passed(step: str, *, seconds: float | None = None, lock_wait_s: float | None = None) -> Event:
    return Event(STEP_PASSED, step, outcome="passed", seconds=seconds, lock_wait_s=lock_wait_s)


def run_ended(outcome: str, *, checkpoints: dict[str, Any], admission_pause_s: float | None) -> Event:
    """A run of every declared step ended (``cut_over``), with its cutoffs per pack and its admission pause."""
    return Event(RUN_ENDED, "", outcome=outcome,
                 detail={"checkpoints": checkpoints, "admission_pause_s": admission_pause_s})


def stopped(step: str, reason: str, *, error: str | None = None, failure: str = "error", seconds: float | None = None,
            lock_wait_s: float | None = None) -> Event:
    """A step that stopped, refused or failed: its reason as the person reads it (the exception's text)."""
    return Event(STOPPED, step, outcome="stopped", reason=(reason or error or "the step failed")[:4000],
                 detail={"error": error} if error else {}, failure=failure, seconds=seconds, lock_wait_s=lock_wait_s)


#: The most characters of evidence a ledger row keeps (its JSON): the writer table of a tenant with a few hundred
#: registered writers fits; beyond it the rows kept are said (kept of total), and the digest is always of the whole.
EVIDENCE_KEPT_CHARS = 32_000
#: The columns of the writer table a reviewer reads (what the question's page shows).
WRITER_COLUMNS = ("process_id", "role", "binary_version", "state", "last_heartbeat_at", "heartbeat_age_s", "stopped_at")


def kept_evidence(shown: Any, limit: int = EVIDENCE_KEPT_CHARS) -> dict[str, Any]:
    """What a ledger row keeps of the evidence shown to a person, bounded in size: the writer table as shown (its
    columns, as many rows as fit in ``limit`` characters, ``rows_kept`` of ``rows_total``) and the evidence's other
    facts; a question whose evidence is text keeps its first ``limit`` characters. The row's ``digest`` is always
    of the whole evidence, so a reviewer can check a kept copy against the original."""
    if isinstance(shown, dict):
        rows = [{k: p.get(k) for k in WRITER_COLUMNS} for p in shown.get("processes") or [] if isinstance(p, dict)]
        facts = {k: v for k, v in shown.items() if k != "processes"}
        kept: list[dict[str, Any]] = []
        size = len(json.dumps({**facts, "processes": [], "rows_kept": len(rows), "rows_total": len(rows)}, default=str))
        for row in rows:
            size += len(json.dumps(row, default=str)) + 2
            if size > limit:
                break
            kept.append(row)
        return {**facts, "processes": kept, "rows_kept": len(kept), "rows_total": len(rows)}
    if shown is None:
        return {}
    text = str(shown)
    return {"text": text[:limit], "chars_kept": min(len(text), limit), "chars_total": len(text)}


def evidence_shown(step: str, subject: str, shown: Any) -> Event:
    """A person is asked ``subject``, shown ``shown``: the ledger keeps the evidence itself, bounded
    (:func:`kept_evidence`), and the digest of the whole."""
    checked_at = shown.get("checked_at") if isinstance(shown, dict) else None
    return Event(EVIDENCE_SHOWN, step, outcome="asked", digest=digest_of(shown), reason=subject,
                 detail={**({"evidence_checked_at": checked_at} if checked_at else {}),
                         "evidence": kept_evidence(shown)})


def answer(step: str, outcome: str, *, who: str | None, at: Any = None, shown: Any = None, reason: str | None = None,
           **detail: Any) -> Event:
    """A person's answer (``outcome``: confirmed, rejected, refused, timed out, ...), on the evidence ``shown``."""
    checked_at = shown.get("checked_at") if isinstance(shown, dict) else None
    return Event(ANSWER, step, outcome=outcome, actor=who, at=time_of(at), digest=digest_of(shown) if shown else None,
                 reason=reason, detail={**detail, **({"evidence_checked_at": checked_at} if checked_at else {})})


def drain_looked(remaining: int, rate_per_min: float | None, eta_s: float | None, *, step: str = "") -> Event:
    """One look of a drain wait: what remains, the rate it drains at (None before it is measured), the ETA."""
    return Event(DRAIN_LOOKED, step, detail={"remaining": remaining, "rate_per_min": rate_per_min, "eta_s": eta_s})

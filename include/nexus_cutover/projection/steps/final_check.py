"""``final_old_writer_check``: no old writer after the release, no history row changed since the digest (also
``nexus-cutover verify``); and what the proof means as events.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from ... import events as E
from ... import tx
from ...clock import utcnow
from ...events import Event
from ...transition import Outcome, StepResult, Verdict
from .. import actions, cutover_fence
from ..digest.model import HistoryDigest
from ..transition import CUTOVER
from .context import RETURN, CutoverRun, _each, _judged, _quiet


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


def complete_text(value: dict[str, Any]) -> str:
    """The line a person reads when the cutover is complete: its cutoffs, the release and the verified digest."""
    cutoffs = ", ".join(f"{pack} {cutoff}" for pack, cutoff in (value.get("cutoffs") or {}).items()) or "none"
    digest = value.get("history_digest") or {}
    return (f"cutover complete for {value.get('tenant')}: cutoffs (LegacyMaxOrdinal per pack) {cutoffs}; fence "
            f"{value.get('fence_id')} released at {value.get('released_at')}; history digest {digest.get('hash', '-')} "
            f"verified ({_rows_text(digest.get('rows'))})")


def _rows_text(rows: Any) -> str:
    if isinstance(rows, dict):
        return ", ".join(f"{table} {count} row(s)" for table, count in rows.items()) or "no rows"
    return f"{rows} row(s)" if rows is not None else "rows not counted"


def _cutoffs(run: CutoverRun) -> dict[str, int | None]:
    found = run.earlier("audit_and_checkpoint", RETURN) or []
    return {r["pack_install_id"]: r.get("legacy_max_ordinal") for r in _each(found)}


def _released_at(run: CutoverRun) -> dt.datetime | StepResult:
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


def events(step: str, r: dict) -> list[Event]:
    """The history digest verified against the rows after the release (or found changed)."""
    history = r.get("history_digest") or {}
    if not history:
        return []
    return [Event(E.DIGEST_VERIFIED, step, outcome="verified" if history.get("verified") else "not verified",
                  digest=str(history.get("hash")),
                  detail={"rows": history.get("rows"), "cutoffs": r.get("cutoffs"), "released_at": r.get("released_at")})]

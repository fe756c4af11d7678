"""``history_digest``: the digest of every history Event / WorkItem row, and what taking it means as events."""

from __future__ import annotations

from ... import events as E
from ...events import Event
from ...transition import StepResult
from .. import actions
from .context import CutoverRun, _once_the_schema_exists, _schema_a_dry_run_lacks


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


def events(step: str, r: dict) -> list[Event]:
    """The digest taken: its hash, rows, chunks and time (its rows per second is a figure)."""
    if not r.get("hash"):
        return []
    return [Event(E.DIGEST_TAKEN, step, outcome="taken", digest=str(r["hash"]),
                  detail={k: r.get(k) for k in ("rows", "chunks", "cutoffs", "taken_at", "seconds")})]

"""``audit_and_checkpoint``: one pack's audit and one-time ``LegacyMaxOrdinal``, and what it means as events."""

from __future__ import annotations

from ... import events as E
from ...events import Event
from ...transition import StepResult
from .. import actions
from .context import CutoverRun, _judged, _once_the_schema_exists, _schema_a_dry_run_lacks


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


def events(step: str, r: dict) -> list[Event]:
    """One pack's checkpoint: written, already written, refused (with its cutoff and who wrote it)."""
    cutoff = r.get("legacy_max_ordinal")
    return [Event(E.CHECKPOINT, step, outcome=r.get("outcome"), pack=r.get("pack_install_id"),
                  cutoff=int(cutoff) if cutoff is not None else None, holder=r.get("written_by"))]

"""What the delivery engineer does next when a cutover step stops: one text per step, the only copy.

``docs/runbook.md``'s task table shows the same texts in its last column (a
test keeps them equal); the Airflow tasks append the step's text to every stop
message, and the status view and the CLI can show it.
"""

from __future__ import annotations

NEXT_ACTION: dict[str, str] = {
    "resolve_packs": (
        "fix the form or the connection; trigger again. A tenant another run or command holds: the message names "
        "the holder and how to take it over (`adopt`)"
    ),
    "apply_schema": (
        "land the v2 handoff first, then clear the task"
    ),
    "arm_fence": (
        "active overrides: have L2 revoke them, then clear. Several cutover fences: have L2 release all but the one "
        "of the cutover in progress, then clear. A held tenant: the message names the holder and how to take it over"
    ),
    "wait_for_drain": (
        "read the report (grouped by cause, with WorkIds). Resolve with the old runtime or a separately "
        "reviewed operational decision. **Never change WorkItem status to proceed.** Clear the task"
    ),
    "check_old_writers": (
        "stop it; clear the task"
    ),
    "confirm_writers_stopped": (
        "confirm only when no old binary can resume; the database cannot prove it. If a writer came back: "
        "stop it, clear `check_old_writers`"
    ),
    "history_digest": (
        "it is read only and wrote nothing: a timeout or a lost connection, clear the task; a missing column, "
        "clear `apply_schema` first"
    ),
    "audit_and_checkpoint": (
        "a fence finding: clear `arm_fence` (or have L2 revoke the override), then this task; a refusal needs"
        " a **separately reviewed recovery decision**; the cutoff is never used to hide it. Do not mark input"
        " processed/skipped, delete it, raise the cutoff or replay a source to pass. A lock timeout: clear "
        "and rerun"
    ),
    "start_new_host": (
        "fix the host, clear the task"
    ),
    "verify_readiness": (
        "check the host's log; clear"
    ),
    "resume_admission": (
        "check the new host's log, then clear `verify_readiness`; a fence held by another run is that run's "
        "to release"
    ),
    "final_old_writer_check": (
        "**do not restart an old writer after this point**: stop it and review what it admitted. A history "
        "difference names the rows changed since the digest: stop whatever changed them and review those rows "
        "against the tenant's backup; nothing here rewrites them"
    ),
}


def next_action(step: str) -> str | None:
    """The runbook's next action for ``step`` (a task id of the cutover DAG), as plain text; None if unknown."""
    text = NEXT_ACTION.get(step)
    return None if text is None else text.replace("**", "").replace("`", "")

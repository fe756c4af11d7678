"""What a rollout tells a person (issue 38, item 1): its wave's question, and its end (with a halt or a cancel).

Invariants (the channel, the redaction and the sending are :mod:`nexus_airflow.notify`'s):

* A wave's question is one message naming the tenants it asks for and those not in it (late, or asking on their
  own), with the link to that question's Required-actions page: never one per tenant.
* A rollout ends with one message, from its ``summary`` task: succeeded, halted (past the failure budget, after
  wave N), cancelled, failed (a tenant did not succeed, the form was refused) or a preflight's table, with the
  summary a person needs: done, failed with the step and reason, not run with why, skipped with why. A halt or
  a cancel ends the rollout at once (the later waves are skipped in the same scheduler pass), so its end message
  is the halt's: one message, not two.
* Never raises: a message that cannot be built or sent is logged, the task's outcome is its own.
"""

from __future__ import annotations

import logging
from typing import Any

from nexus_airflow.notify import NEEDS_CONFIRMATION, base_url, question_link, rollouts_link, run_link, send

log = logging.getLogger("nexus.rollout")


def _links(context, *, question: bool = False) -> list[str]:
    base, ti = base_url(), context.get("ti")
    if not base or ti is None:
        return []
    found = [f"answer it: {link}"] if question and (link := question_link(context)) else []
    return [*found, f"the rollout run: {run_link(base, ti.dag_id, ti.run_id)}", f"rollouts: {rollouts_link(base)}"]


def wave_question(context, wave: int, rows: list[dict[str, Any]], timeout_s: int) -> None:
    """The wave's question is parked: one message naming its ready tenants and those not in it."""
    from nexus_cutover.notices import WORDS, Message

    try:
        ready = [r["tenant"] for r in rows if r.get("kind") == "ready"]
        others = [f"{r['tenant']} ({r['status']})" for r in rows if r.get("kind") != "ready"]
        facts = [("event", WORDS[NEEDS_CONFIRMATION]), ("rollout", context["run_id"]), ("wave", str(wave)),
                 ("tenants in this question", ", ".join(ready)),
                 *([("not in it", "; ".join(others))] if others else []), ("answer within", f"{timeout_s} s")]
        text = ("Confirm that every old writer of every tenant in this question is stopped. One answer for the wave; "
                "each tenant re-checks its own registry when it arrives. Reject (or no answer in time) fails these "
                "tenants: cutover not performed, their fences stay armed.")
        send(context, Message(f"[nexus] {WORDS[NEEDS_CONFIRMATION]}: rollout wave {wave}, {len(ready)} tenant(s): "
                              f"{', '.join(ready)}", facts, text, _links(context, question=True)), log)
    except Exception as exc:  # noqa: BLE001 - the question is asked either way
        log.error("the wave question's notification could not be built: %s: %s", type(exc).__name__, exc)


def ended(outcome: str, headline: str, lines: list[str], facts: list[tuple[str, str]] | None = None) -> None:
    """The rollout's end (``outcome``: SUCCEEDED, HALTED, CANCELLED, FAILED, PREFLIGHT DONE), its summary lines."""
    from nexus_cutover.notices import Message

    try:
        from airflow.sdk import get_current_context

        context = get_current_context()
        run_id = context["run_id"]
        message = Message(f"[nexus] ROLLOUT {outcome}: {headline}",
                          [("event", f"ROLLOUT {outcome}"), ("rollout", run_id), *(facts or [])],
                          "\n".join(lines), _links(context))
        send(context, message, log)
    except Exception as exc:  # noqa: BLE001 - the summary's outcome is its own
        log.error("the rollout's end notification could not be built: %s: %s", type(exc).__name__, exc)


def summary_facts(tenants: dict[str, Any], skipped: dict[str, str]) -> list[tuple[str, str]]:
    """Done, failed (step: reason), not run (why), skipped (why): what a person reads first."""
    def named(state: str, detail) -> str:
        return "; ".join(f"{t}{detail(o)}" for t, o in tenants.items() if o["state"] == state) or "none"

    return [("done", named("success", lambda o: "")),
            ("failed", named("failed", lambda o: f" ({o.get('task')}: {o.get('reason')})")),
            ("not run", named("not run", lambda o: f" ({o.get('reason')})")),
            ("skipped", "; ".join(f"{t} ({why})" for t, why in skipped.items()) or "none")]

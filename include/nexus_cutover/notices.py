"""Notices: what a person is told of a run, whichever path runs it, and the sink that tells them.

The words of every notice live here: its subject (the event's word, the tenant, where it happened), its ``key: value``
facts, its text, a stop's reason summarized from its report. Where a notice goes is the caller's: Airflow sends it
through the run's notify connection (``nexus_airflow.notify``: SMTP or a Slack webhook), the command line through
``NEXUS_NOTIFY_WEBHOOK`` (:class:`WebhookSender`). :class:`NoticeSink` turns a run's events into notices, so a
stopped ``nexus-cutover run`` tells its channel as a stopped DAG run does.

Invariants:

* A notice never carries a DSN or a password: URLs with credentials are masked (:func:`scrub`), each fact is
  bounded (:data:`MAX_REASON` characters).
* Sending never fails a step: a sink's failure is logged by the recorder and swallowed.
* Light to import (standard library only).
"""

from __future__ import annotations

import json
import logging
import re
import urllib.request
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from . import events as E

log = logging.getLogger(__name__)

FAILURE = "failure"
NEEDS_CONFIRMATION = "needs_confirmation"
SUCCESS = "success"
FENCE_WAITING = "fence_waiting"
PAUSE_AHEAD = "pause_ahead"
RESUMED = "resumed"
BACKED_OUT = "backed_out"
#: The words of each event in a notice's subject.
WORDS = {FAILURE: "FAILED", NEEDS_CONFIRMATION: "NEEDS CONFIRMATION", SUCCESS: "CUT OVER",
         FENCE_WAITING: "FENCED AND WAITING", PAUSE_AHEAD: "PAUSE AHEAD", RESUMED: "ADMISSION RESUMED",
         BACKED_OUT: "BACKED OUT"}
#: What a person does next, by event.
TEXTS = {
    FAILURE: "Read the task log and its XCom `report` (runbook: docs/runbook.md).",
    NEEDS_CONFIRMATION: "Answer it in Airflow (the link below; Browse -> Required actions lists it too); "
                        "no answer in time ends the run failed.",
    SUCCESS: "The tenant is cut over: checkpoints written, admission resumed, the history digest verified.",
    PAUSE_AHEAD: "Nothing to do now: the tenant's new work waits (nothing is lost) until admission resumes; a notice "
                 "then says how long the pause lasted.",
    RESUMED: "The new host admits the tenant's work again; the run goes on to its final check.",
    BACKED_OUT: "No cutover: the old runtime admits the tenant's work again. Restart the old writers you stopped; a "
                "later cutover starts with a new run.",
}
#: The same, for a run of the command line (no task log, no XCom: its own output and report).
COMMAND_TEXTS = {**TEXTS, FAILURE: "Read the command's output and its report (runbook: docs/runbook.md)."}
MAX_REASON = 2000
_CREDENTIALS_IN_URL = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^:/@\s]*:)[^@\s]*@")


def scrub(text: str) -> str:
    """``text`` with the password of any ``scheme://user:password@`` URL replaced by ``***``."""
    return _CREDENTIALS_IN_URL.sub(r"\1***@", text)


@dataclass(frozen=True)
class Message:
    """One event as a person reads it: a subject, ``key: value`` lines, free text and the links."""

    subject: str
    facts: list[tuple[str, str]] = field(default_factory=list)
    text: str = ""
    links: list[str] = field(default_factory=list)

    @property
    def body(self) -> str:
        lines = [f"{k}: {scrub(str(v))[:MAX_REASON]}" for k, v in self.facts]
        return "\n".join([*lines, *([""] + [scrub(self.text)] if self.text else []),
                          *([""] + self.links if self.links else [])])


def tenant_message(event: str, *, tenant: str, dag_id: str, run_id: str, task: str, reason: str,
                   task_detail: str | None = None, text: str | None = None, links: Sequence[str] = (),
                   source: str = "dag") -> Message:
    """A tenant run's event: the subject names the event, the tenant and the step (``dag_id.task``: a DAG's task,
    or the command and its step); the body where (``source``: ``dag`` or ``command``), the run and the reason."""
    what = WORDS[event]
    facts = [("event", what), ("tenant", tenant), (source, dag_id), ("run", run_id), ("task", task_detail or task),
             ("reason", reason)]
    return Message(f"[nexus] {what}: tenant {tenant}, {dag_id}.{task}", facts, TEXTS[event] if text is None else text,
                   list(links))


# -- a stop's reason, from its report ---------------------------------------------------------------------------------

def _blockers(report: dict[str, Any]) -> str:
    parts = []
    for cause, items in report["blockers"].items():
        ids = [str(i.get("work_id")) for i in items[:5] if isinstance(i, dict)]
        more = f" +{len(items) - len(ids)} more" if len(items) > len(ids) else ""
        parts.append(f"{cause}: {len(items)} ({', '.join(ids)}{more})")
    return "blockers: " + "; ".join(parts)


def report_summary(report: Any) -> str:
    """A stop's report in one line: a drain's blockers by cause, a gate's findings by kind, else the report."""
    if isinstance(report, dict) and isinstance(report.get("blockers"), dict):
        return _blockers(report)
    if isinstance(report, dict) and isinstance(report.get("findings"), list):
        kinds: dict[str, int] = {}
        for f in report["findings"]:
            kind = f.get("finding", "?") if isinstance(f, dict) else str(f)
            kinds[kind] = kinds.get(kind, 0) + 1
        return "findings: " + ", ".join(f"{k} x{n}" for k, n in kinds.items())
    if isinstance(report, dict):  # the stop's message is already the reason: the rest of the report, not it again
        report = {k: v for k, v in report.items() if k != "message"}
    return "report: " + json.dumps(report, default=str)[:500]


def decided_by_rollout(report: Any) -> bool:
    """Whether a tenant's stop is its rollout's own decision (its wave's question rejected, unanswered or refused,
    the rollout cancelled): the rollout's message reports it, with every tenant it stopped."""
    if not isinstance(report, dict):
        return False
    answer = report.get("wave_answer")
    return bool(report.get("cancelled_by_rollout")) or (isinstance(answer, dict) and answer.get("answer") != "approved")


def pause_ahead_facts(detail: dict[str, Any]) -> str:
    """The heads-up's reason: the pause begins in seconds (the fence is armed next), and what it is expected to hold."""
    eta, remaining = detail.get("eta_s"), detail.get("remaining") or 0
    residual = ("no residual drain" if not remaining else
                f"about {eta:.0f} s of residual drain ({remaining} old projection WorkItem(s))"
                if isinstance(eta, (int, float)) else f"a residual drain of {remaining} old projection WorkItem(s) "
                "(its rate not measured yet)")
    return (f"admission is paused in a few seconds (the fence is armed next) for {residual}, then the old writers' "
            "stop and its confirmation, the checkpoint and the new host's start")


def resumed_facts(detail: dict[str, Any]) -> str:
    """The release's reason: how long admission was paused, from the fence row's own times."""
    pause = detail.get("admission_pause_s")
    return (f"admission paused {pause:.1f} s" if isinstance(pause, (int, float)) else "admission resumed") + (
        f" (fence {detail.get('fence_id')}: armed {detail.get('armed_at')}, released {detail.get('released_at')})")


def backed_out_facts(detail: dict[str, Any]) -> str:
    """The back-out's reason: which fence was released without a cutover, whose it was, the pause it ended."""
    pause = detail.get("admission_pause_s")
    return (f"cutover fence {detail.get('fence_id')} (armed {detail.get('armed_at')} by {detail.get('previous_holder')}) "
            f"released {detail.get('released_at')} without a cutover, before any checkpoint; admission paused "
            + (f"{pause:.1f} s" if isinstance(pause, (int, float)) else "-"))


def cut_over_facts(cutoffs: dict[str, Any], pause_s: Any) -> str:
    """A successful run's facts: each pack's cutoff and the admission pause its release recorded."""
    listed = ", ".join(f"{pack} {cutoff}" for pack, cutoff in cutoffs.items()) or "none"
    return f"checkpoints (LegacyMaxOrdinal per pack): {listed}; admission paused " + (
        f"{pause_s:.1f} s" if isinstance(pause_s, (int, float)) else "-")


# -- the sink ---------------------------------------------------------------------------------------------------------

class NoticeSink:
    """A run's events as notices, through ``send(message)``: the pause ahead (before the fence is armed), admission
    resumed (with the pause it lasted), a back-out (the fence released without a cutover), a step that stopped
    (why), a run that cut its tenant over (its cutoffs and pause). ``kinds``: the notices this sink sends (default:
    all). A DAG's recorder sends the first three only: its task failures are told by Airflow's failure callback
    (which also sees the failures no step records: a killed worker, a task timeout) and its cut-over by its last
    task's success callback. ``source``: what the origin's name is (``command`` or ``dag``)."""

    ALL = (PAUSE_AHEAD, RESUMED, BACKED_OUT, FAILURE, SUCCESS)

    def __init__(self, send: Callable[[Message], None], *, kinds: Sequence[str] = ALL, source: str = "command",
                 texts: dict[str, str] | None = None) -> None:
        self.send, self.kinds, self.source = send, tuple(kinds), source
        self.texts = texts or (COMMAND_TEXTS if source == "command" else TEXTS)

    def notice_of(self, event: E.Event) -> tuple[str, str] | None:
        """The notice an event means (its kind and reason), or None."""
        if event.kind == E.PAUSE_AHEAD:
            return PAUSE_AHEAD, pause_ahead_facts(event.detail)
        if event.kind == E.FENCE_RELEASED and event.outcome == "released":
            return RESUMED, resumed_facts(event.detail)
        if event.kind == E.BACKED_OUT and event.outcome == BACKED_OUT:
            return BACKED_OUT, backed_out_facts(event.detail)
        if event.kind == E.STOPPED:
            return FAILURE, str(event.reason or event.outcome or "stopped")
        if event.kind == E.RUN_ENDED and event.outcome == "cut_over":
            return SUCCESS, cut_over_facts(event.detail.get("checkpoints") or {}, event.detail.get("admission_pause_s"))
        return None

    def receive(self, origin, events: Sequence[E.Event]) -> None:
        for event in events:
            found = self.notice_of(event)
            if found is None or found[0] not in self.kinds:
                continue
            kind, reason = found
            self.send(tenant_message(kind, tenant=event.tenant or origin.tenant, dag_id=origin.dag_id,
                                     run_id=origin.run_id, task=event.step or "run", reason=reason,
                                     text=self.texts[kind], source=self.source))


class WebhookSender:
    """Sends a notice as JSON ``{"text": subject + body}`` to a Slack-compatible incoming webhook (``url``): the
    command line's channel (``NEXUS_NOTIFY_WEBHOOK``). A failed POST raises (the recorder logs it, the run goes on)."""

    def __init__(self, url: str, *, timeout_s: float = 10.0) -> None:
        self.url, self.timeout_s = url, timeout_s

    def __call__(self, message: Message) -> None:
        data = json.dumps({"text": f"*{message.subject}*\n{message.body}"}).encode()
        request = urllib.request.Request(self.url, data=data, headers={"Content-Type": "application/json"})
        with urllib.request.urlopen(request, timeout=self.timeout_s) as answer:  # noqa: S310 - the deployment's URL
            if not 200 <= answer.status < 300:
                raise RuntimeError(f"the notify webhook answered HTTP {answer.status}")
        log.info("notice sent: %s", message.subject)

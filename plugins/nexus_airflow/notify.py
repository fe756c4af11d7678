"""Notifications: every question, stop and end of a tenant run or a rollout reaches a person, with the link to click.

Invariants:

* Every event is written to the task log (a ``NOTIFY`` line), whether or not anything is sent.
* One channel setting for both DAG families (the cutover and Field History runs, and ``tenant_rollout``): the
  run's field ``notify_conn_id``, else the Airflow Variable ``nexus_notify_conn_id``; empty means log only. A
  rollout hands its ``notify_conn_id`` to every tenant run it starts, so one rollout speaks through one channel.
  The connection decides the channel, sent through Airflow's provider notifiers:

  - ``smtp``: :class:`~airflow.providers.smtp.notifications.smtp.SmtpNotifier`; host/port/login/password as
    usual; extras ``to`` (comma-separated recipients, required), ``from_email``, ``timeout``, ``disable_ssl``,
    ``disable_tls``.
  - ``slackwebhook``: :class:`~airflow.providers.slack.notifications.slack_webhook.SlackWebhookNotifier`
    (``apache-airflow-providers-slack``, in the ``airflow`` extra); the webhook token in the password.

* A send that fails (server unreachable, bad connection, unsupported type) is logged and swallowed: it never
  fails a task and never masks the task's own outcome.
* A message names the tenant (or the rollout and its tenants), the run, the step and a short reason; never a DSN
  or a password: URLs with credentials are masked (:func:`scrub`) and connections are referred to by id only.
  Each carries the pages a person opens (:func:`links`): the question's Required-actions page (Airflow's HITL
  link helper), the run, the tenant's row in the status view (or the rollouts page); none without
  ``[api] base_url``.
* The words are the domain's (:mod:`nexus_cutover.notices`, shared with the command line); the pause ahead and
  admission resumed are sent by the run's recorder (:func:`notice_sink`) when their step's end is recorded.
* One event, one message: a task's failure from ``on_failure_callback`` (once per failed try; the DAGs run with
  ``retries=0``); a question when its step parks, not while it waits; a wave's question is one message naming
  its tenants; a rollout's halt and its end one each; a tenant's stop that is the rollout's own decision (its
  wave rejected or unanswered, the rollout cancelled) is in the rollout's message, not one per tenant. Sensors
  never notify per poke.
* Light to import (DAG files import it at parse time): providers are imported only when sending.
"""

from __future__ import annotations

import contextlib
import html
import logging
from typing import TYPE_CHECKING, Any
from urllib.parse import quote, urlencode

from airflow.sdk import BaseNotifier

if TYPE_CHECKING:
    from nexus_cutover.notices import Message

# The event names of nexus_cutover.notices (tests/dags/test_notifications.py holds them equal): literals here, so a
# DAG file that names its notifier's event imports no domain module at parse time; the words are read when sending.
FAILURE = "failure"
NEEDS_CONFIRMATION = "needs_confirmation"
SUCCESS = "success"
FENCE_WAITING = "fence_waiting"

VARIABLE = "nexus_notify_conn_id"
#: The status view's own pages (the plugin's FastAPI app: ``plugins/nexus_status_plugin.py``'s URL prefix).
STATUS_PREFIX = "/nexus-status"


# -- links ---------------------------------------------------------------------------------------------------------

def base_url() -> str:
    """``[api] base_url`` without its trailing slash, or "" when it is not configured."""
    try:
        from airflow.sdk.configuration import conf

        return (conf.get("api", "base_url", fallback=None) or "").rstrip("/")
    except Exception:  # noqa: BLE001 - no configuration readable: no links
        return ""


def run_link(base: str, dag_id: str, run_id: str) -> str:
    return f"{base}/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def tenant_link(base: str, tenant: str) -> str:
    """The tenant's row in the status view (the page filtered to its name)."""
    return f"{base}{STATUS_PREFIX}/?{urlencode({'search': tenant})}"


def rollouts_link(base: str) -> str:
    """The rollouts page of the status view (the latest rollouts, their waves and tenants)."""
    return f"{base}{STATUS_PREFIX}/rollouts"


def question_link(context) -> str | None:
    """The Required-actions page of the question the context's task asks (Airflow's HITL link helper)."""
    from airflow.providers.standard.operators.hitl import HITLOperator

    base = base_url()
    if not base or not isinstance(context.get("task"), HITLOperator):
        return None
    return HITLOperator.generate_link_to_ui_from_context(context=context, base_url=base)


def links(context, *, question: bool = False, tenant: str | None = None) -> list[str]:
    """The pages a person opens from a message about the context's run: the question's Required-actions page
    (``question``), the run, the tenant's row in the status view (``tenant``); none without ``[api] base_url``.
    Never raises."""
    try:
        base, ti = base_url(), context.get("ti")
        if not base or ti is None:
            return []
        found = []
        if question and (link := question_link(context)):
            found.append(f"answer it: {link}")
        found.append(f"the run: {run_link(base, ti.dag_id, ti.run_id)}")
        if tenant:
            found.append(f"the tenant: {tenant_link(base, tenant)}")
        return found
    except Exception:  # noqa: BLE001 - a message without links is still sent
        return []


# -- the message and where it goes ----------------------------------------------------------------------------------

def channel_of(params: Any) -> str:
    """The connection id events of a run are sent through: its ``notify_conn_id``, else the Variable
    ``nexus_notify_conn_id``; "" (log only) when neither is set or the Variable cannot be read."""
    conn_id = (params or {}).get("notify_conn_id") or ""
    if conn_id:
        return str(conn_id)
    try:
        from airflow.sdk import Variable

        return Variable.get(VARIABLE, default="") or ""
    except Exception:  # noqa: BLE001 - no Variable backend reachable: log only
        return ""


def send(context, message: Message, log) -> bool:
    """Log ``message`` and send it through the run's channel (:func:`channel_of`); True when it was sent. Never
    raises (see the module invariants)."""
    body = message.body
    log.warning("NOTIFY %s\n%s", message.subject, body)
    conn_id = channel_of(context.get("params"))
    if not conn_id:
        log.info("notification logged only (no notify_conn_id param nor Variable %s)", VARIABLE)
        return False
    try:
        _deliver(conn_id, message.subject, body, context)
    except Exception as exc:  # noqa: BLE001 - a lost notification must never change the task outcome
        from nexus_cutover.notices import scrub

        log.error("notification NOT sent through connection %s: %s", conn_id, scrub(f"{type(exc).__name__}: {exc}"))
        return False
    log.info("notification sent through connection %s", conn_id)
    return True


def _slack_text(subject: str, body: str) -> str:
    """Slack mrkdwn: the subject bold, the body as lines (its links stay clickable), ``& < >`` escaped."""
    def esc(s: str) -> str:
        return s.replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")

    return f"*{esc(subject)}*\n{esc(body)}"


def _deliver(conn_id: str, subject: str, body: str, context) -> None:
    from airflow.sdk import BaseHook

    conn = BaseHook.get_connection(conn_id)
    if conn.conn_type == "smtp":
        from airflow.providers.smtp.notifications.smtp import SmtpNotifier

        extra = conn.extra_dejson
        to = [a.strip() for a in str(extra.get("to") or "").split(",") if a.strip()]
        if not to:
            raise ValueError(f"smtp connection {conn_id} has no recipients: set its extra 'to' (comma-separated)")
        notifier = SmtpNotifier(to=to, from_email=extra.get("from_email") or "nexus-cutover@localhost",
                                subject=subject, html_content=f"<pre>{html.escape(body)}</pre>", smtp_conn_id=conn_id)
    elif conn.conn_type == "slackwebhook":
        try:
            from airflow.providers.slack.notifications.slack_webhook import SlackWebhookNotifier
        except ImportError as exc:
            raise RuntimeError("a slackwebhook connection needs apache-airflow-providers-slack installed") from exc
        notifier = SlackWebhookNotifier(slack_webhook_conn_id=conn_id, text=_slack_text(subject, body))
    else:
        raise ValueError(f"connection type {conn.conn_type!r} is not a notification channel: use smtp or "
                         "slackwebhook")
    # notify(), not __call__: the text is the project's, already final; rendering it as a template would let a
    # stop reason's braces or a tenant's data be evaluated.
    notifier.notify(context)


# -- a tenant run's events -------------------------------------------------------------------------------------------

def _cut_over(ti) -> str:
    """A successful run's facts: each pack's cutoff and the admission pause its release recorded."""
    from nexus_airflow import results
    from nexus_cutover.notices import cut_over_facts

    try:
        released = results.release(ti) or {}
        return cut_over_facts(results.checkpoints(ti), released.get("admission_pause_s"))
    except Exception:  # noqa: BLE001 - the message is sent without them
        return "cut over (read the run's XComs for its checkpoints)"


def _cut_over_before(ti) -> str | None:
    """:func:`nexus_airflow.results.cut_over_before` (None when it cannot be read: the notice is then sent)."""
    from nexus_airflow import results

    try:
        return results.cut_over_before(ti) if ti is not None else None
    except Exception:  # noqa: BLE001 - a notice is never lost to a failed read
        return None


def _task_label(ti) -> str:
    map_index = getattr(ti, "map_index", -1)
    return ti.task_id if map_index is None or map_index < 0 else f"{ti.task_id}[{map_index}]"


def tenant_message(context, event: str, reason: str, text: str, *, question: bool = False) -> Message:
    """A tenant run's event (:func:`nexus_cutover.notices.tenant_message`) from the task's context, with its links."""
    from nexus_cutover import notices

    ti = context.get("ti")
    tenant = (context.get("params") or {}).get("tenant", "?")
    dag_id = getattr(ti, "dag_id", None) or getattr(context.get("dag"), "dag_id", "?")
    task = _task_label(ti) if ti is not None else "?"
    return notices.tenant_message(event, tenant=tenant, dag_id=dag_id, run_id=context.get("run_id", "?"), task=task,
                                  task_detail=f"{task} (try {getattr(ti, 'try_number', '?')})", reason=reason,
                                  text=text, links=links(context, question=question, tenant=tenant))


class CutoverNotifier(BaseNotifier):
    """Log, and send through the run's channel, one event of a tenant run (see module invariants)."""

    def __init__(self, event: str = FAILURE, reason: str | None = None) -> None:
        super().__init__()
        self.event = event
        self.reason = reason

    def _report(self, context) -> Any:
        ti = context.get("ti")
        try:
            return ti.xcom_pull(task_ids=ti.task_id, key="report", map_indexes=ti.map_index) if ti else None
        except Exception:  # noqa: BLE001 - the report is a bonus; the exception is the reason
            return None

    def reason_of(self, context) -> str:
        if self.reason:
            return self.reason
        if self.event == SUCCESS:
            return _cut_over(context.get("ti"))
        parts = []
        exc = context.get("exception")
        if exc is not None:
            parts.append(str(exc) or type(exc).__name__)
        if report := self._report(context):
            from nexus_cutover.notices import report_summary

            summary = report_summary(report)
            parts = [p for p in parts if p not in summary] + [summary]  # a report that repeats the exception: once
        return " | ".join(parts) or "no reason recorded: read the task log"

    def message(self, context) -> Message:
        """The event as a person reads it; plain text, credentials scrubbed, bounded."""
        from nexus_cutover import notices

        text = notices.TEXTS[self.event]
        return tenant_message(context, self.event, self.reason_of(context), text,
                              question=self.event == NEEDS_CONFIRMATION)

    def notify(self, context) -> None:
        params = context.get("params") or {}
        if self.event == SUCCESS and params.get("dry_run"):
            return  # a dry run cuts nothing over
        if self.event == SUCCESS and (before := _cut_over_before(context.get("ti"))):
            self.log.info("no cut-over notice: %s", before)  # a rerun cut nothing over: nobody is told it did
            return
        from nexus_cutover.notices import decided_by_rollout

        if self.event == FAILURE and (params.get("rollout") or {}).get("run_id") and decided_by_rollout(
                self._report(context)):
            self.log.info("this stop is the rollout's decision: its message reports it, with the wave's tenants")
            return
        send(context, self.message(context), self.log)


def notice_sink(context):
    """The notices a run's events mean that no Airflow callback sends (the pause ahead, admission resumed with the
    pause it lasted, a back-out), through the run's channel with the run's links; the task's failure and its cut-over are
    sent by :class:`CutoverNotifier` from Airflow's callbacks."""
    from nexus_cutover import notices
    from nexus_cutover.notices import Message

    tenant = (context.get("params") or {}).get("tenant")

    def deliver(message: Message) -> None:
        send(context, Message(message.subject, message.facts, message.text, links(context, tenant=tenant)),
             logging.getLogger("airflow.task"))

    return notices.NoticeSink(deliver, kinds=(notices.PAUSE_AHEAD, notices.RESUMED, notices.BACKED_OUT), source="dag")


def notify_needs_confirmation(context, reason: str) -> None:
    """Tell the run's channel a HITL step is waiting for a person; never raises."""
    with contextlib.suppress(Exception):  # send() already swallows send errors; this guards message building
        CutoverNotifier(NEEDS_CONFIRMATION, reason)(context)

"""Notifications of the tenant DAGs: a task failed, or a person must confirm something.

Invariants:

* Every event is written to the task log, whether or not anything is sent.
* It is *sent* only when a connection id is configured: the run's param
  ``notify_conn_id``, else the Airflow Variable ``nexus_notify_conn_id``; empty
  means log only. The connection decides the channel:

  - ``smtp`` (``apache-airflow-providers-smtp``, installed with Airflow):
    host/port/login/password as usual; extras ``to`` (comma-separated
    recipients, required), ``from_email``, ``timeout``, ``disable_ssl``,
    ``disable_tls``.
  - ``slackwebhook``: only when ``apache-airflow-providers-slack`` is
    installed. It is not a dependency of this project; to enable it,
    ``pip install apache-airflow-providers-slack`` into the Airflow environment
    and create a Slack incoming-webhook connection.

* A send that fails (server unreachable, bad connection, unsupported type) is
  logged and swallowed: it never fails a task and never masks the task's own
  outcome.
* A message names the tenant, DAG, run, task and a short reason (the failure
  message, the drain report's blockers grouped by cause, the audit findings
  summary); never a DSN or a password: URLs with credentials are masked and
  connections are referred to by id only.
* One event, one message: failures come from ``on_failure_callback`` (called
  once per failed try; the DAGs run with ``retries=0``), and a confirmation
  request is sent when a HITL step parks, not while it waits. Sensors never
  notify per poke: a stuck drain ends the sensor, which fails once.
* Light to import (DAG files import it at parse time): providers are imported
  only when sending.
"""

from __future__ import annotations

import contextlib
import html
import json
import re
from typing import Any

from airflow.sdk import BaseNotifier

FAILURE = "failure"
NEEDS_CONFIRMATION = "needs_confirmation"
VARIABLE = "nexus_notify_conn_id"
MAX_REASON = 2000
_CREDENTIALS_IN_URL = re.compile(r"(\b[a-zA-Z][\w+.-]*://[^:/@\s]*:)[^@\s]*@")


def scrub(text: str) -> str:
    """``text`` with the password of any ``scheme://user:password@`` URL replaced by ``***``."""
    return _CREDENTIALS_IN_URL.sub(r"\1***@", text)


def _blockers(report: dict[str, Any]) -> str:
    parts = []
    for cause, items in report["blockers"].items():
        ids = [str(i.get("work_id")) for i in items[:5] if isinstance(i, dict)]
        more = f" +{len(items) - len(ids)} more" if len(items) > len(ids) else ""
        parts.append(f"{cause}: {len(items)} ({', '.join(ids)}{more})")
    return "blockers: " + "; ".join(parts)


def _report_summary(report: Any) -> str:
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


def links(context, event: str) -> list[str]:
    """The pages a person opens from the message: a question's Required-actions page (Airflow's own link helper),
    the run, and the status view's tenants page; none when ``[api] base_url`` is not configured. Never raises."""
    try:
        from urllib.parse import quote

        from airflow.sdk.configuration import conf

        base = (conf.get("api", "base_url", fallback=None) or "").rstrip("/")
        ti = context.get("ti")
        if not base or ti is None:
            return []
        found = []
        if event == NEEDS_CONFIRMATION:
            from airflow.providers.standard.operators.hitl import HITLOperator

            if isinstance(context.get("task"), HITLOperator):
                found.append(f"answer it: {HITLOperator.generate_link_to_ui_from_context(context=context, base_url=base)}")
        found.append(f"the run: {base}/dags/{quote(ti.dag_id, safe='')}/runs/{quote(ti.run_id, safe='')}")
        found.append(f"status view: {base}/plugin/nexus-tenants")
        return found
    except Exception:  # noqa: BLE001 - a message without links is still sent
        return []


def _task_label(ti) -> str:
    map_index = getattr(ti, "map_index", -1)
    return ti.task_id if map_index is None or map_index < 0 else f"{ti.task_id}[{map_index}]"


class CutoverNotifier(BaseNotifier):
    """Log, and send through the configured connection, one event of a tenant run (see module invariants)."""

    def __init__(self, event: str = FAILURE, reason: str | None = None) -> None:
        super().__init__()
        self.event = event
        self.reason = reason

    # -- what is said -------------------------------------------------------

    def reason_of(self, context) -> str:
        if self.reason:
            return self.reason
        parts = []
        exc = context.get("exception")
        if exc is not None:
            parts.append(str(exc) or type(exc).__name__)
        ti = context.get("ti")
        try:
            report = ti.xcom_pull(task_ids=ti.task_id, key="report", map_indexes=ti.map_index) if ti else None
        except Exception:  # noqa: BLE001 - the report is a bonus; the exception is the reason
            report = None
        if report:
            summary = _report_summary(report)
            parts = [p for p in parts if p not in summary] + [summary]  # a report that repeats the exception: once
        return " | ".join(parts) or "no reason recorded: read the task log"

    def message(self, context) -> tuple[str, str]:
        """(subject, body) of the event; plain text, credentials scrubbed, bounded."""
        ti = context.get("ti")
        params = context.get("params") or {}
        tenant = params.get("tenant", "?")
        dag_id = getattr(ti, "dag_id", None) or getattr(context.get("dag"), "dag_id", "?")
        task = _task_label(ti) if ti is not None else "?"
        what = "FAILED" if self.event == FAILURE else "NEEDS CONFIRMATION"
        reason = scrub(self.reason_of(context))[:MAX_REASON]
        subject = f"[nexus] {what}: tenant {tenant}, {dag_id}.{task}"
        body = "\n".join([
            f"event: {what}",
            f"tenant: {tenant}",
            f"dag: {dag_id}",
            f"run: {context.get('run_id', '?')}",
            f"task: {task} (try {getattr(ti, 'try_number', '?')})",
            f"reason: {reason}",
            "",
            "Read the task log and its XCom `report` (runbook: docs/runbook.md)."
            if self.event == FAILURE else
            "Answer it in Airflow: Browse -> Required actions (no answer in time ends the run failed).",
            *links(context, self.event),
        ])
        return subject, body

    # -- where it goes ------------------------------------------------------

    @staticmethod
    def conn_id_of(context) -> str:
        conn_id = (context.get("params") or {}).get("notify_conn_id") or ""
        if conn_id:
            return conn_id
        try:
            from airflow.sdk import Variable

            return Variable.get(VARIABLE, default="") or ""
        except Exception:  # noqa: BLE001 - no Variable backend reachable: log only
            return ""

    def notify(self, context) -> None:
        subject, body = self.message(context)
        self.log.warning("NOTIFY %s\n%s", subject, body)
        conn_id = self.conn_id_of(context)
        if not conn_id:
            self.log.info("notification logged only (no notify_conn_id param nor Variable %s)", VARIABLE)
            return
        try:
            self._send(conn_id, subject, body)
        except Exception as exc:  # noqa: BLE001 - a lost notification must never change the task outcome
            self.log.error("notification NOT sent through connection %s: %s", conn_id,
                           scrub(f"{type(exc).__name__}: {exc}"))
        else:
            self.log.info("notification sent through connection %s", conn_id)

    def _send(self, conn_id: str, subject: str, body: str) -> None:
        from airflow.sdk import BaseHook

        conn = BaseHook.get_connection(conn_id)
        if conn.conn_type == "smtp":
            _send_smtp(conn_id, conn.extra_dejson, subject, body)
        elif conn.conn_type == "slackwebhook":
            try:
                from airflow.providers.slack.hooks.slack_webhook import SlackWebhookHook
            except ImportError as exc:
                raise RuntimeError("a slackwebhook connection needs apache-airflow-providers-slack installed") from exc
            SlackWebhookHook(slack_webhook_conn_id=conn_id).send(text=f"*{subject}*\n```{body}```")
        else:
            raise ValueError(f"connection type {conn.conn_type!r} is not a notification channel: use smtp or "
                             "slackwebhook")


def _send_smtp(conn_id: str, extra: dict[str, Any], subject: str, body: str) -> None:
    from airflow.providers.smtp.hooks.smtp import SmtpHook

    to = [a.strip() for a in str(extra.get("to") or "").split(",") if a.strip()]
    if not to:
        raise ValueError(f"smtp connection {conn_id} has no recipients: set its extra 'to' (comma-separated)")
    with SmtpHook(smtp_conn_id=conn_id) as hook:
        hook.send_email_smtp(
            to=to, subject=subject, from_email=extra.get("from_email") or "nexus-cutover@localhost",
            html_content=f"<pre>{html.escape(body)}</pre>",
        )


def notify_needs_confirmation(context, reason: str) -> None:
    """Tell the configured channel a HITL step is waiting for a person; never raises."""
    with contextlib.suppress(Exception):  # notify() already swallows send errors; this guards message building
        CutoverNotifier(NEEDS_CONFIRMATION, reason)(context)

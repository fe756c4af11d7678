"""What the command line records: the same events as a DAG's run, to the same delivery ledger and metrics.

Every command that runs a declared step (``nexus-cutover run`` and each single-step command,
``connector-projection-cutover``, ``activate-pack``, the Field History stages) records through
:func:`command_recorder`'s :class:`~nexus_cutover.recording.Recorder`:

* the delivery ledger when ``NEXUS_LEDGER_DSN`` is set (the same database the Airflow connection ``nexus_ledger``
  names; an outage spools the events on this machine, as a worker does: :mod:`nexus_cutover.ledger_spool`);
* the metrics when ``NEXUS_STATSD=host:port`` is set (a StatsD listener: the names, tags and prefix a DAG's task
  sends; ``NEXUS_STATSD_PREFIX``, default ``airflow``);
* the notices when ``NEXUS_NOTIFY_WEBHOOK`` is set (a Slack-compatible incoming webhook: a stop with its reason, a
  cut-over with its cutoffs and pause: :class:`~nexus_cutover.notices.NoticeSink`, the words a DAG's run sends).

None set: nothing is recorded, as before. The run is the command's own: its DAG column is the program
(``nexus-cutover``, ``connector-projection-cutover``, ``field-history-eligibility``), its run id the holder
(``-holder``: give the same one to each step-by-step command of one cutover and they are one run; the default is
unique per invocation), its actor ``-actor`` (default the operating system's user). A dry run records nothing.
"""

from __future__ import annotations

import getpass
import os
from typing import Any

from .. import settings
from ..db import DSN_ENV_LEDGER
from ..metrics import StatsdSender
from ..notices import NoticeSink, WebhookSender
from ..recording import NOT_RECORDING, LedgerSink, MetricsSink, Origin, Recorder
from ..transition import Transition
from .common import mask_dsn_secrets

STATSD_ENV = settings.BY_NAME["statsd"].alias
STATSD_PREFIX_ENV = settings.BY_NAME["statsd_prefix"].alias
NOTIFY_WEBHOOK_ENV = settings.BY_NAME["notify_webhook"].alias


def default_actor() -> str:
    """The person running the command: the operating system's user (``-actor`` names another)."""
    try:
        return getpass.getuser()
    except Exception:  # noqa: BLE001 - no user database entry (a container's uid): still someone
        return f"uid:{os.getuid()}"


def command_recorder(args: Any, *, program: str, tenant: str | None, transition: Transition | None) -> Recorder:
    """The recorder of one command: ``args`` gives ``holder``, ``actor`` and ``dry_run`` (when the command has
    them); :data:`~nexus_cutover.recording.NOT_RECORDING` for a dry run, without a tenant, or with neither sink set."""
    if getattr(args, "dry_run", False) or not tenant:
        return NOT_RECORDING
    sinks: list[Any] = []
    statsd = settings.value("statsd")
    send = StatsdSender(statsd, prefix=settings.value("statsd_prefix")) if statsd else None
    dsn = settings.value("ledger_dsn")
    if dsn:
        sinks.append(LedgerSink(lambda: dsn, where=DSN_ENV_LEDGER, **({"send": send} if send else {})))
    if send is not None:
        sinks.append(MetricsSink(send))
    if webhook := settings.value("notify_webhook"):
        sinks.append(NoticeSink(WebhookSender(webhook)))
    if not sinks:
        return NOT_RECORDING
    holder = str(getattr(args, "holder", "") or program)
    origin = Origin(tenant=tenant, dag_id=program, run_id=holder, transition=transition,
                    actor=str(getattr(args, "actor", "") or default_actor()))
    return Recorder(origin, sinks, mask=mask_dsn_secrets)

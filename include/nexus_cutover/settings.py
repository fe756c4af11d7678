"""Every setting the product reads, declared once, and the one reader of them (issue 49, item 1).

A setting is an option of the section ``nexus`` of Airflow's configuration, ``[nexus] <name>``, with a ``NEXUS_*``
environment variable as its documented alias (the names the product read before). :data:`SETTINGS` declares each
one (type, default, description, example, whether it is secret); the Airflow provider's ``config`` section
(:func:`provider_config`, ``nexus_airflow.provider``) and the README's "Settings" table are made from it.

Invariants:

* :func:`value` is the only reader of a ``NEXUS_*`` setting (tests/test_architecture.py fails on any other
  ``os.environ`` read of one). It returns, first found: the environment variable ``AIRFLOW__NEXUS__<NAME>``, the
  alias ``NEXUS_<NAME>``, the Airflow configuration (the source the plugin installs, :func:`install_source`:
  ``airflow.cfg``'s ``[nexus]``, ``_cmd``/``_secret``, a secrets backend), then the declared default. Both
  environment variables come before ``airflow.cfg``, as Airflow's own variables do; and Airflow's ``conf.get``
  answers every declared option with its default, so a source consulted first would hide every alias.
* An empty or blank value counts as unset (the product read ``NEXUS_X=`` as unset before).
* A value is converted to the declared type; one that is not of it raises :class:`BadSetting` (a
  :class:`~nexus_cutover.errors.BadInput` and a ``ValueError``) naming the setting, where it came from and the
  value, except a secret's value, which no message, table or listing shows.
* Nothing here imports Airflow: the domain runs without it (the command line, the reference host); only where the
  plugin package was imported does the Airflow configuration answer.
* Test hooks are no settings: ``NEXUS_AIRFLOW_FAULT``, ``NEXUS_AIRFLOW_PAUSE_DIR`` and ``NEXUS_MIN_POLL_INTERVAL_S``
  (``nexus_airflow.faults``) stay plain environment variables, as do the per-tenant ``AIRFLOW_CONN_NEXUS_TENANT_*``
  connections.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass
from typing import Any

from .errors import BadInput

SECTION = "nexus"
#: The release that added the ``[nexus]`` section (``version_added`` of every option declared with it).
FIRST_VERSION = "0.1.0"
TYPES = ("string", "integer", "float", "boolean")
_TRUE, _FALSE = {"1", "true", "t", "yes", "y", "on"}, {"0", "false", "f", "no", "n", "off"}


class BadSetting(BadInput, ValueError):
    """A setting's value is not of its declared type (exit 2 on the command line)."""


@dataclass(frozen=True)
class Setting:
    name: str  #: the option of ``[nexus]``, lower case
    type: str  #: one of :data:`TYPES`
    default: Any  #: of the type, or None: unset
    description: str
    example: str | None = None
    secret: bool = False  #: a DSN: never printed; ``sensitive`` in Airflow's configuration
    version_added: str = FIRST_VERSION

    @property
    def alias(self) -> str:
        return "NEXUS_" + self.name.upper()

    @property
    def airflow_env(self) -> str:
        return f"AIRFLOW__{SECTION.upper()}__{self.name.upper()}"

    @property
    def default_text(self) -> str | None:
        """The default as Airflow's configuration writes it (a string; None when there is none)."""
        if self.default is None:
            return None
        if self.type == "boolean":
            return "True" if self.default else "False"
        return str(self.default)


_S = Setting
SETTINGS: tuple[Setting, ...] = (
    _S("tenant_dsn", "string", None, "The tenant database of the command line (nexus-cutover, the lifecycle "
       "entrypoint, the Field History stages, the reference host) as an SQLAlchemy URL; a DAG run reads the "
       "tenant's Airflow connection instead.", "mysql+pymysql://user:pw@host:3306/tenant_db", secret=True),
    _S("ledger_dsn", "string", None, "The delivery ledger's database of the command line (nexus-cutover report, "
       "and what a command records); Airflow's tasks use the connection nexus_ledger.",
       "postgresql+psycopg2://user:pw@host/ledger", secret=True),
    _S("ledger_spool_dir", "string", None, "The directory of the machine's ledger spool (events not yet in the "
       "ledger); unset: $AIRFLOW_HOME/nexus-ledger-spool, ~/airflow/nexus-ledger-spool without AIRFLOW_HOME.",
       "/var/lib/nexus/ledger-spool"),
    _S("ledger_timeout_s", "float", 3.0, "Seconds one attempt to reach the delivery ledger may take (connect, "
       "and each statement on PostgreSQL) before the events are spooled."),
    _S("statsd", "string", None, "host:port of a StatsD listener the command line sends its nexus.* metrics to "
       "(Airflow's tasks use Airflow's metrics); unset: the command line sends none.", "localhost:8125"),
    _S("statsd_prefix", "string", "airflow", "The prefix of the command line's metrics (Airflow's [metrics] "
       "statsd_prefix, so one exporter mapping reads both)."),
    _S("notify_webhook", "string", None, "A Slack-compatible incoming webhook the command line posts its notices "
       "to (each stop, the pause ahead, admission resumed, a cut-over); Airflow's tasks use the run's notify "
       "connection. Unset: the command line sends none.", "https://hooks.slack.com/services/T000/B000/XXXX",
       secret=True),
    _S("writers_stop_command", "string", None, "The command line's writer-stop command (run with "
       "-writers-stop-controller command): stops the tenant's old writers and waits for them; {tenant} replaced, the "
       "tenant as NEXUS_TENANT in its environment, never its DSN. A DAG reads the Variable nexus_writers_stop_command.",
       "kubectl scale deploy/{tenant}-old-writers --replicas=0"),
    _S("writers_stop_url", "string", None, "The command line's writer-stop API (run with -writers-stop-controller "
       "http), POSTed to once; {tenant} replaced. A DAG uses the form's writers_stop_http_conn_id.",
       "https://deployer.example.test/api/v1/tenants/{tenant}/connector-projection-old-writers/stop", secret=True),
    _S("airflow_url", "string", None, "The Airflow UI's base URL, for links to a run's page in the holders' "
       "reports; unset: no link.", "https://airflow.example.com"),
    _S("host_heartbeat_s", "float", 5.0, "Seconds between two heartbeats of the reference host."),
    _S("host_poll_s", "float", 0.5, "Seconds the reference host sleeps when it found no work."),
    _S("status_refresh_s", "float", 10.0, "Seconds a tenant's state read by the status view stays fresh: at "
       "most one read per tenant per interval."),
    _S("status_readers", "integer", 4, "Threads of the status view reading tenant databases."),
    _S("status_wait_s", "float", 120.0, "Seconds one status-view request waits for the reads it needs."),
    _S("status_fresh_wait_s", "float", 10.0, "Seconds the status view's rows wait for the re-read of a stale "
       "state before it is served as stale."),
    _S("default_host_controller", "string", "manual", "The cutover form's default host_controller (manual, "
       "command or http), read when the DAG file is parsed.", "command"),
    _S("celery_preload", "boolean", True, "Whether a Celery worker imports the product's modules once before "
       "its pool forks (the workers' setting)."),
    _S("fused_tasks", "boolean", True, "Whether the steps declared fused run as one task (ADR 0011); False: "
       "one task per step. Set it alike for every Airflow component, with no run in flight."),
    _S("armed_slots", "integer", 0, "Cutover runs of this Airflow armed at once (their admission fenced): a run "
       "arms its fence only while fewer are armed, else waits before arming with admission open; set it to the "
       "worker slots armed work may take, and the pool nexus_armed to as many. 0: no bound. The workers' setting.",
       "4"),
    _S("waits_end_in_triggerer", "boolean", False, "Whether a deferred wait that passes in the triggerer ends "
       "its task there (no worker resumes it)."),
    _S("trigger_quiet_log_s", "float", 300.0, "Seconds between two log lines of a deferred wait whose progress "
       "did not change (0: every poll); the triggerer's setting."),
    _S("airflow_compat_question_per_try", "boolean", True, "Whether the fix for apache/airflow#72155 (one HITL "
       "question per try) is installed; False leaves Airflow's sessions untouched."),
    _S("producer_upgrade_command", "string", None, "How this deployment upgrades lagging producers, named in "
       "the producer gates' stops; unset: only the general advice.", "python -m nexus_sim.upgrade --namespace demo"),
)
BY_NAME: dict[str, Setting] = {s.name: s for s in SETTINGS}
BY_ALIAS: dict[str, Setting] = {s.alias: s for s in SETTINGS}

#: The Airflow configuration, ``key -> str | None``, once the plugin package installed it (:func:`install_source`).
_source: Callable[[str], str | None] | None = None


def install_source(source: Callable[[str], str | None] | None) -> None:
    """Read ``[nexus]`` options through ``source`` after both environment variables (None: no such source)."""
    global _source
    _source = source


def raw(name: str, environ: Mapping[str, str] | None = None) -> tuple[str | None, str]:
    """The text of the setting ``name`` and where it came from (the variable, ``airflow config`` or
    ``default``); None as the text when it is unset everywhere."""
    setting = BY_NAME[name]
    env = os.environ if environ is None else environ
    for where in (setting.airflow_env, setting.alias):
        text = env.get(where, "").strip()
        if text:
            return text, where
    if _source is not None:
        text = (_source(name) or "").strip()
        if text:
            # Airflow's configuration answers an unset option with the provider's declared default: said as such
            return text, "default" if text == setting.default_text else f"[{SECTION}] {name} of Airflow's configuration"
    return None, "default"


def value(name: str, environ: Mapping[str, str] | None = None) -> Any:
    """The setting ``name`` as its declared type (see the module's invariants for the order it is looked up in)."""
    setting = BY_NAME[name]
    text, where = raw(name, environ)
    if text is None:
        return setting.default
    return convert(setting, text, where)


def convert(setting: Setting, text: str, where: str) -> Any:
    """``text`` as ``setting``'s type; :class:`BadSetting` naming the setting (never a secret's value)."""
    try:
        if setting.type == "integer":
            return int(text)
        if setting.type == "float":
            return float(text)
        if setting.type == "boolean":
            if text.lower() in _TRUE | _FALSE:
                return text.lower() in _TRUE
            raise ValueError(text)
        return text
    except ValueError:
        shown = "(hidden: a secret)" if setting.secret else repr(text)
        kinds = {"integer": "a whole number", "float": "a number", "boolean": "true/false or 1/0"}
        raise BadSetting(f"setting {SECTION}.{setting.name} ({where}) = {shown} is not {kinds[setting.type]}; "
                         f"unset it for the default {setting.default_text}") from None


def secret_values(environ: Mapping[str, str] | None = None) -> list[str]:
    """Every value a secret setting has anywhere (both variables, Airflow's configuration): what a message must
    never show, whichever of them was read."""
    env = os.environ if environ is None else environ
    found = []
    for s in SETTINGS:
        if s.secret:
            found += [env.get(s.airflow_env, "").strip(), env.get(s.alias, "").strip(), raw(s.name, env)[0] or ""]
    return [text for text in dict.fromkeys(found) if text]


def host_aliases(environ: Mapping[str, str]) -> dict[str, str]:
    """The settings given as ``AIRFLOW__NEXUS__*`` in ``environ``, not secret, under their ``NEXUS_*`` alias: a new
    host's environment holds nothing of Airflow's (:func:`nexus_cutover.dsn.host_environment`), yet reads them."""
    return {s.alias: environ[s.airflow_env].strip() for s in SETTINGS
            if not s.secret and environ.get(s.airflow_env, "").strip()}


def provider_config() -> dict[str, Any]:
    """The ``config`` section of the Airflow provider's description (Airflow's provider_info schema)."""
    options = {}
    for s in SETTINGS:
        option: dict[str, Any] = {"description": f"{s.description} Alias: the environment variable {s.alias}.",
                                  "version_added": s.version_added, "type": s.type, "example": s.example,
                                  "default": s.default_text}
        if s.secret:
            option["sensitive"] = True
        options[s.name] = option
    return {SECTION: {"description": "nexus-cutover's settings. Each may also be given as its NEXUS_* environment "
                      "variable (read after AIRFLOW__NEXUS__<NAME>, before airflow.cfg).", "options": options}}


def listing(environ: Mapping[str, str] | None = None) -> list[dict[str, Any]]:
    """Every setting as this process reads it, for a page a person reads: its name, alias, type, the value in force
    (a secret's only as set or unset, never its text; a bad value as the error), where it came from (the variable,
    Airflow's configuration, or the default) and what it sets."""
    rows = []
    for s in SETTINGS:
        text, where = raw(s.name, environ)
        if s.secret:
            shown = "set (secret: not shown)" if text is not None else "unset"
        else:
            try:
                shown = s.default_text if text is None else str(convert(s, text, where))
            except BadSetting as exc:
                shown = f"bad value: {exc}"
        rows.append({"name": s.name, "alias": s.alias, "type": s.type, "value": shown if shown is not None else "unset",
                     "source": where, "default": s.default_text, "description": s.description})
    return rows


def readme_table() -> str:
    """The README's "Settings" table (tests/test_settings.py keeps the README's copy equal to it)."""
    rows = ["| `[nexus]` option | alias | type | default | what it sets |", "|---|---|---|---|---|"]
    for s in SETTINGS:
        default = "unset" if s.default is None else f"`{s.default_text}`"
        rows.append(f"| `{s.name}` | `{s.alias}` | {s.type}{', secret' if s.secret else ''} | {default} | "
                    f"{s.description} |")
    return "\n".join(rows) + "\n"

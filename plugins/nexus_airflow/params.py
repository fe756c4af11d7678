"""The trigger forms (JSON-schema Params) and their resolution at run time, each field written once.

Invariants:

* The form never holds a DSN or password: the tenant DB is named by an Airflow
  connection id (default ``nexus_tenant_<tenant>``), resolved by
  :class:`~nexus_airflow.hooks.NexusTenantHook` inside tasks only.
* ``tenant`` is required and pattern-checked (it is a namespace: lower-case
  letters, digits, ``_`` and ``-``, at most 64 characters); every other field
  has a bounded default, so a form with only a tenant is a valid run.
* A field is one :class:`Field`: its default, schema and description live
  there, and the same object builds the ``Param`` and resolves the run's value
  (no second copy of a default in a ``params.get(k, default)``).
* What the form cannot say (a field needed only with another's value, a key the
  DAG does not know) is checked by :func:`check_form` in the run's first task,
  before anything is read or written.
* Light to import: only ``airflow.sdk.Param`` (the DAG files import this at parse time).
"""

from __future__ import annotations

import os
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
CONN_ID_PATTERN = r"^$|^[A-Za-z0-9_.-]{1,200}$"
PACK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
HOST_CONTROLLERS = ("manual", "command", "http")
#: The runbook's floor for poll intervals (apache/airflow#71172: very short pokes can be marked failed).
#: The test harness lowers it (``NEXUS_MIN_POLL_INTERVAL_S``) for in-process runs only.
MIN_POLL_INTERVAL_S = int(os.environ.get("NEXUS_MIN_POLL_INTERVAL_S", "10"))

_REQUIRED = object()


@dataclass(frozen=True)
class Field:
    """One form field: builds its ``Param`` and resolves its value from a run's params."""

    default: Any
    title: str
    description: str
    schema: dict[str, Any] = field(default_factory=dict)
    cast: Callable[[Any], Any] = lambda v: v

    def param(self):
        from airflow.sdk import Param

        if self.default is _REQUIRED:
            return Param(title=self.title, description=self.description, **self.schema)
        return Param(self.default, title=self.title, description=self.description, **self.schema)

    def value(self, params: Mapping[str, Any], name: str) -> Any:
        raw = params[name] if self.default is _REQUIRED else params.get(name, self.default)
        return self.cast(raw)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _seconds(default: int, title: str, description: str, *, minimum: int = 1, maximum: int = 7 * 86400) -> Field:
    return Field(default, title, description, {"type": "integer", "minimum": minimum, "maximum": maximum}, int)


TENANT_FIELDS: dict[str, Field] = {
    "tenant": Field(_REQUIRED, "Tenant (namespace)", "The tenant's namespace, e.g. acme. Lower-case letters, digits, _ and -.",
                    {"type": "string", "pattern": TENANT_PATTERN}),
    "conn_id": Field("", "Tenant DB connection id", "Airflow connection of the tenant database (mysql for MySQL/TiDB, "
                     "sqlite for the embedded demo). Empty: nexus_tenant_<tenant>.",
                     {"type": "string", "pattern": CONN_ID_PATTERN}),
}
NOTIFY_FIELD = Field(
    "", "Notification connection id",
    "Where failures and needs-confirmation events are sent: an smtp connection (extra 'to') or a Slack webhook "
    "connection (needs the Slack provider). Empty: the Variable nexus_notify_conn_id, else the task log only.",
    {"type": "string", "pattern": CONN_ID_PATTERN},
)
STALE_HEARTBEAT_FIELD = Field(
    None, "Stale heartbeat window (s)",
    "A process whose last heartbeat is older than this is silent (not live). Empty: the product's default "
    "window (nexus_cutover.liveness).",
    {"type": ["null", "integer"], "minimum": 1, "maximum": 86400}, _int,
)


APPROVAL_MODES = ("per_tenant", "per_wave")
USER_NAME_PATTERN = r"^[A-Za-z0-9_.@+-]{1,128}$"
#: Who may answer a confirmation, shared by the cutover's form and the rollout's (one definition).
APPROVAL_FIELDS: dict[str, Field] = {
    "approvers": Field([], "Approvers", "Airflow user names allowed to answer the run's confirmations (writer "
                       "stop, and a manual host start); the user who triggered the run (or its rollout) is not one "
                       "of them unless allow_self_approval is set. Empty: anyone allowed by the auth manager.",
                       {"type": "array", "items": {"type": "string", "pattern": USER_NAME_PATTERN}, "uniqueItems": True},
                       lambda v: tuple(v or ())),
    "allow_self_approval": Field(False, "Allow self-approval", "With approvers: let the user who triggered the run "
                                 "answer its confirmation too (off by default: four eyes).", {"type": "boolean"}, bool),
    "approval": Field("per_tenant", "Approval", "per_tenant: this run asks its own writer-stop confirmation. per_wave: "
                      "set by tenant_rollout only: the rollout asks one question for the whole wave; this run gathers "
                      "its evidence, waits for that answer and re-checks its evidence when it comes.",
                      {"type": "string", "enum": list(APPROVAL_MODES)}),
    "rollout": Field({}, "Rollout", "Set by tenant_rollout (its run id, wave and the user who triggered it); "
                     "leave empty when triggering one tenant.", {"type": "object"}, lambda v: dict(v or {})),
}


def poll_interval_field(description: str) -> Field:
    return _seconds(30, "Poll interval (s)", f"{description} At least {MIN_POLL_INTERVAL_S} s.",
                    minimum=MIN_POLL_INTERVAL_S, maximum=3600)


CUTOVER_FIELDS: dict[str, Field] = {
    **TENANT_FIELDS,
    "pack_install_ids": Field([], "Pack incarnations", "PackInstallIds to cut over. Empty: every active pack of the namespace.",
                              {"type": "array", "items": {"type": "string", "pattern": PACK_ID_PATTERN}, "uniqueItems": True},
                              lambda v: tuple(v or ())),
    "drain_timeout": _seconds(3600, "Drain timeout (s)", "How long wait_for_drain may wait for old projection work to become terminal."),
    "stale_heartbeat": STALE_HEARTBEAT_FIELD,
    "host_controller": Field("manual", "How the new host is started",
                             "manual: ask the engineer (HITL); command: run the configured host command (Variable "
                             "nexus_host_command); http: POST to the deployer via host_http_conn_id.",
                             {"type": "string", "enum": list(HOST_CONTROLLERS)}),
    "host_http_conn_id": Field("nexus_deployer", "Deployer HTTP connection id", "Used when host_controller is http.",
                               {"type": "string", "pattern": CONN_ID_PATTERN}, lambda v: v or "nexus_deployer"),
    "dry_run": Field(False, "Dry run", "Run every check and print the exact plan of writes; write nothing.", {"type": "boolean"}, bool),
    "adopt": Field(None, "Take over the fence of", "The holder (ArmedBy) of a cutover fence left by a command-line "
                   "invocation or armed by hand, to take over once you know it is finished. Empty: a fence of a "
                   "finished Airflow run is taken over by itself; any other holder's stops the run, naming it.",
                   {"type": ["null", "string"], "maxLength": 128}),
    "poll_interval": poll_interval_field("How often the waiting steps (drain, writers, readiness) look at the tenant DB."),
    "writers_stop_timeout": _seconds(3600, "Writers stop timeout (s)",
                                     "How long check_old_writers waits for every old writer to be stopped or silent."),
    "confirm_timeout": _seconds(86400, "Confirmation timeout (s)", "How long the human confirmations wait. A timeout never confirms.",
                                maximum=30 * 86400),
    "checkpoint_timeout": _seconds(300, "Audit/checkpoint timeout (s)",
                                   "Bound of each pack's audit + checkpoint call (lock waits included).", maximum=86400),
    "digest_timeout": _seconds(1800, "History digest timeout (s)",
                               "Bound of the history digest and of its verification at the end (each is read only).",
                               maximum=86400),
    "readiness_timeout": _seconds(1800, "Readiness timeout (s)", "How long verify_readiness waits for the new host to activate.",
                                  maximum=86400),
    "notify_conn_id": NOTIFY_FIELD,
    **APPROVAL_FIELDS,
}


def _per_wave_needs_rollout(values: dict[str, Any]) -> str | None:
    rollout = values.get("rollout") or {}
    if values.get("approval") == "per_wave" and not (rollout.get("run_id") and isinstance(rollout.get("wave"), int)):
        return ("approval per_wave is set by tenant_rollout only (it needs rollout.run_id and rollout.wave): "
                "trigger one tenant with approval per_tenant")
    return None


#: Cross-field rules of the cutover form (checked by its first task).
CUTOVER_RULES = [_per_wave_needs_rollout]


def params_of_fields(fields: Mapping[str, Field]) -> dict[str, Any]:
    """The ``params`` of a DAG: one ``Param`` per field."""
    return {name: f.param() for name, f in fields.items()}


def cutover_params() -> dict[str, Any]:
    """The ``params`` of the cutover DAG."""
    return params_of_fields(CUTOVER_FIELDS)


def tenant_params() -> dict[str, Any]:
    """``tenant`` (required, pattern-checked) and ``conn_id``: the first fields of every per-tenant form."""
    return params_of_fields(TENANT_FIELDS)


def notify_conn_param():
    """The optional notification connection of a run (see :mod:`nexus_airflow.notify`)."""
    return NOTIFY_FIELD.param()


def conn_id_for(tenant: str) -> str:
    return f"nexus_tenant_{tenant}"


def resolve(fields: Mapping[str, Field], params: Mapping[str, Any]) -> dict[str, Any]:
    """Every field's value for a run; an empty ``conn_id`` becomes ``nexus_tenant_<tenant>``, an empty
    ``stale_heartbeat`` the product's default window."""
    values = {name: f.value(params, name) for name, f in fields.items() if name != "notify_conn_id"}
    values["conn_id"] = values.get("conn_id") or conn_id_for(values["tenant"])
    if "stale_heartbeat" in values:
        values["stale_heartbeat"] = default_stale_heartbeat(values["stale_heartbeat"])
    return values


def check_form(context, fields: Mapping[str, Field], rules: list[Callable[[dict[str, Any]], str | None]] = ()) -> None:
    """Refuse (BadInput) a run whose conf names an unknown key, or that a cross-field rule refuses.

    Called by a DAG's first task: a bad form fails before anything is read or written.
    """
    from nexus_cutover.errors import BadInput

    dag_run = context.get("dag_run")
    conf = dict(getattr(dag_run, "conf", None) or {})
    unknown = sorted(set(conf) - set(fields))
    if unknown:
        raise BadInput(f"unknown field(s) {', '.join(unknown)} in the run's conf; this DAG knows: {', '.join(fields)}")
    values = resolve(fields, context["params"])
    problems = [p for p in (rule(values) for rule in rules) if p]
    if problems:
        raise BadInput("; ".join(problems))


@dataclass(frozen=True)
class RunParams:
    """The resolved form of one cutover run."""

    tenant: str
    conn_id: str
    pack_install_ids: tuple[str, ...]
    drain_timeout: int
    stale_heartbeat: int
    host_controller: str
    host_http_conn_id: str
    dry_run: bool
    poll_interval: int
    writers_stop_timeout: int
    confirm_timeout: int
    checkpoint_timeout: int
    digest_timeout: int
    readiness_timeout: int
    approvers: tuple[str, ...] = ()
    allow_self_approval: bool = False
    approval: str = "per_tenant"
    rollout: dict[str, Any] = field(default_factory=dict)
    adopt: str | None = None

    @classmethod
    def from_context(cls, context) -> RunParams:
        return cls(**resolve(CUTOVER_FIELDS, context["params"]))


def default_stale_heartbeat(value: int | None) -> int:
    """``value``, or the product's one default window when the form left it empty."""
    if value is not None:
        return int(value)
    from nexus_cutover.liveness import DEFAULT_STALE_HEARTBEAT_S

    return int(DEFAULT_STALE_HEARTBEAT_S)

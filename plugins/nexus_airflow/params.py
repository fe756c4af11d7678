"""The trigger forms (JSON-schema Params) and their resolution at run time, each field written once.

Invariants:

* The form never holds a DSN or password: the tenant DB is named by an Airflow
  connection id (default ``nexus_tenant_<tenant>``), resolved by
  :class:`~nexus_airflow.hooks.NexusTenantHook` inside tasks only.
* ``tenant`` is required and pattern-checked (it is a namespace: lower-case
  letters, digits, ``_`` and ``-``, at most 64 characters); every other field
  has a bounded default, so a form with only a tenant is a valid run.
* Only required fields are required by the form: Airflow's trigger form stars a
  field, and keeps Trigger disabled while it is empty, unless its type allows
  null. Every optional field's type therefore allows null, and an empty (null)
  value resolves to the field's default, so the form submits with any subset of
  the optional fields filled.
* The form shows up front what a single-tenant run needs (the tenant, dry run,
  how the new host starts); every other field sits in a collapsed section
  (:data:`SECTIONS`), the fields ``tenant_rollout`` sets last.
* A field is one :class:`Field`: its default, schema and description live
  there, and the same object builds the ``Param`` and resolves the run's value
  (no second copy of a default in a ``params.get(k, default)``).
* What the form cannot say (a field needed only with another's value, a key the
  DAG does not know) is checked by :func:`check_form` in the run's first task,
  before anything is read or written.
* Light to import: only ``airflow.sdk.Param`` (the DAG files import this at parse time).
"""

from __future__ import annotations

import dataclasses
import re
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from typing import Any

from nexus_airflow.faults import poll_floor_s
from nexus_cutover import settings
from nexus_cutover.projection.digest_limits import DEFAULT_DIGEST_CONNECTIONS, MAX_DIGEST_CONNECTIONS
from nexus_cutover.projection.transition import BACK_OUT, DEFAULT_ARM_WHEN_DRAIN_BELOW_S

TENANT_PATTERN = r"^[a-z0-9][a-z0-9_-]{0,63}$"
CONN_ID_PATTERN = r"^$|^[A-Za-z0-9_.-]{1,200}$"
PACK_ID_PATTERN = r"^[A-Za-z0-9][A-Za-z0-9_.:-]{0,63}$"
HOST_CONTROLLERS = ("manual", "command", "http")
#: How ``stop_old_writers`` stops the old writers (:mod:`nexus_cutover.projection.writers_stop`'s kinds; issue 50).
WRITERS_STOP_CONTROLLERS = ("manual", "command", "http")
#: The form's default ``host_controller``: ``manual``, unless the deployment names another in the environment of its
#: Airflow processes (the setting ``default_host_controller``, ``NEXUS_DEFAULT_HOST_CONTROLLER``; ``make airflow`` sets
#: ``command``: its reference host starts by itself). Read when the DAG file is parsed: a setting, no database.
DEFAULT_HOST_CONTROLLER = settings.value("default_host_controller")
if DEFAULT_HOST_CONTROLLER not in HOST_CONTROLLERS:
    raise ValueError(f"setting nexus.default_host_controller ({settings.raw('default_host_controller')[1]}) = "
                     f"{DEFAULT_HOST_CONTROLLER!r} is none of {HOST_CONTROLLERS}")
#: The floor for poll intervals (:func:`nexus_airflow.faults.poll_floor_s`: 10 s, lowered by the test harness only).
MIN_POLL_INTERVAL_S = poll_floor_s()

_REQUIRED = object()

#: The collapsed sections of the forms, in the order they appear (a field without one shows up front).
CONNECTIONS = "Connections, packs and fence takeover"
#: The same section on a form with no pack or fence field (Field History's).
CONNECTIONS_ONLY = "Connections"
APPROVAL = "Who may approve"
TIMING = "Timeouts and polling"
ROLLOUT_ONLY = "Set by tenant_rollout only (leave as they are)"
SECTIONS = (CONNECTIONS, CONNECTIONS_ONLY, APPROVAL, TIMING, ROLLOUT_ONLY)


def nullable(schema: dict[str, Any]) -> dict[str, Any]:
    """``schema`` whose ``type`` (and ``enum``) also allow null: what makes Airflow's form treat a field as optional."""
    out = dict(schema)
    kinds = out.get("type")
    if kinds is not None:
        kinds = [kinds] if isinstance(kinds, str) else list(kinds)
        out["type"] = kinds if "null" in kinds else [*kinds, "null"]
    if "enum" in out and None not in out["enum"]:
        out["enum"] = [*out["enum"], None]
    return out


@dataclass(frozen=True)
class Field:
    """One form field: builds its ``Param`` and resolves its value from a run's params.

    A field with a default is optional: its ``Param`` allows null, and null (a
    field emptied on the form) resolves to the default. ``section`` names the
    collapsed section it sits in (None: up front).
    """

    default: Any
    title: str
    description: str
    schema: dict[str, Any] = field(default_factory=dict)
    cast: Callable[[Any], Any] = lambda v: v
    section: str | None = None

    @property
    def required(self) -> bool:
        return self.default is _REQUIRED

    def param(self):
        from airflow.sdk import Param

        shown = {"section": self.section} if self.section else {}
        if self.required:
            return Param(title=self.title, description=self.description, **self.schema, **shown)
        schema = nullable(self.schema)
        if "enum" in schema:  # the form's empty choice reads as what it means, not "null" (issue 51, item 9)
            schema["values_display"] = {"null": f"(default: {self.default})", **schema.get("values_display", {})}
        return Param(self.default, title=self.title, description=self.description, **schema, **shown)

    def value(self, params: Mapping[str, Any], name: str) -> Any:
        if self.required:
            return self.cast(params[name])
        raw = params.get(name)
        return self.cast(self.default if raw is None else raw)

    def in_section(self, section: str | None) -> Field:
        """This field, shown in ``section`` (the same field on another form)."""
        return dataclasses.replace(self, section=section)


def _int(v: Any) -> int | None:
    return None if v is None else int(v)


def _seconds(default: int, title: str, description: str, *, minimum: int = 1, maximum: int = 7 * 86400,
             section: str | None = TIMING) -> Field:
    return Field(default, title, description, {"type": "integer", "minimum": minimum, "maximum": maximum}, int, section)


def _text(v: Any) -> str:
    return v or ""


TENANT_FIELD = Field(_REQUIRED, "Tenant (namespace)",
                     "The tenant's namespace, e.g. acme. Lower-case letters, digits, _ and -.",
                     {"type": "string", "pattern": TENANT_PATTERN})
#: An Airflow pool's name (the characters Airflow's pool names use), or empty.
POOL_PATTERN = r"^$|^[A-Za-z0-9_.-]{1,256}$"
#: The tenant connection's extra that names its database cluster's pool (read by a rollout for each tenant).
READ_POOL_EXTRA = "nexus_read_pool"


def is_pool_name(value: Any) -> bool:
    """Whether ``value`` is a non-empty Airflow pool name (:data:`POOL_PATTERN`): the one rule of the form, the
    rollout's read of the connection extra and the scheduler's policy."""
    return isinstance(value, str) and bool(value) and re.fullmatch(POOL_PATTERN, value) is not None
READ_POOL_FIELD = Field(None, "Heavy reads pool", "The Airflow pool this run's heavy reads run in (the history "
                        "digest and its verification; Field History's materialization): the pool of the tenant's "
                        "database cluster, so a fleet cannot saturate one cluster. Its size is the deployment's "
                        "(airflow pools set <pool> <slots> <description>); a pool that does not exist is not used. Empty: a rollout "
                        f"takes the tenant connection's extra {READ_POOL_EXTRA}, else Airflow's default pool.",
                        {"type": "string", "pattern": POOL_PATTERN}, _text, CONNECTIONS)
CONN_ID_FIELD = Field(None, "Tenant DB connection id", "Airflow connection of the tenant database (mysql for "
                      "MySQL/TiDB, sqlite for the embedded demo). Empty: nexus_tenant_<tenant>.",
                      {"type": "string", "pattern": CONN_ID_PATTERN}, _text, CONNECTIONS)
NOTIFY_FIELD = Field(
    None, "Notification connection id",
    "Where questions, stops, ends and fence alerts are sent (a rollout's too, and its tenants' runs): an smtp "
    "connection (extra 'to') or a Slack incoming-webhook connection. Empty: the Variable nexus_notify_conn_id, "
    "else the task log only.",
    {"type": "string", "pattern": CONN_ID_PATTERN}, _text, CONNECTIONS,
)
STALE_HEARTBEAT_FIELD = Field(
    None, "Stale heartbeat window (s)",
    "A process whose last heartbeat is older than this is silent (not live). Empty: the product's default "
    "window (nexus_cutover.liveness).",
    {"type": "integer", "minimum": 1, "maximum": 86400}, _int, TIMING,
)


APPROVAL_MODES = ("per_tenant", "per_wave")
#: ``tenant_rollout``'s ``mode`` (``preflight``: only the preflight table) and what a preflight stop does.
ROLLOUT_MODES = ("rollout", "preflight")
ON_PREFLIGHT_STOP = ("skip", "halt", "run")
USER_NAME_PATTERN = r"^[A-Za-z0-9_.@+-]{1,128}$"
#: Who may answer a confirmation, shared by the cutover's form and the rollout's (one definition).
APPROVER_FIELDS: dict[str, Field] = {
    "approvers": Field([], "Approvers", "Airflow user names allowed to answer the run's confirmations (writer "
                       "stop, and a manual host start); the user who triggered the run (or its rollout) is not one "
                       "of them unless allow_self_approval is set. Empty: anyone allowed by the auth manager.",
                       {"type": "array", "items": {"type": "string", "pattern": USER_NAME_PATTERN}, "uniqueItems": True},
                       lambda v: tuple(v or ()), APPROVAL),
    "allow_self_approval": Field(False, "Allow self-approval", "With approvers: let the user who triggered the run "
                                 "answer its confirmation too (off by default: four eyes).", {"type": "boolean"}, bool,
                                 APPROVAL),
}
#: What ``tenant_rollout`` sets on each tenant's run (a single-tenant run leaves them as they are).
ROLLOUT_SET_FIELDS: dict[str, Field] = {
    "approval": Field("per_tenant", "Approval", "per_tenant: this run asks its own writer-stop confirmation. per_wave: "
                      "set by tenant_rollout only: the rollout asks one question for the whole wave; this run gathers "
                      "its evidence, waits for that answer and re-checks its evidence when it comes.",
                      {"type": "string", "enum": list(APPROVAL_MODES)}, section=ROLLOUT_ONLY),
    "rollout": Field({}, "Rollout", "Set by tenant_rollout (its run id, wave and the user who triggered it); "
                     "leave empty when triggering one tenant.", {"type": "object"}, lambda v: dict(v or {}), ROLLOUT_ONLY),
}
APPROVAL_FIELDS: dict[str, Field] = {**APPROVER_FIELDS, **ROLLOUT_SET_FIELDS}


def poll_interval_field(description: str) -> Field:
    return _seconds(30, "Poll interval (s)", f"{description} At least {MIN_POLL_INTERVAL_S} s.",
                    minimum=MIN_POLL_INTERVAL_S, maximum=3600)


#: The fields every per-tenant form starts with.
TENANT_FIELDS: dict[str, Field] = {"tenant": TENANT_FIELD, "conn_id": CONN_ID_FIELD}

CUTOVER_FIELDS: dict[str, Field] = {
    "tenant": TENANT_FIELD,
    "host_controller": Field(DEFAULT_HOST_CONTROLLER, "How the new host is started",
                             "manual: ask the engineer (HITL); command: run the configured host command (Variable "
                             "nexus_host_command); http: POST to the deployer via host_http_conn_id.",
                             {"type": "string", "enum": list(HOST_CONTROLLERS)}),
    "dry_run": Field(False, "Dry run", "Run every check and print the exact plan of writes; write nothing.", {"type": "boolean"}, bool),
    "conn_id": CONN_ID_FIELD,
    "pack_install_ids": Field([], "Pack incarnations", "PackInstallIds to cut over. Empty: every active pack of the namespace.",
                              {"type": "array", "items": {"type": "string", "pattern": PACK_ID_PATTERN}, "uniqueItems": True},
                              lambda v: tuple(v or ()), CONNECTIONS),
    "host_http_conn_id": Field("nexus_deployer", "Deployer HTTP connection id", "Used when host_controller is http.",
                               {"type": "string", "pattern": CONN_ID_PATTERN}, lambda v: v or "nexus_deployer", CONNECTIONS),
    "writers_stop_controller": Field("manual", "How the old writers are stopped",
                                     "manual: you stop them (check_old_writers waits); command: run the configured "
                                     "stop command (Variable nexus_writers_stop_command) and wait for it; http: POST to "
                                     "the deployment API via writers_stop_http_conn_id. Its answer is evidence, shown "
                                     "at the confirmation; a failure stops the run with the fence held.",
                                     {"type": "string", "enum": list(WRITERS_STOP_CONTROLLERS)},
                                     lambda v: v or "manual", CONNECTIONS),
    "writers_stop_http_conn_id": Field("nexus_deployer", "Writer-stop HTTP connection id",
                                       "Used when writers_stop_controller is http.",
                                       {"type": "string", "pattern": CONN_ID_PATTERN},
                                       lambda v: v or "nexus_deployer", CONNECTIONS),
    "notify_conn_id": NOTIFY_FIELD,
    "adopt": Field(None, "Take over the fence of", "The holder (ArmedBy) of a cutover fence left by a command-line "
                   "invocation or armed by hand, to take over once you know it is finished. Empty: a fence of a "
                   "finished Airflow run is taken over by itself; any other holder's stops the run, naming it.",
                   {"type": "string", "maxLength": 128}, lambda v: v or None, CONNECTIONS),
    "read_pool": READ_POOL_FIELD,
    "digest_connections": Field(DEFAULT_DIGEST_CONNECTIONS, "History digest connections",
                                "Connections the history digest reads its chunks on at once (the same rows and the "
                                "same verification as on one): the digest runs while admission is paused, and a larger "
                                "server takes it sooner. "
                                "Each is a connection to the tenant's server for the digest's length.",
                                {"type": "integer", "minimum": 1, "maximum": MAX_DIGEST_CONNECTIONS}, int, CONNECTIONS),
    **APPROVER_FIELDS,
    "arm_when_drain_below": _seconds(int(DEFAULT_ARM_WHEN_DRAIN_BELOW_S), "Arm when the drain is below (s)",
                                     "Arm the fence only once the old projection backlog would drain within this many "
                                     "seconds at its measured rate, so the admission pause holds only a short residual "
                                     "drain. 0 arms at once.", minimum=0),
    "pre_arm_timeout": _seconds(3600, "Pre-arm timeout (s)", "How long wait_for_short_drain waits for that before "
                                "it stops, nothing written and the fence not armed.", maximum=30 * 86400),
    "drain_timeout": _seconds(3600, "Drain timeout (s)", "How long wait_for_drain may wait for old projection work to become terminal."),
    "writers_stop_timeout": _seconds(3600, "Writers stop timeout (s)",
                                     "How long check_old_writers waits for every old writer to be stopped or silent."),
    "writers_stop_controller_timeout": _seconds(300, "Writer-stop controller timeout (s)",
                                                "Bound of the writer-stop controller (command or http): a command "
                                                "still running then is killed and the run stops, the fence held.",
                                                maximum=86400),
    "fence_alert_after": _seconds(7200, "Alert when fenced for (s)",
                                  "A run that still holds the tenant's admission fence this long after it was armed "
                                  "alerts once through the notification channel (notify_conn_id), naming the step it "
                                  "waits at and how long admission has been paused, with the link. Nothing else "
                                  "changes: the run keeps waiting.", maximum=30 * 86400),
    "confirm_timeout": _seconds(86400, "Confirmation timeout (s)", "How long the human confirmations wait. A timeout never confirms.",
                                maximum=30 * 86400),
    "lock_timeout": _seconds(300, "Lock timeout (s)",
                             "Bound of each step that writes under the tenant's locks: arming the fence, each pack's "
                             "audit + checkpoint, the release (lock waits included). Formerly checkpoint_timeout, "
                             "which a form or a rollout's cutover_conf may still name.", maximum=86400),
    "digest_timeout": _seconds(1800, "History digest timeout (s)",
                               "Bound of the history digest and of its verification at the end (each is read only).",
                               maximum=86400),
    "readiness_timeout": _seconds(1800, "Readiness timeout (s)", "How long verify_readiness waits for the new host to activate.",
                                  maximum=86400),
    "poll_interval": poll_interval_field("The longest gap between the looks of a waiting step (drain, writers, "
                                         "readiness) at the tenant DB: a wait looks again after 1 s, 2 s, 4 s, ... "
                                         "up to it."),
    "stale_heartbeat": STALE_HEARTBEAT_FIELD,
    **ROLLOUT_SET_FIELDS,
}


#: Upper bound of a rollout's ``max_parallel``: the cutover DAG's ``max_active_runs`` (tests/rollout checks they
#: agree), so a per-wave question never waits for a tenant run Airflow holds queued.
MAX_PARALLEL_CAP = 16
#: Fields of the per-tenant form a rollout may set for every tenant (never a DSN: connections are per tenant).
SHARED_FIELDS = ("arm_when_drain_below", "pre_arm_timeout", "drain_timeout", "stale_heartbeat", "host_controller",
                 "host_http_conn_id", "dry_run",
                 "poll_interval", "writers_stop_timeout", "confirm_timeout", "fence_alert_after", "lock_timeout", "digest_timeout",
                 "digest_connections", "readiness_timeout", "read_pool", "writers_stop_controller",
                 "writers_stop_http_conn_id", "writers_stop_controller_timeout")
ROLLOUT_FIELDS: dict[str, Field] = {
    "tenants": Field(_REQUIRED, "Tenants", "Namespaces; each uses the connection nexus_tenant_<tenant>.",
                     {"type": "array", "items": {"type": "string", "pattern": TENANT_PATTERN}, "uniqueItems": True},
                     lambda v: list(v or ())),
    "mode": Field("rollout", "Mode", "rollout: the preflight (every tenant's plan verdict), then the waves. preflight: "
                  "only the preflight table; no fence is armed and no tenant run starts.",
                  {"type": "string", "enum": list(ROLLOUT_MODES)}),
    "on_preflight_stop": Field("skip", "When a tenant's preflight says stop",
                               "skip: run the others and name it as skipped with its reason. halt: start no wave. "
                               "run: start it anyway; its own run stops where the preflight said (a failure that "
                               "counts against max_failed), e.g. when its connection is created after the preflight.",
                               {"type": "string", "enum": list(ON_PREFLIGHT_STOP)}),
    "canary": Field(1, "Canary", "The first N tenants, or a list of tenant names, run first as wave 0.",
                    {"type": ["integer", "array"]}),
    "wave_size": Field(10, "Wave size", "Tenants per wave after the canary.", {"type": "integer", "minimum": 1, "maximum": 500},
                       int),
    "max_parallel": Field(4, "Max parallel tenants", "At most this many tenants of a wave run at once.",
                          {"type": "integer", "minimum": 1, "maximum": MAX_PARALLEL_CAP}, int),
    "max_failed": Field(0, "Failure budget per wave",
                        "A count (>= 1), or a fraction of the wave (< 1). Past it the rollout halts.",
                        {"type": "number", "minimum": 0}),
    "retry_failed": Field(False, "Retry failed tenants", "On a rerun, run again the tenants whose earlier cutover "
                          "run failed.", {"type": "boolean"}, bool),
    "approval": Field("per_tenant", "Approval", "per_tenant: each tenant's run asks; per_wave: one question per wave.",
                      {"type": "string", "enum": list(APPROVAL_MODES)}, section=APPROVAL),
    **APPROVER_FIELDS,
    "notify_conn_id": NOTIFY_FIELD,
    "tenants_variable": Field(None, "Tenants Variable", "An Airflow Variable holding a JSON list of more tenants "
                              "(after `tenants`).", {"type": "string"}, _text, CONNECTIONS),
    "cutover_conf": Field({"host_controller": DEFAULT_HOST_CONTROLLER}, "Per-tenant form fields",
                          f"Applied to every tenant's run; allowed keys: {', '.join(SHARED_FIELDS)}.",
                          {"type": "object"}, lambda v: dict(v or {}), TIMING),
    "preflight_concurrency": Field(8, "Preflight concurrency",
                                   "How many tenant databases the preflight (and the plan's standing reads) read at once.",
                                   {"type": "integer", "minimum": 1, "maximum": 64}, int, TIMING),
}


def _per_wave_needs_rollout(values: dict[str, Any]) -> str | None:
    rollout = values.get("rollout") or {}
    if values.get("approval") == "per_wave" and not (rollout.get("run_id") and isinstance(rollout.get("wave"), int)):
        return ("approval per_wave is set by tenant_rollout only (it needs rollout.run_id and rollout.wave): "
                "trigger one tenant with approval per_tenant")
    return None


#: Cross-field rules of the cutover form (checked by its first task).
CUTOVER_RULES = [_per_wave_needs_rollout]

#: The back-out's form (``connector_projection_back_out``): the tenant, where its question is told, who may answer
#: it, and its bounds; each field the cutover's own (one definition).
BACK_OUT_FIELDS: dict[str, Field] = {name: CUTOVER_FIELDS[name] for name in (
    "tenant", "conn_id", "notify_conn_id", "approvers", "allow_self_approval", "confirm_timeout", "lock_timeout",
    "stale_heartbeat")}


def form_of(dag_id: str) -> tuple[Mapping[str, Field], list[Callable[[dict[str, Any]], str | None]]]:
    """The form and cross-field rules of a run of the per-tenant DAG ``dag_id`` (its first task checks them)."""
    return (BACK_OUT_FIELDS, []) if dag_id == BACK_OUT.name else (CUTOVER_FIELDS, CUTOVER_RULES)


def params_of_fields(fields: Mapping[str, Field]) -> dict[str, Any]:
    """The ``params`` of a DAG: one ``Param`` per field."""
    return {name: f.param() for name, f in fields.items()}


def cutover_params() -> dict[str, Any]:
    """The ``params`` of the cutover DAG."""
    return params_of_fields(CUTOVER_FIELDS)


def conn_id_for(tenant: str) -> str:
    return f"nexus_tenant_{tenant}"


def resolve(fields: Mapping[str, Field], params: Mapping[str, Any]) -> dict[str, Any]:
    """Every field's value for a run; an empty ``conn_id`` becomes ``nexus_tenant_<tenant>``, an empty
    ``stale_heartbeat`` the product's default window."""
    values = {name: f.value(params, name) for name, f in fields.items() if name != "notify_conn_id"}
    if "tenant" in values:
        values["conn_id"] = values.get("conn_id") or conn_id_for(values["tenant"])
    if "stale_heartbeat" in values:
        values["stale_heartbeat"] = default_stale_heartbeat(values["stale_heartbeat"])
    return values


#: Fields renamed since a release, old name -> new: a form or a rollout's ``cutover_conf`` naming the old one is
#: read as the new one (docs/runbook.md, "Settings").
RENAMED_FIELDS = {"checkpoint_timeout": "lock_timeout"}


def renamed_fields(conf: Mapping[str, Any], *, only_old: bool = False) -> dict[str, Any]:
    """``conf`` with every renamed field under its new name (``only_old``: just those, by their new names);
    ValueError when a conf names a field by both names with different values."""
    out = {} if only_old else dict(conf)
    for old, new in RENAMED_FIELDS.items():
        if old not in conf:
            continue
        if new in conf and conf[new] != conf[old]:
            raise ValueError(f"{old} (the former name of {new}) and {new} are both given, with different values: "
                             f"give {new} only")
        out.pop(old, None)
        out[new] = conf[old]
    return out


def check_form(context, fields: Mapping[str, Field], rules: list[Callable[[dict[str, Any]], str | None]] = ()) -> None:
    """Refuse (BadInput) a run whose conf names an unknown key, or that a cross-field rule refuses.

    Called by a DAG's first task: a bad form fails before anything is read or written.
    """
    from nexus_cutover.errors import BadInput

    dag_run = context.get("dag_run")
    try:
        conf = renamed_fields(dict(getattr(dag_run, "conf", None) or {}))
    except ValueError as exc:
        raise BadInput(str(exc)) from None
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
    arm_when_drain_below: int
    pre_arm_timeout: int
    stale_heartbeat: int
    host_controller: str
    host_http_conn_id: str
    dry_run: bool
    poll_interval: int
    writers_stop_timeout: int
    confirm_timeout: int
    fence_alert_after: int
    lock_timeout: int
    digest_timeout: int
    digest_connections: int
    readiness_timeout: int
    approvers: tuple[str, ...] = ()
    allow_self_approval: bool = False
    approval: str = "per_tenant"
    rollout: dict[str, Any] = field(default_factory=dict)
    adopt: str | None = None
    read_pool: str = ""
    writers_stop_controller: str = "manual"
    writers_stop_http_conn_id: str = "nexus_deployer"
    writers_stop_controller_timeout: int = 300

    @classmethod
    def from_context(cls, context) -> RunParams:
        conf = getattr(context.get("dag_run"), "conf", None) or {}
        return cls(**resolve(CUTOVER_FIELDS, {**context["params"], **renamed_fields(conf, only_old=True)}))


def default_stale_heartbeat(value: int | None) -> int:
    """``value``, or the product's one default window when the form left it empty."""
    if value is not None:
        return int(value)
    from nexus_cutover.liveness import DEFAULT_STALE_HEARTBEAT_S

    return int(DEFAULT_STALE_HEARTBEAT_S)

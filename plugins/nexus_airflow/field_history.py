"""Operators, poller and sensor of the Field History eligibility DAG (seed 003, three stage gates).

Every rule lives in :mod:`nexus_cutover.field_history.gates`; these classes only
resolve the run's form, open the tenant engine (:class:`~nexus_airflow.hooks.NexusTenantHook`),
call one gate and turn its report into a task outcome:

* a passed gate returns its report (XCom ``return_value``);
* a failed gate pushes the report (XCom ``report``), logs it, and fails the
  task without retry (:func:`~nexus_airflow.base.stop`): gates stop and report;
* a stage above ``target_stage`` skips (and with it everything downstream).

The outbox drain reuses :class:`~nexus_airflow.sensors.StatusPollSensor` and
:class:`~nexus_airflow.triggers.StatusPollTrigger` (deferrable by default, bounded by
``drain_timeout`` from its first poke); it never changes an outbox row.
Light to import: domain code is imported inside methods only.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from airflow.sdk import BaseOperator

from nexus_airflow.base import domain_errors, holder_of_run, stop, tenant_engine
from nexus_airflow.params import (
    _REQUIRED,
    CONN_ID_FIELD,
    CONNECTIONS_ONLY,
    NOTIFY_FIELD,
    READ_POOL_FIELD,
    STALE_HEARTBEAT_FIELD,
    TENANT_FIELDS,
    TIMING,
    Field,
    check_form,
    params_of_fields,
    poll_interval_field,
    resolve,
)
from nexus_airflow.pollers import StepPoller
from nexus_airflow.sensors import StatusPollSensor
from nexus_cutover import settings

VERSION_PATTERN = r"^\d+(\.\d+)*$"
#: What an empty ``target_stage`` means (:func:`target_stage_of`), as the form's empty choice reads: no digit, so a
#: person typing a stage's number into the choice picks that stage, not the default.
STAGE_BY_RELEASES = "as far as the releases given allow"
OPTIONAL_VERSION_PATTERN = r"^$|^\d+(\.\d+)*$"


FH_FIELDS: dict[str, Field] = {
    **TENANT_FIELDS,
    "conn_id": CONN_ID_FIELD.in_section(CONNECTIONS_ONLY),  # this form has no pack or fence field
    "read_pool": READ_POOL_FIELD.in_section(CONNECTIONS_ONLY),
    # No fixed default (issue 51, item 2): a first run given both releases goes to stage 3 instead of looking done
    # after stage 1; one given only the stage-1 release stops after stage 1 and its What now? names the next run.
    "target_stage": Field(
        None,
        "Target stage",
        "Run the gates up to this stage; earlier stages are re-verified, not redone. Empty: as far as the releases "
        "given allow (3 with a producer-cutover release, else 1).",
        {"type": "integer", "enum": [1, 2, 3], "values_display": {"null": f"(default: {STAGE_BY_RELEASES})"}},
        lambda v: None if v is None else int(v),
    ),
    "stage1_release": Field(
        _REQUIRED,
        "Stage-1 release",
        "The release every deployed runtime_api and audit_outbox_worker already runs that preserves "
        "FieldHistoryEligible: your release notes name it (4.12.0 in the reference). Stage 1 checks the process "
        "registry against it and names any process that runs an older one.",
        {"type": "string", "pattern": VERSION_PATTERN},
    ),
    "producer_release": Field(
        None,
        "Producer-cutover release",
        "The release whose producers always stamp (e.g. 4.13.0). Required for stages 2 and 3.",
        {"type": "string", "pattern": OPTIONAL_VERSION_PATTERN},
        lambda v: v or "",
    ),
    "batch_size": Field(
        2000,
        "Materialization batch size",
        "Rows per materialization transaction (TiDB-safe: a few thousand at most).",
        {"type": "integer", "minimum": 1, "maximum": 10000},
        int,
        TIMING,
    ),
    "materialize_timeout": Field(
        1800,
        "Materialization timeout (s)",
        "Bound of one materialization call; committed batches stay and a clear resumes.",
        {"type": "integer", "minimum": 1, "maximum": 7 * 86400},
        int,
        TIMING,
    ),
    "drain_timeout": Field(
        3600,
        "Outbox drain timeout (s)",
        "How long stage_2_drain_outbox waits for pre-cutover outbox work to be delivered.",
        {"type": "integer", "minimum": 1, "maximum": 7 * 86400},
        int,
        TIMING,
    ),
    "switch_timeout": Field(
        1800,
        "Stage 3 switch timeout (s)",
        "Bound of stage 3 after reservation is turned off: in-flight mutations and the outbox rows they left settle, "
        "then the comparison and the read switch under the locks. A timeout switches nothing; clear to retry.",
        {"type": "integer", "minimum": 1, "maximum": 86400},
        int,
        TIMING,
    ),
    "stale_heartbeat": STALE_HEARTBEAT_FIELD,
    "poll_interval": poll_interval_field("How often the drain sensor looks at the outbox."),
    "notify_conn_id": NOTIFY_FIELD.in_section(CONNECTIONS_ONLY),
}


def field_history_params() -> dict[str, Any]:
    """The trigger form: tenant (+ connection), how far to go, the two releases, bounds."""
    return params_of_fields(FH_FIELDS)


def target_stage_of(values: dict[str, Any]) -> int:
    """The stage a run goes to: the form's ``target_stage``, else 3 when it names a producer-cutover release (stages
    2 and 3 need one), else 1."""
    if values.get("target_stage") is not None:
        return int(values["target_stage"])
    return 3 if values.get("producer_release") else 1


def _producer_release_for_stages_2_and_3(values: dict[str, Any]) -> str | None:
    if target_stage_of(values) >= 2 and not values["producer_release"]:
        return f"target_stage={values['target_stage']} needs producer_release (the producer-cutover release, e.g. 4.13.0)"
    return None


FORM_RULES = [_producer_release_for_stages_2_and_3]


@dataclass(frozen=True)
class FieldHistoryParams:
    tenant: str
    conn_id: str
    target_stage: int
    stage1_release: str
    producer_release: str
    batch_size: int
    materialize_timeout: int
    drain_timeout: int
    switch_timeout: int
    stale_heartbeat: int
    poll_interval: int
    read_pool: str = ""

    @classmethod
    def from_context(cls, context) -> FieldHistoryParams:
        values = resolve(FH_FIELDS, context["params"])
        return cls(**{**values, "target_stage": target_stage_of(values)})

    def require_producer_release(self) -> str:
        from nexus_cutover.errors import BadInput

        problem = _producer_release_for_stages_2_and_3(vars(self))
        if problem:
            raise BadInput(problem)
        return self.producer_release


def _skip_unless_requested(context, step: str) -> FieldHistoryParams:
    """The run's params; skips ``step`` (and with it everything downstream) when its declared stage is above
    ``target_stage``."""
    from airflow.sdk.exceptions import AirflowSkipException

    from nexus_cutover.field_history.transition import stage_number

    p = FieldHistoryParams.from_context(context)
    stage = stage_number(step)
    if p.target_stage < stage:
        raise AirflowSkipException(f"target_stage={p.target_stage}: stage {stage} not requested")
    return p


#: The deployment's own way to upgrade the producers, named in the producer gates' stops when set (``make airflow``
#: sets the demo's control, ``python -m nexus_sim.upgrade ...``); a real deployment may name its rollout or runbook.
PRODUCER_UPGRADE_ENV = settings.BY_NAME["producer_upgrade_command"].alias


def producer_upgrade_next(report: dict[str, Any]) -> str | None:
    """The next action of a producer gate that stopped on lagging producers (None for any other stop)."""
    if not (report.get("counts") or {}).get("lagging_processes"):
        return None
    how = settings.value("producer_upgrade_command")
    lagging = [f"{f.get('process_id')} ({f.get('role')} {f.get('binary_version')} < {f.get('release')})"
               for f in report.get("findings") or [] if isinstance(f, dict) and f.get("finding") == "lagging_process"]
    named = "; ".join(lagging[:20]) + (f"; +{len(lagging) - 20} more in the report" if len(lagging) > 20 else "")
    return (f"upgrade the lagging producers ({named or 'see the report'}) through your deployment's rollout (or mark "
            "the ones that are gone stopped in the process registry), then clear this task"
            + (f"; in this deployment: {how}" if how else ""))


def field_history_run(context, engine, log):
    """The :class:`~nexus_cutover.field_history.steps.FieldHistoryRun` of this task: the run's params, this run
    as the switch's writer, the body's lines in the task log, the materialization's fault seam."""
    from nexus_airflow.faults import materialize_batch_pause
    from nexus_cutover.field_history.steps import FieldHistoryRun

    p = FieldHistoryParams.from_context(context)
    ti = context["ti"]
    return FieldHistoryRun(engine, namespace=p.tenant, stage1_release=p.stage1_release,
                           producer_release=p.producer_release, batch_size=p.batch_size,
                           materialize_timeout_s=p.materialize_timeout, switch_timeout_s=p.switch_timeout,
                           heartbeat_window_s=p.stale_heartbeat, updated_by=holder_of_run(ti.dag_id, ti.run_id),
                           say=lambda line: log.info("%s", line), between_read_and_write=materialize_batch_pause())


class GateOperator(BaseOperator):
    """The declared Field History gate its task id names: its body (the stage commands run the same), skipped
    when the run's ``target_stage`` does not reach its stage; see the module invariants."""

    ui_color = "#e8f0fe"

    def execute(self, context) -> dict[str, Any]:
        from nexus_cutover.field_history.steps import run_step
        from nexus_cutover.field_history.transition import stage_number

        p = _skip_unless_requested(context, self.task_id)
        if stage_number(self.task_id) >= 2:
            with domain_errors(context, self.log):
                p.require_producer_release()
        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            result = run_step(self.task_id, field_history_run(context, engine, self.log))
        for key, value in result.keyed.items():  # stage_1's ``tls``: the TLS the run reached the tenant with
            context["ti"].xcom_push(key=key, value=value)
        if not result.verdict.proceeds:
            stop(context, self.log, result.stop_message, result.value, next_action=producer_upgrade_next(result.value))
        self.log.info("%s", result.domain.render())
        return result.value


class Stage1Operator(GateOperator):
    """Stage 1, the run's first task: it refuses a bad form (unknown keys, a missing producer_release) first."""

    def execute(self, context) -> dict[str, Any]:
        with domain_errors(context, self.log):
            check_form(context, FH_FIELDS, FORM_RULES)
        return super().execute(context)


class OutboxDrainPoller(StepPoller):
    """Stage 2's outbox wait (:class:`nexus_cutover.field_history.steps.OutboxWatch`) from a connection id."""

    kind = "outbox"

    @staticmethod
    def transition():
        from nexus_cutover.field_history.transition import FIELD_HISTORY

        return FIELD_HISTORY


class OutboxDrainSensor(StatusPollSensor):
    """Stage 2: wait until no pre-cutover outbox row is pending, processing or failed; stop and report when stuck."""

    poller_path = "nexus_airflow.field_history.OutboxDrainPoller"
    timeout_param = "drain_timeout"

    def execute(self, context) -> Any:
        _skip_unless_requested(context, self.task_id)
        return super().execute(context)

    def interval(self, context) -> float:
        return float(FieldHistoryParams.from_context(context).poll_interval)

    def wait_seconds(self, context) -> float:
        return FieldHistoryParams.from_context(context).drain_timeout

    def poller_kwargs(self, context, deadline: str) -> dict[str, Any]:
        p = FieldHistoryParams.from_context(context)
        with domain_errors(context, self.log):
            release = p.require_producer_release()
        return {
            "conn_id": p.conn_id,
            "namespace": p.tenant,
            "deadline": deadline,
            "stale_heartbeat_s": p.stale_heartbeat,
            "producer_release": release,
            "step": self.step,
        }

    def finish(self, context, result: dict[str, Any]) -> Any:
        report = result.get("report", {})
        if result["state"] == "drained":
            self.log.info("pre-cutover outbox work drained")
            return report
        stop(
            context,
            self.log,
            f"the pre-cutover outbox drain is {result['state']}: {result.get('message')} "
            f"(no outbox row was changed); resolve it with the outbox worker, then clear {self.step}",
            report,
        )

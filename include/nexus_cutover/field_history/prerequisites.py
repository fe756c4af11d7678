"""What a Field History step needs to find in the tenant database before it reads anything."""

from __future__ import annotations

from sqlalchemy import Connection, Engine

from .. import catalog
from ..errors import MissingSchema
from ..schema import existing_columns, has_table

#: Part A tables the Field History steps read or write.
TABLES = (
    catalog.AuditFieldChange,
    catalog.FieldHistoryTrackingInterval,
    catalog.ProcessRegistry,
    catalog.AuditOutbox,
    catalog.RuntimeSetting,
)


def missing_tables(bind: Engine | Connection) -> list[str]:
    return [t.name for t in TABLES if not has_table(bind, t.name)]


def require_tables(bind: Engine | Connection) -> None:
    missing = missing_tables(bind)
    if missing:
        raise MissingSchema(missing, "not a tenant database, or a DSN naming the wrong schema?")


def require_eligibility_column(bind: Engine | Connection) -> None:
    """:class:`MissingSchema` unless the tables and the stage-1 column exist."""
    require_tables(bind)
    added = catalog.FIELD_HISTORY_ELIGIBLE
    cols = existing_columns(bind, added.table.name) or set()
    if added.column_name not in cols:
        raise MissingSchema(
            [added.label],
            "stage 1 adds it: run the field_history_eligibility DAG with target_stage=1",
        )


def next_stage_action(stage: int) -> str:
    """What a person does after the tenant completed Field History stage ``stage`` (0: not started): the releases
    the next run needs, and the producer upgrade that stages 2 and 3 wait for."""
    if stage <= 0:
        return ("target_stage 1 with stage1_release, the release every runtime_api and audit_outbox_worker already "
                "runs that preserves FieldHistoryEligible (your deployment's release notes; 4.12.0 in the reference); "
                "then upgrade the producers and go on to stage 3")
    if stage == 1:
        return ("upgrade every producer (runtime_api, audit_outbox_worker) to the producer-cutover release through "
                "your deployment's rollout, then target_stage 3 with that release as producer_release")
    return "target_stage 3 with producer_release (the producer-cutover release): the read switch"

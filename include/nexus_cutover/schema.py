"""Schema inspection and the additive (Part B) DDL steps.

Invariants:

* Only the Part B objects of the contract are ever created by the pipeline:
  ``_System_WorkItem.InputStartOrdinal``, ``_System_ConnectorProjectionProtocol``
  and ``_System_AuditFieldChange.FieldHistoryEligible``. Each step is skipped
  when its object exists, so reruns converge.
* The v2 prerequisite ``_System_WorkItem.ReplayOfWorkId`` is checked, never
  created: a tenant without it is not eligible for the range cutover.
* Names and types come from :mod:`nexus_cutover.catalog`; DDL is compiled by
  the target dialect, never assembled from input.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Engine, inspect
from sqlalchemy import exc as sa_exc
from sqlalchemy.schema import CreateTable

from . import catalog
from .catalog import AddedColumn
from .db import classify, is_ddl_already_done
from .errors import MissingSchema


def existing_columns(bind: Engine | Connection, table_name: str) -> set[str] | None:
    """Column names of ``table_name``, or None when the table does not exist."""
    insp = inspect(bind)
    if not insp.has_table(table_name):
        return None
    return {c["name"] for c in insp.get_columns(table_name)}


def has_column(bind: Engine | Connection, added: AddedColumn) -> bool:
    cols = existing_columns(bind, added.table.name)
    return cols is not None and added.column_name in cols


def has_table(bind: Engine | Connection, table_name: str) -> bool:
    return inspect(bind).has_table(table_name)


def create_legacy_schema(engine: Engine) -> None:
    """Create the Part A tables (the pre-cutover tenant); existing tables are kept."""
    catalog.legacy_metadata.create_all(engine, checkfirst=True)


def add_column_ddl(bind: Engine | Connection, added: AddedColumn) -> str:
    preparer = bind.dialect.identifier_preparer
    col = added.column
    type_sql = col.type.compile(dialect=bind.dialect)
    return (
        f"ALTER TABLE {preparer.quote(added.table.name)} "
        f"ADD COLUMN {preparer.quote(col.name)} {type_sql} NULL"
    )


@dataclass(frozen=True)
class DdlStep:
    """One additive object: what it is, whether it exists, and the DDL creating it."""

    label: str
    present: bool
    ddl: str


def projection_steps(bind: Engine | Connection) -> list[DdlStep]:
    """Part B steps of the connector projection range cutover, in order."""
    protocol = catalog.ConnectorProjectionProtocol
    return [
        DdlStep(
            catalog.INPUT_START_ORDINAL.label,
            has_column(bind, catalog.INPUT_START_ORDINAL),
            add_column_ddl(bind, catalog.INPUT_START_ORDINAL),
        ),
        DdlStep(
            protocol.name,
            has_table(bind, protocol.name),
            str(CreateTable(protocol).compile(dialect=bind.dialect)).strip(),
        ),
    ]


def field_history_steps(bind: Engine | Connection) -> list[DdlStep]:
    """Part B step of Field History eligibility stage 1."""
    added = catalog.FIELD_HISTORY_ELIGIBLE
    return [DdlStep(added.label, has_column(bind, added), add_column_ddl(bind, added))]


def apply_steps(engine: Engine, steps: list[DdlStep]) -> list[str]:
    """Run the DDL of absent steps, one statement each; returns the labels this call created.

    A concurrent identical DDL (another run adding the same object first) is
    not an error: the object exists, which is all the step promises.
    """
    created = []
    for step in steps:
        if step.present:
            continue
        try:
            with engine.begin() as conn:
                conn.exec_driver_sql(step.ddl)
        except sa_exc.DBAPIError as exc:
            if not is_ddl_already_done(exc):
                raise classify(exc, f"adding {step.label}") from exc
            continue
        created.append(step.label)
    return created


def require_v2_prerequisite(bind: Engine | Connection) -> None:
    """:class:`MissingSchema` unless the WorkItem-only v2 handoff (ReplayOfWorkId) landed."""
    cols = existing_columns(bind, catalog.WorkItem.name)
    if cols is None:
        raise MissingSchema([catalog.WorkItem.name], "not a tenant database?")
    if catalog.V2_REPLAY_OF_WORK_ID.column_name not in cols:
        raise MissingSchema(
            [catalog.V2_REPLAY_OF_WORK_ID.label],
            "the WorkItem-only v2 handoff must land before this cutover; this tool never creates it",
        )


def require_tenant_schema(bind: Engine | Connection) -> None:
    """:class:`MissingSchema` naming every Part A table (the pre-cutover tenant schema) that is absent."""
    missing = [name for name in catalog.legacy_metadata.tables if not has_table(bind, name)]
    if missing:
        raise MissingSchema(missing, "not a tenant database, or a DSN naming the wrong schema?")


def missing_projection_schema(bind: Engine | Connection) -> list[str]:
    """Every object the range protocol needs that is absent (empty when complete)."""
    missing = []
    work_cols = existing_columns(bind, catalog.WorkItem.name)
    if work_cols is None:
        return [catalog.WorkItem.name]
    for added in (catalog.V2_REPLAY_OF_WORK_ID, catalog.INPUT_START_ORDINAL):
        if added.column_name not in work_cols:
            missing.append(added.label)
    for table in (catalog.Event, catalog.PackInstall, catalog.Lock, catalog.ConnectorProjectionProtocol):
        if not has_table(bind, table.name):
            missing.append(table.name)
    return missing


def require_projection_schema(bind: Engine | Connection) -> None:
    missing = missing_projection_schema(bind)
    if missing:
        raise MissingSchema(missing, "apply the additive schema (cutover step 1) first")

"""The projection identity: the one helper that encodes it (contract, "Projection identity").

Identity = (PackInstallId, EventKind, RouteVersion, FlowVersion, WorkType, SourceLane).
Both ``_System_Event`` and ``_System_WorkItem`` carry these six columns, in this
order, as the prefix of their source-lane / projection-order indexes; nothing
else in the project lists them.
"""

from __future__ import annotations

from collections.abc import Iterable
from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Connection, Table, and_, literal, select

from .catalog import PROJECTION_WORK_TYPES

COLUMN_NAMES = ("PackInstallId", "EventKind", "RouteVersion", "FlowVersion", "WorkType", "SourceLane")


class ProjectionIdentity(NamedTuple):
    pack_install_id: str
    event_kind: str
    route_version: int
    flow_version: str
    work_type: str
    source_lane: str

    def as_values(self) -> dict[str, Any]:
        """Column name -> value, for INSERTs into Event or WorkItem."""
        return dict(zip(COLUMN_NAMES, self, strict=True))

    def label(self) -> str:
        return "/".join(str(part) for part in self)


def columns(table: Table) -> list[ColumnElement]:
    """The identity columns of ``table`` (Event or WorkItem), in index order."""
    return [table.c[name] for name in COLUMN_NAMES]


def of_row(row: Any) -> ProjectionIdentity:
    """The identity of a row selected with :func:`columns` (by column name)."""
    mapping = row._mapping if hasattr(row, "_mapping") else row
    return ProjectionIdentity(*(mapping[name] for name in COLUMN_NAMES))


def matches(table: Table, identity: ProjectionIdentity) -> ColumnElement[bool]:
    """``table``'s rows of exactly ``identity`` (an equality prefix of its index)."""
    return and_(*(table.c[name] == value for name, value in zip(COLUMN_NAMES, identity, strict=True)))


def is_projection_input(table: Table) -> ColumnElement[bool]:
    """``table``'s rows (Event or WorkItem) of a projection work type (contract, "Ordinary work").

    The one SQL form of the rule: an Event is a projection input when its ``WorkType`` is one of
    :data:`~nexus_cutover.catalog.PROJECTION_WORK_TYPES`; every other Event is ordinary work.
    """
    return table.c.WorkType.in_(PROJECTION_WORK_TYPES)


def projection_identities(conn: Connection, table: Table, identities: Iterable[ProjectionIdentity]) -> set[ProjectionIdentity]:
    """The members of ``identities`` (read from ``table``'s rows) whose work type is a projection work type.

    The server decides, as it decides every identity equality: a value spelled byte for byte like one of
    :data:`~nexus_cutover.catalog.PROJECTION_WORK_TYPES` is one under any collation; any other spelling
    (``'Connector.Projection'`` on a case-folding collation) is asked of the server with one index dive on
    ``table``'s identity prefix (:func:`is_projection_input` against the stored value).
    """
    def server_says_projection(ident: ProjectionIdentity) -> bool:
        probe = select(literal(1)).where(matches(table, ident), is_projection_input(table)).limit(1)
        return conn.execute(probe).first() is not None

    return {ident for ident in identities if ident.work_type in PROJECTION_WORK_TYPES or server_says_projection(ident)}

"""The projection identity: the one helper that encodes it (contract, "Projection identity").

Identity = (PackInstallId, EventKind, RouteVersion, FlowVersion, WorkType, SourceLane).
Both ``_System_Event`` and ``_System_WorkItem`` carry these six columns, in this
order, as the prefix of their source-lane / projection-order indexes; nothing
else in the project lists them.
"""

from __future__ import annotations

from typing import Any, NamedTuple

from sqlalchemy import ColumnElement, Table, and_

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

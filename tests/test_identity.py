"""nexus_cutover.identity: the six identity columns are the index prefix of Event and WorkItem; round trips."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import create_engine, insert, select
from sqlalchemy.dialects import sqlite

from nexus_cutover import catalog, identity
from nexus_cutover.identity import COLUMN_NAMES, ProjectionIdentity

IDENTITY = ProjectionIdentity("pk-1", "contact.updated", 3, "flow-7", "sync", "lane/a")


def _index(table, name):
    (index,) = [i for i in table.indexes if i.name == name]
    return [c.name for c in index.columns]


@pytest.mark.parametrize(
    ("table", "index", "next_column"),
    [
        (catalog.Event, "ix_Event_SourceLane", "EnqueueOrdinal"),
        (catalog.WorkItem, "ix_WorkItem_ProjectionOrder", "LaneOrdinal"),
    ],
)
def test_identity_columns_are_the_index_prefix(table, index, next_column):
    columns = _index(table, index)
    assert tuple(columns[: len(COLUMN_NAMES)]) == COLUMN_NAMES
    assert columns[len(COLUMN_NAMES) :] == [next_column]
    assert [c.name for c in identity.columns(table)] == list(COLUMN_NAMES)
    assert all(c.table is table for c in identity.columns(table))


def test_the_names_follow_the_tuple_fields():
    assert ProjectionIdentity._fields == ("pack_install_id", "event_kind", "route_version", "flow_version", "work_type", "source_lane")
    assert len(COLUMN_NAMES) == len(ProjectionIdentity._fields)


def test_as_values_label_and_of_row_round_trip():
    values = IDENTITY.as_values()
    assert list(values) == list(COLUMN_NAMES)
    assert values == {
        "PackInstallId": "pk-1",
        "EventKind": "contact.updated",
        "RouteVersion": 3,
        "FlowVersion": "flow-7",
        "WorkType": "sync",
        "SourceLane": "lane/a",
    }
    assert IDENTITY.label() == "pk-1/contact.updated/3/flow-7/sync/lane/a"
    assert identity.of_row(values) == IDENTITY
    assert identity.of_row({**values, "EventId": 9, "Status": "pending"}) == IDENTITY  # other columns ignored


def test_matches_is_an_equality_on_each_identity_column_in_order():
    sql = str(identity.matches(catalog.Event, IDENTITY).compile(dialect=sqlite.dialect()))
    positions = [sql.index(f'"_System_Event"."{name}" = ') for name in COLUMN_NAMES]
    assert positions == sorted(positions) and sql.count(" AND ") == len(COLUMN_NAMES) - 1


def test_round_trip_through_a_real_row():
    """In-memory SQLite: insert with as_values, select with columns(), read back with of_row, find with matches."""
    engine = create_engine("sqlite://")
    catalog.metadata.create_all(engine, tables=[catalog.Event])
    other = IDENTITY._replace(source_lane="lane/b")
    now = dt.datetime(2026, 1, 1)
    with engine.begin() as conn:
        for event_id, ident in ((1, IDENTITY), (2, other)):
            conn.execute(
                insert(catalog.Event).values(
                    EventId=event_id, Namespace="acme", EnqueueOrdinal=event_id, ReceiptId=f"r{event_id}", Status="pending",
                    Payload="{}", ReceivedAt=now, **ident.as_values(),
                )
            )
        rows = conn.execute(select(*identity.columns(catalog.Event)).order_by(catalog.Event.c.EventId)).all()
        assert [identity.of_row(row) for row in rows] == [IDENTITY, other]
        found = conn.execute(select(catalog.Event.c.EventId).where(identity.matches(catalog.Event, other))).scalars().all()
        assert found == [2]
    engine.dispose()

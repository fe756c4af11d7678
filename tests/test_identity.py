"""nexus_cutover.identity: the six identity columns are the index prefix of Event and WorkItem; round trips."""

from __future__ import annotations

import datetime as dt

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import create_engine, delete, insert, select, text
from sqlalchemy.dialects import sqlite
from sqlalchemy.engine import make_url

from nexus_cutover import catalog, identity
from nexus_cutover.db import make_engine
from nexus_cutover.identity import COLUMN_NAMES, ProjectionIdentity
from nexus_cutover.schema import create_legacy_schema
from tests import collations, hostile

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


# -- equality as the server decides it (contract: "Equality of identity values is decided once, by the server") --

SERVER_COLLATIONS = (collations.DEFAULT, collations.PAD_SPACE_BIN, collations.NO_PAD_BIN, "utf8mb4_unicode_ci")


def test_utf8mb4_bin_pads_with_spaces_and_nopad_bin_does_not(mysql_server_url):
    """What the tests' 'binary PAD SPACE' tenants rely on, checked on the server (MariaDB names the no-pad one)."""
    engine = make_engine(make_url(mysql_server_url).set(database="mysql"))
    try:
        with engine.connect() as conn:
            facts = conn.execute(
                text(
                    "SELECT CONVERT('a' USING utf8mb4) COLLATE utf8mb4_bin = CONVERT('a ' USING utf8mb4) COLLATE utf8mb4_bin, "
                    "CONVERT('a' USING utf8mb4) COLLATE utf8mb4_nopad_bin = CONVERT('a ' USING utf8mb4) COLLATE utf8mb4_nopad_bin, "
                    "CONVERT('a' USING utf8mb4) COLLATE utf8mb4_bin = CONVERT('A' USING utf8mb4) COLLATE utf8mb4_bin, "
                    "CONVERT('a' USING utf8mb4) COLLATE utf8mb4_general_ci = CONVERT('A ' USING utf8mb4) COLLATE utf8mb4_general_ci"
                )
            ).one()
    finally:
        engine.dispose()
    assert tuple(bool(v) for v in facts) == (True, False, False, True)


@pytest.mark.parametrize("collation", SERVER_COLLATIONS)
def test_value_keys_agree_with_the_servers_own_join_on_the_column(collation, mysql_server_url):
    """Hostile values stored in a real column: two values have equal keys exactly when the server's join pairs them."""
    field = catalog.Field
    with collations.collated_database(mysql_server_url, collation) as url:
        engine = make_engine(url)
        try:
            create_legacy_schema(engine)

            @settings(max_examples=40, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
            @given(hostile.family(max_size=4).flatmap(lambda bases: st.lists(hostile.keys_from(bases), min_size=2, max_size=10)))
            def check(values):
                with engine.begin() as conn:
                    conn.execute(delete(field))
                    row = {"ObjectName": "o", "TrackHistory": False, "Revision": 0}
                    rows = [{**row, "FieldId": i, "FieldName": v} for i, v in enumerate(values)]
                    conn.execute(insert(field), rows)
                    other = field.alias("other")
                    pairs = select(field.c.FieldId, other.c.FieldId).join(other, field.c.FieldName == other.c.FieldName)
                    joined = set(conn.execute(pairs).all())
                    keys = identity.value_keys(conn, field.c.FieldName, values, cache=False)
                for i, a in enumerate(values):
                    for j, b in enumerate(values):
                        assert ((i, j) in joined) == (keys[a] == keys[b]), (collation, a, b)

            check()
        finally:
            engine.dispose()


@pytest.mark.parametrize("collation", collations.COLLATIONS)
def test_identity_keys_equate_identities_the_server_joins(collation, mysql_server_url):
    with collations.collated_database(mysql_server_url, collation) as url:
        engine = make_engine(url)
        try:
            create_legacy_schema(engine)
            a = IDENTITY._replace(source_lane="Lane-A", event_kind="Contact.Updated")
            b = IDENTITY._replace(source_lane="lane-a ", event_kind="contact.updated")
            c = IDENTITY._replace(source_lane="Lane-A  ", route_version=4)
            with engine.connect() as conn:
                keys = identity.identity_keys(conn, [a, b, c])
        finally:
            engine.dispose()
    assert (keys[a] == keys[b]) == (collation == collations.DEFAULT)  # case folds only under the default collation
    assert keys[a] != keys[c]  # RouteVersion differs


def test_value_keys_on_sqlite_are_the_values_themselves():
    engine = create_engine("sqlite://")
    with engine.connect() as conn:
        assert identity.value_keys(conn, catalog.Event.c.SourceLane, ["a", "A", "a "]) == {"a": "a", "A": "A", "a ": "a "}
    engine.dispose()

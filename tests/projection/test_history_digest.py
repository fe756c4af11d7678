"""The history digest: computed the same on every backend, and every change to a history row named by key."""

from __future__ import annotations

import datetime as dt
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, insert, select, text, update
from sqlalchemy.engine import make_url

from nexus_cutover import catalog
from nexus_cutover.db import Deadline, make_engine
from nexus_cutover.errors import BadInput, LockTimeout, MissingSchema
from nexus_cutover.projection.checkpoint import run_checkpoint
from nexus_cutover.projection.digest import HistoryDigest, compute_digest, load_digest, verify_digest
from nexus_cutover.runtime.host import run_host
from nexus_sim.scenario import TenantScenario, drained_pack_history
from tests.support import fence_pack_namespace, make_cutover_ready, prepared_engine

NS, PACK = "tenant-d", "pk-d"
Event, WorkItem = catalog.Event, catalog.WorkItem


def history(engine, *, seed: int = 3, lanes: int = 3, generations: int = 4, receipts: int = 0,
            text: str = "Zoë Ångström café") -> TenantScenario:
    """A drained old-protocol history with every column kind, NULLs, and a non-ASCII payload."""
    sc = TenantScenario(namespace=NS)
    pack = sc.pack(PACK)
    drained_pack_history(pack, random.Random(seed), lanes=lanes, generations=generations, legacy_zero_lanes=1)
    lane = pack.lane("unicode")
    event = lane.event(payload=json.dumps({"name": text}, ensure_ascii=False), received_at=dt.datetime(2026, 1, 2, 3, 4, 5, 678901))
    lane.work_item(event, attempt=2, lease_owner="old-worker-1", blocked_on=None)
    sc.ordinary_work(event)
    other = TenantScenario(namespace="someone-else", event_id_start=10_000, work_id_start=10_000)
    other_lane = other.pack("pk-other").lane("x")
    other_lane.generation(2)
    for i in range(receipts):
        sc.receipt(PACK, f"new-{i % 2}", f"rc-{i:03d}")
    sc.write(engine)
    other.write(engine)
    return sc


def kinds(result) -> list[tuple[str, str, int | None, tuple[str, ...]]]:
    return [(d.table, d.kind, d.key, tuple(d.columns)) for d in result.differences]


def execute(engine, stmt) -> None:
    with engine.begin() as conn:
        conn.execute(stmt)


def test_unchanged_history_verifies_and_the_summary_says_what_was_covered(engine):
    sc = history(engine)
    digest = compute_digest(engine, NS, chunk_rows=7)
    assert digest.rows == {Event.name: len(sc.events), WorkItem.name: len(sc.work_items)}  # the other namespace is not in it
    assert digest.chunk_count[Event.name] == -(-len(sc.events) // 7)
    assert len(digest.short_hash) == 16 and digest.summary()["hash"] == digest.short_hash
    result = verify_digest(engine, digest)
    assert result.ok, result.summary()
    assert result.rows_now == digest.rows and "verified" in result.summary()


def in_charset(url: str, charset: str) -> str:
    """``url``'s database switched to ``charset`` (before any table exists), as a tenant may be created."""
    db = make_url(url)
    admin = make_engine(db)
    with admin.begin() as conn:
        conn.execute(text(f"ALTER DATABASE `{db.database}` CHARACTER SET {charset}"))
    admin.dispose()
    return url


def test_sqlite_and_mariadb_compute_the_same_digest_for_the_same_rows(mysql_url, sqlite_url):
    digests = []
    for url in (in_charset(mysql_url, "utf8mb4"), sqlite_url):  # utf8mb4, as TiDB: any text
        with prepared_engine(url, make_cutover_ready) as eng:
            history(eng, seed=11, text="Zoë Łukasz 東京 ✓")
            digests.append(compute_digest(eng, NS, chunk_rows=5))
    on_mysql, on_sqlite = digests
    assert on_mysql.rows == on_sqlite.rows and on_mysql.rows[Event.name] > 10
    assert on_mysql.as_json()["tables"] == on_sqlite.as_json()["tables"]
    assert on_mysql.short_hash == on_sqlite.short_hash


def test_a_latin1_tenant_hashes_the_utf8_text_like_every_other_backend(mysql_url, sqlite_url):
    """Text stored in another charset is converted before hashing: the same rows, the same digest."""
    latin1 = make_url(in_charset(mysql_url, "latin1"))
    digests = []
    for url in (mysql_url, sqlite_url):
        with prepared_engine(url, make_cutover_ready) as eng:
            history(eng, seed=2, text="Zoë Ångström café")
            digests.append(compute_digest(eng, NS, chunk_rows=5))
    look = make_engine(latin1)
    with look.connect() as conn:
        charset = conn.execute(text("SELECT CHARACTER_SET_NAME FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = "
                                    "DATABASE() AND TABLE_NAME = '_System_Event' AND COLUMN_NAME = 'Payload'")).scalar()
    look.dispose()
    assert charset == "latin1"
    assert digests[0].short_hash == digests[1].short_hash


def test_a_digest_taken_on_one_backend_verifies_on_the_other(mysql_url, sqlite_url):
    with prepared_engine(mysql_url, make_cutover_ready) as eng:
        history(eng, seed=5)
        saved = json.loads(json.dumps(compute_digest(eng, NS, chunk_rows=4).as_json()))
    with prepared_engine(sqlite_url, make_cutover_ready) as eng:
        history(eng, seed=5)
        assert verify_digest(eng, HistoryDigest.from_json(saved)).ok
        execute(eng, update(Event).where(Event.c.EventId == 3).values(Status="skipped"))
        assert kinds(verify_digest(eng, HistoryDigest.from_json(saved))) == [(Event.name, "changed", 3, ("Status",))]


CHANGES = {
    "int": (Event, 4, {"RouteVersion": 99}, ("RouteVersion",)),
    "text": (Event, 5, {"Payload": '{"name": "Zoe"}'}, ("Payload",)),
    "datetime": (Event, 2, {"ReceivedAt": dt.datetime(2026, 1, 2, 3, 4, 5, 678902)}, ("ReceivedAt",)),
    "null to value": (Event, 7, {"ReplayOfWorkId": 1}, ("ReplayOfWorkId",)),
    "value to null": (WorkItem, 3, {"LaneOrdinal": None}, ("LaneOrdinal",)),
    "two columns": (WorkItem, 2, {"Status": "pending", "Attempt": 5}, ("Attempt", "Status")),
    "work item text to null": (WorkItem, 1, {"SelectedEventId": None, "FlowVersion": None}, ("FlowVersion", "SelectedEventId")),
}


@pytest.mark.parametrize("change", list(CHANGES), ids=list(CHANGES))
def test_a_history_row_changed_after_the_digest_is_named_with_its_columns(engine, change):
    history(engine)
    table, key, values, columns = CHANGES[change]
    digest = compute_digest(engine, NS, chunk_rows=6)
    pk = table.primary_key.columns[0]
    execute(engine, update(table).where(pk == key).values(**values))
    result = verify_digest(engine, digest)
    assert kinds(result) == [(table.name, "changed", key, tuple(sorted(columns)))]
    assert f"{pk.name} {key} changed" in result.summary()
    assert result.chunks_differing[table.name] == 1


def test_a_deleted_history_row_is_named_missing(engine):
    history(engine)
    digest = compute_digest(engine, NS, chunk_rows=6)
    execute(engine, delete(WorkItem).where(WorkItem.c.WorkId == 4))
    result = verify_digest(engine, digest)
    assert kinds(result) == [(WorkItem.name, "missing", 4, ())]
    assert result.rows_now[WorkItem.name] == digest.rows[WorkItem.name] - 1


@pytest.mark.parametrize("event_id", [0, 10**9], ids=["low id", "high id"])
def test_an_inserted_history_event_is_named_extra_wherever_its_id_falls(engine, event_id):
    sc = history(engine)
    digest = compute_digest(engine, NS, chunk_rows=6)
    row = {**sc.events[0], "EventId": event_id, "ReceiptId": "late-old-writer", "EnqueueOrdinal": 0}
    execute(engine, insert(Event).values(**row))
    result = verify_digest(engine, digest)
    assert kinds(result) == [(Event.name, "extra", event_id, ())]


def test_an_old_style_work_item_with_a_low_id_is_extra(engine):
    sc = history(engine)
    digest = compute_digest(engine, NS, chunk_rows=6)
    execute(engine, insert(WorkItem).values(**{**sc.work_items[0], "WorkId": -5}))
    assert kinds(verify_digest(engine, digest)) == [(WorkItem.name, "extra", -5, ())]


def test_several_rows_changed_in_one_chunk_are_reported_by_range_with_their_columns(engine):
    history(engine)
    digest = compute_digest(engine, NS, chunk_rows=50)
    execute(engine, update(Event).where(Event.c.EventId.in_([2, 3])).values(Status="failed"))
    result = verify_digest(engine, digest)
    (d,) = result.differences
    assert (d.kind, d.key, d.columns, d.lo) == ("several", None, ["Status"], None)
    assert "more than one row" in d.text


def test_rows_the_new_host_admits_and_changes_above_the_cutoff_pass(engine):
    sc = history(engine, receipts=6)
    digest = compute_digest(engine, NS, chunk_rows=5)
    fence_pack_namespace(engine, PACK)
    assert run_checkpoint(engine, PACK, timeout_s=30, written_by="test").ok
    assert run_host(engine, NS, process_id="host-d", drain_and_exit=True, poll_s=0.01) == 0
    with engine.connect() as conn:
        cutoff = sc.packs[0].last_ordinal
        above = conn.execute(select(Event.c.EventId).where(Event.c.EnqueueOrdinal > cutoff)).scalars().all()
        claimed = conn.execute(select(WorkItem.c.Status).where(WorkItem.c.InputStartOrdinal.is_not(None))).scalars().all()
    assert len(above) == 6 and set(claimed) == {"completed"}  # the host admitted, claimed and completed range work
    # a TiDB server may hand the new host a low id: content, not the id, says it is above the cutoff
    low = {**sc.events[0], "EventId": -1, "ReceiptId": "range-low-id", "EnqueueOrdinal": cutoff + 100}
    execute(engine, insert(Event).values(**low))
    result = verify_digest(engine, digest)
    assert result.ok, result.summary()
    assert result.cutoffs_now == {PACK: cutoff}


def test_a_table_without_the_expected_columns_is_a_clear_error(legacy_engine):
    with pytest.raises(MissingSchema, match=r"_System_WorkItem\.InputStartOrdinal"):
        compute_digest(legacy_engine, NS)


def test_a_missing_table_is_named(tenant_url):
    with prepared_engine(tenant_url, lambda eng: None) as eng:
        with pytest.raises(MissingSchema, match="_System_Event"):
            compute_digest(eng, NS)


def test_bad_chunk_size_and_damaged_digests_are_bad_input(engine, tmp_path):
    history(engine)
    with pytest.raises(BadInput, match="chunk rows"):
        compute_digest(engine, NS, chunk_rows=0)
    saved = compute_digest(engine, NS, chunk_rows=6).as_json()
    path = tmp_path / "digest.json"
    path.write_text(json.dumps(saved))
    assert load_digest(str(path)).short_hash == saved["hash"]
    saved["tables"][Event.name]["chunks"][0][2] += 1
    path.write_text(json.dumps(saved))
    with pytest.raises(BadInput, match="damaged"):
        load_digest(str(path))
    path.write_text("{not json")
    with pytest.raises(BadInput, match="not JSON"):
        load_digest(str(path))
    with pytest.raises(BadInput, match="cannot read"):
        load_digest(str(tmp_path / "absent.json"))
    broken = {**saved, "tables": {"_System_Fence": {}}}
    with pytest.raises(BadInput, match="unknown table"):
        HistoryDigest.from_json(broken)


def test_a_digest_interrupted_by_a_timeout_wrote_nothing_and_the_rerun_is_identical(engine):
    history(engine)
    clean = compute_digest(engine, NS, chunk_rows=4)
    seen = []
    deadline = Deadline(3600)

    def expire(_table, chunk):
        seen.append(chunk)
        if len(seen) == 3:
            deadline.seconds = 0  # the call's bound runs out between two chunks

    with pytest.raises(LockTimeout, match="digesting"):
        compute_digest(engine, NS, chunk_rows=4, deadline=deadline, on_chunk=expire)
    assert len(seen) == 3
    assert compute_digest(engine, NS, chunk_rows=4).short_hash == clean.short_hash


def test_a_connection_killed_between_chunks_does_not_change_the_digest(mysql_url):
    with prepared_engine(mysql_url, make_cutover_ready) as eng:
        history(eng)
        clean = compute_digest(eng, NS, chunk_rows=4)
        admin = make_engine(mysql_url)
        killed = []

        def kill(_table, _chunk):
            if len(killed) < 2:
                with admin.connect() as conn:
                    me = conn.execute(text("SELECT CONNECTION_ID()")).scalar()
                    ids = conn.execute(text("SELECT ID FROM information_schema.PROCESSLIST WHERE DB = DATABASE() AND ID <> :me"),
                                       {"me": me}).scalars().all()
                    for pid in ids:
                        conn.execute(text(f"KILL CONNECTION {int(pid)}"))
                    killed.extend(ids)

        again = compute_digest(eng, NS, chunk_rows=4, on_chunk=kill)
        admin.dispose()
        assert killed and again.short_hash == clean.short_hash


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), chunk_rows=st.integers(1, 9), pick=st.integers(0, 10_000),
       corruption=st.sampled_from(["status", "ordinal", "payload", "delete", "insert", "lease"]))
def test_any_single_corruption_of_a_random_history_is_named(seed, chunk_rows, pick, corruption):
    with prepared_engine("sqlite://", make_cutover_ready) as eng:  # a fresh in-memory tenant per example
        sc = TenantScenario(namespace=NS)
        drained_pack_history(sc.pack(PACK), random.Random(seed), lanes=2, generations=3)
        sc.write(eng)
        digest = compute_digest(eng, NS, chunk_rows=chunk_rows)
        assert verify_digest(eng, digest).ok
        event = sc.events[pick % len(sc.events)]
        work = sc.work_items[pick % len(sc.work_items)]
        this_event = update(Event).where(Event.c.EventId == event["EventId"])
        if corruption == "status":
            execute(eng, this_event.values(Status="failed" if event["Status"] != "failed" else "processed"))
            expected = (Event.name, "changed", event["EventId"])
        elif corruption == "ordinal":
            execute(eng, this_event.values(EnqueueOrdinal=0 if event["EnqueueOrdinal"] else 1))
            expected = (Event.name, "changed", event["EventId"])
        elif corruption == "payload":
            execute(eng, this_event.values(Payload=event["Payload"] + " "))
            expected = (Event.name, "changed", event["EventId"])
        elif corruption == "delete":
            execute(eng, delete(WorkItem).where(WorkItem.c.WorkId == work["WorkId"]))
            expected = (WorkItem.name, "missing", work["WorkId"])
        elif corruption == "insert":
            execute(eng, insert(WorkItem).values(**{**work, "WorkId": 10**6 + pick}))
            expected = (WorkItem.name, "extra", 10**6 + pick)
        else:
            execute(eng, update(WorkItem).where(WorkItem.c.WorkId == work["WorkId"]).values(LeaseOwner="intruder"))
            expected = (WorkItem.name, "changed", work["WorkId"])
        result = verify_digest(eng, digest)
        assert [(d.table, d.kind, d.key) for d in result.differences] == [expected]

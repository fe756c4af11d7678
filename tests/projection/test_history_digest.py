"""The history digest: computed the same on every backend, and every change to a history row named by key."""

from __future__ import annotations

import datetime as dt
import json
import random

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st
from sqlalchemy import BigInteger, delete, insert, literal, select, text, update
from sqlalchemy.engine import make_url

from nexus_cutover import catalog
from nexus_cutover.db import Deadline, make_engine
from nexus_cutover.errors import BadInput, LockTimeout, MissingSchema
from nexus_cutover.projection import digest as digests
from nexus_cutover.projection.checkpoint import run_checkpoint
from nexus_cutover.projection.digest import HistoryDigest, compute_digest, load_digest, verify_digest
from nexus_cutover.runtime.host import run_host
from nexus_sim.scenario import TenantScenario, drained_pack_history, insert_rows
from tests.support import fence_pack_namespace, make_cutover_ready, prepared_engine

NS, PACK = "tenant-d", "pk-d"
Event, WorkItem = catalog.Event, catalog.WorkItem
ORDINARY_WORK_TYPE = "email.send"


def projection_rows(sc: TenantScenario) -> dict[str, int]:
    """How many history rows the scenario has: projection inputs and projection WorkItems (no ordinary work)."""
    return {Event.name: sum(e["WorkType"] == catalog.PROJECTION_WORK_TYPE for e in sc.events),
            WorkItem.name: sum(w["WorkClass"] == catalog.WORK_CLASS_PROJECTION for w in sc.work_items)}


def history(engine, *, seed: int = 3, lanes: int = 3, generations: int = 4, receipts: int = 0,
            text: str = "Zoë Ångström café") -> TenantScenario:
    """A drained old-protocol history with every column kind, NULLs, and a non-ASCII payload."""
    sc = TenantScenario(namespace=NS)
    pack = sc.pack(PACK)
    drained_pack_history(pack, random.Random(seed), lanes=lanes, generations=generations, legacy_zero_lanes=1)
    lane = pack.lane("unicode")
    event = lane.event(payload=json.dumps({"name": text}, ensure_ascii=False), received_at=dt.datetime(2026, 1, 2, 3, 4, 5, 678901))
    lane.work_item(event, attempt=2, lease_owner="old-worker-1", blocked_on=None)
    # ordinary work beside it (contract, "Ordinary work"): an ordinary Event of the pack and its ordinary WorkItem
    mail = pack.lane("mail", event_kind="mail.requested", work_type=ORDINARY_WORK_TYPE).event(status="pending")
    sc.ordinary_work(mail, status="retry")
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
    assert digest.rows == projection_rows(sc)  # neither the other namespace nor ordinary work is in it
    assert digest.chunk_count[Event.name] == -(-projection_rows(sc)[Event.name] // 7)
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


def history_keys(engine, table) -> list[int]:
    pk = table.primary_key.columns[0]
    where = digests.history_rows(table, NS, {})
    with engine.connect() as conn:
        return sorted(conn.execute(select(pk).where(*where)).scalars())


def by_slice(keys) -> dict[int, list[int]]:
    out: dict[int, list[int]] = {}
    for key in keys:
        out.setdefault(digests.slice_of(key), []).append(key)
    return out


def test_slices_spread_consecutive_and_strided_keys_and_sql_agrees_with_python(engine):
    n = digests.SLICES
    assert [digests.slice_of(k) for k in range(n)] == list(range(n))  # consecutive keys: every slice once
    for stride in (2, 16, 1000, 2**20):  # ids a stride apart (several servers, shards) spread too
        assert sorted(digests.slice_of(k * stride + 3) for k in range(n)) == list(range(n)), stride
    assert sorted(digests.slice_of((k << 58) + 5) for k in range(n)) == list(range(n))  # high shard bits
    assert 0 <= digests.slice_of(-1) < n and 0 <= digests.slice_of(-2**63) < n
    if engine.dialect.name != "sqlite":  # the server's copy of the rule gives the same slice for every key
        keys = [0, 1, 15, 16, 255, 4097, 2**31 - 1, 2**31, 2**40 + 7, 2**62 + 12345, -1, -2**63, 10**18]
        with engine.connect() as conn:
            sql = [conn.execute(select(digests._Shape.slice_sql(literal(k, BigInteger)))).scalar() for k in keys]
        assert sql == [digests.slice_of(k) for k in keys]


def test_several_rows_of_one_chunk_are_each_named_with_their_columns(engine):
    """Rows of one chunk differ, each alone in its slice: each is named, a changed one with its own columns."""
    sc = history(engine, lanes=4, generations=6)
    digest = compute_digest(engine, NS, chunk_rows=200)  # one chunk per table
    assert digest.chunk_count == {Event.name: 1, WorkItem.name: 1}
    assert len(digest.tables[Event.name].chunks[0].slice_chunks()) == digests.SLICES
    event_keys = history_keys(engine, Event)
    consecutive = event_keys[20:23]  # a run of ids changed together: three slices
    free = by_slice(k for k in event_keys if digests.slice_of(k) not in {digests.slice_of(c) for c in consecutive})
    first, second, third = (free[j][0] for j in sorted(free)[:3])
    work = by_slice(history_keys(engine, WorkItem))[2][0]
    execute(engine, update(Event).where(Event.c.EventId == first).values(Status="skipped"))
    execute(engine, update(Event).where(Event.c.EventId == second).values(Payload="{}", RouteVersion=7))
    execute(engine, delete(Event).where(Event.c.EventId == third))
    execute(engine, update(Event).where(Event.c.EventId.in_(consecutive)).values(SourceLane="moved"))
    execute(engine, update(WorkItem).where(WorkItem.c.WorkId == work).values(LeaseOwner="intruder"))
    result = verify_digest(engine, digest)
    assert len({digests.slice_of(k) for k in (first, second, third, *consecutive)}) == 6
    assert kinds(result) == sorted([
        (Event.name, "changed", first, ("Status",)),
        (Event.name, "changed", second, ("RouteVersion", "Payload")),  # catalog order
        (Event.name, "missing", third, ()),
        *((Event.name, "changed", key, ("SourceLane",)) for key in consecutive),
    ], key=lambda d: digests.slice_of(d[2])) + [(WorkItem.name, "changed", work, ("LeaseOwner",))]
    assert result.chunks_differing == {Event.name: 1, WorkItem.name: 1} and result.named_rows == 7
    assert len(sc.events) > 16


def test_two_rows_of_one_slice_are_the_chunks_key_range_with_its_row_counts(engine):
    history(engine, lanes=4, generations=6)
    digest = compute_digest(engine, NS, chunk_rows=200)
    slices = by_slice(history_keys(engine, Event))
    j, same = next((j, keys) for j, keys in slices.items() if len(keys) >= 2)
    other = next(keys[0] for k, keys in slices.items() if k != j)
    execute(engine, update(Event).where(Event.c.EventId == same[0]).values(Status="failed"))
    execute(engine, update(Event).where(Event.c.EventId == same[1]).values(Status="skipped"))  # unalike: no XOR cancels
    execute(engine, update(Event).where(Event.c.EventId == other).values(Status="skipped"))
    result = verify_digest(engine, digest)
    rows = digest.rows[Event.name]
    assert sorted(kinds(result), key=str) == sorted([(Event.name, "changed", other, ("Status",)),
                                                     (Event.name, "range", None, ("Status",))], key=str)
    (d,) = [d for d in result.differences if d.kind == "range"]
    assert (d.lo, d.hi, d.rows_then, d.rows_now, d.narrowed) == (None, None, rows, rows, True)
    assert f"rows with EventId in (-inf, +inf] differ ({rows} rows then, {rows} now; column(s) Status)" in d.text
    execute(engine, delete(Event).where(Event.c.EventId == same[1]))  # a missing row: every column's figure moves
    (d,) = [d for d in verify_digest(engine, digest).differences if d.kind == "range"]
    assert (d.rows_then, d.rows_now) == (rows, rows - 1) and "Status" in d.columns


def test_past_the_bound_the_differences_are_key_ranges_with_row_counts(engine):
    """More differing rows than MAX_NAMED_ROWS: the first ones are named, the rest are key ranges (not narrowed)."""
    sc = TenantScenario(namespace=NS)
    lane = sc.pack(PACK).lane("deep")
    for _ in range(digests.MAX_NAMED_ROWS + 40):
        lane.generation(1)
    sc.write(engine)
    digest = compute_digest(engine, NS, chunk_rows=16)
    changed = [e["EventId"] for e in sc.events]
    execute(engine, update(Event).where(Event.c.EventId.in_(changed)).values(Status="skipped"))
    result = verify_digest(engine, digest)
    named = [d for d in result.differences if d.kind == "changed"]
    ranges = [d for d in result.differences if d.kind == "range"]
    assert len(named) == digests.MAX_NAMED_ROWS and {d.key for d in named} < set(changed)
    assert all(d.columns == ["Status"] for d in named)
    assert all(set(d.columns) <= {"Status"} for d in ranges)  # XOR figures: a column changed alike in an even
    # number of a range's rows can cancel out of its list (never a wrong column); a named row's are exact
    assert result.named_rows == digests.MAX_NAMED_ROWS == result.as_json()["named_rows"]
    unnamed = [d for d in ranges if not d.narrowed]
    assert unnamed and all(f"{digests.MAX_NAMED_ROWS} rows were already named" in d.text for d in unnamed)
    last = digest.tables[Event.name].chunks
    assert unnamed[-1].hi is None and unnamed[-1].lo == last[-2].hi  # the last chunk, open-ended
    covered = {d.key for d in named}
    for d in ranges:  # every changed row not named lies in a range reported
        covered |= {k for k in changed if (d.lo is None or k > d.lo) and (d.hi is None or k <= d.hi)}
    assert covered == set(changed)


def test_ordinary_work_changing_and_appearing_after_the_digest_never_fails_it(engine):
    """Ordinary Events and WorkItems are not history: the new runtime processes and creates them after the release."""
    sc = history(engine)
    digest = compute_digest(engine, NS, chunk_rows=5)
    ordinary = next(w for w in sc.work_items if w["WorkClass"] == catalog.WORK_CLASS_ORDINARY)
    execute(engine, update(WorkItem).where(WorkItem.c.WorkId == ordinary["WorkId"]).values(Status="completed", Attempt=3))
    execute(engine, update(Event).where(Event.c.EventId == ordinary["SelectedEventId"]).values(Status="processed"))
    more = TenantScenario(namespace=NS, event_id_start=-50, work_id_start=-50)  # low ids: content decides, not the id
    mail = more.pack("pk-mail-only").lane("Mail Ä ", event_kind="mail.requested", work_type=ORDINARY_WORK_TYPE).event()
    more.ordinary_work(mail, status="pending")
    insert_rows(engine, Event, more.events)
    insert_rows(engine, WorkItem, more.work_items)
    result = verify_digest(engine, digest)
    assert result.ok, result.summary()
    execute(engine, update(Event).where(Event.c.EventId == sc.events[0]["EventId"]).values(Status="skipped"))
    assert kinds(verify_digest(engine, digest)) == [(Event.name, "changed", sc.events[0]["EventId"], ("Status",))]


def test_a_version_1_digest_is_refused_with_what_to_do(engine):
    history(engine)
    saved = compute_digest(engine, NS, chunk_rows=6).as_json()
    with pytest.raises(BadInput, match="version-1 digest.*ordinary work.*take a new digest"):
        HistoryDigest.from_json({**saved, "version": 1})


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


def slice_of_key(digest, table, key) -> tuple[int, int]:
    """(chunk, slice) of ``key`` in the digest's recorded chunk ranges (the last chunk open-ended)."""
    import bisect

    chunks = digest.tables[table.name].chunks
    return min(bisect.bisect_left([ch.hi for ch in chunks], key), len(chunks) - 1), digests.slice_of(key)


@settings(max_examples=25, deadline=None)
@given(seed=st.integers(0, 10_000), chunk_rows=st.integers(16, 80),
       picks=st.lists(st.tuples(st.integers(0, 10_000), st.sampled_from(["status", "payload", "delete"])),
                      min_size=2, max_size=6))
def test_corruptions_in_distinct_slices_are_each_named(seed, chunk_rows, picks):
    """Several rows of one chunk differ, each alone in its slice: every one is named (changed with its column, or missing)."""
    with prepared_engine("sqlite://", make_cutover_ready) as eng:
        sc = TenantScenario(namespace=NS)
        drained_pack_history(sc.pack(PACK), random.Random(seed), lanes=3, generations=6)
        sc.write(eng)
        digest = compute_digest(eng, NS, chunk_rows=chunk_rows)
        chosen: dict[tuple[int, int], tuple[dict, str]] = {}
        for pick, how in picks:
            event = sc.events[pick % len(sc.events)]
            chosen.setdefault(slice_of_key(digest, Event, event["EventId"]), (event, how))
        expected = []
        for _, (event, how) in sorted(chosen.items()):  # differences come chunk by chunk, slice by slice
            this = Event.c.EventId == event["EventId"]
            if how == "delete":
                execute(eng, delete(Event).where(this))
                expected.append((Event.name, "missing", event["EventId"], ()))
            elif how == "payload":
                execute(eng, update(Event).where(this).values(Payload=event["Payload"] + "!"))
                expected.append((Event.name, "changed", event["EventId"], ("Payload",)))
            else:
                execute(eng, update(Event).where(this).values(Status="failed" if event["Status"] != "failed" else "skipped"))
                expected.append((Event.name, "changed", event["EventId"], ("Status",)))
        assert kinds(verify_digest(eng, digest)) == expected

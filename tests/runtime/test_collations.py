"""Identity equality and receipt keys as the tenant's collation decides them (contract, "Projection identity").

On SQLite (BINARY: exact bytes) and on MariaDB tenants of its default collation (``utf8mb4_general_ci``: folds
case, ignores trailing spaces) and of a binary PAD SPACE one (``utf8mb4_bin``: ignores trailing spaces only).
What the collation equates is asked of the server (``equality``), never assumed.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import event, func, select

from nexus_cutover import catalog
from nexus_cutover.catalog import Event, IngressReceipt, WorkItem
from nexus_cutover.db import Deadline
from nexus_cutover.errors import BadInput
from nexus_cutover.runtime.admission import admit_batch
from nexus_cutover.runtime.claim import claim_work, complete
from nexus_cutover.runtime.errors import InadmissibleReceipts, InvalidReceipts, ReceiptCollision
from nexus_cutover.runtime.host import run_host
from nexus_cutover.runtime.materializer import materialize
from nexus_cutover.runtime.model import Routing
from nexus_cutover.runtime.payload import load_payloads

from ..support import history_checksum
from .support import NS, PACK, assert_membership, inp, range_generations, range_tenant, server_owners


def _statements(engine):
    sent: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda _c, _cur, statement, *_: sent.append(" ".join(statement.split())))
    return sent


@pytest.mark.parametrize("variants", [("Lane-A", "lane-a", "LANE-A"), ("a", "a ", "a  "), ("Ünï", "ünï ", "ÜNÏ")])
def test_lanes_the_collation_equates_are_one_identity_with_one_generation(collated_engine, equality, variants):
    range_tenant(collated_engine)
    first, second, third = variants
    result = admit_batch(collated_engine, PACK, [inp(first, "1"), inp(second, "2"), inp(first, "3")])
    later = admit_batch(collated_engine, PACK, [inp(third, "4")])
    same = equality.equal(first, second)
    assert len(result.created_work_ids) == (1 if same else 2)
    owners = assert_membership(collated_engine)  # the server's join: each Event in exactly one generation
    assert len(owners) == 4
    if same:
        (work_id,) = result.created_work_ids
        with collated_engine.connect() as conn:
            members = [p.receipt_id for p in load_payloads(conn, work_id)]
        expected = ["1", "2", "3"] + (["4"] if equality.equal(first, third) else [])
        assert members == expected
        assert later.extended_work_ids == ([work_id] if equality.equal(first, third) else [])
    with collated_engine.connect() as conn:
        events = dict(conn.execute(select(Event.c.ReceiptId, Event.c.SourceLane)).all())
    assert events == {"1": first, "2": second, "3": first, "4": third}  # every Event keeps its own bytes


def test_a_claimed_generation_sends_a_variant_to_one_successor(collated_engine, equality):
    range_tenant(collated_engine)
    (work_id,) = admit_batch(collated_engine, PACK, [inp("Lane-A", "1")]).created_work_ids
    claimed = claim_work(collated_engine, work_id, "w")
    result = admit_batch(collated_engine, PACK, [inp("lane-a", "2"), inp("Lane-A ", "3")])
    # one successor per identity class of the batch (the claimed generation keeps both bounds)
    assert len(result.created_work_ids) == len({equality.cls(x) for x in ("lane-a", "Lane-A ")})
    assert not result.extended_work_ids
    assert complete(collated_engine, claimed)
    assert all(len(holders) == 1 for holders in server_owners(collated_engine, PACK).values())
    assert_membership(collated_engine)


@pytest.mark.parametrize(("admitted", "offered"), [("a0Q5e00000AbCdE", "a0Q5e00000ABCDE"), ("crm-1", "crm-1 ")])
def test_a_receipt_key_the_collation_equates_but_bytes_differ_is_a_collision_named_not_retried(
    collated_engine, equality, admitted, offered
):
    range_tenant(collated_engine)
    (first,) = admit_batch(collated_engine, PACK, [inp("a", admitted)]).admitted
    before = history_checksum(collated_engine)
    sent = _statements(collated_engine)
    if not equality.equal(admitted, offered):  # a binary collation tells them apart: a fresh receipt
        assert [a.receipt_id for a in admit_batch(collated_engine, PACK, [inp("a", offered)]).admitted] == [offered]
        return
    with pytest.raises(ReceiptCollision) as info:
        admit_batch(collated_engine, PACK, [inp("a", "fresh"), inp("a", offered)], deadline=Deadline(60))
    err = info.value
    assert err.keys == {("a", offered)}
    assert repr(offered) in str(err) and repr(admitted) in str(err) and f"EventId {first.event_id}" in str(err)
    assert "timed out" not in str(err) and "lock" not in str(err)
    assert history_checksum(collated_engine) == before  # nothing written: not acknowledged, fresh input not admitted
    # Not retried: the optimistic INSERT once, then one probing attempt that found the collision before inserting.
    assert sum(s.startswith("INSERT INTO") and "_System_Event" in s.split("(")[0] for s in sent) == 1


def test_two_receipts_of_one_batch_the_collation_equates_collide_with_each_other(collated_engine, equality):
    range_tenant(collated_engine)
    batch = [inp("a", "Rx-1"), inp("b", "y"), inp("a", "rx-1 ")]
    if not equality.equal("Rx-1", "rx-1 "):
        assert len(admit_batch(collated_engine, PACK, batch).admitted) == 3
        return
    with pytest.raises(ReceiptCollision, match="earlier in the same batch") as info:
        admit_batch(collated_engine, PACK, batch)
    assert info.value.keys == {("a", "rx-1 ")}
    result = admit_batch(collated_engine, PACK, batch[:2])  # without the collider: admitted
    assert [a.receipt_id for a in result.admitted] == ["Rx-1", "y"]


def test_a_lane_variant_of_an_admitted_receipt_key_is_a_collision_not_a_duplicate(collated_engine, equality):
    range_tenant(collated_engine)
    admit_batch(collated_engine, PACK, [inp("Lane-A", "r1")])
    if not equality.equal("Lane-A", "lane-a"):
        assert admit_batch(collated_engine, PACK, [inp("lane-a", "r1")]).admitted
        return
    with pytest.raises(ReceiptCollision) as info:
        admit_batch(collated_engine, PACK, [inp("lane-a", "r1")])
    assert "'Lane-A'" in str(info.value) and "'lane-a'" in str(info.value)
    exact = admit_batch(collated_engine, PACK, [inp("Lane-A", "r1")])  # the exact key stays a duplicate
    assert [d.reason for d in exact.duplicates] == ["covered"] and not exact.admitted


def test_a_pack_named_in_another_spelling_admits_under_its_stored_id(collated_engine, equality):
    range_tenant(collated_engine)
    if not equality.equal(PACK, "PK-1 "):
        with pytest.raises(BadInput, match="unknown pack"):
            admit_batch(collated_engine, "PK-1 ", [inp("a", "1")])
        return
    result = admit_batch(collated_engine, "PK-1 ", [inp("a", "1")])
    assert result.pack_install_id == PACK
    assert [g.PackInstallId for g in range_generations(collated_engine)] == [PACK]
    with collated_engine.connect() as conn:
        assert conn.execute(select(Event.c.PackInstallId)).scalars().all() == [PACK]
    assert_membership(collated_engine)


def test_invalid_receipts_are_named_each_and_nothing_is_written(collated_engine):
    range_tenant(collated_engine)
    before = history_checksum(collated_engine)
    with pytest.raises(InvalidReceipts) as info:
        admit_batch(collated_engine, PACK, [inp("a", "ok"), inp("", "r"), inp("a", "x" * 129), inp("a", "k", event_kind="e" * 129)])
    assert info.value.keys == {("", "r"), ("a", "x" * 129), ("a", "k")} and info.value.exit_code == 2
    assert history_checksum(collated_engine) == before


def _receipt_rows(engine):
    with engine.connect() as conn:
        return {
            (r.SourceLane, r.ReceiptId): (r.MaterializedAt is not None, r.ConfirmedAt is not None)
            for r in conn.execute(select(IngressReceipt.c.SourceLane, IngressReceipt.c.ReceiptId, IngressReceipt.c.MaterializedAt,
                                         IngressReceipt.c.ConfirmedAt))
        }


def _receipt(engine, lane, receipt):
    with engine.begin() as conn:
        conn.execute(
            IngressReceipt.insert().values(
                PackInstallId=PACK, SourceLane=lane, ReceiptId=receipt, EventKind="contact.changed", Payload="{}",
                ReceivedAt=dt.datetime(2026, 1, 1),
            )
        )


def test_the_host_leaves_a_colliding_receipt_unconfirmed_for_review_and_keeps_admitting_the_pack(collated_engine, equality):
    """Receipt ``0015e00000XyZaB`` arrives after a connector admitted ``0015e00000xyzab`` directly (its own receipt row
    gone to retention): on a case-insensitive tenant the host names both keys, leaves the receipt durable and
    unconfirmed, admits the others, and keeps admitting the pack's later receipts."""
    range_tenant(collated_engine)
    admit_batch(collated_engine, PACK, [inp("a", "0015e00000xyzab")])
    for lane, receipt in (("a", "rc-1"), ("a", "0015e00000XyZaB"), ("b", "rc-2")):
        _receipt(collated_engine, lane, receipt)
    colliding = equality.equal("0015e00000xyzab", "0015e00000XyZaB")
    if colliding:
        with pytest.raises(ReceiptCollision) as info:
            run_host(collated_engine, NS, process_id="h1", drain_and_exit=True, poll_s=0.01)
        assert "'0015e00000XyZaB'" in str(info.value) and "'0015e00000xyzab'" in str(info.value)
    else:
        assert run_host(collated_engine, NS, process_id="h1", drain_and_exit=True, poll_s=0.01) == 0
    rows = _receipt_rows(collated_engine)
    assert rows[("a", "rc-1")] == rows[("b", "rc-2")] == (True, True)
    assert rows[("a", "0015e00000XyZaB")] == ((False, False) if colliding else (True, True))
    _receipt(collated_engine, "b", "rc-3")  # a later receipt of the same pack: still admitted
    if colliding:
        with pytest.raises(ReceiptCollision):
            run_host(collated_engine, NS, process_id="h2", drain_and_exit=True, poll_s=0.01)
    else:
        run_host(collated_engine, NS, process_id="h2", drain_and_exit=True, poll_s=0.01)
    assert _receipt_rows(collated_engine)[("b", "rc-3")] == (True, True)
    assert _receipt_rows(collated_engine)[("a", "0015e00000XyZaB")] == ((False, False) if colliding else (True, True))
    assert_membership(collated_engine)


def test_the_materializer_reports_each_inadmissible_receipt_and_admits_the_rest(collated_engine, equality):
    range_tenant(collated_engine)
    admit_batch(collated_engine, PACK, [inp("a", "Dup-1")])
    for lane, receipt in (("a", "dup-1"), ("a", "new-1"), ("b", "new-2")):
        _receipt(collated_engine, lane, receipt)
    report = materialize(collated_engine, PACK, Routing())
    colliding = equality.equal("Dup-1", "dup-1")
    assert report.rejected_keys == ({("a", "dup-1")} if colliding else set())
    assert report.admitted == (2 if colliding else 3) and report.confirmed == report.admitted
    if colliding:
        (rejection,) = report.rejected
        assert rejection.kind == "collision" and "'Dup-1'" in rejection.detail and "'dup-1'" in rejection.detail
        again = materialize(collated_engine, PACK, Routing(), skip=report.rejected_keys)
        assert again.admitted == again.confirmed == 0 and not again.rejected


def test_an_inadmissible_error_names_its_kinds_when_combined():
    from nexus_cutover.runtime.errors import Collision, MissingCoverage

    collision = ReceiptCollision(PACK, [Collision("a", "X", "a", "x", 7)])
    uncovered = MissingCoverage(PACK, [("b", "y", 9)])
    both = InadmissibleReceipts.combined(PACK, collision.rejections + uncovered.rejections)
    assert type(both) is InadmissibleReceipts and both.keys == {("a", "X"), ("b", "y")}
    assert isinstance(InadmissibleReceipts.combined(PACK, uncovered.rejections), MissingCoverage)
    assert isinstance(InadmissibleReceipts.combined(PACK, collision.rejections), ReceiptCollision)


def test_generations_and_events_counted_by_the_servers_join(collated_engine):
    """A smoke check of the helper every test here relies on: the server's join sees one owner per admitted Event."""
    range_tenant(collated_engine)
    admit_batch(collated_engine, PACK, [inp("x", str(i)) for i in range(5)])
    with collated_engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(WorkItem).where(WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION)) == 1
    assert sorted(len(h) for h in server_owners(collated_engine, PACK).values()) == [1] * 5

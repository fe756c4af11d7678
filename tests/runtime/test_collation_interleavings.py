"""Admission of lanes the collation equates, interleaved with a claim and with a replay, on MariaDB (both collations).

Each test pins one interleaving with real transactions on their own connections: a thread holds its transaction
open at a known point (an event), the other session is started and the test waits until the server shows it
waiting for the row lock (:func:`.support.wait_for_lock_wait`), then the first commits. After each: every admitted
input has exactly one generation as the server's own join sees it, a claimed generation's payload set never changes,
and inputs of one identity (as the collation compares it) never end up in two queued generations.

Lane spellings: ``Lane-A`` is admitted first; ``Lane-A `` / ``Lane-A  `` are the same identity under both
collations (PAD SPACE), ``lane-a`` only under the case-insensitive default.
"""

from __future__ import annotations

import concurrent.futures
import threading

import pytest

from nexus_cutover import tx
from nexus_cutover.db import Deadline
from nexus_cutover.runtime.admission import admit_batch
from nexus_cutover.runtime.claim import claim_in, claim_work, complete
from nexus_cutover.runtime.payload import load_payloads
from nexus_cutover.runtime.replay import replay

from .support import PACK, assert_membership, inp, range_generations, range_tenant, wait_for_lock_wait

pytestmark = pytest.mark.mysql


def _payloads(engine, work_id):
    with engine.connect() as conn:
        return [p.receipt_id for p in load_payloads(conn, work_id)]


def _collation(engine) -> str:
    with engine.connect() as conn:
        return conn.exec_driver_sql("SELECT @@collation_database").scalar()


def _held(engine, body, entered: threading.Event, release: threading.Event):
    """``body(conn)`` in a policy transaction that stays open (after ``body``) until ``release`` is set."""

    def run(conn):
        result = body(conn)
        entered.set()
        assert release.wait(60)
        return result

    return tx.run(engine, run, what="a transaction held open by the test", deadline=Deadline(90))


def test_a_claim_committing_while_admission_waits_sends_every_variant_to_one_successor(mysql_collated_engine):
    engine = mysql_collated_engine
    range_tenant(engine)
    (first,) = admit_batch(engine, PACK, [inp("Lane-A", "1")]).created_work_ids
    entered, release = threading.Event(), threading.Event()
    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        claiming = pool.submit(_held, engine, lambda conn: claim_in(conn, first, "w"), entered, release)
        assert entered.wait(60)  # claimed, not committed: the generation still reads as pending to admission
        admitting = pool.submit(admit_batch, engine, PACK, [inp("Lane-A ", "2"), inp("lane-a", "3"), inp("Lane-A  ", "4")])
        wait_for_lock_wait(engine, "UPDATE", alive=lambda: not admitting.done())  # its extension waits for the row
        release.set()
        claimed = claiming.result(60)
        result = admitting.result(60)
    assert claimed.lane_ordinal == 1 and _payloads(engine, first) == ["1"]  # the claimed range never moved
    assert not result.extended_work_ids
    folds_case = _collation(engine).endswith("_ci")
    successors = {a.receipt_id: a.work_id for a in result.admitted}
    assert successors["2"] == successors["4"] != first  # one successor for the PAD SPACE variants
    assert (successors["3"] == successors["2"]) is folds_case
    assert len(result.created_work_ids) == (1 if folds_case else 2)
    assert_membership(engine)


def test_a_claim_waits_for_the_admission_extending_its_generation_and_claims_the_whole_range(mysql_collated_engine):
    engine = mysql_collated_engine
    range_tenant(engine)
    (first,) = admit_batch(engine, PACK, [inp("Lane-A", "1")]).created_work_ids
    inside, release = threading.Event(), threading.Event()

    def pause(_conn, _result):  # inside the pack transaction, the generation extended, not committed
        inside.set()
        assert release.wait(60)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        admitting = pool.submit(admit_batch, engine, PACK, [inp("Lane-A  ", "2"), inp("lane-a", "3")], in_transaction=pause)
        assert inside.wait(60)
        claiming = pool.submit(claim_work, engine, first, "w")
        wait_for_lock_wait(engine, "UPDATE", alive=lambda: not claiming.done())
        release.set()
        result = admitting.result(60)
        claimed = claiming.result(60)
    folds_case = _collation(engine).endswith("_ci")
    assert result.extended_work_ids == [first]
    expected = ["1", "2", "3"] if folds_case else ["1", "2"]
    assert _payloads(engine, first) == expected and claimed.lane_ordinal == len(expected)
    assert (len(result.created_work_ids) == 1) is not folds_case  # 'lane-a' is its own identity on the binary collation
    assert complete(engine, claimed)
    assert _payloads(engine, first) == expected
    assert_membership(engine)


def test_a_replay_waits_for_the_admission_of_a_variant_and_later_variants_join_the_replay(mysql_collated_engine):
    engine = mysql_collated_engine
    range_tenant(engine)
    (first,) = admit_batch(engine, PACK, [inp("Lane-A", "1")]).created_work_ids
    assert complete(engine, claim_work(engine, first, "w"))
    inside, release = threading.Event(), threading.Event()

    def pause(_conn, _result):  # holding the pack lock: replay is serialized behind it
        inside.set()
        assert release.wait(60)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        admitting = pool.submit(admit_batch, engine, PACK, [inp("Lane-A ", "2")], in_transaction=pause)
        assert inside.wait(60)
        replaying = pool.submit(replay, engine, first)
        wait_for_lock_wait(engine, "SELECT", alive=lambda: not replaying.done())  # the pack lock row
        release.set()
        successor = admitting.result(60)
        replayed = replaying.result(60)
    (successor_id,) = successor.created_work_ids  # the completed generation keeps its bounds
    assert replayed.ordinal == 3 and _payloads(engine, successor_id) == ["2"]
    later = admit_batch(engine, PACK, [inp("Lane-A  ", "4")])
    assert later.extended_work_ids == [replayed.work_id]  # the replay is the latest generation, unclaimed: it absorbs
    assert _payloads(engine, replayed.work_id) == [f"replay:{first}:3", "4"]
    assert [g.WorkId for g in range_generations(engine) if g.Status == "pending"] == sorted([successor_id, replayed.work_id])
    assert_membership(engine)

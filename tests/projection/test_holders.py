"""Holders unique at any length, and no call out of the process under a tenant lock (issue 33, items 1 and 4).

Contract, "One cutover per tenant at a time": two holders that differ anywhere (also past ``ArmedBy``'s 128
characters: a long Airflow run id, a long ``-holder``) are never stored or compared as the same holder. And a
fence decision asks what it needs of the holder (for the DAG, Airflow) before it takes the namespace lock: held
open, that look holds no lock; a fence that changed between the look and the lock is refused (``FenceChanged``).
On SQLite and MariaDB, and in the TiDB-semantics lane.
"""

from __future__ import annotations

import logging
import os
import re
import subprocess
import sys
import threading

import pytest
from sqlalchemy import select

from nexus_cutover import catalog, tx
from nexus_cutover.db import Deadline
from nexus_cutover.holders import HOLDER_WIDTH, is_digested, same_holder, stored_holder
from nexus_cutover.locks import lifecycle_lock_names
from nexus_cutover.projection import cutover_fence
from nexus_sim.scenario import TenantScenario
from tests.support import make_cutover_ready, prepared_engine

NS, PACK = "acme", "pk-1"
#: Two holders equal in their first 150 characters: cut at 128 they were one.
LONG_A = "cli:" + "a" * 146 + ":one"
LONG_B = "cli:" + "a" * 146 + ":two"


def _fences(engine) -> list[tuple[str, str | None, bool]]:
    f = catalog.AdmissionFence
    with engine.connect() as conn:
        rows = conn.execute(select(f.c.ArmedBy, f.c.ReleasedBy, f.c.ReleasedAt).where(f.c.Namespace == NS)
                            .order_by(f.c.FenceId)).all()
    return [(r.ArmedBy, r.ReleasedBy, r.ReleasedAt is not None) for r in rows]


def _tenant(engine) -> None:
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK).lane("a").generation(2)
    sc.write(engine)


# -- the stored spelling ----------------------------------------------------------------------------------------

def test_a_name_that_fits_is_stored_as_it_is_and_a_longer_one_uniquely_in_the_columns_width():
    assert stored_holder("airflow:dag:run-1") == "airflow:dag:run-1" and not is_digested("airflow:dag:run-1")
    a, b = stored_holder(LONG_A), stored_holder(LONG_B)
    assert LONG_A[:128] == LONG_B[:128] and a != b
    assert len(a) == len(b) == HOLDER_WIDTH and is_digested(a) and is_digested(b)
    assert a.startswith(LONG_A[:90])  # a person still reads whose it is
    assert stored_holder(a) == a  # idempotent: the stored spelling given back names the same holder
    assert same_holder(a, LONG_A) and same_holder(a, a) and not same_holder(a, LONG_B)
    assert not same_holder("Run-A", "run-a") and not same_holder("run-a", "run-a ")  # bytes, never a collation


def test_two_rollouts_with_long_run_ids_give_a_tenants_two_cutover_runs_two_holders():
    from nexus_airflow import rollout as ro
    from nexus_airflow.base import holder_of_run

    first, second = ("fleet-emea-after-the-change-freeze-" + "x" * 120 + suffix for suffix in ("-1", "-2"))
    holders = [holder_of_run(ro.CUTOVER_DAG, ro.run_id_for(run, "tenant-42")) for run in (first, second)]
    assert holders[0][:128] == holders[1][:128]  # what the old cut stored for both
    assert stored_holder(holders[0]) != stored_holder(holders[1])


def test_the_dags_holder_state_does_not_ask_airflow_about_a_holder_it_cannot_read_back():
    """A digested holder names a run whose id cannot be read back: unknown (adopted only when named), no call."""
    from nexus_airflow.base import holder_of_run, holder_state

    judge = holder_state({"ti": None}, logging.getLogger("test"))  # a call into Airflow would fail on ti None
    digested = stored_holder(holder_of_run("connector_projection_cutover", "rollout__" + "r" * 200 + "__t"))
    assert judge(digested) == cutover_fence.HOLDER_UNKNOWN
    assert judge("cli:someone@host:pid1") == cutover_fence.HOLDER_UNKNOWN


# -- arming and releasing ---------------------------------------------------------------------------------------

def test_a_second_long_holder_equal_in_its_first_128_characters_is_refused_not_reused(engine):
    _tenant(engine)
    armed = cutover_fence.arm_fence(engine, NS, armed_by=LONG_A, timeout_s=10, packs=[PACK])
    assert armed.outcome == "armed" and armed.holder == stored_holder(LONG_A)
    with pytest.raises(cutover_fence.FenceHeld) as held:
        cutover_fence.arm_fence(engine, NS, armed_by=LONG_B, timeout_s=10, packs=[PACK],
                                holder_state=lambda h: cutover_fence.HOLDER_ACTIVE)
    assert held.value.holder == stored_holder(LONG_A)
    with pytest.raises(cutover_fence.FenceHeld):  # unknown (a CLI holder): not adopted silently either
        cutover_fence.held_by_another(engine, NS, holder=LONG_B)
    assert cutover_fence.arm_fence(engine, NS, armed_by=LONG_A, timeout_s=10, packs=[PACK]).outcome == "reused"
    with pytest.raises(cutover_fence.FenceHeld):
        cutover_fence.release_fence(engine, NS, armed.fence_id, released_by=LONG_B, timeout_s=10)
    assert _fences(engine) == [(stored_holder(LONG_A), None, False)]
    released = cutover_fence.release_fence(engine, NS, armed.fence_id, released_by=LONG_A, timeout_s=10)
    assert released.outcome == "released"
    with pytest.raises(cutover_fence.ReleasedByAnother):
        cutover_fence.release_fence(engine, NS, armed.fence_id, released_by=LONG_B, timeout_s=10)
    assert _fences(engine) == [(stored_holder(LONG_A), stored_holder(LONG_A), True)]


def test_a_long_holder_is_adopted_when_named_by_its_whole_name_or_its_stored_spelling(engine):
    _tenant(engine)
    cutover_fence.arm_fence(engine, NS, armed_by=LONG_A, timeout_s=10, packs=[PACK])
    with pytest.raises(cutover_fence.FenceHeld):  # another long name with the same first 128 characters is not it
        cutover_fence.arm_fence(engine, NS, armed_by="run-2", timeout_s=10, packs=[PACK], adopt=LONG_B)
    adopted = cutover_fence.arm_fence(engine, NS, armed_by="run-2", timeout_s=10, packs=[PACK],
                                      adopt=stored_holder(LONG_A))
    assert adopted.outcome == "adopted" and adopted.previous_holder == stored_holder(LONG_A)
    again = cutover_fence.arm_fence(engine, NS, armed_by=LONG_B, timeout_s=10, packs=[PACK], adopt="run-2")
    assert again.outcome == "adopted" and _fences(engine) == [(stored_holder(LONG_B), None, False)]


def test_holders_that_differ_only_in_case_or_trailing_spaces_are_two_holders(collated_tenant_url):
    with prepared_engine(collated_tenant_url, make_cutover_ready) as engine:
        _tenant(engine)
        cutover_fence.arm_fence(engine, NS, armed_by="Run-A", timeout_s=10, packs=[PACK])
        for other in ("run-a", "Run-A "):
            with pytest.raises(cutover_fence.FenceHeld):
                cutover_fence.arm_fence(engine, NS, armed_by=other, timeout_s=10, packs=[PACK],
                                        holder_state=lambda h: cutover_fence.HOLDER_ACTIVE)
        assert _fences(engine) == [("Run-A", None, False)]


def _cli(engine, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEXUS_TENANT_DSN": engine.url.render_as_string(hide_password=False)}
    return subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def test_the_cli_refuses_a_long_holder_equal_in_its_first_128_characters(engine):
    _tenant(engine)
    armed = _cli(engine, "arm-fence", "-namespace", NS, "-holder", LONG_A)
    assert armed.returncode == 0, armed.stdout + armed.stderr
    second = _cli(engine, "arm-fence", "-namespace", NS, "-holder", LONG_B)
    assert second.returncode == 3, second.stdout + second.stderr
    assert "is held by" in second.stderr and repr(stored_holder(LONG_A)) in second.stderr and "reused" not in second.stdout
    release = _cli(engine, "release-fence", "-namespace", NS, "-holder", LONG_B)
    assert release.returncode == 3, release.stdout + release.stderr
    assert _fences(engine) == [(stored_holder(LONG_A), None, False)]


# -- no call out of the process under the lock ------------------------------------------------------------------

class HeldLook:
    """A ``holder_state`` that stays open until released, then says what Airflow would: run-1 finished, any other
    holder still at work. The Airflow call, held."""

    def __init__(self):
        self.entered, self.release = threading.Event(), threading.Event()
        self.asked: list[str] = []

    def __call__(self, holder: str) -> str:
        self.asked.append(holder)
        self.entered.set()
        assert self.release.wait(60), "the test never released the look"
        return cutover_fence.HOLDER_FINISHED if holder == "run-1" else cutover_fence.HOLDER_ACTIVE


def _arm_in_thread(engine, look, **kw):
    outcome: dict = {}

    def arm():
        try:
            outcome["result"] = cutover_fence.arm_fence(engine, NS, armed_by="run-2", timeout_s=30, packs=[PACK],
                                                        holder_state=look, **kw)
        except Exception as exc:  # noqa: BLE001 - the test reads it
            outcome["error"] = exc

    thread = threading.Thread(target=arm)
    thread.start()
    assert look.entered.wait(30), "the decision never asked about the holder"
    return thread, outcome


def test_while_the_holder_is_looked_at_no_tenant_lock_is_held(engine):
    _tenant(engine)
    first = cutover_fence.arm_fence(engine, NS, armed_by="run-1", timeout_s=10, packs=[PACK])
    look = HeldLook()
    thread, outcome = _arm_in_thread(engine, look)
    try:
        # Another operator of the tenant takes the namespace lock at once (a 2 s bound: not a wait on us).
        took = tx.run(engine, lambda conn: "locked", what="another operator", deadline=Deadline(2),
                      locks=lifecycle_lock_names(NS))
        assert took == "locked"
    finally:
        look.release.set()
        thread.join(60)
    assert outcome.get("result") is not None, outcome
    assert outcome["result"].outcome == "adopted" and outcome["result"].fence_id == first.fence_id


def test_a_fence_taken_between_the_look_and_the_lock_is_looked_at_again_and_its_new_holder_named(engine):
    """run-1 finished, says the look; while it is out, run-3 adopts the fence. Under the lock the fence is not the one
    looked at: nothing is written, the decision looks again and stops naming run-3, which holds the tenant now."""
    _tenant(engine)
    first = cutover_fence.arm_fence(engine, NS, armed_by="run-1", timeout_s=10, packs=[PACK])
    look = HeldLook()
    thread, outcome = _arm_in_thread(engine, look)
    try:
        taken = cutover_fence.arm_fence(engine, NS, armed_by="run-3", timeout_s=10, packs=[PACK],
                                        holder_state=lambda h: cutover_fence.HOLDER_FINISHED)
        assert taken.outcome == "adopted"
    finally:
        look.release.set()
        thread.join(60)
    assert isinstance(outcome.get("error"), cutover_fence.FenceHeld), outcome
    assert outcome["error"].holder == "run-3" and look.asked == ["run-1", "run-3"]
    assert _fences(engine) == [("run-3", None, False)] and taken.fence_id == first.fence_id


def test_a_fence_that_keeps_moving_under_every_look_is_refused_and_nothing_is_written(engine):
    """Each look at the holder lets another session adopt the fence under a new name (no lock is held during the
    look): after every look the lock finds another holder; after LOOKS looks the decision refuses (FenceChanged)."""
    _tenant(engine)
    cutover_fence.arm_fence(engine, NS, armed_by="run-1", timeout_s=10, packs=[PACK])
    names = iter(f"hand-{n}" for n in range(10))

    def finished_but_moved_meanwhile(holder: str) -> str:
        with engine.begin() as conn:  # the fence taken over by hand while this run looks (outside its lock)
            conn.execute(catalog.AdmissionFence.update().where(catalog.AdmissionFence.c.ReleasedAt.is_(None))
                         .values(ArmedBy=next(names)))
        return cutover_fence.HOLDER_FINISHED

    with pytest.raises(cutover_fence.FenceChanged) as changed:
        cutover_fence.arm_fence(engine, NS, armed_by="run-2", timeout_s=10, packs=[PACK], holder_state=finished_but_moved_meanwhile)
    assert f"({cutover_fence.LOOKS} looks)" in str(changed.value) and "nothing was written" in str(changed.value)
    assert _fences(engine) == [(f"hand-{cutover_fence.LOOKS - 1}", None, False)]  # never run-2


def test_plan_names_an_airflow_run_that_holds_the_tenant_as_one_with_its_link(engine):
    """Issue 34, item 10: the CLI cannot ask Airflow, but it says the holder is an Airflow run, and links it."""
    _tenant(engine)
    run_id = "manual__2026-12-04T01:00:00+00:00"
    cutover_fence.arm_fence(engine, NS, armed_by=f"airflow:connector_projection_cutover:{run_id}", timeout_s=10, packs=[PACK])
    env = {**os.environ, "NEXUS_TENANT_DSN": engine.url.render_as_string(hide_password=False),
           "NEXUS_AIRFLOW_URL": "http://airflow.example:8080/"}
    done = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", "plan", "-namespace", NS], env=env,
                          capture_output=True, text=True, timeout=120)
    said = done.stdout + done.stderr
    assert done.returncode == 3, said
    assert f"an Airflow run (run {run_id} of DAG connector_projection_cutover" in said, said
    assert "http://airflow.example:8080/dags/connector_projection_cutover/runs/manual__2026-12-04T01%3A00%3A00%2B00%3A00" in said
    assert "armed by hand or by a command-line invocation" not in said


def test_a_refusal_names_its_times_with_their_zone(engine):
    """Issue 34: times without a zone. A held fence's ArmedAt reads as UTC."""
    _tenant(engine)
    cutover_fence.arm_fence(engine, NS, armed_by="run-1", timeout_s=10, packs=[PACK])
    with pytest.raises(cutover_fence.FenceHeld) as held:
        cutover_fence.arm_fence(engine, NS, armed_by="run-2", timeout_s=10, packs=[PACK],
                                holder_state=lambda h: cutover_fence.HOLDER_ACTIVE)
    assert re.search(r"armed \d{4}-\d\d-\d\d \d\d:\d\d:\d\d UTC\)", str(held.value)), str(held.value)

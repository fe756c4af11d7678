"""Hypothesis state machine: admit / duplicate / claim / complete / retry / replay against an in-memory model.

After every step: every admitted input belongs to exactly one generation, every
generation's payload set (what a worker loads by WorkId) equals the model's,
and ordinals are unique and increasing. Runs on SQLite and on MariaDB; each
example uses a fresh pack of one tenant database.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test
from sqlalchemy import insert

from nexus_cutover import catalog
from nexus_cutover.protocol_row import insert_protocol_row
from nexus_cutover.runtime.admission import admit_batch
from nexus_cutover.runtime.claim import claim_work, complete, retry_or_fail
from nexus_cutover.runtime.payload import load_payloads
from nexus_cutover.runtime.replay import replay
from nexus_sim.old_runtime import allocate_table_id
from nexus_sim.scenario.builder import BASE_TIME

from .support import NS, assert_membership, inp

LANES = ("a", "b", "c")
LEGACY = 3  # each pack starts with legacy Events at ordinals 1..3 (the cutoff), receipts legacy-1..3
_packs = itertools.count(1)


@dataclass
class Gen:
    work_id: int
    lane: str
    members: list[str]
    status: str = "pending"
    attempt: int = 0
    claimed_payloads: list[str] | None = None


@dataclass
class Model:
    next_ordinal: int = LEGACY + 1
    receipts: dict[tuple[str, str], int] = field(default_factory=dict)  # fresh admitted -> ordinal
    gens: dict[int, Gen] = field(default_factory=dict)

    def latest(self, lane: str) -> Gen | None:
        mine = [g for g in self.gens.values() if g.lane == lane]
        return max(mine, key=lambda g: self.receipts_ordinal(g.members[-1]), default=None)

    def receipts_ordinal(self, receipt: str) -> int:
        return next(o for (_lane, r), o in self.receipts.items() if r == receipt)


def _setup_pack(engine, pack):
    with engine.begin() as conn:
        conn.execute(
            insert(catalog.PackInstall).values(PackInstallId=pack, Namespace=NS, PackName="p", Status="active", InstalledAt=BASE_TIME)
        )
        conn.execute(insert(catalog.EnqueueOrdinal).values(PackInstallId=pack, LastOrdinal=LEGACY))
        for o in range(1, LEGACY + 1):
            conn.execute(
                insert(catalog.Event).values(
                    EventId=allocate_table_id(conn, catalog.Event.c.EventId),
                    Namespace=NS,
                    PackInstallId=pack,
                    EventKind="contact.changed",
                    RouteVersion=1,
                    FlowVersion="1.0.0",
                    WorkType="connector.projection",
                    SourceLane="a",
                    EnqueueOrdinal=o,
                    ReceiptId=f"legacy-{o}",
                    Status="processed",
                    Payload="{}",
                    ReceivedAt=BASE_TIME,
                )
            )
        insert_protocol_row(conn, pack, LEGACY, "test")


def machine_for(engine):
    class RangeMachine(RuleBasedStateMachine):
        @initialize()
        def setup(self):
            self.pack = f"sm-{next(_packs)}"
            _setup_pack(engine, self.pack)
            self.model = Model()
            self.counter = itertools.count(1)
            self.replay_ordinals: dict[int, str] = {}

        # -- admission ------------------------------------------------------

        @rule(lanes=st.lists(st.sampled_from(LANES), min_size=1, max_size=5), dup_picks=st.lists(st.integers(0, 10_000), max_size=2))
        def admit(self, lanes, dup_picks):
            model = self.model
            fresh = [(lane, f"r{next(self.counter)}") for lane in lanes]
            known = sorted(model.receipts)
            dups = [known[i % len(known)] for i in dup_picks] if known else []
            batch = [inp(lane, r) for lane, r in fresh] + [inp(lane, r) for lane, r in dups]
            result = admit_batch(engine, self.pack, batch)
            assert sorted((d.source_lane, d.receipt_id) for d in result.duplicates) == sorted(dups)
            assert all(d.reason == "covered" for d in result.duplicates)
            by_receipt = {a.receipt_id: a for a in result.admitted}
            assert len(by_receipt) == len(fresh)
            # ordinals: consecutive, in batch order, above everything before
            for lane, r in fresh:
                assert by_receipt[r].ordinal == model.next_ordinal
                model.receipts[(lane, r)] = model.next_ordinal
                model.next_ordinal += 1
            for lane in dict.fromkeys(lane for lane, _ in fresh):
                members = [r for lane2, r in fresh if lane2 == lane]
                latest = model.latest(lane)
                work_id = by_receipt[members[0]].work_id
                if latest is not None and latest.status == "pending" and latest.attempt == 0:
                    assert work_id == latest.work_id and work_id in result.extended_work_ids
                    latest.members.extend(members)
                else:
                    assert work_id not in model.gens and work_id in result.created_work_ids
                    model.gens[work_id] = Gen(work_id, lane, list(members))

        @rule(ordinal=st.integers(1, LEGACY))
        def legacy_duplicate(self, ordinal):
            result = admit_batch(engine, self.pack, [inp("a", f"legacy-{ordinal}")])
            assert not result.admitted and [d.reason for d in result.duplicates] == ["at_or_below_cutoff"]

        # -- work -----------------------------------------------------------

        def _pick(self, statuses, i):
            cands = sorted(w for w, g in self.model.gens.items() if g.status in statuses)
            return self.model.gens[cands[i % len(cands)]] if cands else None

        @precondition(lambda self: any(g.status in ("pending", "retry") for g in self.model.gens.values()))
        @rule(i=st.integers(0, 1000))
        def claim(self, i):
            gen = self._pick(("pending", "retry"), i)
            claimed = claim_work(engine, gen.work_id, "w")
            assert claimed is not None and claimed.attempt == gen.attempt
            gen.status = "processing"
            with engine.connect() as conn:
                gen.claimed_payloads = [p.receipt_id for p in load_payloads(conn, gen.work_id)]
            assert gen.claimed_payloads == gen.members
            self.claimed = getattr(self, "claimed", {})
            self.claimed[gen.work_id] = claimed

        @precondition(lambda self: any(g.status in ("processing", "completed") for g in self.model.gens.values()))
        @rule(i=st.integers(0, 1000))
        def claim_is_exclusive(self, i):
            gen = self._pick(("processing", "completed"), i)
            assert claim_work(engine, gen.work_id, "other") is None

        @precondition(lambda self: any(g.status == "processing" for g in self.model.gens.values()))
        @rule(i=st.integers(0, 1000), fail=st.booleans())
        def finish(self, i, fail):
            gen = self._pick(("processing",), i)
            claimed = self.claimed.pop(gen.work_id)
            if fail:
                status = retry_or_fail(engine, claimed, retry_in_s=0, max_attempts=3)
                gen.attempt += 1
                assert status == ("failed" if gen.attempt >= 3 else "retry")
                gen.status = status
            else:
                assert complete(engine, claimed)
                gen.status = "completed"

        @precondition(lambda self: any(g.status in ("completed", "failed") for g in self.model.gens.values()))
        @rule(i=st.integers(0, 1000))
        def do_replay(self, i):
            gen = self._pick(("completed", "failed"), i)
            result = replay(engine, gen.work_id)
            assert result.ordinal == self.model.next_ordinal
            receipt = f"replay:{gen.work_id}:{result.ordinal}"
            self.model.receipts[(gen.lane, receipt)] = result.ordinal
            self.model.next_ordinal += 1
            self.model.gens[result.work_id] = Gen(result.work_id, gen.lane, [receipt])

        # -- invariants ------------------------------------------------------

        @invariant()
        def exact_membership(self):
            if not hasattr(self, "model"):
                return
            owner = assert_membership(engine, {self.pack: LEGACY}, pack=self.pack)
            assert len(owner) == len(self.model.receipts)
            with engine.connect() as conn:
                for gen in self.model.gens.values():
                    assert [p.receipt_id for p in load_payloads(conn, gen.work_id)] == gen.members
                    if gen.claimed_payloads is not None:
                        assert gen.claimed_payloads == gen.members

    return RangeMachine


STATEFUL = settings(max_examples=25, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


@pytest.mark.parametrize("backend", ["sqlite", "mysql"])
def test_range_protocol_state_machine(backend, request):
    engine = request.getfixturevalue(f"{backend}_range_engine")
    run_state_machine_as_test(machine_for(engine), settings=STATEFUL)

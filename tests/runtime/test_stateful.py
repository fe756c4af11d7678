"""Hypothesis state machine: hostile admission, ingress receipts, duplicates, claim / complete / retry / replay
against an in-memory model, on SQLite and on MariaDB tenants of two collations.

Identities (Event kind, source lane) and receipt ids are drawn from hostile text (:mod:`tests.hostile`): variants
of a few bases that differ in case, trailing spaces or characters a collation folds, non-ASCII, values at the
column's length. The model decides equality with the server's ``=`` under the tenant's collation
(:class:`tests.collations.ServerEquality`, exact bytes on SQLite), independently of the product's keys.

After every step:

* every admitted input belongs to exactly one generation, as the server's own join on the identity columns sees
  it (:func:`.support.assert_membership`), and every generation's payload set (what a worker loads by WorkId) is
  the model's;
* no receipt is acknowledged unless an Event with its exact key exists (checked on every duplicate and every
  confirmed ingress receipt);
* no ingress receipt is left unconfirmed without an error naming it (a collision's error names both keys).

Each example uses a fresh pack of one tenant database.
"""

from __future__ import annotations

import itertools
from dataclasses import dataclass, field

import pytest
from hypothesis import HealthCheck, settings
from hypothesis import strategies as st
from hypothesis.stateful import RuleBasedStateMachine, initialize, invariant, precondition, rule, run_state_machine_as_test
from sqlalchemy import func, insert, select
from sqlalchemy.exc import DBAPIError

from nexus_cutover import catalog
from nexus_cutover.catalog import Event, IngressReceipt
from nexus_cutover.protocol_row import insert_protocol_row
from nexus_cutover.runtime.admission import admit_batch
from nexus_cutover.runtime.claim import claim_work, complete, retry_or_fail
from nexus_cutover.runtime.errors import COLLISION, INVALID, InvalidReceipts, ReceiptCollision
from nexus_cutover.runtime.materializer import materialize
from nexus_cutover.runtime.model import Input, Routing
from nexus_cutover.runtime.payload import load_payloads
from nexus_cutover.runtime.replay import replay
from nexus_sim.old_runtime import allocate_table_id
from nexus_sim.scenario.builder import BASE_TIME
from tests import hostile

from .support import NS, assert_membership

KIND_BASES = ["contact.changed", "Deal.Updated"]
LEGACY = 3  # each pack starts with legacy Events at ordinals 1..3 (the cutoff), receipts legacy-1..3
LIMIT = 128  # SourceLane / ReceiptId / EventKind column length
_packs = itertools.count(1)


@dataclass
class Gen:
    work_id: int
    identity: tuple[int, int]  # (class of the Event kind, class of the lane)
    kind: str  # the spelling the WorkItem carries (its first member's)
    lane: str
    members: list[str]
    status: str = "pending"
    attempt: int = 0
    claimed_payloads: list[str] | None = None


@dataclass
class Model:
    next_ordinal: int = LEGACY + 1
    #: (lane class, receipt class) -> (lane, receipt, ordinal) of the admitted receipt holding that key
    admitted: dict[tuple[int, int], tuple[str, str, int]] = field(default_factory=dict)
    gens: dict[int, Gen] = field(default_factory=dict)

    def latest(self, identity: tuple[int, int]) -> Gen | None:
        mine = [g for g in self.gens.values() if g.identity == identity]
        return max(mine, key=lambda g: self.ordinal_of(g.members[-1]), default=None)

    def ordinal_of(self, receipt: str) -> int:
        return next(o for _lane, r, o in self.admitted.values() if r == receipt)


def _setup_pack(engine, pack, lane):
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
                    EventKind=KIND_BASES[0],
                    RouteVersion=1,
                    FlowVersion="1.0.0",
                    WorkType="connector.projection",
                    SourceLane=lane,
                    EnqueueOrdinal=o,
                    ReceiptId=f"legacy-{o}",
                    Status="processed",
                    Payload="{}",
                    ReceivedAt=BASE_TIME,
                )
            )
        insert_protocol_row(conn, pack, LEGACY, "test")


def _exact_event(engine, pack: str, lane: str, receipt: str) -> int | None:
    """The EventId holding exactly (pack, lane, receipt), byte for byte (the server finds candidates, Python compares)."""
    with engine.connect() as conn:
        rows = conn.execute(
            select(Event.c.EventId, Event.c.PackInstallId, Event.c.SourceLane, Event.c.ReceiptId).where(
                Event.c.PackInstallId == pack, Event.c.SourceLane == lane, Event.c.ReceiptId == receipt
            )
        ).all()
    exact = [r.EventId for r in rows if (r.PackInstallId, r.SourceLane, r.ReceiptId) == (pack, lane, receipt)]
    return exact[0] if exact else None


def _event_count(engine, pack: str) -> int:
    with engine.connect() as conn:
        return conn.scalar(select(func.count()).select_from(Event).where(Event.c.PackInstallId == pack))


def machine_for(engine, oracle):
    class RangeMachine(RuleBasedStateMachine):
        @initialize(bases=hostile.identities_and_receipts())
        def setup(self, bases):
            nonlocal eq
            eq = oracle.fresh()  # values of one example never meet another's (each has its own pack)
            self.lane_bases, self.receipt_bases = bases
            self.pack = f"sm-{next(_packs)}"
            self.legacy_lane = self.lane_bases[0][:LIMIT]
            _setup_pack(engine, self.pack, self.legacy_lane)
            self.model = Model()
            for o in range(1, LEGACY + 1):
                self.model.admitted[(eq.cls(self.legacy_lane), eq.cls(f"legacy-{o}"))] = (self.legacy_lane, f"legacy-{o}", o)
            self.claimed = {}
            self.rejected: dict[tuple[str, str], str] = {}  # ingress receipts reported as not admissible: key -> kind

        # -- drawing hostile inputs ----------------------------------------------------

        def _items(self, data, *, max_size=6, legacy_variants=False):
            receipt_bases = self.receipt_bases + ([f"legacy-{o}" for o in range(1, LEGACY + 1)] if legacy_variants else [])
            item = st.tuples(
                hostile.keys_from(KIND_BASES),
                hostile.keys_from(self.lane_bases),
                hostile.keys_from(receipt_bases),
            )
            return data.draw(st.lists(item, min_size=1, max_size=max_size))

        def _identity(self, kind: str, lane: str) -> tuple[int, int]:
            return eq.cls(kind), eq.cls(lane)

        def _key(self, lane: str, receipt: str) -> tuple[int, int]:
            return eq.cls(lane), eq.cls(receipt)

        @staticmethod
        def _invalid(kind: str, lane: str, receipt: str) -> bool:
            return max(len(kind), len(lane), len(receipt)) > LIMIT

        def _sort(self, items):
            """The model's verdict on a batch: (collisions {key: other key}, duplicates, fresh, repeated)."""
            collisions, duplicates, fresh, repeated = {}, [], [], []
            first: dict[tuple[int, int], tuple[str, str]] = {}
            for kind, lane, receipt in items:
                key = self._key(lane, receipt)
                if key in self.model.admitted:
                    lane0, receipt0, _ = self.model.admitted[key]
                    if (lane0, receipt0) == (lane, receipt):
                        duplicates.append((lane, receipt))
                    else:
                        collisions[(lane, receipt)] = (lane0, receipt0)
                    continue
                earlier = first.setdefault(key, (lane, receipt))
                if earlier != (lane, receipt):
                    collisions[(lane, receipt)] = earlier
                elif any((lane2, r2) == (lane, receipt) for _k, lane2, r2 in fresh):
                    repeated.append((lane, receipt))
                else:
                    fresh.append((kind, lane, receipt))
            return collisions, duplicates, fresh, repeated

        def _take_admitted(self, fresh, result):
            """Check and record what admission did with ``fresh`` (in batch = ordinal order)."""
            by_key = {(a.source_lane, a.receipt_id): a for a in result.admitted}
            assert sorted(by_key) == sorted((lane, r) for _k, lane, r in fresh)
            ordered = sorted(fresh, key=lambda it: by_key[(it[1], it[2])].ordinal)
            for _kind, lane, receipt in ordered:
                a = by_key[(lane, receipt)]
                assert a.ordinal == self.model.next_ordinal, (a, self.model.next_ordinal)
                self.model.admitted[self._key(lane, receipt)] = (lane, receipt, a.ordinal)
                self.model.next_ordinal += 1
            groups: dict[tuple[int, int], list[tuple[str, str, str]]] = {}
            for it in ordered:
                groups.setdefault(self._identity(it[0], it[1]), []).append(it)
            for identity, members in groups.items():
                work_ids = {by_key[(lane, r)].work_id for _k, lane, r in members}
                assert len(work_ids) == 1, f"one identity, as the server compares it, got generations {work_ids}"
                (work_id,) = work_ids
                latest = self.model.latest(identity)
                if latest is not None and latest.status == "pending" and latest.attempt == 0:
                    assert work_id == latest.work_id and work_id in result.extended_work_ids
                    latest.members.extend(r for _k, _l, r in members)
                else:
                    assert work_id not in self.model.gens and work_id in result.created_work_ids
                    kind0, lane0, _ = members[0]
                    self.model.gens[work_id] = Gen(work_id, identity, kind0, lane0, [r for _k, _l, r in members])

        def _assert_exact(self, duplicates):
            for d in duplicates:
                assert _exact_event(engine, self.pack, d.source_lane, d.receipt_id) == d.event_id, d

        # -- admission -------------------------------------------------------------------

        @rule(data=st.data())
        def admit(self, data):
            items = self._items(data, legacy_variants=True)
            batch = [Input(lane, receipt, f'{{"r": {receipt!r}}}', event_kind=kind) for kind, lane, receipt in items]
            events_before = _event_count(engine, self.pack)
            invalid = {(lane, r) for kind, lane, r in items if self._invalid(kind, lane, r)}
            if invalid:
                with pytest.raises(InvalidReceipts) as info:
                    admit_batch(engine, self.pack, batch)
                assert info.value.keys == invalid
                assert _event_count(engine, self.pack) == events_before
                return
            collisions, duplicates, fresh, repeated = self._sort(items)
            if collisions:
                with pytest.raises(ReceiptCollision) as info:
                    admit_batch(engine, self.pack, batch)
                assert info.value.keys == set(collisions)
                for r in info.value.rejections:
                    lane0, receipt0 = collisions[r.key]
                    assert repr(r.receipt_id) in r.detail and repr(receipt0) in r.detail and repr(lane0) in r.detail, r.detail
                assert _event_count(engine, self.pack) == events_before  # nothing written
                return
            result = admit_batch(engine, self.pack, batch)
            assert sorted((d.source_lane, d.receipt_id) for d in result.duplicates) == sorted(duplicates + repeated)
            self._assert_exact(result.duplicates)
            self._take_admitted(fresh, result)

        @rule(ordinal=st.integers(1, LEGACY))
        def legacy_duplicate(self, ordinal):
            result = admit_batch(engine, self.pack, [Input(self.legacy_lane, f"legacy-{ordinal}", "{}")])
            assert not result.admitted and [d.reason for d in result.duplicates] == ["at_or_below_cutoff"]
            self._assert_exact(result.duplicates)

        # -- ingress receipts and the materializer ----------------------------------------

        @rule(data=st.data())
        def ingest_and_materialize(self, data):
            items = self._items(data, max_size=5)
            for kind, lane, receipt in items:  # the ingress writer: a key its table already holds is refused there
                try:
                    with engine.begin() as conn:
                        conn.execute(
                            insert(IngressReceipt).values(
                                PackInstallId=self.pack, SourceLane=lane, ReceiptId=receipt, EventKind=kind,
                                Payload=f'{{"r": {receipt!r}}}', ReceivedAt=BASE_TIME,
                            )
                        )
                except DBAPIError:
                    pass
            with engine.connect() as conn:
                pending = conn.execute(
                    select(IngressReceipt.c.SourceLane, IngressReceipt.c.ReceiptId, IngressReceipt.c.EventKind)
                    .where(IngressReceipt.c.PackInstallId == self.pack, IngressReceipt.c.MaterializedAt.is_(None))
                ).all()
            offered = [(k, lane, r) for lane, r, k in pending if (lane, r) not in self.rejected]
            invalid = {(lane, r) for k, lane, r in offered if self._invalid(k, lane, r)}
            collisions, duplicates, fresh, repeated = self._sort([it for it in offered if (it[1], it[2]) not in invalid])
            assert not repeated  # the receipt table's key already refused equal keys
            results = []
            report = materialize(engine, self.pack, Routing(), skip=set(self.rejected), after_commit=results.append)
            rejected = {r.key: r for r in report.rejected}
            assert {k for k, r in rejected.items() if r.kind == INVALID} == invalid
            assert {k for k, r in rejected.items() if r.kind == COLLISION} == set(collisions)
            for key, (lane0, receipt0) in collisions.items():
                detail = rejected[key].detail
                assert repr(key[1]) in detail and repr(receipt0) in detail and repr(lane0) in detail, detail
            self.rejected.update({k: r.kind for k, r in rejected.items()})
            if fresh or duplicates:
                (result,) = results
                assert sorted((d.source_lane, d.receipt_id) for d in result.duplicates) == sorted(duplicates)
                self._assert_exact(result.duplicates)
                self._take_admitted(fresh, result)
            self._receipts_accounted_for()

        def _receipts_accounted_for(self):
            """Confirmed => an Event with the exact key exists; unconfirmed => an error named it."""
            with engine.connect() as conn:
                rows = conn.execute(
                    select(IngressReceipt.c.SourceLane, IngressReceipt.c.ReceiptId, IngressReceipt.c.ConfirmedAt).where(
                        IngressReceipt.c.PackInstallId == self.pack
                    )
                ).all()
            for lane, receipt, confirmed in rows:
                if confirmed is not None:
                    assert _exact_event(engine, self.pack, lane, receipt) is not None, (lane, receipt)
                else:
                    assert (lane, receipt) in self.rejected, f"receipt {(lane, receipt)!r} unconfirmed without an error naming it"

        # -- work ------------------------------------------------------------------------

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
            self.model.admitted[self._key(gen.lane, receipt)] = (gen.lane, receipt, result.ordinal)
            self.model.next_ordinal += 1
            self.model.gens[result.work_id] = Gen(result.work_id, gen.identity, gen.kind, gen.lane, [receipt])

        # -- invariants ------------------------------------------------------------------

        @invariant()
        def exact_membership(self):
            if not hasattr(self, "model"):
                return
            owner = assert_membership(engine, {self.pack: LEGACY}, pack=self.pack)
            assert len(owner) == len(self.model.admitted) - LEGACY
            with engine.connect() as conn:
                for gen in self.model.gens.values():
                    assert [p.receipt_id for p in load_payloads(conn, gen.work_id)] == gen.members
                    if gen.claimed_payloads is not None:
                        assert gen.claimed_payloads == gen.members

    eq = oracle
    return RangeMachine


STATEFUL = settings(max_examples=25, stateful_step_count=25, deadline=None, suppress_health_check=list(HealthCheck), derandomize=True)


def test_range_protocol_state_machine(collated_engine, equality):
    """On SQLite, and on MariaDB tenants of its default collation and of a binary PAD SPACE one."""
    run_state_machine_as_test(machine_for(collated_engine, equality), settings=STATEFUL)

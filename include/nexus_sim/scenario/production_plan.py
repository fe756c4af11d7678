"""The planner of the production-shaped tenant (:mod:`.production`): one pack's history at a time, its payloads and
its receipts, as rows of a :class:`~.builder.TenantScenario`, nothing written.

Split out of :mod:`.production`, whose :func:`~.production.production_tenant` drives it (one :class:`Plan` per
tenant) and reports what it planted (:class:`~.production_model.Planted`).

Invariants (those of the production-shaped tenant, :mod:`.production`, that are the planner's to keep):

* Only what the server can hold (:func:`held_text` tells which hostile values its character set holds; the others
  are not planted) and only what it keeps apart: spellings the server equates are one identity
  (:class:`~.production_model.LanePlan`), whose generations alternate spellings and one of which mixes them; two
  receipt keys the server equates never both exist (the first is planted, the others become future
  ``ingress_duplicate`` receipts).
* A history the contract's audit accepts once ordinary Events are not audited: every identity's last generation
  is completed, a generation's selected Event is its last, pre-ordinal identities have no positive ordinal.
* One ordinal sequence per pack: the streams of one pack's history (its identities, its ordinary work) are
  interleaved in a random merge that keeps each stream's order (:func:`interleave`); the live tail of
  ``in_flight`` generations comes after the drained history.
* Deterministic: one rng and one id space (:class:`Ids`: 15-character CRM ids, unique even to a
  case-insensitive, space-padding comparison) per tenant; the same seed, collation and ``now`` plan the same rows.
"""

from __future__ import annotations

import datetime as dt
import random
from collections.abc import Callable, Iterator
from typing import Any

from ..collation import ServerCollation
from .builder import Lane, PackBuilder, TenantScenario
from .hostile import (
    CRM_PREFIXES,
    LANE_SPELLINGS,
    LONG_EVENT_KIND,
    LONG_PAYLOAD_BYTES,
    NON_ASCII_ALPHABET,
    SOURCE_LANE_MAX,
    case_variant,
    crm_id,
    payload,
)
from .production_model import (
    FUTURE_COLLISION,
    FUTURE_FRESH,
    FUTURE_INGRESS_DUPLICATE,
    ORDINARY_EVENT_STATUS,
    ORDINARY_WORK_TYPES,
    PROJECTION_WORK_TYPE,
    FutureReceipt,
    LanePlan,
)

#: The Status of a generation's selected Event by the generation's WorkItem Status.
_SELECTED_EVENT_STATUS = {"completed": "processed", "failed": "failed", "cancelled": "skipped"}


class Ids:
    """15-character CRM ids, unique in the tenant even to a case-insensitive, space-padding comparison."""

    def __init__(self, rng: random.Random):
        self.rng = rng
        self.seen: set[str] = set()

    def new(self, prefix: str | None = None) -> str:
        while True:
            rid = crm_id(self.rng, prefix or self.rng.choice(CRM_PREFIXES))
            key = rid.upper()  # ASCII ids: no collation equates more than case-folding does
            if key not in self.seen:
                self.seen.add(key)
                return rid


def held_text(collation: ServerCollation) -> dict[str, bool]:
    """Every hostile value and character -> whether the server's character set holds it (one statement)."""
    values = [s for spellings in LANE_SPELLINGS for s in spellings] + list(NON_ASCII_ALPHABET) + [LONG_EVENT_KIND]
    for s in values:
        if len(s) > SOURCE_LANE_MAX:
            raise AssertionError(f"hostile value over the column limit: {len(s)} characters")
    return dict(zip(values, collation.holds(values), strict=True))


Step = Callable[[], None]


class Plan:
    """Planning state shared by the packs of one tenant (one rng, one id space)."""

    def __init__(self, sc: TenantScenario, rng: random.Random, ids: Ids, alphabet: str, collation: ServerCollation,
                 *, now: dt.datetime):
        self.sc, self.rng, self.ids, self.alphabet, self.collation, self.now = sc, rng, ids, alphabet, collation, now
        self.lanes: list[LanePlan] = []
        self.trimmed_event_ids: list[int] = []
        self.long_payload_event_ids: list[int] = []
        self.pending_receipts: list[tuple[str, str, str]] = []
        self.variant_pairs: list[tuple[tuple[str, str, str], tuple[str, str, str]]] = []
        self.future: list[FutureReceipt] = []
        self.confirmed = 0
        #: Per pack: admitted projection Events of hostile lanes at positive ordinals (receipt-variant targets).
        self.hostile_events: dict[str, list[dict[str, Any]]] = {}

    def payload(self, tag: str) -> str:
        return payload(self.rng, self.alphabet, tag=tag)

    # -- one pack's history: streams of steps, interleaved so ordinals interleave -------------------------

    def pack_history(self, pack: PackBuilder, group_classes: list[list[list[str]]], *, plain_lanes: int,
                     legacy_zero_lanes: int, generations: int, max_inputs: int, long_kind: bool,
                     ordinary_statuses: tuple[str, ...], ordinary_per_status: int, trimmed: int,
                     in_flight: int = 0) -> None:
        streams: list[Iterator[None]] = []
        for index, classes in enumerate(group_classes):
            for spellings in classes:
                lp = LanePlan(pack.pack_install_id, spellings, index, False, "contact.changed")
                self.lanes.append(lp)
                streams.append(self._lane_stream(pack, lp, generations, max_inputs))
        for i in range(plain_lanes):
            lp = LanePlan(pack.pack_install_id, [f"lane-{i:03d}"], None, i < legacy_zero_lanes, "contact.changed")
            self.lanes.append(lp)
            streams.append(self._lane_stream(pack, lp, generations, max_inputs))
        if long_kind:
            lp = LanePlan(pack.pack_install_id, ["lane-kind"], None, False, LONG_EVENT_KIND)
            self.lanes.append(lp)
            streams.append(self._lane_stream(pack, lp, 2, max_inputs))
        streams.append(self._ordinary_stream(pack, ordinary_statuses, ordinary_per_status, trimmed))
        interleave(self.rng, streams)
        for i in range(in_flight):  # the live tail, after the drained history (as an old runtime leaves it)
            lane = pack.lane(f"live-{i % 3:02d}", work_type=PROJECTION_WORK_TYPE)
            status = ("pending", "retry", "processing")[i % 3]
            extra: dict[str, Any] = {}
            if status == "retry":
                extra = {"attempt": 1, "next_attempt_at": self.now}
            elif status == "processing":
                extra = {"lease_owner": "old-worker-crashed", "lease_expires_at": self.now - dt.timedelta(minutes=5)}
            self._generation(pack, lane, [lane], self.rng.randint(1, max_inputs), status, **extra)

    def _generation(self, pack: PackBuilder, owner: Lane, spelled: list[Lane], inputs: int, status: str,
                    *, legacy: bool = False, **work: Any) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """``inputs`` Events (spellings cycling through ``spelled``) coalesced into one old WorkItem of ``owner``."""
        events = []
        for k in range(inputs):
            lane = spelled[k % len(spelled)]
            if k == inputs - 1:  # the selected Event
                event_status = _SELECTED_EVENT_STATUS.get(status, "pending")
            else:  # a coalesced input keeps a historical pending status now and then (the audit permits it)
                event_status = self.rng.choices(("pending", "processed"), (1, 4))[0]
            rid = self.ids.new()
            events.append(lane.event(status=event_status, legacy=legacy, receipt_id=rid, payload=self.payload(rid)))
        return events, owner.work_item(events[-1], status=status, **work)

    def _lane_stream(self, pack: PackBuilder, lp: LanePlan, generations: int, max_inputs: int) -> Iterator[None]:
        """The drained history of one identity: ``generations`` per spelling, alternating; the last completed.

        With several spellings (the server equates them), one generation coalesces Events of every spelling into
        a WorkItem of the first spelling, as an old runtime coalescing by the server's equality left it.
        """
        lanes = [pack.lane(s, event_kind=lp.event_kind, work_type=PROJECTION_WORK_TYPE) for s in lp.spellings]
        total = generations * len(lanes)
        mixed_at = self.rng.randrange(total - 1) if len(lanes) > 1 and total > 1 else None
        for g in range(total):
            yield
            lane = lanes[g % len(lanes)]
            status = "completed" if g == total - 1 else self.rng.choices(("completed", "failed", "cancelled"), (8, 1, 1))[0]
            if g == mixed_at:
                _, work = self._generation(pack, lanes[0], lanes, max(len(lanes), self.rng.randint(2, max_inputs + 1)),
                                           "completed", legacy=lp.legacy_zero)
                lp.mixed_spelling_work_id = work["WorkId"]
            else:
                events, _ = self._generation(pack, lane, [lane], self.rng.randint(1, max_inputs), status,
                                             legacy=lp.legacy_zero)
                if lp.group is not None and not lp.legacy_zero:
                    self.hostile_events.setdefault(pack.pack_install_id, []).extend(events)
            lp.generations += 1

    def _ordinary_stream(self, pack: PackBuilder, statuses: tuple[str, ...], per_status: int, trimmed: int) -> Iterator[None]:
        """Ordinary Events, each with its one ordinary WorkItem in ``statuses``; then retention-trimmed ones."""
        lane_pool = [s for lp in self.lanes if lp.pack_install_id == pack.pack_install_id for s in lp.spellings]
        n = 0
        for status in statuses:
            for k in range(per_status):
                yield
                work_type = ORDINARY_WORK_TYPES[n % len(ORDINARY_WORK_TYPES)]
                n += 1
                lane = pack.lane(self.rng.choice(lane_pool), event_kind="email.requested", work_type=work_type)
                rid = self.ids.new("00T")
                event = lane.event(status=ORDINARY_EVENT_STATUS[status], receipt_id=rid, payload=self.payload(rid))
                self.sc.ordinary_work(event, status=status, **self._ordinary_details(status, k, event))
        for k in range(trimmed):
            yield
            lane = pack.lane(self.rng.choice(lane_pool), event_kind="email.requested", work_type=ORDINARY_WORK_TYPES[k % 3])
            rid = self.ids.new("00T")
            legacy = k == 0 and trimmed > 1  # admitted before ordinals existed
            event = lane.event(status="processed", legacy=legacy, receipt_id=rid, payload=self.payload(rid))
            self.trimmed_event_ids.append(event["EventId"])

    def _ordinary_details(self, status: str, k: int, event: dict[str, Any]) -> dict[str, Any]:
        if status == "blocked":
            return {"blocked_on": f"erp://invoices/{event['ReceiptId']}"}
        if status == "retry":
            return {"attempt": 2, "next_attempt_at": self.now + dt.timedelta(days=7)}  # due next week
        if status == "processing":
            expires = self.now + (dt.timedelta(hours=1) if k % 2 == 0 else -dt.timedelta(minutes=10))
            return {"lease_owner": f"ordinary-worker-{k + 1}", "lease_expires_at": expires, "attempt": 1}
        if status == "failed":
            return {"attempt": 5}
        return {}

    # -- payloads and receipts ---------------------------------------------------------------------------------

    def long_payloads(self, packs: list[str], count: int) -> None:
        """Give ``count`` projection Events of ``packs`` a payload within 535 bytes of TEXT's limit."""
        candidates = [e for e in self.sc.events if e["PackInstallId"] in packs and e["WorkType"] == PROJECTION_WORK_TYPE]
        for event in self.rng.sample(candidates, min(count, len(candidates))):
            event["Payload"] = payload(self.rng, self.alphabet, tag=event["ReceiptId"], size_bytes=LONG_PAYLOAD_BYTES)
            self.long_payload_event_ids.append(event["EventId"])

    def receipts(self, pack_id: str, *, confirmed: int, variant_sets: int, collision_targets: int) -> None:
        """Confirmed receipts of admitted Events, unmaterialized receipt-id variants, future receipts."""
        admitted = self.hostile_events.get(pack_id, [])
        picks = self.rng.sample(admitted, min(len(admitted), confirmed + collision_targets))
        for event in picks[:confirmed]:  # durable receipts of admitted Events, materialized and confirmed
            row = self.sc.receipt(pack_id, event["SourceLane"], event["ReceiptId"], event_kind=event["EventKind"])
            row.update(Payload=event["Payload"], MaterializedAt=event["ReceivedAt"], ConfirmedAt=event["ReceivedAt"])
            self.confirmed += 1
        for event in picks[confirmed:]:  # admitted Events whose receipt rows retention deleted: collision targets
            self._variants_of_admitted(pack_id, event)
        lanes = [lp for lp in self.lanes if lp.pack_install_id == pack_id and lp.group is not None and not lp.legacy_zero]
        for i in range(variant_sets if lanes else 0):
            lp = lanes[i % len(lanes)]
            self._pending_variants(pack_id, lp, self.ids.new())

    def _variants_of_admitted(self, pack_id: str, event: dict[str, Any]) -> None:
        lane, rid = event["SourceLane"], event["ReceiptId"]
        candidates = [(lane, case_variant(rid)), (lane, rid + " ")]
        other = next((s for lp in self.lanes if lp.pack_install_id == pack_id and lane in lp.spellings
                      for s in lp.spellings if s != lane), None)
        if other is None:  # the server keeps every other spelling of the group apart: a lane of another identity
            group = next(lp.group for lp in self.lanes if lp.pack_install_id == pack_id and lane in lp.spellings)
            other = next((s for s in LANE_SPELLINGS[group] if s != lane and s in self._planned_spellings(pack_id)), None)
        if other is not None:
            candidates.append((other, rid))
        for cand_lane, cand_rid in candidates:
            same = self.collation.equal(cand_lane, lane) and self.collation.equal(cand_rid, rid)
            kind = FUTURE_COLLISION if same else FUTURE_FRESH
            self.future.append(FutureReceipt(pack_id, cand_lane, cand_rid, event["EventKind"], kind, (lane, rid)))

    def _planned_spellings(self, pack_id: str) -> set[str]:
        return {s for lp in self.lanes if lp.pack_install_id == pack_id for s in lp.spellings}

    def _pending_variants(self, pack_id: str, lp: LanePlan, rid: str) -> None:
        """Unmaterialized receipts whose keys differ only in case or trailing spaces (id, and lane spelling):
        the first of each server class is planted, the others are future ``ingress_duplicate`` receipts."""
        lane = lp.spellings[0]
        keys = [(lane, rid), (lane, case_variant(rid)), (lane, rid + " ")]
        other = next((s for s in LANE_SPELLINGS[lp.group] if s != lane and s in self._planned_spellings(pack_id)), None)
        if other is not None:  # another spelling of the lane: the same key to a collation that equates them
            keys.append((other, rid))
        planted: list[tuple[str, str]] = []
        for lane, receipt_id in keys:
            twin = next((p for p in planted if self.collation.equal(p[0], lane) and self.collation.equal(p[1], receipt_id)),
                        None)
            if twin is None:
                row = self.sc.receipt(pack_id, lane, receipt_id)
                row["Payload"] = self.payload(receipt_id)
                self.pending_receipts.append((pack_id, lane, receipt_id))
                if planted:
                    self.variant_pairs.append(((pack_id, *planted[0]), (pack_id, lane, receipt_id)))
                planted.append((lane, receipt_id))
            else:
                self.future.append(FutureReceipt(pack_id, lane, receipt_id, "contact.changed", FUTURE_INGRESS_DUPLICATE, twin))


def interleave(rng: random.Random, streams: list[Iterator[None]]) -> None:
    """Run the streams' steps in a random merge that keeps each stream's own order (one ordinal sequence per pack)."""
    live = list(streams)
    while live:
        stream = rng.choice(live)
        try:
            next(stream)
        except StopIteration:
            live.remove(stream)


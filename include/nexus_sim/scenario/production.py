"""The production-shaped tenant (issues 24 and 25): what a long-lived CRM tenant holds when its cutover starts.

:func:`production_tenant` plans, :func:`build_production_tenant` plans against a
tenant database and writes. The tenant holds, per active pack:

* drained old projection history on lanes drawn from hostile text
  (:data:`~.hostile.LANE_SPELLINGS`: case variants, trailing spaces, non-ASCII,
  values at the column limit), plus plain lanes, the first ones entirely
  pre-ordinal (ordinal 0), and one identity whose Event kind is at its column limit;
* ordinary work (``WorkClass = 'ordinary'``, Events of non-projection work
  types) in every status -- pending, blocked, retry due next week, processing
  (one live lease, one expired), completed, failed, cancelled -- and ordinary
  Events whose WorkItem retention already deleted (one of them pre-ordinal);
  ordinals are allocated per pack, interleaved with the projection history;
* non-ASCII payloads, and ``long_payloads`` Events whose payload is within 535
  bytes of TEXT's 65,535;
* ingress receipts: confirmed ones of admitted Events, unmaterialized ones whose
  15-character CRM ids differ only in case or trailing spaces (only those the
  server keeps apart), and *future receipts* (:class:`FutureReceipt`) that live
  traffic sends later (:mod:`nexus_sim.traffic`);

and beside the active packs an uninstalled incarnation of the first one (same
PackName, drained history and completed ordinary work), a greenfield pack (no
Event, no WorkItem), ``registry_stopped_rows`` stopped old processes (default
10,000; every old role, so each writer role alone exceeds 1,000 rows) and, on
request, live old writers and Field History rows.

Invariants:

* Only what a real tenant could hold: equality of lanes and receipt ids is the
  server's (:class:`~nexus_sim.collation.ServerCollation`). Spellings the
  server equates are one identity: their generations alternate spellings (and,
  as the old runtime coalesced by the server's equality, one generation mixes
  them); spellings it keeps apart are separate identities, each with a complete
  history. Two receipt keys the server equates never both exist in one unique
  index: the first is planted, the other becomes a future receipt. Values the
  column's character set cannot hold are dropped and reported.
* The planned history is one the contract's audit accepts once ordinary Events
  are not audited: every identity's last generation is completed, coalesced
  inputs of failed or cancelled generations lie below a later completed one,
  and pre-ordinal identities have no positive ordinal.
* Deterministic: the same collation, seed, ``now`` and sizes give the same rows.
  Rows that do not depend on liveness use fixed timestamps; live heartbeats,
  leases and due times are relative to ``now``.
* :class:`Planted` reports, as data, everything planted that tests assert on.
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from collections.abc import Callable, Iterator
from dataclasses import asdict, dataclass
from typing import Any

from sqlalchemy import Engine

from nexus_cutover import catalog
from nexus_cutover.clock import utcnow
from nexus_cutover.runtime.model import Routing
from nexus_cutover.schema import apply_steps, create_legacy_schema, field_history_steps

from ..collation import ServerCollation
from .builder import BASE_TIME, Lane, PackBuilder, TenantScenario
from .hostile import (
    CRM_PREFIXES,
    LANE_SPELLINGS,
    LONG_EVENT_KIND,
    LONG_PAYLOAD_BYTES,
    NON_ASCII_ALPHABET,
    SOURCE_LANE_MAX,
    case_variant,
    crm_id,
    free_text,
    payload,
)

#: The projection work type: what the reference host routes receipts to by default, so that planted history and
#: what the host admits after the release are one work type.
PROJECTION_WORK_TYPE = Routing().work_type
#: Work types of ordinary work (never a projection work type).
ORDINARY_WORK_TYPES = ("crm.email.send", "crm.webhook.deliver", "crm.rollup.recalculate")
ORDINARY_STATUSES = ("pending", "blocked", "retry", "processing", "completed", "failed", "cancelled")
#: The Status an ordinary Event has while its WorkItem has the given Status.
ORDINARY_EVENT_STATUS = {
    "pending": "pending",
    "blocked": "pending",
    "retry": "pending",
    "processing": "processing",
    "completed": "processed",
    "failed": "failed",
    "cancelled": "skipped",
}
#: The Status of a generation's selected Event by the generation's WorkItem Status.
_SELECTED_EVENT_STATUS = {"completed": "processed", "failed": "failed", "cancelled": "skipped"}

OLD_BINARY_VERSIONS = ("4.8.2", "4.9.0", "4.10.1", "4.11.0")
#: Roles of the stopped registry rows: every old-protocol writer role and every pre-cutover producer role.
STOPPED_ROLES = catalog.OLD_WRITER_ROLES + (
    catalog.ROLE_RUNTIME_API,
    catalog.ROLE_SERVICE_MANAGER,
    catalog.ROLE_AUDIT_OUTBOX_WORKER,
)
#: ProcessIds of the live old writers planted with ``live_old_writers`` (an old runtime simulator stands in for them
#: with ``writer_id`` / ``worker_id``).
LIVE_OLD_WRITER_IDS = {catalog.ROLE_INGRESS_WRITER: "old-ingress-1", catalog.ROLE_PROJECTION_WORKER: "old-worker-1"}
LIVE_PRODUCER_IDS = {catalog.ROLE_RUNTIME_API: "runtime-api-1", catalog.ROLE_AUDIT_OUTBOX_WORKER: "outbox-worker-1"}
OLD_PRODUCER_VERSION = "4.11.0"
NEW_PRODUCER_VERSION = "4.13.0"

FIRST_PACK = "pk-crm-sync-v2"
UNINSTALLED_PACK = "pk-crm-sync-v1"
#: An active pack whose id is at PackInstallId's column limit (64 characters).
LONG_PACK = ("pk-billing-eu-west-" + "x" * 64)[: catalog.PackInstall.c.PackInstallId.type.length]
GREENFIELD_PACK = "pk-greenfield"

FUTURE_COLLISION = "collision"
FUTURE_FRESH = "fresh"
FUTURE_INGRESS_DUPLICATE = "ingress_duplicate"


@dataclass(frozen=True)
class FutureReceipt:
    """A receipt that live traffic sends after the build.

    ``kind``: ``collision`` -- the server equates its key with ``equals``, an
    admitted Event's key, but the bytes differ: the runtime must neither
    acknowledge it as a duplicate nor retry it forever; ``fresh`` -- the server
    keeps it apart from ``equals``: a new input, admitted as such;
    ``ingress_duplicate`` -- the server equates it with ``equals``, a receipt row
    that exists: ``_System_IngressReceipt``'s primary key refuses it.
    """

    pack_install_id: str
    source_lane: str
    receipt_id: str
    event_kind: str
    kind: str
    equals: tuple[str, str]


@dataclass
class LanePlan:
    """One server equality class of lane spellings of a pack: one projection identity."""

    pack_install_id: str
    spellings: list[str]
    group: int | None  # index into LANE_SPELLINGS; None for a plain lane
    legacy_zero: bool
    event_kind: str
    generations: int = 0
    mixed_spelling_work_id: int | None = None


@dataclass
class Planted:
    """What :func:`production_tenant` planted, as data (``as_json()`` for reports)."""

    namespace: str
    seed: int
    #: The server's answers (:meth:`ServerCollation.describe`): dialect, charset, collation, folds_case, pads_spaces.
    collation: dict[str, Any]
    #: Every active pack, the greenfield one included.
    active_packs: list[str]
    uninstalled_packs: list[str]
    greenfield_packs: list[str]
    #: Per pack (every incarnation): the allocator's LastOrdinal, and Event counts by kind.
    last_ordinal: dict[str, int]
    projection_events: dict[str, int]
    ordinary_events: dict[str, int]
    legacy_zero_events: dict[str, int]
    projection_work_by_status: dict[str, int]
    live_projection_work: int
    ordinary_work_by_status: dict[str, int]
    #: Ordinary Events without a WorkItem (retention deleted it), EventIds.
    ordinary_events_without_work_item: list[int]
    lanes: list[LanePlan]
    #: (pack, spellings) of every identity the server spells in two or more ways.
    case_variant_lanes: list[tuple[str, list[str]]]
    #: Spelling groups of LANE_SPELLINGS the server splits into several identities.
    split_spelling_groups: list[list[list[str]]]
    #: Hostile values the column's character set cannot hold (not planted).
    dropped_values: list[str]
    held_non_ascii: str
    long_payload_event_ids: list[int]
    long_values: dict[str, int]
    #: Unmaterialized receipts planted now: (pack, lane, receipt id).
    pending_receipts: list[tuple[str, str, str]]
    #: Unmaterialized receipts whose ids differ from another planted one's only in case or trailing spaces.
    receipt_variant_pairs: list[tuple[tuple[str, str, str], tuple[str, str, str]]]
    confirmed_receipts: int
    future_receipts: list[FutureReceipt]
    registry_stopped_rows: int
    registry_stopped_by_role: dict[str, int]
    live_processes: list[str]
    field_history_rows: int

    @property
    def collision_receipts(self) -> list[FutureReceipt]:
        return [f for f in self.future_receipts if f.kind == FUTURE_COLLISION]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ProductionTenant:
    scenario: TenantScenario
    planted: Planted
    collation: ServerCollation


class _Ids:
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


def production_tenant(
    collation: ServerCollation,
    *,
    namespace: str = "prod",
    seed: int = 24,
    now: dt.datetime | None = None,
    active_packs: int = 2,
    plain_lanes: int = 3,
    legacy_zero_lanes: int = 1,
    generations: int = 3,
    max_inputs: int = 3,
    ordinary_per_status: int = 2,
    retention_trimmed_ordinary: int = 3,
    long_payloads: int = 2,
    confirmed_receipts: int = 4,
    receipt_variant_sets: int = 2,
    collision_targets: int = 2,
    in_flight_generations: int = 0,
    registry_stopped_rows: int = 10_000,
    live_old_writers: bool = False,
    field_history: bool = False,
    uninstalled_incarnation: bool = True,
    greenfield_pack: bool = True,
) -> ProductionTenant:
    """Plan the production-shaped tenant (module docstring) for the server ``collation`` answers for.

    Sizes are per active pack unless said otherwise. ``in_flight_generations``
    live old projection generations per active pack (pending, retry due now,
    processing with an expired lease) give an old runtime something to drain.
    """
    rng = random.Random(seed)
    sc = TenantScenario(namespace=namespace, now=now or utcnow())
    ids = _Ids(rng)
    held = _held_text(collation)
    alphabet = "".join(ch for ch in NON_ASCII_ALPHABET if held[ch])
    groups = [[s for s in spellings if held[s]] for spellings in LANE_SPELLINGS]
    dropped = [s for spellings in LANE_SPELLINGS for s in spellings if not held[s]]
    dropped += [ch for ch in NON_ASCII_ALPHABET if not held[ch]]
    long_kind_held = held[LONG_EVENT_KIND]
    if not long_kind_held:
        dropped.append(LONG_EVENT_KIND)
    group_classes = [collation.classes(g) if g else [] for g in groups]

    packs = [FIRST_PACK, LONG_PACK] + [f"pk-pack-{i}" for i in range(2, active_packs)]
    packs = packs[:active_packs]
    plan = _Plan(sc, rng, ids, alphabet, collation, now=sc.now)

    if uninstalled_incarnation:
        old = sc.pack(UNINSTALLED_PACK, name=_pack_name(UNINSTALLED_PACK), status=catalog.PACK_UNINSTALLED)
        plan.pack_history(old, group_classes, plain_lanes=plain_lanes, legacy_zero_lanes=0, generations=2,
                          max_inputs=max_inputs, long_kind=False, ordinary_statuses=("completed", "cancelled"),
                          ordinary_per_status=1, trimmed=1)
    for pack_id in packs:
        pack = sc.pack(pack_id, name=_pack_name(pack_id))
        plan.pack_history(pack, group_classes, plain_lanes=plain_lanes, legacy_zero_lanes=legacy_zero_lanes,
                          generations=generations, max_inputs=max_inputs, long_kind=long_kind_held,
                          ordinary_statuses=ORDINARY_STATUSES, ordinary_per_status=ordinary_per_status,
                          trimmed=retention_trimmed_ordinary, in_flight=in_flight_generations)
    if greenfield_pack:
        sc.pack(GREENFIELD_PACK, name="greenfield")

    active = list(packs)
    plan.long_payloads(active, long_payloads)
    for pack_id in active:
        plan.receipts(pack_id, confirmed=confirmed_receipts, variant_sets=receipt_variant_sets,
                      collision_targets=collision_targets)
    stopped_by_role = _stopped_registry(sc, rng, registry_stopped_rows)
    live = []
    if live_old_writers:
        for role, pid in LIVE_OLD_WRITER_IDS.items():
            sc.process(role, process_id=pid, version=OLD_BINARY_VERSIONS[-1])
            live.append(pid)
    fh_rows = 0
    if field_history:
        for role, pid in LIVE_PRODUCER_IDS.items():
            sc.process(role, process_id=pid, version=OLD_PRODUCER_VERSION)
            live.append(pid)
        fh_rows = _field_history(sc, rng, alphabet)

    split = [classes for classes in group_classes if len(classes) > 1]
    case_variants = [(lp.pack_install_id, lp.spellings) for lp in plan.lanes if len(lp.spellings) > 1]
    events_by_pack: dict[str, Counter] = {}
    for e in sc.events:
        kind = "projection" if e["WorkType"] == PROJECTION_WORK_TYPE else "ordinary"
        events_by_pack.setdefault(e["PackInstallId"], Counter())[kind] += 1
        if e["EnqueueOrdinal"] == 0:
            events_by_pack[e["PackInstallId"]]["legacy_zero"] += 1
    projection_status = Counter(w["Status"] for w in sc.work_items if w["WorkClass"] == catalog.WORK_CLASS_PROJECTION)
    ordinary_status = Counter(w["Status"] for w in sc.work_items if w["WorkClass"] == catalog.WORK_CLASS_ORDINARY)
    planted = Planted(
        namespace=namespace,
        seed=seed,
        collation=collation.describe(),
        active_packs=active + ([GREENFIELD_PACK] if greenfield_pack else []),
        uninstalled_packs=[UNINSTALLED_PACK] if uninstalled_incarnation else [],
        greenfield_packs=[GREENFIELD_PACK] if greenfield_pack else [],
        last_ordinal={p.pack_install_id: p.last_ordinal for p in sc.packs},
        projection_events={p: c["projection"] for p, c in events_by_pack.items()},
        ordinary_events={p: c["ordinary"] for p, c in events_by_pack.items()},
        legacy_zero_events={p: c["legacy_zero"] for p, c in events_by_pack.items()},
        projection_work_by_status=dict(sorted(projection_status.items())),
        live_projection_work=sum(projection_status[s] for s in catalog.WORK_LIVE_STATUSES),
        ordinary_work_by_status=dict(sorted(ordinary_status.items())),
        ordinary_events_without_work_item=plan.trimmed_event_ids,
        lanes=plan.lanes,
        case_variant_lanes=case_variants,
        split_spelling_groups=split,
        dropped_values=dropped,
        held_non_ascii=alphabet,
        long_payload_event_ids=plan.long_payload_event_ids,
        long_values={
            "source_lane_chars": max(len(lp_s) for lp in plan.lanes for lp_s in lp.spellings),
            "event_kind_chars": max(len(e["EventKind"]) for e in sc.events),
            "pack_install_id_chars": max(len(p) for p in active),
            "payload_utf8_bytes": max(len(e["Payload"].encode()) for e in sc.events),
        },
        pending_receipts=plan.pending_receipts,
        receipt_variant_pairs=plan.variant_pairs,
        confirmed_receipts=plan.confirmed,
        future_receipts=plan.future,
        registry_stopped_rows=sum(stopped_by_role.values()),
        registry_stopped_by_role=stopped_by_role,
        live_processes=live,
        field_history_rows=fh_rows,
    )
    return ProductionTenant(sc, planted, collation)


def build_production_tenant(engine: Engine, **knobs: Any) -> ProductionTenant:
    """Create the Part A schema if absent (and, with ``field_history``, seed 003's stage 1 column), plan
    :func:`production_tenant` against this server, write it.

    Writes in bounded multi-row batches (:meth:`TenantScenario.write`): one
    transaction per batch of at most :data:`~.builder.BATCH_ROWS` rows.
    """
    create_legacy_schema(engine)
    if knobs.get("field_history"):  # stamped rows need seed 003's stage 1 column (as on the demo tenant)
        apply_steps(engine, field_history_steps(engine))
    tenant = production_tenant(ServerCollation.of_tenant_keys(engine), **knobs)
    tenant.scenario.write(engine)
    return tenant


# -- planning -----------------------------------------------------------------------------------------------


def _held_text(collation: ServerCollation) -> dict[str, bool]:
    """Every hostile value and character -> whether the server's character set holds it (one statement)."""
    values = [s for spellings in LANE_SPELLINGS for s in spellings] + list(NON_ASCII_ALPHABET) + [LONG_EVENT_KIND]
    for s in values:
        if len(s) > SOURCE_LANE_MAX:
            raise AssertionError(f"hostile value over the column limit: {len(s)} characters")
    return dict(zip(values, collation.holds(values), strict=True))


Step = Callable[[], None]


class _Plan:
    """Planning state shared by the packs of one tenant (one rng, one id space)."""

    def __init__(self, sc: TenantScenario, rng: random.Random, ids: _Ids, alphabet: str, collation: ServerCollation,
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
        _interleave(self.rng, streams)
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


def _pack_name(pack_id: str) -> str:
    """The PackName of an incarnation: its id without the ``pk-`` prefix and incarnation suffix (so a reinstall
    keeps its PackName), at most 40 characters."""
    name = pack_id.removeprefix("pk-")
    if pack_id in (FIRST_PACK, UNINSTALLED_PACK):
        name = name.rsplit("-v", 1)[0]
    return name[:40]


def _interleave(rng: random.Random, streams: list[Iterator[None]]) -> None:
    """Run the streams' steps in a random merge that keeps each stream's own order (one ordinal sequence per pack)."""
    live = list(streams)
    while live:
        stream = rng.choice(live)
        try:
            next(stream)
        except StopIteration:
            live.remove(stream)


def _stopped_registry(sc: TenantScenario, rng: random.Random, rows: int) -> dict[str, int]:
    """``rows`` stopped old processes, round-robin over :data:`STOPPED_ROLES`, over the year before BASE_TIME."""
    by_role: Counter = Counter()
    for i in range(rows):
        role = STOPPED_ROLES[i % len(STOPPED_ROLES)]
        started = BASE_TIME - dt.timedelta(days=365) + dt.timedelta(minutes=rng.randrange(365 * 24 * 60))
        stopped = started + dt.timedelta(minutes=rng.randrange(1, 30 * 24 * 60))
        host = f"crm-app-{rng.randrange(1, 40):02d}"
        sc.process(
            role,
            process_id=f"old-runtime-{host}-{rng.randrange(1000, 65535)}-{i:05d}/{role}",
            version=rng.choice(OLD_BINARY_VERSIONS),
            protocol=catalog.PROTOCOL_OLD,
            started_at=started,
            heartbeat_at=stopped,
            stopped=True,
        )
        by_role[role] += 1
    return dict(sorted(by_role.items()))


def _field_history(sc: TenantScenario, rng: random.Random, alphabet: str) -> int:
    """Field History rows as the demo has them (old NULL rows with and without a sequence, new stamped rows),
    with non-ASCII values; returns how many audit field changes."""
    for field_id, track, intervals in ((101, True, [(0, None)]), (102, True, [(0, 40), (60, None)]), (103, False, [])):
        sc.field(field_id, track_history=track, intervals=intervals, last_sequence=100)
    start = len(sc.audit_changes)
    for seq in range(1, 100, 2):
        for field_id in (101, 102, 103):
            row = sc.audit_change(field_id, history_sequence=seq, producer_version=OLD_PRODUCER_VERSION)
            row.update(OldValue=free_text(rng, alphabet, 12), NewValue=free_text(rng, alphabet, 12))
    for field_id, eligible in ((101, True), (102, True), (103, False)):
        for _ in range(3):
            sc.audit_change(field_id, history_sequence=None, eligible=eligible, producer_version=NEW_PRODUCER_VERSION)
    sc.audit_change(None, history_sequence=None)
    sc.audit_change(101, history_sequence=None)
    sc.outbox_row(producer_version=OLD_PRODUCER_VERSION, status="delivered")
    sc.setting(catalog.SETTING_READ_MODE, catalog.READ_MODE_COMPAT)
    sc.setting(catalog.SETTING_SEQUENCE_RESERVATION, "true")
    return len(sc.audit_changes) - start


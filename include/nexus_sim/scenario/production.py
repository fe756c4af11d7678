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

What it holds: :func:`production_tenant` (the whole tenant: its packs, the registry, Field History, and the
:class:`Planted` report) and :func:`build_production_tenant`. Beside it, each re-exported here so importers keep
``from nexus_sim.scenario.production import ...``: the tenant's names and data classes
(:mod:`.production_model`), and the planner of one pack's history, its payloads and its receipts
(:mod:`.production_plan`).
"""

from __future__ import annotations

import datetime as dt
import random
from collections import Counter
from typing import Any

from sqlalchemy import Engine

from nexus_cutover import catalog
from nexus_cutover.clock import utcnow
from nexus_cutover.schema import apply_steps, create_legacy_schema, field_history_steps

from ..collation import ServerCollation
from .builder import BASE_TIME, TenantScenario
from .hostile import LANE_SPELLINGS, LONG_EVENT_KIND, NON_ASCII_ALPHABET, free_text
from .production_model import (  # noqa: F401 - re-exported: importers know these as production's
    FIRST_PACK,
    FUTURE_COLLISION,
    FUTURE_FRESH,
    FUTURE_INGRESS_DUPLICATE,
    GREENFIELD_PACK,
    LIVE_OLD_WRITER_IDS,
    LIVE_PRODUCER_IDS,
    LONG_PACK,
    NEW_PRODUCER_VERSION,
    OLD_BINARY_VERSIONS,
    OLD_PRODUCER_VERSION,
    ORDINARY_EVENT_STATUS,
    ORDINARY_STATUSES,
    ORDINARY_WORK_TYPES,
    PROJECTION_WORK_TYPE,
    STOPPED_ROLES,
    UNINSTALLED_PACK,
    FutureReceipt,
    LanePlan,
    Planted,
    ProductionTenant,
)
from .production_plan import Ids, Plan, Step, held_text  # noqa: F401 - Step re-exported: importers know it as production's


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
    ids = Ids(rng)
    held = held_text(collation)
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
    plan = Plan(sc, rng, ids, alphabet, collation, now=sc.now)

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


def _pack_name(pack_id: str) -> str:
    """The PackName of an incarnation: its id without the ``pk-`` prefix and incarnation suffix (so a reinstall
    keeps its PackName), at most 40 characters."""
    name = pack_id.removeprefix("pk-")
    if pack_id in (FIRST_PACK, UNINSTALLED_PACK):
        name = name.rsplit("-v", 1)[0]
    return name[:40]


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


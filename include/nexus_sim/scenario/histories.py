"""Ready-made legacy histories built with :class:`~.builder.TenantScenario`."""

from __future__ import annotations

import random

from nexus_cutover import catalog

from .builder import PackBuilder, TenantScenario


def drained_pack_history(
    pack: PackBuilder,
    rng: random.Random,
    *,
    lanes: int = 3,
    generations: int = 5,
    max_inputs: int = 4,
    legacy_zero_lanes: int = 0,
    lane_prefix: str = "lane",
) -> None:
    """A drained old-protocol history that the cutover audit accepts.

    Every lane walks forward: coalesced generations, each a completed WorkItem
    selecting its last input; some failed generations with a direct task; the
    first ``legacy_zero_lanes`` lanes are entirely pre-ordinal (ordinal 0).
    Coalesced inputs keep a historical Event status of ``pending`` now and then,
    which the audit must permit.
    """
    for index in range(lanes):
        lane = pack.lane(f"{lane_prefix}-{index:03d}")
        legacy = index < legacy_zero_lanes
        for _ in range(generations):
            inputs = rng.randint(1, max_inputs)
            status = "failed" if rng.random() < 0.1 else "completed"
            coalesced_status = "pending" if rng.random() < 0.2 else "processed"
            lane.generation(inputs, status=status, legacy=legacy, coalesced_event_status=coalesced_status)
        # the tail always ends with a completed generation, so nothing lies beyond the boundary
        lane.generation(rng.randint(1, max_inputs), status="completed", legacy=legacy)


def demo_tenant(namespace: str = "demo", *, seed: int = 7, in_flight: bool = True) -> TenantScenario:
    """The demo tenant: several packs and lanes, legacy history, old work in flight, field history."""
    rng = random.Random(seed)
    sc = TenantScenario(namespace=namespace)
    for pack_id, lanes, zero in (("pk-crm-sync", 4, 1), ("pk-billing", 2, 0)):
        pack = sc.pack(pack_id, name=pack_id.removeprefix("pk-"))
        drained_pack_history(pack, rng, lanes=lanes, generations=6, legacy_zero_lanes=zero)
        if in_flight:
            lane = pack.lane("lane-live")
            lane.generation(2, status="completed")
            lane.generation(3, status="pending")
            lane.generation(1, status="processing", lease_owner="old-worker-1")
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id="old-ingress-1")
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-1")
    sc.process(catalog.ROLE_RUNTIME_API, version="4.11.0", process_id="runtime-api-1")
    sc.process(catalog.ROLE_AUDIT_OUTBOX_WORKER, version="4.11.0", process_id="outbox-worker-1")
    for field_id, track, intervals in ((101, True, [(0, None)]), (102, True, [(0, 40), (60, None)]), (103, False, [])):
        sc.field(field_id, track_history=track, intervals=intervals, last_sequence=100)
    for seq in range(1, 80, 3):
        for field_id in (101, 102, 103):
            sc.audit_change(field_id, history_sequence=seq)
    sc.audit_change(None, history_sequence=None)
    return sc

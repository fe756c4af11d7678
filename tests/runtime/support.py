"""Helpers of the runtime tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from sqlalchemy import Engine, select

from nexus_cutover import catalog
from nexus_cutover.catalog import Event, WorkItem
from nexus_cutover.identity import columns, of_row
from nexus_cutover.runtime.model import Input
from nexus_cutover.runtime.payload import load_payloads
from nexus_sim.scenario import TenantScenario

NS = "acme"
PACK = "pk-1"


def range_tenant(
    engine: Engine,
    *,
    packs: tuple[str, ...] = (PACK,),
    legacy_max: int | None = 0,
    namespace: str = NS,
    build: Callable[[TenantScenario], None] | None = None,
) -> TenantScenario:
    """Packs (active) with a version-1 protocol row (``legacy_max=None``: no row); ``build`` adds history first.

    With history, the cutoff is each pack's last legacy ordinal unless ``legacy_max`` is given.
    """
    sc = TenantScenario(namespace=namespace)
    for pack in packs:
        sc.pack(pack)
    if build is not None:
        build(sc)
    if legacy_max is not None:
        for builder in sc.packs:
            if builder.pack_install_id in packs:
                sc.protocol_row(builder.pack_install_id, max(legacy_max, builder.last_ordinal))
    sc.write(engine)
    return sc


def inp(lane: str, receipt: str, payload: str | None = None, **kw) -> Input:
    return Input(lane, receipt, payload if payload is not None else f'{{"r": "{receipt}"}}', **kw)


def range_generations(engine: Engine, pack: str | None = None) -> list:
    """Every range generation (InputStartOrdinal set), by WorkId; of one pack if given."""
    with engine.connect() as conn:
        return conn.execute(
            select(
                WorkItem.c.WorkId,
                WorkItem.c.Status,
                WorkItem.c.Attempt,
                WorkItem.c.InputStartOrdinal,
                WorkItem.c.LaneOrdinal,
                WorkItem.c.SelectedEventId,
                WorkItem.c.ReplayOfWorkId,
                *columns(WorkItem),
            )
            .where(WorkItem.c.InputStartOrdinal.is_not(None), *([WorkItem.c.PackInstallId == pack] if pack else []))
            .order_by(WorkItem.c.WorkId)
        ).all()


def all_events(engine: Engine, pack: str | None = None) -> list:
    with engine.connect() as conn:
        return conn.execute(
            select(
                Event.c.EventId,
                Event.c.EnqueueOrdinal,
                Event.c.ReceiptId,
                Event.c.Status,
                Event.c.ReceivedAt,
                Event.c.ReplayOfWorkId,
                *columns(Event),
            )
            .where(*([Event.c.PackInstallId == pack] if pack else []))
            .order_by(Event.c.EventId)
        ).all()


def payload_ordinals(engine: Engine, work_id: int) -> list[int]:
    with engine.connect() as conn:
        return [p.ordinal for p in load_payloads(conn, work_id)]


def payload_receipts(engine: Engine, work_id: int) -> list[str]:
    with engine.connect() as conn:
        return [p.receipt_id for p in load_payloads(conn, work_id)]


def assert_membership(engine: Engine, cutoff: dict[str, int] | None = None, *, pack: str | None = None) -> dict[int, int]:
    """Every post-cutoff Event lies in exactly one range generation of its identity; returns EventId -> WorkId.

    Also: ranges of one identity never overlap, each range's bounds are member ordinals, and
    ordinals of a pack are unique.
    """
    cutoff = cutoff or {}
    gens = range_generations(engine, pack)
    events = all_events(engine, pack)
    by_identity = defaultdict(list)
    for g in gens:
        by_identity[of_row(g)].append(g)
    for ranges in by_identity.values():
        ranges.sort(key=lambda g: g.InputStartOrdinal)
        for a, b in zip(ranges, ranges[1:], strict=False):
            assert a.LaneOrdinal < b.InputStartOrdinal, f"overlapping generations {a.WorkId} and {b.WorkId}"
    seen_ordinals = defaultdict(set)
    owner = {}
    for ev in events:
        if ev.EnqueueOrdinal > 0:
            assert ev.EnqueueOrdinal not in seen_ordinals[ev.PackInstallId], f"ordinal {ev.EnqueueOrdinal} reused"
            seen_ordinals[ev.PackInstallId].add(ev.EnqueueOrdinal)
        if ev.EnqueueOrdinal <= cutoff.get(ev.PackInstallId, 0):
            continue
        holders = [g.WorkId for g in by_identity[of_row(ev)] if g.InputStartOrdinal <= ev.EnqueueOrdinal <= g.LaneOrdinal]
        assert len(holders) == 1, f"Event {ev.EventId} (ordinal {ev.EnqueueOrdinal}) belongs to {holders}"
        owner[ev.EventId] = holders[0]
    for g in gens:
        members = sorted(e.EnqueueOrdinal for e in events if owner.get(e.EventId) == g.WorkId)
        assert members and members[0] == g.InputStartOrdinal and members[-1] == g.LaneOrdinal, g
    return owner


__all__ = [
    "NS",
    "PACK",
    "all_events",
    "assert_membership",
    "catalog",
    "inp",
    "payload_ordinals",
    "payload_receipts",
    "range_generations",
    "range_tenant",
]

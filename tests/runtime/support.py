"""Helpers of the runtime tests (no fixtures here: see conftest.py)."""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Callable

from sqlalchemy import Engine, and_, select

from nexus_cutover import catalog
from nexus_cutover.catalog import Event, WorkItem
from nexus_cutover.identity import COLUMN_NAMES, columns
from nexus_cutover.runtime.model import Input
from nexus_cutover.runtime.payload import load_payloads
from nexus_sim.checks import range_membership
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


def server_owners(engine: Engine, pack: str | None = None) -> dict[int, list[int]]:
    """EventId -> the WorkIds of range generations owning it, as the server's own join on the six identity columns
    sees it (``InputStartOrdinal <= EnqueueOrdinal <= LaneOrdinal``): the contract's membership, whatever the collation."""
    e, w = Event, WorkItem
    on = range_membership()
    stmt = select(e.c.EventId, w.c.WorkId).select_from(e.outerjoin(w, on))
    if pack:
        stmt = stmt.where(e.c.PackInstallId == pack)
    owners: dict[int, list[int]] = defaultdict(list)
    with engine.connect() as conn:
        for event_id, work_id in conn.execute(stmt):
            owners[event_id] += [] if work_id is None else [work_id]
    return owners


def overlapping_generations(engine: Engine, pack: str | None = None) -> list[tuple[int, int]]:
    """Pairs of distinct range generations of one identity (as the server joins it) whose ranges overlap."""
    a, b = WorkItem.alias("a"), WorkItem.alias("b")
    stmt = select(a.c.WorkId, b.c.WorkId).join(
        b,
        and_(
            *(a.c[name] == b.c[name] for name in COLUMN_NAMES),
            a.c.WorkId < b.c.WorkId,
            a.c.InputStartOrdinal <= b.c.LaneOrdinal,
            b.c.InputStartOrdinal <= a.c.LaneOrdinal,
        ),
    ).where(a.c.InputStartOrdinal.is_not(None), b.c.InputStartOrdinal.is_not(None))
    if pack:
        stmt = stmt.where(a.c.PackInstallId == pack)
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(stmt)]


def assert_membership(engine: Engine, cutoff: dict[str, int] | None = None, *, pack: str | None = None) -> dict[int, int]:
    """Every post-cutoff Event lies in exactly one range generation of its identity; returns EventId -> WorkId.

    Membership is the server's own join on the identity columns (:func:`server_owners`), so identities the tenant's
    collation equates are one identity. Also: ranges of one identity never overlap, each range's bounds are member
    ordinals, and ordinals of a pack are unique.
    """
    cutoff = cutoff or {}
    gens = range_generations(engine, pack)
    events = all_events(engine, pack)
    assert overlapping_generations(engine, pack) == []
    owners = server_owners(engine, pack)
    seen_ordinals = defaultdict(set)
    owner = {}
    for ev in events:
        if ev.EnqueueOrdinal > 0:
            assert ev.EnqueueOrdinal not in seen_ordinals[ev.PackInstallId], f"ordinal {ev.EnqueueOrdinal} reused"
            seen_ordinals[ev.PackInstallId].add(ev.EnqueueOrdinal)
        if ev.EnqueueOrdinal <= cutoff.get(ev.PackInstallId, 0):
            continue
        holders = owners.get(ev.EventId, [])
        assert len(holders) == 1, f"Event {ev.EventId} (ordinal {ev.EnqueueOrdinal}) belongs to {holders}"
        owner[ev.EventId] = holders[0]
    for g in gens:
        members = sorted(e.EnqueueOrdinal for e in events if owner.get(e.EventId) == g.WorkId)
        assert members and members[0] == g.InputStartOrdinal and members[-1] == g.LaneOrdinal, g
    return owner


def wait_for_lock_wait(engine: Engine, statement_start: str, *, alive: Callable[[], bool], timeout_s: float = 30.0) -> None:
    """Until a transaction on ``engine``'s database waits for a row lock in a statement starting with ``statement_start``
    (InnoDB's ``LOCK WAIT``): the barrier of the interleaving tests (what the server shows, not a pause of a guessed length)."""
    import time

    from sqlalchemy import text

    sql = text(
        "SELECT t.trx_query FROM information_schema.INNODB_TRX t "
        "JOIN information_schema.PROCESSLIST p ON p.ID = t.trx_mysql_thread_id "
        "WHERE t.trx_state = 'LOCK WAIT' AND p.DB = :db AND t.trx_query LIKE :q"
    )
    deadline = time.monotonic() + timeout_s
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        while time.monotonic() < deadline:
            assert alive(), f"the session ended before it waited in {statement_start!r}"
            if conn.execute(sql, {"db": engine.url.database, "q": statement_start + "%"}).first() is not None:
                return
            time.sleep(0.15)  # InnoDB refreshes INNODB_TRX only when it was read more than 0.1 s ago
    raise AssertionError(f"no session waited for a row lock in {statement_start!r} within {timeout_s:g}s")


__all__ = [
    "NS",
    "PACK",
    "all_events",
    "assert_membership",
    "catalog",
    "inp",
    "payload_ordinals",
    "payload_receipts",
    "overlapping_generations",
    "range_generations",
    "range_tenant",
    "server_owners",
    "wait_for_lock_wait",
]

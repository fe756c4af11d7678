"""``nexus_sim.traffic.LiveTraffic``: receipts and ordinary work keep arriving; everything it writes (or has refused)
is in its report and in the database, on SQLite and MariaDB (utf8mb4 default and utf8mb4_bin)."""

from __future__ import annotations

import time

from sqlalchemy import func, insert, select

from nexus_cutover import catalog
from nexus_cutover.clock import utcnow
from nexus_cutover.db import make_engine
from nexus_cutover.runtime.tx import ID_SHARD_BITS, id_shard
from nexus_cutover.schema import apply_steps, projection_steps
from nexus_sim.scenario.production import FUTURE_COLLISION, ORDINARY_WORK_TYPES, build_production_tenant
from nexus_sim.traffic import TRAFFIC_ID_PREFIX, LiveTraffic

#: Part A tables: the tenants of these tests have no cutover schema unless a test applies it.
E, W, R = (catalog.legacy_metadata.tables[t.name] for t in (catalog.Event, catalog.WorkItem, catalog.IngressReceipt))
SMALL = {"namespace": "prod", "seed": 24, "active_packs": 2, "plain_lanes": 2, "generations": 2, "registry_stopped_rows": 0}


def _receipts(engine) -> dict[tuple[str, str, str], object]:
    with engine.connect() as conn:
        return {(r.PackInstallId, r.SourceLane, r.ReceiptId): r for r in conn.execute(select(R))}


def test_ticks_write_receipts_future_receipts_and_ordinary_work(collated_tenant_url):
    engine = make_engine(collated_tenant_url)
    try:
        tenant = build_production_tenant(engine, **SMALL)
        p, coll = tenant.planted, tenant.collation
        pending_before = sorted(w["WorkId"] for w in tenant.scenario.work_items
                                if w["WorkClass"] == catalog.WORK_CLASS_ORDINARY and w["Status"] == "pending")
        traffic = LiveTraffic(engine, p, receipts_per_tick=2, future_per_tick=3, ordinary_per_tick=1,
                              complete_ordinary_per_tick=1, interval_s=0)
        for _ in range(4):
            traffic.tick()
        report = traffic.report
        assert report.ticks == 4 and report.errors == []

        # new receipts: stored byte for byte, unmaterialized, on planted lanes, with the traffic's own 15-character ids
        stored = _receipts(engine)
        assert len(report.receipts) == 4 * 2 * len(p.active_packs)
        lanes = {s for lp in p.lanes for s in lp.spellings}
        for key in report.receipts:
            assert key in stored and stored[key].MaterializedAt is None and stored[key].ConfirmedAt is None
            assert key[1] in lanes and key[2].startswith(TRAFFIC_ID_PREFIX) and len(key[2]) == 15

        # planned future receipts, in plan order: stored exactly, or refused because the server equates them with a row
        assert [f for f, _ in report.future_sent] == p.future_receipts[:12]
        for f, outcome in report.future_sent:
            key = (f.pack_install_id, f.source_lane, f.receipt_id)
            if outcome == "stored":
                assert key in stored
            else:
                assert outcome == "rejected_at_ingress" and key not in stored and key in report.rejected_at_ingress
                assert any(k[0] == key[0] and coll.equal(k[1], key[1]) and coll.equal(k[2], key[2]) for k in stored)
        collisions = [f for f, _ in report.future_sent if f.kind == FUTURE_COLLISION]
        assert bool(report.collisions_stored) is bool(collisions)  # the first collision of each admitted key gets in

        # ordinary work: one Event and one WorkItem, ordinals above the planted ones, ids in the pack's shard
        with engine.connect() as conn:
            last = dict(conn.execute(select(catalog.EnqueueOrdinal.c.PackInstallId, catalog.EnqueueOrdinal.c.LastOrdinal)).all())
            for pack in p.active_packs:
                mine = [o for o in report.ordinary if o[0] == pack]
                if pack in p.greenfield_packs:
                    assert mine == []
                    continue
                ordinals = [o[3] for o in mine]
                assert len(mine) == 4 and ordinals == sorted(ordinals) and ordinals[0] > p.last_ordinal[pack]
                assert last[pack] == ordinals[-1]
                for _, event_id, work_id, ordinal in mine:
                    ev = conn.execute(select(E).where(E.c.EventId == event_id)).one()
                    work = conn.execute(select(W).where(W.c.WorkId == work_id)).one()
                    assert (ev.PackInstallId, ev.EnqueueOrdinal, ev.WorkType in ORDINARY_WORK_TYPES) == (pack, ordinal, True)
                    assert work.WorkClass == catalog.WORK_CLASS_ORDINARY and work.SelectedEventId == event_id
                    assert work.WorkType == ev.WorkType and work.PackInstallId is None
                    assert event_id >> ID_SHARD_BITS == id_shard(pack) == work_id >> ID_SHARD_BITS

            # the ordinary worker took the lowest pending WorkIds first (the planted ones) and finished their Events
            assert report.ordinary_completed == pending_before[:4]
            done = conn.execute(select(W.c.Status, E.c.Status).join(E, E.c.EventId == W.c.SelectedEventId)
                                .where(W.c.WorkId.in_(report.ordinary_completed))).all()
            assert done and set(done) == {("completed", "processed")}
    finally:
        engine.dispose()


def test_started_traffic_stops_and_reports_everything_it_wrote(collated_tenant_url):
    engine = make_engine(collated_tenant_url)
    try:
        tenant = build_production_tenant(engine, **SMALL)
        with engine.connect() as conn:
            events_before = conn.execute(select(func.count()).select_from(E)).scalar()
        receipts_before = len(_receipts(engine))
        traffic = LiveTraffic(engine, tenant.planted, interval_s=0.05).start()
        deadline = time.monotonic() + 60
        while traffic.report.ticks < 3 and time.monotonic() < deadline:
            time.sleep(0.05)
        report = traffic.stop()
        assert report.ticks >= 3 and report.errors == []
        stored_future = [f for f, outcome in report.future_sent if outcome == "stored"]
        # read after stop: exactly what the report names, so nothing was written after it returned
        assert len(_receipts(engine)) == receipts_before + len(report.receipts) + len(stored_future)
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(E)).scalar() == events_before + len(report.ordinary)
        assert traffic.report == report
    finally:
        engine.dispose()


def test_ordinary_ordinals_stay_above_the_cutoff_once_a_pack_has_its_protocol_row(sqlite_url):
    engine = make_engine(sqlite_url)
    try:
        tenant = build_production_tenant(engine, **SMALL)
        pack = tenant.planted.active_packs[0]
        apply_steps(engine, projection_steps(engine))
        cutoff = tenant.planted.last_ordinal[pack] + 50  # a floor above LastOrdinal: the allocator must respect it
        with engine.begin() as conn:
            conn.execute(insert(catalog.ConnectorProjectionProtocol).values(
                PackInstallId=pack, ProtocolVersion=1, LegacyMaxOrdinal=cutoff, WrittenAt=utcnow(), WrittenBy="test"))
        traffic = LiveTraffic(engine, tenant.planted, ordinary_packs=[pack], receipt_packs=[], future_per_tick=0)
        traffic.tick()
        traffic.tick()
        assert [o[3] for o in traffic.report.ordinary] == [cutoff + 1, cutoff + 2]
    finally:
        engine.dispose()


def test_the_same_seed_sends_the_same_traffic(tmp_path):
    reports = []
    for name in ("a", "b"):
        path = tmp_path / f"{name}.db"
        path.touch()
        engine = make_engine(f"sqlite:///{path}")
        try:
            tenant = build_production_tenant(engine, **SMALL)
            traffic = LiveTraffic(engine, tenant.planted, seed=7)
            for _ in range(3):
                traffic.tick()
            reports.append(traffic.report)
        finally:
            engine.dispose()
    a, b = reports
    assert a.receipts == b.receipts and a.future_sent == b.future_sent
    assert [(o[0], o[3]) for o in a.ordinary] == [(o[0], o[3]) for o in b.ordinary]


def test_a_statement_refused_under_concurrent_ddl_is_retried_not_an_error():
    """apply_schema altering a table while a producer reads it (MariaDB 1684 / 1412, wrapped as the runtime wraps
    driver errors) is a retry at the next tick; any other database error is still reported."""
    import pymysql
    from sqlalchemy.exc import OperationalError

    from nexus_cutover.errors import CutoverError
    from nexus_sim.traffic import _under_concurrent_ddl

    def wrapped(code: int, text: str) -> CutoverError:
        driver = OperationalError("SELECT ...", {}, pymysql.err.OperationalError(code, text))
        try:
            raise CutoverError("database error while live traffic: ordinary work") from driver
        except CutoverError as exc:
            return exc

    assert _under_concurrent_ddl(wrapped(1684, "skipped since its definition is being modified by concurrent DDL"))
    assert _under_concurrent_ddl(wrapped(1412, "Table definition has changed, please retry transaction"))
    assert not _under_concurrent_ddl(wrapped(1213, "Deadlock found when trying to get lock"))
    assert not _under_concurrent_ddl(CutoverError("no driver error at all"))

"""The production-shaped tenant of ``nexus_sim``: what it plants is in the database, byte for byte, on SQLite and on
MariaDB under a case-insensitive and a binary collation; it is a tenant the server could hold; the same seed builds
the same rows; its 10,000 registry rows go in bounded multi-row batches."""

from __future__ import annotations

import datetime as dt
from collections import Counter

import pytest
from sqlalchemy import Table, event, func, select

from nexus_cutover import catalog, identity
from nexus_cutover.db import Deadline, make_engine
from nexus_cutover.projection import audit
from nexus_cutover.schema import create_legacy_schema
from nexus_sim.collation import ServerCollation
from nexus_sim.scenario.builder import BATCH_ROWS
from nexus_sim.scenario.hostile import EVENT_KIND_MAX, LONG_PAYLOAD_BYTES, SOURCE_LANE_MAX, TEXT_MAX_BYTES
from nexus_sim.scenario.production import (
    FUTURE_COLLISION,
    FUTURE_FRESH,
    FUTURE_INGRESS_DUPLICATE,
    GREENFIELD_PACK,
    ORDINARY_STATUSES,
    ORDINARY_WORK_TYPES,
    PROJECTION_WORK_TYPE,
    UNINSTALLED_PACK,
    build_production_tenant,
    production_tenant,
)
from tests.sim.conftest import NS, SEED, SIZES

E, W, R, P = catalog.Event, catalog.WorkItem, catalog.IngressReceipt, catalog.ProcessRegistry


def _in_key_order(table: Table, rows: list[dict]) -> list[dict]:
    """``rows`` sorted by primary key in Python (by code point: the server's own order follows its collation)."""
    key = [c.name for c in table.primary_key.columns]
    return sorted(rows, key=lambda r: tuple(r[k] for k in key))


def rows_of(engine, table: Table) -> list[dict]:
    """Every row of ``table``'s Part A columns as dicts, in primary-key order."""
    legacy = catalog.legacy_metadata.tables[table.name]
    with engine.connect() as conn:
        return _in_key_order(legacy, [dict(r._mapping) for r in conn.execute(select(*legacy.columns))])


def planned(rows: list[dict], table: Table) -> list[dict]:
    """The planned rows as the database returns them: every Part A column (absent keys are NULL), in key order."""
    legacy = catalog.legacy_metadata.tables[table.name]
    return _in_key_order(legacy, [{c.name: r.get(c.name) for c in legacy.columns} for r in rows])


# -- what was planted is there ----------------------------------------------------------------------------------


@pytest.mark.parametrize(
    "table, attr",
    [(catalog.PackInstall, "pack_rows"), (E, "events"), (W, "work_items"), (R, "receipts"), (P, "processes")],
    ids=lambda v: v if isinstance(v, str) else v.name,
)
def test_every_planted_row_is_in_the_database_byte_for_byte(production, table, attr):
    """Non-ASCII text, trailing spaces, 128-character lanes and 65,000-byte payloads come back unchanged."""
    assert rows_of(production.engine, table) == planned(getattr(production.tenant.scenario, attr), table)


def test_ordinary_work_in_every_status_beside_projection_work(production):
    p = production.tenant.planted
    now = production.tenant.scenario.now
    with production.engine.connect() as conn:
        ordinary = conn.execute(select(W).where(W.c.WorkClass == catalog.WORK_CLASS_ORDINARY)).all()
        projection = conn.execute(select(W.c.Status).where(W.c.WorkClass == catalog.WORK_CLASS_PROJECTION)).scalars().all()
        types = dict(conn.execute(select(E.c.EventId, E.c.WorkType)).all())
    by_status = Counter(w.Status for w in ordinary)
    assert set(by_status) == set(ORDINARY_STATUSES)
    assert dict(by_status) == p.ordinary_work_by_status
    assert all(types[w.SelectedEventId] in ORDINARY_WORK_TYPES and w.WorkType == types[w.SelectedEventId] for w in ordinary)
    assert all(w.PackInstallId is None and w.LaneOrdinal is None for w in ordinary)
    retry = [w for w in ordinary if w.Status == "retry"]
    assert retry and all(w.NextAttemptAt >= now + dt.timedelta(days=6) for w in retry)  # due next week
    assert all(w.BlockedOn for w in ordinary if w.Status == "blocked")
    leases = sorted(w.LeaseExpiresAt > now for w in ordinary if w.Status == "processing")
    assert leases[0] is False and leases[-1] is True  # one lease expired, one live
    # projection work beside it: every status terminal (drained), the live count reported as zero
    assert projection and set(projection) <= set(catalog.WORK_TERMINAL_STATUSES)
    assert Counter(projection) == Counter(p.projection_work_by_status) and p.live_projection_work == 0


def test_ordinary_events_whose_work_item_retention_deleted(production):
    p = production.tenant.planted
    with production.engine.connect() as conn:
        orphans = conn.execute(
            select(E.c.EventId, E.c.EnqueueOrdinal)
            .where(E.c.WorkType.in_(ORDINARY_WORK_TYPES), ~select(W.c.WorkId).where(W.c.SelectedEventId == E.c.EventId).exists())
            .order_by(E.c.EventId)
        ).all()
    assert [e for e, _ in orphans] == sorted(p.ordinary_events_without_work_item)
    assert 0 in {o for _, o in orphans} and any(o > 0 for _, o in orphans)  # one admitted before ordinals existed


def test_ordinals_are_per_pack_increasing_never_reused_and_interleave_work_types(production):
    p = production.tenant.planted
    with production.engine.connect() as conn:
        events = conn.execute(select(E.c.PackInstallId, E.c.EnqueueOrdinal, E.c.WorkType)).all()
        last = dict(conn.execute(select(catalog.EnqueueOrdinal.c.PackInstallId, catalog.EnqueueOrdinal.c.LastOrdinal)).all())
    for pack in p.active_packs + p.uninstalled_packs:
        mine = [e for e in events if e.PackInstallId == pack and e.EnqueueOrdinal > 0]
        ordinals = [e.EnqueueOrdinal for e in mine]
        assert len(ordinals) == len(set(ordinals)), f"{pack}: an ordinal is used twice"
        assert last[pack] == max(ordinals, default=0) == p.last_ordinal[pack]
        if pack in p.greenfield_packs:
            assert not mine
            continue
        ordinary = [e.EnqueueOrdinal for e in mine if e.WorkType != PROJECTION_WORK_TYPE]
        projection = [e.EnqueueOrdinal for e in mine if e.WorkType == PROJECTION_WORK_TYPE]
        assert min(ordinary) < max(projection) and min(projection) < max(ordinary), f"{pack}: work types not interleaved"


def test_packs_incarnations_and_a_greenfield_pack(production):
    p = production.tenant.planted
    with production.engine.connect() as conn:
        packs = {r.PackInstallId: r for r in conn.execute(select(catalog.PackInstall))}
        counts = dict(conn.execute(select(E.c.PackInstallId, func.count()).group_by(E.c.PackInstallId)).all())
        greenfield_work = conn.execute(select(func.count()).select_from(W).where(W.c.PackInstallId == GREENFIELD_PACK)).scalar()
    assert p.uninstalled_packs == [UNINSTALLED_PACK] and packs[UNINSTALLED_PACK].Status == catalog.PACK_UNINSTALLED
    active = [pk for pk, r in packs.items() if r.Status == catalog.PACK_ACTIVE]
    assert sorted(active) == sorted(p.active_packs)
    same_name = [pk for pk in active if packs[pk].PackName == packs[UNINSTALLED_PACK].PackName]
    assert len(same_name) == 1, "the uninstalled incarnation is a reinstall of an active pack (same PackName)"
    assert counts[UNINSTALLED_PACK] > 0 and GREENFIELD_PACK not in counts and greenfield_work == 0
    assert max(len(pk) for pk in packs) == catalog.PackInstall.c.PackInstallId.type.length


def test_stopped_registry_rows_of_every_old_role(production):
    p = production.tenant.planted
    with production.engine.connect() as conn:
        rows = conn.execute(select(P.c.Role, P.c.StoppedAt, P.c.ProjectionProtocol)).all()
    stopped = Counter(r.Role for r in rows if r.StoppedAt is not None)
    assert sum(stopped.values()) == p.registry_stopped_rows == 10_000
    assert dict(stopped) == p.registry_stopped_by_role
    assert all(r.ProjectionProtocol == catalog.PROTOCOL_OLD for r in rows)
    for role in catalog.OLD_WRITER_ROLES:  # each writer role alone is beyond a 1,000-row page
        assert stopped[role] > 1000, role
    assert p.live_processes == [] and all(r.StoppedAt is not None for r in rows)


def test_long_values_at_the_column_limits(production):
    p = production.tenant.planted
    with production.engine.connect() as conn:
        lanes = set(conn.execute(select(E.c.SourceLane)).scalars())  # not DISTINCT: that keeps one spelling per class
        kinds = set(conn.execute(select(E.c.EventKind)).scalars())
        long_payloads = conn.execute(select(E.c.Payload).where(E.c.EventId.in_(p.long_payload_event_ids))).scalars().all()
    assert max(len(s) for s in lanes) == SOURCE_LANE_MAX == p.long_values["source_lane_chars"]
    assert max(len(k) for k in kinds) == EVENT_KIND_MAX
    assert len(long_payloads) == len(p.long_payload_event_ids) == 2
    assert all(LONG_PAYLOAD_BYTES - 4 < len(x.encode()) <= LONG_PAYLOAD_BYTES < TEXT_MAX_BYTES for x in long_payloads)
    assert any(ord(ch) > 127 for x in long_payloads for ch in x)
    assert any(ord(ch) > 0xFFFF for ch in p.held_non_ascii), "four-byte UTF-8 is held by every backend of this module"


# -- equality is the server's ------------------------------------------------------------------------------------


def test_lane_spellings_are_one_identity_exactly_where_the_server_equates_them(production):
    """The server's own GROUP BY over the identity columns finds one group per planted lane plan."""
    p = production.tenant.planted
    flags = p.collation
    assert (flags["folds_case"], flags["pads_spaces"]) == {
        "sqlite": (False, False), "mysql-utf8mb4": (True, True), "mysql-utf8mb4_bin": (False, True)}[production.backend]
    spelled = {tuple(s) for _, s in p.case_variant_lanes}
    assert (("Lane-A", "lane-a", "LANE-A") in spelled) is flags["folds_case"]
    assert (("Lane-B", "Lane-B ", "Lane-B  ") in spelled) is flags["pads_spaces"]
    assert (("Lane-C", "lane-c ") in spelled) is (flags["folds_case"] and flags["pads_spaces"])
    with production.engine.connect() as conn:
        for pack in p.active_packs + p.uninstalled_packs:
            groups = conn.execute(
                select(*identity.columns(E)).where(E.c.PackInstallId == pack, E.c.WorkType == PROJECTION_WORK_TYPE)
                .group_by(*identity.columns(E))
            ).all()
            plans = [lp for lp in p.lanes if lp.pack_install_id == pack]
            assert len(groups) == len(plans), pack
            # not DISTINCT: the server would keep one spelling per class
            stored = set(conn.execute(select(E.c.SourceLane).where(E.c.PackInstallId == pack)).scalars())
            for lp in plans:  # every spelling is stored with its own bytes
                assert set(lp.spellings) <= stored, lp.spellings
    for lp in p.lanes:  # the server equates a plan's spellings and no two plans' spellings of a pack
        assert production.tenant.collation.classes(lp.spellings) == [lp.spellings]
        assert (lp.mixed_spelling_work_id is not None) is (len(lp.spellings) > 1)


def test_the_planted_projection_history_is_one_the_audit_accepts(production):
    """The builder plants only history a real old runtime could have left drained, and ordinary work in every status
    beside it, which the contract does not audit: the audit finds nothing at all on any collation."""
    p = production.tenant.planted
    engine = production.engine
    with engine.connect() as conn:
        for pack in p.active_packs + p.uninstalled_packs:
            report = audit.audit_pack(conn, pack, NS, Deadline(120))
            assert report.findings == [], [f.describe() for f in report.findings]
            assert report.legacy_max_ordinal == p.last_ordinal[pack]


def test_receipts_differing_only_in_case_or_trailing_spaces(production):
    """Planted receipt variants all exist; no two the server equates; each future receipt is what its kind says."""
    p = production.tenant.planted
    coll = production.tenant.collation
    with production.engine.connect() as conn:
        stored = {(r.PackInstallId, r.SourceLane, r.ReceiptId): r for r in conn.execute(select(R))}

        def equal_rows(table, pack, lane, rid):
            """Rows the server equates with the key (its collation), as exact (lane, receipt id) bytes."""
            return conn.execute(select(table.c.SourceLane, table.c.ReceiptId).where(
                table.c.PackInstallId == pack, table.c.SourceLane == lane, table.c.ReceiptId == rid)).all()

        for key in p.pending_receipts:
            assert key in stored and stored[key].MaterializedAt is None and stored[key].ConfirmedAt is None
        # ids (and lanes) differing only in case or trailing spaces coexist unless the server equates them all
        assert bool(p.receipt_variant_pairs) is not (p.collation["folds_case"] and p.collation["pads_spaces"])
        for a, b in p.receipt_variant_pairs:
            assert a in stored and b in stored and a != b
            assert not (coll.equal(a[1], b[1]) and coll.equal(a[2], b[2]))
            assert a[2].strip().upper() == b[2].strip().upper() and a[1].strip().upper() == b[1].strip().upper()
        for f in p.future_receipts:
            key = (f.pack_install_id, f.source_lane, f.receipt_id)
            assert key not in stored and key != (f.pack_install_id, *f.equals)
            events, receipts = equal_rows(E, *key), equal_rows(R, *key)
            if f.kind == FUTURE_COLLISION:  # an admitted Event's key to the server, other bytes, no receipt row left
                assert [tuple(r) for r in events] == [f.equals] and receipts == []
            elif f.kind == FUTURE_INGRESS_DUPLICATE:  # the receipt table holds an equal key
                assert [tuple(r) for r in receipts] == [f.equals]
            else:
                assert f.kind == FUTURE_FRESH and events == [] and receipts == []
    kinds = Counter(f.kind for f in p.future_receipts)
    flags = p.collation
    assert bool(kinds[FUTURE_COLLISION]) is (flags["folds_case"] or flags["pads_spaces"])
    assert bool(kinds[FUTURE_FRESH]) is not (flags["folds_case"] and flags["pads_spaces"])
    assert all(len(f.receipt_id.rstrip()) == 15 for f in p.future_receipts)


def test_the_server_answers_about_characters_it_cannot_hold(mysql_url):
    """On the server's own default character set (MariaDB 10.11: latin1) four-byte and CJK text is dropped and
    reported, and everything planted still round-trips."""
    engine = make_engine(mysql_url)
    try:
        tenant = build_production_tenant(engine, namespace=NS, seed=SEED, registry_stopped_rows=10, **SIZES)
        p = tenant.planted
        if p.collation["charset"] == "utf8mb4":
            pytest.fail("this server's default character set is utf8mb4: the test needs a narrower one (e.g. latin1)")
        assert "客户-📇" in p.dropped_values and "📇" in p.dropped_values
        assert all(tenant.collation.holds(list(p.held_non_ascii)))
        assert rows_of(engine, E) == planned(tenant.scenario.events, E)
    finally:
        engine.dispose()


# -- deterministic, and cheap to write -----------------------------------------------------------------------------


def test_the_same_seed_plans_the_same_rows_and_another_seed_others(production):
    coll = production.tenant.collation
    now = production.tenant.scenario.now

    def plan(seed):
        t = production_tenant(coll, namespace=NS, seed=seed, now=now, **SIZES)
        sc = t.scenario
        return (sc.pack_rows, sc.events, sc.work_items, sc.receipts, sc.processes, sc.ordinal_rows()), t.planted

    again_rows, again_planted = plan(SEED)
    sc = production.tenant.scenario
    assert again_rows == (sc.pack_rows, sc.events, sc.work_items, sc.receipts, sc.processes, sc.ordinal_rows())
    assert again_planted == production.tenant.planted
    other_rows, _ = plan(SEED + 1)
    assert other_rows[1] != again_rows[1] and other_rows[4] != again_rows[4]


def test_ten_thousand_registry_rows_go_in_bounded_multi_row_batches(collated_tenant_url):
    """Every INSERT into the registry carries at most BATCH_ROWS rows, and 10,000 rows take ten of them."""
    engine = make_engine(collated_tenant_url)
    sizes: list[int] = []

    def count(conn, cursor, statement, parameters, context, executemany):
        if statement.lstrip().upper().startswith("INSERT INTO") and P.name in statement:
            sizes.append(len(parameters) if executemany else 1)

    try:
        create_legacy_schema(engine)
        event.listen(engine, "before_cursor_execute", count)
        build_production_tenant(engine, namespace=NS, seed=SEED, active_packs=1, plain_lanes=1, generations=1)
    finally:
        event.remove(engine, "before_cursor_execute", count)
    try:
        assert sum(sizes) == 10_000
        assert max(sizes) <= BATCH_ROWS and len(sizes) == -(-10_000 // BATCH_ROWS)
        with engine.connect() as conn:
            assert conn.execute(select(func.count()).select_from(P).where(P.c.StoppedAt.is_not(None))).scalar() == 10_000
    finally:
        engine.dispose()


def test_server_collation_agrees_with_the_tables_own_comparison(production):
    """The probe's classes of every stored lane spelling are the groups the server's COUNT(DISTINCT) finds."""
    coll = ServerCollation.of_tenant_keys(production.engine)
    assert coll.describe() == production.tenant.planted.collation
    with production.engine.connect() as conn:
        spellings = list(dict.fromkeys(conn.execute(select(E.c.SourceLane).order_by(E.c.EventId)).scalars()))
        groups = conn.execute(select(func.count(E.c.SourceLane.distinct()))).scalar()
    classes = coll.classes(spellings)
    assert len(classes) == groups
    assert (groups < len(spellings)) is (coll.folds_case or coll.pads_spaces)
    for c in classes:
        assert all(coll.equal(c[0], v) for v in c)
    for a, b in zip(classes, classes[1:], strict=False):
        assert not coll.equal(a[0], b[0])


def test_demo_knobs_plant_old_work_in_flight_live_processes_and_field_history(sqlite_url):
    """What the demo and the end-to-end tests ask for: live old projection work for an old runtime to drain, live old
    writers and pre-cutover producers, and Field History rows (the stage 1 column created for the stamped ones)."""
    engine = make_engine(sqlite_url)
    try:
        tenant = build_production_tenant(engine, namespace=NS, seed=SEED, registry_stopped_rows=0, in_flight_generations=3,
                                         live_old_writers=True, field_history=True, **SIZES)
        p = tenant.planted
        with engine.connect() as conn:
            live_projection = conn.execute(select(W.c.Status).where(
                W.c.WorkClass == catalog.WORK_CLASS_PROJECTION, W.c.Status.in_(catalog.WORK_LIVE_STATUSES))).scalars().all()
            processes = conn.execute(select(P.c.ProcessId, P.c.Role, P.c.StoppedAt)).all()
            audit_rows = conn.execute(select(func.count()).select_from(catalog.AuditFieldChange)).scalar()
        assert sorted(live_projection) == sorted(["pending", "retry", "processing"] * 2) and p.live_projection_work == 6
        assert {(pid, stopped) for pid, _, stopped in processes} == {(pid, None) for pid in p.live_processes}
        assert {role for _, role, _ in processes} == {catalog.ROLE_INGRESS_WRITER, catalog.ROLE_PROJECTION_WORKER,
                                                     catalog.ROLE_RUNTIME_API, catalog.ROLE_AUDIT_OUTBOX_WORKER}
        assert audit_rows == p.field_history_rows > 0
    finally:
        engine.dispose()

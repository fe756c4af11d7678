"""The cutover audit and one-time checkpoint, rule by rule, on MariaDB and SQLite."""

from __future__ import annotations

import datetime as dt
import random

import pytest
from sqlalchemy import select, update

from nexus_cutover import catalog, identity
from nexus_cutover.db import Deadline
from nexus_cutover.projection import audit
from nexus_cutover.projection.checkpoint import ALREADY_WRITTEN, REFUSED, WOULD_WRITE, WRITTEN, run_checkpoint
from nexus_cutover.protocol_row import WrongProtocolVersion, read_protocol_row
from nexus_sim.scenario import TenantScenario, drained_pack_history, insert_rows
from tests.support import fence_pack_namespace, history_checksum


def checkpoint(engine, pack="pk-1", *, fenced=True, **kw):
    """The checkpoint after cutover step 1 armed the namespace's fence (``fenced``), as the contract requires."""
    if fenced:
        fence_pack_namespace(engine, pack)
    return run_checkpoint(engine, pack, timeout_s=kw.pop("timeout_s", 30), written_by="test", **kw)


def protocol_rows(engine):
    with engine.connect() as conn:
        return conn.execute(select(catalog.ConnectorProjectionProtocol)).all()


def kinds(result):
    return {(f.finding, tuple(f.event_ids), tuple(f.work_ids)) for f in result.findings}


def refused_with(result, expected):
    assert result.outcome == REFUSED
    assert result.legacy_max_ordinal is None
    return kinds(result) == expected


# -- permitted histories ------------------------------------------------------------


def test_drained_history_writes_the_greatest_ordinal_once(engine):
    sc = TenantScenario()
    pack = sc.pack("pk-1")
    drained_pack_history(pack, random.Random(3), lanes=4, generations=6, legacy_zero_lanes=1)
    sc.write(engine)
    before = history_checksum(engine)

    result = checkpoint(engine)

    assert result.outcome == WRITTEN
    assert result.legacy_max_ordinal == pack.last_ordinal > 0
    rows = protocol_rows(engine)
    assert [(r.PackInstallId, r.ProtocolVersion, r.LegacyMaxOrdinal) for r in rows] == [("pk-1", 1, pack.last_ordinal)]
    assert history_checksum(engine) == before


def test_greenfield_pack_gets_cutoff_zero(engine):
    sc = TenantScenario()
    sc.pack("pk-1")
    sc.write(engine)
    assert checkpoint(engine).legacy_max_ordinal == 0
    assert protocol_rows(engine)[0].LegacyMaxOrdinal == 0


def test_direct_input_with_failed_task_is_permitted(engine):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    lane.generation(1, status="failed")  # a direct task, failed: terminal, permitted
    lane.generation(2, status="completed")
    sc.write(engine)
    assert checkpoint(engine).outcome == WRITTEN


def test_pending_coalesced_event_at_or_below_the_boundary_is_permitted(engine):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    lane.generation(4, status="completed", coalesced_event_status="pending")
    sc.write(engine)
    assert checkpoint(engine).outcome == WRITTEN


def test_mixed_history_with_only_direct_inputs_is_permitted(engine):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    lane.generation(1, legacy=True)
    lane.generation(1, legacy=True)
    lane.generation(1)
    lane.generation(1, status="failed")
    lane.generation(1)
    sc.write(engine)
    result = checkpoint(engine)
    assert result.outcome == WRITTEN and result.legacy_max_ordinal == 3


def test_ordinary_work_and_other_packs_do_not_disturb_the_audit(engine):
    sc = TenantScenario()
    pack1, pack2 = sc.pack("pk-1"), sc.pack("pk-2")
    drained_pack_history(pack1, random.Random(1), lanes=2, generations=3)
    events, _ = pack1.lane("x").generation(1)
    sc.ordinary_work(events[0], status="completed")
    # pack 2 is broken in every way; auditing pack 1 must not see it
    lane2 = pack2.lane("b")
    lane2.event()
    lane2.generation(1, status="pending")
    sc.write(engine)
    assert checkpoint(engine, "pk-1").outcome == WRITTEN
    assert checkpoint(engine, "pk-2").outcome == REFUSED
    assert [r.PackInstallId for r in protocol_rows(engine)] == ["pk-1"]


# -- refusals --------------------------------------------------------------------


@pytest.mark.parametrize("status", catalog.WORK_LIVE_STATUSES)
def test_live_projection_work_is_refused(engine, status):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    lane.generation(2)
    _, live = lane.generation(1, status=status)
    sc.write(engine)
    before = history_checksum(engine)
    result = checkpoint(engine)
    assert refused_with(result, {(audit.LIVE_WORK, (), (live["WorkId"],))})
    assert protocol_rows(engine) == []
    assert history_checksum(engine) == before


def test_live_ordinary_work_directly_selecting_an_event_is_live_work(engine):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    events, _ = lane.generation(2)
    ordinary = sc.ordinary_work(events[0], status="retry")
    sc.write(engine)
    result = checkpoint(engine)
    assert refused_with(result, {(audit.LIVE_WORK, (events[0]["EventId"],), (ordinary["WorkId"],))})


def test_native_work_before_checkpoint_is_refused(engine):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    lane.generation(1)
    event = lane.event()
    native = lane.work_item(event, status="completed", input_start_ordinal=event["EnqueueOrdinal"])
    sc.write(engine)
    result = checkpoint(engine)
    assert refused_with(result, {(audit.NATIVE_WORK_BEFORE_CHECKPOINT, (), (native["WorkId"],))})


def test_mixed_history_indirect_input_is_refused_even_below_the_boundary(engine):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    legacy_events, _ = lane.generation(2, legacy=True)  # first event is coalesced with ordinal 0
    lane.generation(2)
    sc.write(engine)
    result = checkpoint(engine)
    coalesced_positive = sc.events[2]["EventId"]
    assert refused_with(
        result, {(audit.MIXED_HISTORY_INDIRECT, (legacy_events[0]["EventId"], coalesced_positive), ())}
    )


def test_input_beyond_the_completed_boundary_owned_by_failed_work_is_refused(engine):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    lane.generation(2, status="completed")
    events, _ = lane.generation(3, status="failed")  # two coalesced inputs above B, reached only by failed work
    sc.write(engine)
    result = checkpoint(engine)
    assert refused_with(result, {(audit.BEYOND_COMPLETED_BOUNDARY, (events[0]["EventId"], events[1]["EventId"]), ())})


def test_a_completed_boundary_below_many_failed_generations_is_found(engine):
    """B(I) lies under several failed generations: the identity is walked down from its (failed) top."""
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    boundary_events, _ = lane.generation(2, status="completed")
    above = []
    for _ in range(6):
        events, _ = lane.generation(2, status="failed")
        above.append(events[0]["EventId"])  # the coalesced input; the selected one has its (failed) direct task
    sc.write(engine)
    result = checkpoint(engine)
    assert refused_with(result, {(audit.BEYOND_COMPLETED_BOUNDARY, tuple(above), ())})
    assert boundary_events[0]["EventId"] not in result.findings[0].event_ids


@pytest.mark.parametrize("seed", [1, 2])
def test_reach_read_from_the_top_equals_the_maximum_over_every_row(engine, seed):
    """B(I), the terminal reach and the total reach of each identity, read from the top of its range (one
    statement for every identity) and walked down where the top is no completed projection row, equal the
    plain maxima over every projection WorkItem row of the identity: past one walk batch, with ties on a
    LaneOrdinal, rows without a LaneOrdinal, an ordinary WorkItem on top of a lane, and another pack beside.
    """
    rng = random.Random(seed)
    sc = TenantScenario()
    pack, other = sc.pack("pk-1"), sc.pack("pk-2")
    statuses = catalog.WORK_TERMINAL_STATUSES + catalog.WORK_LIVE_STATUSES
    not_completed = tuple(s for s in statuses if s != catalog.WORK_COMPLETED)
    lanes = [pack.lane(f"lane-{i:03d}") for i in range(60)]
    for i, lane in enumerate(lanes):
        shape = i % 5
        if shape == 4:
            lane.event()  # Events only: no WorkItem reaches anything
            continue
        lane.generation(rng.randint(1, 3), status=catalog.WORK_COMPLETED if shape != 2 else rng.choice(not_completed))
        top_rows = {0: rng.randint(0, 1), 1: rng.randint(1, 8), 2: rng.randint(1, 9), 3: 2}[shape]
        for _ in range(top_rows):
            events, _ = lane.generation(rng.randint(1, 2), status=rng.choice(not_completed))
            if shape == 3:  # a tie: a second WorkItem on the same LaneOrdinal, completed or not
                lane.work_item(events[-1], status=rng.choice(statuses))
        if rng.random() < 0.3:
            lane.work_item(None, status=rng.choice(statuses))  # no LaneOrdinal: reaches nothing
        other.lane(lane.identity.source_lane).generation(1, status=catalog.WORK_COMPLETED)
        if i % 7 == 0:  # a WorkItem of another class carrying the identity, above every projection row of the lane
            on_top = lane.work_item(None, status=catalog.WORK_COMPLETED, lane_ordinal=pack.next_ordinal())
            on_top["WorkClass"] = catalog.WORK_CLASS_ORDINARY
    deep = lanes[1]
    for _ in range(audit.REACH_WALK_BATCH + 10):
        deep.generation(1, status="failed")
    sc.ordinary_work(sc.events[0], status="completed")
    sc.write(engine)

    expected = {}
    for lane in lanes:
        rows = [w for w in sc.work_items if w["WorkClass"] == catalog.WORK_CLASS_PROJECTION
                and identity.of_row(w) == lane.identity and w["LaneOrdinal"] is not None]

        def greatest(keep, rows=rows):
            return max((w["LaneOrdinal"] for w in rows if keep(w["Status"])), default=None)

        expected[lane.identity] = (
            greatest(lambda s: s == catalog.WORK_COMPLETED),
            greatest(lambda s: s in catalog.WORK_TERMINAL_STATUSES),
            greatest(lambda s: True),
        )
    with engine.connect() as conn:
        reach = audit._work_reach_by_identity(conn, "pk-1", [lane.identity for lane in lanes], Deadline(60))
    got = {ident: (r.completed_boundary, r.terminal_reach, r.any_reach) for ident, r in reach.items()}
    assert got == expected
    assert expected[deep.identity][0] < expected[deep.identity][1]  # the deep lane's boundary really lies deep


def test_beyond_boundary_with_no_completed_work_at_all(engine):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    events, _ = lane.generation(2, status="cancelled")
    sc.write(engine)
    assert refused_with(checkpoint(engine), {(audit.BEYOND_COMPLETED_BOUNDARY, (events[0]["EventId"],), ())})


def test_input_without_any_owner_is_refused(engine):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    lane.generation(2)
    orphan = lane.event(status="pending")
    other_lane_orphan = sc.packs[0].lane("b").event(status="processed")
    sc.write(engine)
    result = checkpoint(engine)
    assert refused_with(
        result,
        {
            (audit.MISSING_OWNER, (orphan["EventId"],), ()),
            (audit.MISSING_OWNER, (other_lane_orphan["EventId"],), ()),
        },
    )
    assert {f.identity.source_lane for f in result.findings} == {"a", "b"}


def test_every_finding_is_reported_not_just_the_first(engine):
    sc = TenantScenario()
    pack = sc.pack("pk-1")
    a, b, c = pack.lane("a"), pack.lane("b"), pack.lane("c")
    _, live = a.generation(1, status="blocked", blocked_on="crm-api")
    b.generation(1)
    orphan = b.event()
    c.generation(1, legacy=True)
    mixed_events, _ = c.generation(2)
    sc.write(engine)
    result = checkpoint(engine)
    assert [f.finding for f in result.findings] == [audit.LIVE_WORK, audit.MIXED_HISTORY_INDIRECT, audit.MISSING_OWNER]
    assert result.findings[0].work_ids == [live["WorkId"]]
    assert result.findings[1].event_ids == [mixed_events[0]["EventId"]]
    assert result.findings[2].event_ids == [orphan["EventId"]]


def test_findings_are_streamed_in_keyset_batches(engine):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    lane.generation(1)
    orphans = [lane.event()["EventId"] for _ in range(23)]
    sc.write(engine)
    result = checkpoint(engine, batch_size=5)
    assert result.findings[0].event_ids == orphans


def test_clock_order_disagreeing_with_ordinals_does_not_change_the_verdict(engine):
    """ReceivedAt reversed against ordinals: decisions use ordinals only."""

    def build(reverse: bool) -> TenantScenario:
        sc = TenantScenario()
        lane = sc.pack("pk-1").lane("a")
        lane.generation(3)
        lane.generation(2, status="failed")
        lane.event()
        if reverse:
            stamps = sorted((e["ReceivedAt"] for e in sc.events), reverse=True)
            for event, stamp in zip(sc.events, stamps, strict=True):
                event["ReceivedAt"] = stamp
            for work in sc.work_items:
                work["CreatedAt"] = work["UpdatedAt"] = dt.datetime(2020, 1, 1)
        return sc

    verdicts = []
    for reverse in (False, True):
        eng = engine
        with eng.begin() as conn:
            for table in (catalog.WorkItem, catalog.Event, catalog.EnqueueOrdinal, catalog.PackInstall,
                          catalog.ConnectorProjectionProtocol):
                conn.execute(table.delete())
        build(reverse).write(eng)
        verdicts.append(kinds(checkpoint(eng)))
    assert verdicts[0] == verdicts[1] and verdicts[0]


# -- one-time semantics -------------------------------------------------------


def test_existing_checkpoint_is_returned_unchanged_without_reauditing(engine):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    lane.generation(2)
    sc.write(engine)
    first = checkpoint(engine)
    written_at = protocol_rows(engine)[0].WrittenAt
    # new work appears afterwards (admitted by the new runtime, above the cutoff): no re-audit
    sc2 = TenantScenario(event_id_start=1000, work_id_start=1000)
    late = sc2.pack("pk-1").lane("a")
    late.pack.last_ordinal = 10
    late.generation(1, status="pending")
    insert_rows(engine, catalog.Event, sc2.events)
    insert_rows(engine, catalog.WorkItem, sc2.work_items)
    second = checkpoint(engine)
    assert (first.outcome, second.outcome) == (WRITTEN, ALREADY_WRITTEN)
    assert second.legacy_max_ordinal == first.legacy_max_ordinal == 2
    rows = protocol_rows(engine)
    assert len(rows) == 1 and rows[0].WrittenAt == written_at


def test_a_row_with_another_protocol_version_is_an_error(engine):
    sc = TenantScenario()
    sc.pack("pk-1").lane("a").generation(1)
    sc.protocol_row("pk-1", 7, version=2)
    sc.write(engine)
    with pytest.raises(WrongProtocolVersion, match="ProtocolVersion 2"):
        checkpoint(engine)
    with engine.connect() as conn:
        row = read_protocol_row(conn, "pk-1")
    assert (row.protocol_version, row.legacy_max_ordinal) == (2, 7)


def test_dry_run_reports_the_cutoff_and_writes_nothing(engine):
    sc = TenantScenario()
    sc.pack("pk-1").lane("a").generation(3)
    sc.fence()  # armed without a lock row of ours
    sc.write(engine)
    result = checkpoint(engine, dry_run=True, fenced=False)
    assert (result.outcome, result.legacy_max_ordinal) == (WOULD_WRITE, 3)
    assert protocol_rows(engine) == []
    with engine.connect() as conn:  # a dry run takes no lock and so creates no lock row either
        assert conn.execute(select(catalog.Lock)).all() == []
    assert checkpoint(engine, fenced=False).outcome == WRITTEN
    assert checkpoint(engine, dry_run=True, fenced=False).outcome == ALREADY_WRITTEN


def test_the_audit_never_changes_history_even_when_statuses_would_tempt_it(engine):
    sc = TenantScenario()
    lane = sc.pack("pk-1").lane("a")
    lane.generation(3, coalesced_event_status="pending")
    lane.generation(1, status="retry")
    sc.write(engine)
    before = history_checksum(engine)
    assert checkpoint(engine).outcome == REFUSED
    with engine.begin() as conn:  # once the retry completes (old runtime), the same call passes
        conn.execute(update(catalog.WorkItem).where(catalog.WorkItem.c.Status == "retry").values(Status="completed"))
    after_drain = history_checksum(engine)
    assert after_drain != before
    assert checkpoint(engine).outcome == WRITTEN
    assert history_checksum(engine) == after_drain

"""The demo tenant (the production-shaped one) is a valid cutover subject on both backends: once the old runtime
drains its projection work, the audit accepts every pack although ordinary work in every status sits beside it and
more keeps arriving, the drain never waited for that ordinary work, and after the demo's producer upgrade the Field
History gates pass."""

from __future__ import annotations

import datetime as dt

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.field_history import gates
from nexus_cutover.projection.checkpoint import run_checkpoint
from nexus_cutover.projection.cutover_fence import arm_fence
from nexus_cutover.projection.drain import drain_report
from nexus_cutover.schema import apply_steps, projection_steps
from nexus_sim.checks import live_ordinary_work
from nexus_sim.old_runtime import OldRuntimeSimulator
from nexus_sim.traffic import LiveTraffic
from scripts.demo import upgrade_producers
from scripts.demo_seed import NEW_PRODUCER_VERSION, STAGE1_RELEASE, build_tenant


def _in(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(seconds=seconds)


def test_demo_tenant_drains_and_cuts_over(tenant_url, monkeypatch):
    engine = make_engine(tenant_url)
    try:
        sc, planted = build_tenant(engine, "demo")
        assert planted is not None and planted.registry_stopped_rows == 10_000
        live = [w for w in sc.work_items if w["Status"] in catalog.WORK_LIVE_STATUSES]
        projection_live = [w for w in live if w["WorkClass"] == catalog.WORK_CLASS_PROJECTION]
        before = drain_report(engine, "demo", deadline=_in(60), stale_heartbeat=dt.timedelta(seconds=60))
        assert before.remaining == len(projection_live) > 0 and len(live) > len(projection_live)  # ordinary: not counted
        assert before.counts["processing"] and before.counts["retry"] and before.counts["pending"]

        apply_steps(engine, projection_steps(engine))
        arm_fence(engine, "demo", armed_by="demo-test", timeout_s=30)
        traffic = LiveTraffic(engine, planted, receipts_after_release=True, complete_ordinary_per_tick=0)
        sim = OldRuntimeSimulator(engine, "demo", process_id="old-runtime-test", fail_attempts=1, retry_delay_s=0.0,
                                  synthetic_inputs_per_step=1)
        traffic.tick()  # ordinary work keeps arriving while the old runtime drains
        sim.run(exit_when_drained=True, poll_s=0.01)
        traffic.tick()
        assert drain_report(engine, "demo", deadline=_in(60), stale_heartbeat=dt.timedelta(seconds=60)).drained
        held = live_ordinary_work(engine, sc.work_items)
        assert held and all(was == now for was, now in held.values()), held  # drained without touching them
        cutoffs = {}
        for pack in planted.active_packs:
            result = run_checkpoint(engine, pack, timeout_s=60, written_by="demo-test")
            assert result.outcome == "written" and not result.findings, result.as_json()
            cutoffs[pack] = result.legacy_max_ordinal
        created = {o[0]: o[3] for o in traffic.report.ordinary}  # the last ordinal of each pack's new ordinary work
        assert traffic.report.receipts_held == 2 and not traffic.report.errors, traffic.report
        assert all(cutoffs[p] >= created[p] > planted.last_ordinal[p] for p in created), (cutoffs, created)
        assert [p for p, c in cutoffs.items() if c == 0] == planted.greenfield_packs

        monkeypatch.setattr("scripts.demo.TENANT", "demo")
        upgrade_producers(tenant_url)
        assert gates.stage_1(engine, stage1_release=STAGE1_RELEASE, namespace="demo").passed
        assert gates.stage_2_producers(engine, producer_release=NEW_PRODUCER_VERSION, namespace="demo").passed
        assert gates.stage_2_materialize(engine).passed
        s3 = gates.stage_3(engine, producer_release=NEW_PRODUCER_VERSION, updated_by="demo-test", namespace="demo")
        assert s3.passed, s3.render()
    finally:
        engine.dispose()

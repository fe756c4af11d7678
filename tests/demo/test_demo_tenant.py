"""The demo tenant is a valid cutover subject on both backends: once the old runtime drains it,
the audit accepts every pack, and after the demo's producer upgrade the Field History gates pass."""

from __future__ import annotations

import datetime as dt

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.field_history import gates
from nexus_cutover.projection.checkpoint import run_checkpoint
from nexus_cutover.projection.drain import drain_report
from nexus_cutover.projection.fence import arm_fence
from nexus_cutover.schema import apply_steps, create_legacy_schema, field_history_steps, projection_steps
from nexus_sim.old_runtime import OldRuntimeSimulator
from scripts.demo import upgrade_producers
from scripts.demo_seed import NEW_PRODUCER_VERSION, STAGE1_RELEASE, demo_scenario


def _in(seconds: float) -> dt.datetime:
    return dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(seconds=seconds)


def test_demo_tenant_drains_and_cuts_over(tenant_url, monkeypatch):
    engine = make_engine(tenant_url)
    try:
        create_legacy_schema(engine)
        apply_steps(engine, field_history_steps(engine))
        sc = demo_scenario("demo")
        sc.write(engine)
        before = drain_report(engine, "demo", deadline=_in(60), stale_heartbeat=dt.timedelta(seconds=60))
        assert before.remaining == sum(1 for w in sc.work_items if w["Status"] in catalog.WORK_LIVE_STATUSES) > 0
        assert before.counts["processing"] and before.counts["retry"] and before.counts["pending"]

        apply_steps(engine, projection_steps(engine))
        arm_fence(engine, "demo", armed_by="demo-test", timeout_s=30)
        sim = OldRuntimeSimulator(engine, "demo", process_id="old-runtime-test", fail_attempts=1, retry_delay_s=0.0,
                                  synthetic_inputs_per_step=1)
        sim.run(exit_when_drained=True, poll_s=0.01)
        assert drain_report(engine, "demo", deadline=_in(60), stale_heartbeat=dt.timedelta(seconds=60)).drained
        cutoffs = {}
        for pack in ("pk-crm-sync", "pk-billing"):
            result = run_checkpoint(engine, pack, timeout_s=60, written_by="demo-test")
            assert result.outcome == "written", result.as_json()
            cutoffs[pack] = result.legacy_max_ordinal
        assert all(v > 0 for v in cutoffs.values())

        monkeypatch.setattr("scripts.demo.TENANT", "demo")
        upgrade_producers(tenant_url)
        assert gates.stage_1(engine, stage1_release=STAGE1_RELEASE, namespace="demo").passed
        assert gates.stage_2_producers(engine, producer_release=NEW_PRODUCER_VERSION, namespace="demo").passed
        assert gates.stage_2_materialize(engine).passed
        s3 = gates.stage_3(engine, producer_release=NEW_PRODUCER_VERSION, updated_by="demo-test", namespace="demo")
        assert s3.passed, s3.render()
    finally:
        engine.dispose()

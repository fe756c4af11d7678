"""The wait before the fence in the DAG (issue 36, item 1): ``wait_for_short_drain`` is a deferrable sensor that
writes nothing and stops, the fence not armed, when the backlog does not get short; with a draining old runtime
the run arms once the rest is short and goes on. Real runs (dag.test) against MariaDB tenants."""

from __future__ import annotations

from nexus_cutover import catalog
from tests.dags.airflow_harness import run_dag
from tests.dags.cutover_support import base_conf, drained_tenant, history_bytes, snapshot

BACKLOG = 5


def test_a_backlog_that_does_not_shrink_stops_before_the_fence_naming_it(dag, tenant):
    engine, conn_id = tenant
    sc = drained_tenant()
    for lane in range(BACKLOG):
        sc.packs[0].lane(f"lane-backlog-{lane}").generation(1, status="pending")
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-idle")  # live, and never working
    sc.write(engine)
    before = history_bytes(engine)

    result = run_dag(dag, base_conf(conn_id, arm_when_drain_below=60, pre_arm_timeout=3, stale_heartbeat=600))

    assert result.state == "failed" and result.state_of("wait_for_short_drain") == "failed", result.task_states
    assert result.state_of("arm_fence") == "upstream_failed"
    report = result.xcom("wait_for_short_drain", key="report")
    assert report["remaining"] == BACKLOG and report["arm_when_drain_below_s"] == 60, report
    assert "pre_arm_timeout" in report["message"] and "not shrinking" in report["message"], report["message"]
    snap = snapshot(engine)
    assert snap["fences"] == [] and snap["protocol_rows"] == []  # nothing armed, nothing written
    assert history_bytes(engine) == before


def test_a_drained_tenant_passes_the_wait_at_its_first_look(dag, tenant):
    engine, conn_id = tenant
    drained_tenant().write(engine)
    result = run_dag(dag, base_conf(conn_id, arm_when_drain_below=60, dry_run=True))
    looked = result.xcom("wait_for_short_drain")
    assert result.state_of("wait_for_short_drain") == "success" and looked["remaining"] == 0, looked
    assert result.xcom("arm_fence")["outcome"] == "would_arm"
    assert result.xcom("final_old_writer_check")["verdict"] == "proceed"

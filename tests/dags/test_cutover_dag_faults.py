"""Fault injection: each task dies once mid-way (after its first write where it has one); rerun converges.

For every point: run 1 fails at that task; run 2 (every task again, same conf,
same tenant) succeeds; the final state equals a clean run's -- one protocol row
per pack with LegacyMaxOrdinal = the pack's greatest ordinal, written once
(WrittenAt/WrittenBy unchanged by the rerun), exactly one fence, released -- and
no historical Event/WorkItem row changed.
"""

from __future__ import annotations

import pytest
from sqlalchemy import select

from nexus_airflow.faults import FAULT_ENV
from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.schema import create_legacy_schema
from tests.dags.airflow_harness import HitlAnswerer, clear_and_rerun, run_dag
from tests.dags.cutover_support import (
    DAG_ID,
    PACKS,
    Deployer,
    base_conf,
    drained_tenant,
    history_bytes,
    max_ordinal,
    no_range_starts,
    snapshot,
)

CONFIRM = "Confirm: all old writers stopped"
FAULTS = [
    ("apply_schema.after_first_write", "apply_schema"),
    ("arm_fence.after_write", "arm_fence"),
    ("wait_for_drain.poll", "wait_for_drain"),
    ("check_old_writers.poll", "check_old_writers"),
    ("confirm_writers_stopped.before_ask", "confirm_writers_stopped"),
    ("history_digest.mid_way", "history_digest"),
    ("audit_and_checkpoint.after_write", "audit_and_checkpoint[0]"),
    ("start_new_host.after_write", "start_new_host"),
    ("verify_readiness.poll", "resume_admission"),  # the task that runs the step
    ("resume_admission.after_write", "resume_admission"),
    ("final_old_writer_check.before_emit", "final_old_writer_check"),
]


def _protocol_rows_full(engine):
    from nexus_cutover.schema import has_table

    if not has_table(engine, catalog.ConnectorProjectionProtocol.name):
        return []
    with engine.connect() as conn:
        return [tuple(r) for r in conn.execute(select(catalog.ConnectorProjectionProtocol).order_by("PackInstallId"))]


@pytest.mark.parametrize(("point", "failing_task"), FAULTS, ids=[p for p, _ in FAULTS])
def test_fail_once_then_rerun_converges(dag, mysql_url, tenant_connection, monkeypatch, point, failing_task):
    engine = make_engine(mysql_url)
    try:
        create_legacy_schema(engine)
        drained_tenant().write(engine)
        initial_history = history_bytes(engine)
        expected_rows = [(p, 1, max_ordinal(engine, p)) for p in PACKS]
        conn_id = tenant_connection("nexus_tenant_acme_fault", mysql_url)
        with Deployer(engine) as deployer, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}) as hitl:
            tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
            monkeypatch.setenv(FAULT_ENV, point)
            first = run_dag(dag, base_conf(conn_id))
            monkeypatch.delenv(FAULT_ENV)
            rows_after_fault = _protocol_rows_full(engine)
            second = clear_and_rerun(dag, first)
        assert not hitl.errors, hitl.errors
        assert first.state == "failed" and first.state_of(failing_task) == "failed", first.task_states
        assert second.state == "success", second.task_states

        snap = snapshot(engine)
        assert snap["protocol_rows"] == expected_rows
        assert snap["fences"] == [("*", True, True)]  # one fence, reused by the rerun, released once
        assert snap["input_start_ordinal"] is True
        assert snap["history"] and history_bytes(engine) == initial_history and no_range_starts(engine)
        if rows_after_fault:  # the checkpoint written before the fault is the one that stays
            assert _protocol_rows_full(engine) == rows_after_fault
            assert {second.xcom("audit_and_checkpoint", map_index=i)["outcome"] for i in range(2)} == {"already_written"}
        assert second.xcom("final_old_writer_check")["history_digest"]["verified"] is True
        if point.startswith(("start_new_host", "verify_readiness", "resume_admission", "final_old_writer_check")):
            assert len(deployer.requests) == 1  # the rerun found the host running and did not start another
    finally:
        engine.dispose()

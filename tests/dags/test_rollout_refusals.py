"""``tenant_rollout`` refuses bad input as a failed rollout, never a successful one (dag.test, real tasks)."""

from __future__ import annotations

import pytest

from tests.dags.airflow_harness import load_dag, run_dag


@pytest.fixture
def rollout(airflow_db):
    return load_dag("tenant_rollout")


def test_a_plan_that_refuses_its_input_fails_the_rollout_with_the_reason(rollout):
    result = run_dag(rollout, {"tenants": ["acme"], "cutover_conf": {"conn_id": "somewhere-else"}})
    assert result.state == "failed", result.task_states
    assert result.state_of("plan") == "failed" and result.state_of("summary") == "failed"
    summary = result.xcom("summary", key="summary")
    assert summary["succeeded"] == [] and "cutover_conf: unknown or per-tenant fields ['conn_id']" in summary["refusal"]
    assert result.xcom("plan", key="refusal") == summary["refusal"]

"""``tenant_rollout`` refuses bad input as a failed rollout, never a successful one (dag.test, real tasks).

The form is refused by the first task, the preflight, before any tenant database is read."""

from __future__ import annotations

import pytest

from tests.dags.airflow_harness import load_dag, run_dag


@pytest.fixture
def rollout(airflow_db):
    return load_dag("tenant_rollout")


def test_a_plan_that_refuses_its_input_fails_the_rollout_with_the_reason(rollout):
    result = run_dag(rollout, {"tenants": ["acme"], "cutover_conf": {"conn_id": "somewhere-else"}})
    assert result.state == "failed", result.task_states
    assert result.state_of("preflight") == "failed" and result.state_of("summary") == "failed"
    assert result.state_of("plan") == "upstream_failed"  # refused before any tenant database was read
    summary = result.xcom("summary", key="summary")
    assert summary["succeeded"] == [] and "cutover_conf: unknown or per-tenant fields ['conn_id']" in summary["refusal"]
    assert result.xcom("preflight", key="refusal") == summary["refusal"] and result.xcom("preflight", key="preflight") is None


@pytest.mark.parametrize("form, reason", [
    ({"cutover_conf": {"dry_run": "yes"}}, "cutover_conf.dry_run='yes' is refused by the per-tenant form"),
    ({"approval": "per_wave", "wave_size": 5, "max_parallel": 2, "canary": 0},
     "the widest wave has 3 tenants but max_parallel is 2"),
    ({"canary": ["acme", "nobody"]}, "canary names tenant(s) not in the rollout: ['nobody']"),
])
def test_the_plan_names_what_to_fix_before_any_tenant_starts(rollout, form, reason):
    """A value the per-tenant form would refuse (the API's reason, up front), a per-wave wave wider than the
    parallelism (its tenants could never all wait at the question), a canary outside the rollout."""
    result = run_dag(rollout, {"tenants": ["acme", "beta", "gamma"], **form})
    assert result.state == "failed", result.task_states
    assert result.state_of("preflight") == "failed" and result.state_of("plan") == "upstream_failed"
    assert not [t for t, s in result.task_states.items() if ".cutover" in t and s not in ("skipped", "upstream_failed")]
    summary = result.xcom("summary", key="summary")
    assert reason in summary["refusal"], summary


def test_a_missing_tenants_variable_is_named(rollout):
    result = run_dag(rollout, {"tenants": ["acme"], "tenants_variable": "nexus_no_such_fleet"})
    assert result.state == "failed" and result.state_of("preflight") == "failed"
    assert "Variable 'nexus_no_such_fleet' is missing or not JSON" in result.xcom("summary", key="summary")["refusal"]

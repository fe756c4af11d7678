"""A tenant's heavy reads run in its database cluster's pool (issue 36, item 3): which task instances go there
(:func:`nexus_airflow.policies.read_pool_of`, the scheduler's hook), the form's refusal of a name that is not a
pool's, and a rollout's reading of the pool from the tenant connection's extra.

The scheduler path (task instances of a rollout's tenants created in the pool) is asserted on a running Airflow by
``tests/rollout/test_tenant_rollout.py::test_per_wave_asks_the_ready_tenants_and_a_late_one_asks_its_own_follow_up``.
"""

from __future__ import annotations

import json

import pytest

from nexus_airflow.declared import CUTOVER, FIELD_HISTORY, HEAVY_READS
from nexus_airflow.params import CUTOVER_FIELDS
from nexus_airflow.policies import read_pool_of
from nexus_airflow.rollout_plan import cluster_pool


def test_every_heavy_read_is_a_declared_step():
    assert set(HEAVY_READS) == {CUTOVER.name, FIELD_HISTORY.name}
    for transition in (CUTOVER, FIELD_HISTORY):
        assert set(HEAVY_READS[transition.name]) <= set(transition.names)


@pytest.mark.parametrize("dag_id, task_id, conf, pool", [
    (CUTOVER.name, "history_digest", {"read_pool": "tidb_eu_reads"}, "tidb_eu_reads"),
    (CUTOVER.name, "final_old_writer_check", {"read_pool": "tidb_eu_reads"}, "tidb_eu_reads"),
    (FIELD_HISTORY.name, "stage_2_materialize", {"read_pool": "tidb-us.reads"}, "tidb-us.reads"),
    (CUTOVER.name, "arm_fence", {"read_pool": "tidb_eu_reads"}, None),  # not a heavy read: its own pool
    (CUTOVER.name, "history_digest", {}, None),  # no pool named: the task's own (default_pool)
    (CUTOVER.name, "history_digest", None, None),
    (CUTOVER.name, "history_digest", {"read_pool": ""}, None),
    (CUTOVER.name, "history_digest", {"read_pool": "x; drop"}, None),  # not a pool's name: never used
    (CUTOVER.name, "history_digest", {"read_pool": 3}, None),
    ("another_dag", "history_digest", {"read_pool": "tidb_eu_reads"}, None),
])
def test_a_heavy_read_goes_to_the_pool_its_run_names(dag_id, task_id, conf, pool):
    assert read_pool_of(dag_id, task_id, conf) == pool


def test_the_form_refuses_a_name_that_is_not_a_pool():
    param = CUTOVER_FIELDS["read_pool"].param()
    assert param.resolve("tidb_eu_reads") == "tidb_eu_reads"
    with pytest.raises(Exception, match="does not match"):
        CUTOVER_FIELDS["read_pool"].param().resolve("reads of eu; drop")


def test_a_rollout_takes_the_pool_from_the_tenant_connection_extra(monkeypatch):
    """Real Airflow connections from the environment (Airflow's own secrets backend)."""
    monkeypatch.setenv("AIRFLOW_CONN_NEXUS_TENANT_ACME", json.dumps(
        {"conn_type": "sqlite", "host": "/tmp/acme.db", "extra": {"nexus_read_pool": "tidb_eu_reads"}}))
    monkeypatch.setenv("AIRFLOW_CONN_NEXUS_TENANT_BETA", json.dumps({"conn_type": "sqlite", "host": "/tmp/beta.db"}))
    monkeypatch.setenv("AIRFLOW_CONN_NEXUS_TENANT_BAD", json.dumps(
        {"conn_type": "sqlite", "host": "/tmp/bad.db", "extra": {"nexus_read_pool": "eu reads"}}))
    assert cluster_pool("acme") == "tidb_eu_reads"
    assert cluster_pool("beta") is None  # no extra: Airflow's default pool
    assert cluster_pool("nobody") is None  # no connection: the run stops at its first read, naming it
    with pytest.raises(ValueError, match="nexus_tenant_bad: extra nexus_read_pool='eu reads' is not an Airflow pool"):
        cluster_pool("bad")


def test_airflow_applies_the_policy_from_the_wheels_entry_point_without_local_settings():
    """Issue 49: the cluster policy is registered through Airflow's ``airflow.policy`` entry point (no
    ``airflow_local_settings`` needed): Airflow's own plugin manager loads it, and Airflow's own
    ``settings.task_instance_mutation_hook`` moves a heavy read to its run's pool and leaves any other task as it
    is. A contract test: it fails when Airflow stops loading ``airflow.policy`` entry points or renames the hook."""
    from importlib.metadata import entry_points
    from types import SimpleNamespace

    import pluggy
    from airflow import policies, settings

    assert [ep.value for ep in entry_points(group="airflow.policy") if ep.name == "nexus_cutover"] == [
        "nexus_airflow.policy_hooks"]
    manager = pluggy.PluginManager(policies.local_settings_hookspec.project_name)  # as Airflow builds its own
    manager.add_hookspecs(policies)
    settings.load_policy_plugins(manager)
    assert "nexus_cutover" in dict(manager.list_name_plugin())
    heavy = SimpleNamespace(dag_id=CUTOVER.name, task_id=HEAVY_READS[CUTOVER.name][0], pool="default_pool")
    light = SimpleNamespace(dag_id=CUTOVER.name, task_id=CUTOVER.names[0], pool="default_pool")
    from airflow.models.dagrun import DagRun

    run = DagRun(dag_id=CUTOVER.name, run_id="r", conf={"read_pool": "tidb_eu_reads"})  # transient: no pool look-up
    for ti in (heavy, light):
        manager.hook.task_instance_mutation_hook(task_instance=ti, dag_run=run)
    assert (heavy.pool, light.pool) == ("tidb_eu_reads", "default_pool")

"""Real runs of the cutover DAG (dag.test, real tasks) against real tenant databases."""

from __future__ import annotations

import pytest

from nexus_cutover.db import make_engine
from nexus_cutover.schema import create_legacy_schema
from tests.dags.conftest import HitlAnswerer, load_dag, run_dag
from tests.dags.cutover_support import DAG_ID, Deployer, base_conf, drained_tenant, snapshot

CONFIRM = "Confirm: all old writers stopped"


@pytest.fixture(scope="module")
def dag(airflow_db):
    return load_dag(DAG_ID)


@pytest.fixture
def tenant(mysql_url, tenant_connection):
    engine = make_engine(mysql_url)
    create_legacy_schema(engine)
    conn_id = tenant_connection("nexus_tenant_acme_test", mysql_url)
    yield engine, conn_id
    engine.dispose()


def test_happy_path_on_drained_tenant_with_http_controller(dag, tenant, tenant_connection):
    engine, conn_id = tenant
    drained_tenant().write(engine)
    with Deployer(engine) as deployer, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}) as hitl:
        tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
        result = run_dag(dag, base_conf(conn_id))
    assert not hitl.errors, hitl.errors
    assert result.state == "success", result.task_states
    snap = snapshot(engine)
    assert [r[0] for r in snap["protocol_rows"]] == ["pk-a", "pk-b"]
    assert snap["fences"] == [("*", True, True)]

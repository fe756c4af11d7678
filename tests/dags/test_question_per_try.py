"""A re-asked confirmation shows the evidence of the try that asks it (issue 34.4; real runs, real metadata DB).

Airflow 3.3.2 carries a HITL task's question over to its next try (apache/airflow#72155, see
``nexus_airflow.compat``). Here a person clears ``check_old_writers`` (and its downstream, as the UI's Clear
does) through the same REST endpoint the UI calls, while the first question waits; ``dag.test()`` then runs the
cleared tasks again in the same run, and the second try's question is read as the person sees it.
"""

from __future__ import annotations

import datetime as dt
import re

import pytest
from sqlalchemy import update

from nexus_cutover import catalog
from tests.dags.airflow_harness import HitlAnswerer, run_dag
from tests.dags.cutover_support import DAG_ID, Deployer, base_conf, drained_tenant

CONFIRM = "Confirm: all old writers stopped"
Registry = catalog.ProcessRegistry


def _evidence_time(body: str) -> tuple[dt.datetime, int]:
    found = re.search(r"Evidence taken at (\S+)Z, try (\d+) of this step", body)
    assert found, body
    return dt.datetime.fromisoformat(found.group(1)), int(found.group(2))


class ClearThenConfirm:
    """The first question: the person stops another writer, then clears check_old_writers (and downstream);
    the second question: confirmed. Both questions kept in ``asked``."""

    def __init__(self, engine):
        self.engine = engine
        self.asked: list[dict] = []
        self.cleared_at: dt.datetime | None = None

    def __call__(self, detail: dict) -> str | None:
        from airflow.api_fastapi.app import create_app
        from fastapi.testclient import TestClient

        self.asked.append(detail)
        if len(self.asked) > 1:
            return CONFIRM
        with self.engine.begin() as conn:  # what the first question showed is no longer the registry
            conn.execute(update(Registry).where(Registry.c.ProcessId == "old-worker-first").values(ProcessId="old-worker-later"))
        self.cleared_at = dt.datetime.now(dt.UTC).replace(tzinfo=None)
        resp = TestClient(create_app(apps="core")).post(f"/api/v2/dags/{DAG_ID}/clearTaskInstances", json={
            "dry_run": False, "dag_run_id": detail["task_instance"]["dag_run_id"], "task_ids": ["check_old_writers"],
            "include_downstream": True, "only_failed": False})
        assert resp.status_code == 200, resp.text
        return None  # this question is left unanswered: its try was cleared


def _tenant(engine):
    sc = drained_tenant()
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-first", stopped=True)
    sc.write(engine)


def test_a_cleared_confirmation_asks_again_with_the_evidence_of_its_own_try(dag, tenant, tenant_connection):
    engine, conn_id = tenant
    _tenant(engine)
    person = ClearThenConfirm(engine)
    with Deployer(engine) as deployer, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": person}) as hitl:
        tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
        result = run_dag(dag, base_conf(conn_id))
    assert not hitl.errors and len(person.asked) == 2, person.asked
    assert result.state == "success", result.task_states
    first, second = person.asked
    first_taken, first_try = _evidence_time(first["body"])
    taken, try_number = _evidence_time(second["body"])
    assert second["task_instance"]["try_number"] == try_number == first_try + 1
    assert first_taken < person.cleared_at < taken  # evidence newer than the clear
    assert "old-worker-first" in first["body"]
    assert "old-worker-later" in second["body"] and "old-worker-first" not in second["body"]
    evidence = result.xcom("confirm_writers_stopped", key="evidence")
    assert dt.datetime.fromisoformat(evidence["checked_at"]) == taken
    assert result.xcom("confirm_writers_stopped")["evidence_taken_at"] == evidence["checked_at"]  # re-checked against it


@pytest.fixture
def without_question_per_try():
    """A process that clears without the question-per-try fix (e.g. ``airflow tasks clear``, or an API server with
    ``NEXUS_AIRFLOW_COMPAT_QUESTION_PER_TRY=0``)."""
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    from nexus_airflow import compat

    compat.install_question_per_try()
    event.remove(Session, "before_flush", compat._drop_archived_questions)
    try:
        yield
    finally:
        event.listen(Session, "before_flush", compat._drop_archived_questions)


def test_a_question_airflow_carried_over_from_an_earlier_try_is_never_asked(dag, tenant, without_question_per_try):
    engine, conn_id = tenant
    _tenant(engine)
    person = ClearThenConfirm(engine)
    with HitlAnswerer(DAG_ID, {"confirm_writers_stopped": person}) as hitl:
        result = run_dag(dag, base_conf(conn_id))
    assert not hitl.errors and len(person.asked) == 1  # the second try never parked under the first try's question
    assert result.state == "failed" and result.state_of("confirm_writers_stopped") == "failed"
    report = result.xcom("confirm_writers_stopped", key="report")
    assert report["stale_question"] is True
    assert "Airflow kept the question of an earlier try of confirm_writers_stopped" in report["message"]
    assert "cutover not performed" in report["message"] and "Next: clear check_old_writers" in report["message"]

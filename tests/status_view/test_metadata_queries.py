"""The status view's reads of the Airflow metadata DB: a fixed number of indexed queries, whatever the fleet's size.

A real (SQLite) metadata DB migrated by Airflow, rollout runs written into it
(``seed_runs``, as the rollout DAG would leave them). Every statement the
rollout page and the tenant view's "what now?" send is recorded at the
driver; the count must not grow with the number of tenants (not one query
per tenant), and each must reach ``dag_run`` / ``task_instance`` / ``xcom`` /
``variable`` through an index (SQLite's plan: ``SEARCH ... USING INDEX`` or
the primary key, never a bare ``SCAN`` of those tables).
"""

from __future__ import annotations

import re

import pytest
from sqlalchemy import event

from tests.status_view.seed_runs import seed

TABLES = ("dag_run", "task_instance", "xcom", "variable")


@pytest.fixture(scope="module")
def metadata_db():
    from tests.dags.airflow_harness import migrate_metadata_db

    return migrate_metadata_db()


def _rollout(run_id: str, tenants: list[str]) -> dict:
    from nexus_airflow.rollout import ANSWER_KEY, PLAN_KEY, WAVE_KEY, control_variable, run_id_for

    waves = [{"wave": i, "name": f"wave {i}", "tenants": tenants[i * 5:(i + 1) * 5]} for i in range(len(tenants) // 5)]
    runs = [{"dag_id": "tenant_rollout", "run_id": run_id, "state": "running", "conf": {}, "xcoms": [
        {"task_id": "plan", "key": PLAN_KEY, "value": {"waves": waves, "approval": "per_wave", "approvers": ["a"]}},
        {"task_id": "wave_00.close", "key": WAVE_KEY, "value": {"wave": 0, "state": "succeeded", "succeeded": [],
                                                                "failed": {}, "approval": None}},
        # wave 1's question answered, the wave not closed yet: the page says who approved it and when
        {"task_id": "wave_01.confirm", "key": ANSWER_KEY, "value": {"answer": "approved", "by": "a",
                                                                    "at": "2026-12-07T16:00:00+00:00"}}]}]
    for i, t in enumerate(tenants):
        failed = i % 2 == 0
        runs.append({"dag_id": "connector_projection_cutover", "run_id": run_id_for(run_id, t),
                     "state": "failed" if failed else "running", "conf": {"tenant": t},
                     "tis": [{"task_id": "wait_for_drain", "state": "failed" if failed else "deferred"}],
                     "xcoms": [{"task_id": "wait_for_drain", "key": "report", "value": {"message": f"stuck {t}"}}]
                     if failed else []})
    return {"runs": runs, "variables": {control_variable(run_id): "pause"}}


class Statements:
    """Every statement sent on the metadata DB's engine while active."""

    def __init__(self) -> None:
        from airflow import settings

        self.engine, self.seen = settings.engine, []

    def _record(self, conn, cursor, statement, parameters, context, executemany):
        self.seen.append((statement, parameters))

    def __enter__(self):
        event.listen(self.engine, "before_cursor_execute", self._record)
        return self

    def __exit__(self, *exc):
        event.remove(self.engine, "before_cursor_execute", self._record)

    def selects(self) -> list[tuple[str, object]]:
        return [(s, p) for s, p in self.seen if s.lstrip().upper().startswith("SELECT")]

    def plans(self) -> list[tuple[str, list[str]]]:
        with self.engine.connect() as conn:
            return [(s, [str(r[-1]) for r in conn.exec_driver_sql("EXPLAIN QUERY PLAN " + s, p).all()])
                    for s, p in self.selects()]


def _calls(tenants: list[str]):
    from nexus_status.rollouts import rollouts
    from nexus_status.runs import latest_runs

    with Statements() as pages:
        body = rollouts()
        runs = latest_runs(tenants)
    return pages, body, runs


def test_metadata_reads_are_few_and_indexed(metadata_db):
    small = [f"q{i:03d}" for i in range(10)]
    seed(_rollout("rollout-small", small))
    few, body, runs = _calls(small)
    assert [len(w["tenants"]) for w in body["rollouts"][0]["waves"]] == [5, 5]
    assert [w["approval"] for w in body["rollouts"][0]["waves"]] == [
        None, {"by": "a", "at": "2026-12-07T16:00:00+00:00", "answer": "approved"}]  # read in the same statements
    assert runs["q000"]["runs"]["cutover"]["reason"] == "stuck q000" and body["rollouts"][0]["control"]["state"] == "pause"

    large = [f"w{i:03d}" for i in range(400)]
    seed(_rollout("rollout-large", large))
    many, body, runs = _calls(small + large)
    assert [r["run_id"] for r in body["rollouts"]] == ["rollout-large", "rollout-small"]
    assert sum(len(w["tenants"]) for w in body["rollouts"][0]["waves"]) == 400 and len(runs) == 410
    assert runs["w399"]["runs"]["cutover"]["task_state"] == "deferred"
    # 41 times the tenants, the same statements: none per tenant
    assert len(many.selects()) == len(few.selects()) <= 12, [s for s, _ in many.selects()]
    for statement, plan in many.plans():
        for table in TABLES:
            if re.search(rf"\bFROM {table}\b", statement):
                scans = [line for line in plan if re.fullmatch(rf"SCAN {table}", line)]
                assert not scans, (statement, plan)


def test_listing_filters_by_rollout_and_wave(metadata_db):
    from nexus_status.fleet import listing
    from nexus_status.tenants import StateCache

    seed(_rollout("rollout-filter", [f"f{i:03d}" for i in range(10)]))
    conn_ids = [f"nexus_tenant_f{i:03d}" for i in range(12)] + ["nexus_tenant_q001"]  # f010, f011: in no wave
    cache = StateCache(interval_s=3600.0, workers=2)
    try:
        latest = listing(wave=1, cache=cache, conn_ids=conn_ids)  # no rollout named: the latest rollout run
        assert latest["filters"]["rollout"] == "rollout-filter"
        assert [t["tenant"] for t in latest["tenants"]] == [f"f{i:03d}" for i in range(5, 10)]
        assert latest["counts"] == {"total": 13, "shown": 5, "filtered_out": 8, "other_pages": 0, "matching": 5,
                                    "unreadable": 5}  # no connection behind these ids: shown, counted unreadable
        older = listing(rollout="rollout-small", cache=cache, conn_ids=conn_ids)
        assert [t["tenant"] for t in older["tenants"]] == ["q001"] and older["counts"]["filtered_out"] == 12
        assert listing(rollout="no-such-run", cache=cache, conn_ids=conn_ids)["counts"]["filtered_out"] == 13
    finally:
        cache.close()

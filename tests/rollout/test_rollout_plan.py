"""The rollout's pure rules: waves (canary first), the failure budget, the wave question's table."""

from __future__ import annotations

import re

import pytest

from nexus_airflow.rollout import MAX_WAVES, failure_budget, plan_waves, run_id_for
from nexus_airflow.rollout_render import wave_body


def test_the_canary_count_comes_first_then_waves_of_the_given_size_in_order():
    tenants = [f"t{i:02d}" for i in range(12)]
    waves = plan_waves(tenants, 2, 5)
    assert [w["tenants"] for w in waves] == [tenants[:2], tenants[2:7], tenants[7:]]
    assert [w["name"] for w in waves] == ["canary", "wave 1", "wave 2"]
    assert [w["wave"] for w in waves] == [0, 1, 2]


def test_a_named_canary_keeps_the_rollout_order_and_the_rest_follow():
    waves = plan_waves(["a", "b", "c", "d"], ["d", "b"], 10)
    assert [w["tenants"] for w in waves] == [["b", "d"], ["a", "c"]]


def test_no_canary_starts_with_the_first_wave():
    waves = plan_waves(["a", "b", "c"], 0, 2)
    assert [w["tenants"] for w in waves] == [["a", "b"], ["c"]] and waves[0]["name"] == "wave 0"


@pytest.mark.parametrize("canary, size, message", [
    (["zz"], 5, "canary names tenant(s) not in the rollout: ['zz']"),
    (-1, 5, "canary must be a count >= 0"),
    (1, 0, "wave_size must be at least 1"),
])
def test_bad_wave_forms_name_what_to_fix(canary, size, message):
    with pytest.raises(ValueError, match=re.escape(message)):
        plan_waves(["a", "b"], canary, size)


def test_more_waves_than_the_dag_declares_names_the_smallest_wave_size_that_fits():
    tenants = [f"t{i:03d}" for i in range(200)]
    with pytest.raises(ValueError) as exc:
        plan_waves(tenants, 1, 5)
    needed = int(str(exc.value).rsplit(" ", 1)[-1])
    assert len(plan_waves(tenants, 1, needed)) <= MAX_WAVES
    with pytest.raises(ValueError):
        plan_waves(tenants, 1, needed - 1)


@pytest.mark.parametrize("max_failed, wave, budget", [(0, 5, 0), (2, 5, 2), (0.2, 5, 1), (0.5, 3, 1), (0.99, 10, 9)])
def test_the_failure_budget_is_a_count_or_a_fraction_of_the_wave(max_failed, wave, budget):
    assert failure_budget(max_failed, wave) == budget


def test_a_negative_budget_is_refused():
    with pytest.raises(ValueError, match="max_failed"):
        failure_budget(-1, 5)


def test_tenant_run_ids_are_deterministic_and_url_safe():
    rid = run_id_for("manual__2026-12-01T10:00:00+00:00", "acme")
    assert rid == run_id_for("manual__2026-12-01T10:00:00+00:00", "acme")
    assert rid.startswith("rollout__manual__2026-12-01T10:00:00+00:00__acme") and " " not in run_id_for("a b", "c")


def test_the_wave_question_shows_one_row_per_tenant_with_its_evidence_and_the_ones_not_asked():
    ev = {"checked_at": "2026-12-01T10:00:00", "live": [], "processes": [
        {"process_id": "w1", "heartbeat_age_s": 30.0}, {"process_id": "w2", "heartbeat_age_s": 7200.0}]}
    stopped = {**ev, "writers_stop": {"controller": "command", "ok": True, "seconds": 4.2, "ran": "scale-down acme"}}
    body = wave_body(3, [{"tenant": "acme", "status": "ready", "checked_at": ev["checked_at"], "evidence": ev,
                          "drain": "drained"},
                         {"tenant": "gamma", "status": "ready", "checked_at": ev["checked_at"], "evidence": stopped,
                          "drain": "drained"},
                         {"tenant": "beta", "status": "run failed"}])
    assert "## Wave 3" in body
    assert "| `acme` | 0 / 2 | manual (a person) | 30.0 | drained |" in body
    # the writer-stop controller's answer beside the registry's evidence (issue 50, item 1's answer in a wave)
    assert "| `gamma` | 0 / 2 | command: OK, 4.2 s | 30.0 | drained |" in body
    assert "| `beta` | run failed (not in this question) |" in body


def _dag(module: str):
    import importlib
    import pathlib
    import sys

    dags = str(pathlib.Path(__file__).resolve().parents[2] / "dags")
    sys.path.insert(0, dags)
    try:
        return importlib.import_module(module).dag
    finally:
        sys.path.remove(dags)


def test_max_parallel_never_exceeds_the_tenant_runs_airflow_lets_run_at_once():
    """A per-wave question needs every tenant of the wave running: the rollout's cap is the cutover DAG's
    max_active_runs (more would leave tenants queued while the wave waits for them)."""
    from nexus_airflow.params import MAX_PARALLEL_CAP

    cutover, rollout = _dag("connector_projection_cutover"), _dag("tenant_rollout")
    assert cutover.max_active_runs == MAX_PARALLEL_CAP
    assert rollout.params.get_param("max_parallel").schema["maximum"] == MAX_PARALLEL_CAP


def test_plan_skips_exactly_the_unused_wave_groups_and_summary_waits_for_every_wave():
    """plan names the tasks of the waves past its last one (real task ids: a wrong id would skip nothing), each
    wave's open hangs off plan directly (a refused plan fails every wave at once), and summary waits for every
    wave's close (an unused last wave is skipped at once: summary must not run while wave 0 does)."""
    from nexus_airflow.rollout import close_task, unused_wave_tasks, wave_group

    dag = _dag("tenant_rollout")
    assert unused_wave_tasks(MAX_WAVES) == []
    for planned in (1, 3):
        unused = set(unused_wave_tasks(planned))
        used = {t for t in dag.task_ids if t.startswith("wave_") and int(t[5:7]) < planned}
        assert unused <= set(dag.task_ids)
        assert unused | used == {t for t in dag.task_ids if t.startswith("wave_")} and not unused & used
    assert dag.get_task("summary").upstream_task_ids == {close_task(k) for k in range(MAX_WAVES)}
    for k in range(MAX_WAVES):
        expected = {"plan"} | ({close_task(k - 1)} if k else set())
        assert dag.get_task(f"{wave_group(k)}.open").upstream_task_ids == expected


def test_two_rollout_runs_never_share_a_control_variable():
    """The control's name was the run id's safe characters cut at 200: ``a:b`` and ``a_b``, or two long ids equal in
    their first 200 characters, paused each other (issue 33: an identifier compared after a cut)."""
    from nexus_airflow.rollout import control_variable

    assert control_variable("rollout-b") == "nexus_rollout_control__rollout-b"  # a plain id: the name it always had
    pairs = [("a:b", "a_b"), ("x" * 210 + "1", "x" * 210 + "2"), ("manual__2026-12-04T01:00:00+00:00", "manual__2026-12-04T01_00_00_00_00")]
    for one, other in pairs:
        assert control_variable(one) != control_variable(other), (one, other)
    assert all(len(control_variable(r)) <= 250 for pair in pairs for r in pair)  # an Airflow Variable key's width
    assert control_variable("a:b") == control_variable("a:b")


def test_a_tenants_cutover_run_id_is_its_own_whatever_the_rollout_run_ids_length():
    """``rollout__<id>__<tenant>`` was cut at 250: under a long rollout run id two tenants got one run id."""
    long_id = "scheduled__" + "w" * 239
    assert run_id_for("manual__2026-12-04T01:00:00+00:00", "acme") == "rollout__manual__2026-12-04T01:00:00+00:00__acme"
    ids = {run_id_for(long_id, t) for t in ("tenant-" + "a" * 56 + "1", "tenant-" + "a" * 56 + "2")}
    assert len(ids) == 2 and all(len(i) <= 250 and i.endswith(("1", "2")) for i in ids), ids
    assert run_id_for(long_id, "acme") != run_id_for(long_id[:-1] + "x", "acme")

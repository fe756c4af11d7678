"""The status view's proofs read step results by declared step name, through nexus_airflow.results.

What the page shows from real runs is tests/dags (``latest_proofs`` after a cutover and a Field History run);
here: the steps the proofs name are the declared ones of their DAG, mapped to task ids in one place, and a step
the declaration lacks is an error, never an empty proof.
"""

from __future__ import annotations

import pytest
from nexus_status import proofs

from nexus_airflow import results
from nexus_cutover.field_history.transition import FIELD_HISTORY
from nexus_cutover.projection.transition import CUTOVER


def test_the_proof_steps_are_declared_steps_of_their_dag():
    assert set(proofs.TASKS) == {CUTOVER.name, FIELD_HISTORY.name}
    for dag_id, steps in proofs.TASKS.items():
        assert set(steps) <= set(results.transition_of(dag_id).names), (dag_id, steps)
    assert results.task_ids(proofs.TASKS) == [s for steps in proofs.TASKS.values() for s in steps]


@pytest.mark.parametrize(("step", "dag_id"), [
    ("history_digests", proofs.CUTOVER_DAG),  # a misspelling
    ("stage_3", proofs.CUTOVER_DAG),  # a step of the other DAG
    ("history_digest", proofs.FIELD_HISTORY_DAG),
])
def test_a_step_the_declaration_lacks_is_an_error_not_an_empty_proof(step, dag_id):
    with pytest.raises(KeyError):
        results.stored({}, "run-1", step, dag_id=dag_id)


def test_a_cutover_proof_reads_the_declared_steps_results():
    run = "run-1"
    xcoms = {
        (run, "history_digest", "return_value"): {"hash": "h1", "rows": {"_System_Event": 3}, "chunks": 1},
        (run, "final_old_writer_check", "return_value"): {"history_digest": {"verified": True}},
        ("run-2", "history_digest", "return_value"): {"hash": "other"},
    }
    proof = proofs.cutover_proof(run, xcoms)
    assert proof["verified"] is True and proof["digest"]["hash"] == "h1"
    assert "history digest h1 (Event 3) verified" in proof["text"]
    stopped = {(run, "history_digest", "return_value"): {"hash": "h1", "rows": {}},
               (run, "final_old_writer_check", "report"): {"history": {"summary": "2 rows changed",
                                                                     "differences": [{}, {}]}}}
    proof = proofs.cutover_proof(run, stopped)
    assert proof["verified"] is False and proof["differences"] == 2 and "NOT verified: 2 rows changed" in proof["text"]


def test_a_field_history_proof_falls_back_to_the_stop_report():
    run = "run-1"
    xcoms = {(run, "stage_2_materialize", "return_value"): {"passed": True, "counts": {"decided_rows": 5,
                                                                                       "decided_digest": "d"}},
             (run, "stage_3", "report"): {"comparison": {"equal": False, "chunks": 2, "differences": [{}]}}}
    proof = proofs.field_history_proof(run, xcoms)
    assert proof["stage_2_materialize"] == {"passed": True, "decided_rows": 5, "decided_digest": "d"}
    assert proof["stage_3"]["equal"] is False and proof["stage_3"]["differences"] == 1

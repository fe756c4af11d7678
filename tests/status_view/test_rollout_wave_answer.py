"""The rollouts page's wave (issue 51, item 8, in part): an answered wave says who approved it and when before it
closes; a wave whose question waits says for whom, and so does the rollout's ETA, instead of "unknown"."""

from __future__ import annotations

from nexus_status.rollouts import _rollout

PLAN = {"waves": [{"wave": 0, "name": "canary", "tenants": ["t1"]}, {"wave": 1, "name": "wave 1", "tenants": ["t2"]}],
        "approval": "per_wave", "approvers": ["lead-anna", "lead-bob"]}
RUN = {"run_id": "rollout-x", "state": "running", "start_date": None, "end_date": None, "_pk": 1}


def _xc(answers: dict) -> dict:
    return {"plan": PLAN, "waves": {}, "summary": None, "summary_text": None, "preflight": None, "answers": answers}


def test_a_wave_waiting_for_its_answer_names_its_approvers_in_its_eta_and_the_rollouts():
    out = _rollout(RUN, _xc({}), None, {}, {}, {}, own_tasks=[("wave_00.confirm", "awaiting_input")])
    canary = out["waves"][0]
    assert canary["approval"] is None
    assert canary["eta_text"] == "waiting for lead-anna, lead-bob to answer the wave's question"
    assert out["eta"] == {"eta_min": None, "text": "canary: waiting for lead-anna, lead-bob to answer the wave's question"}


def test_an_answered_wave_says_who_and_when_before_it_closes():
    answer = {"answer": "approved", "by": "lead-anna", "at": "2026-12-07T16:00:00+00:00", "shown": {"t1": {}}}
    out = _rollout(RUN, _xc({0: answer}), None, {}, {}, {}, own_tasks=[("wave_00.lane_0", "running")])
    assert out["waves"][0]["approval"] == {"by": "lead-anna", "at": "2026-12-07T16:00:00+00:00", "answer": "approved"}
    assert out["waves"][1]["approval"] is None  # not asked yet
    assert not out["waves"][0]["eta_text"].startswith("waiting for")
    nothing = _rollout(RUN, _xc({0: {"answer": "nothing to confirm"}}), None, {}, {}, {})
    assert nothing["waves"][0]["approval"] is None

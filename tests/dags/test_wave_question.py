"""When a ``per_wave`` question is asked, and for whom (:mod:`nexus_airflow.rollout_confirm`): no tenant waits for
a wave-mate's backlog or writers (issue 36, item 2).

Pure logic over the task states a look reads (``tenant_standing``, ``question_decision``); the Airflow path, a wave
with a late tenant that asks its own follow-up question, is
``tests/rollout/test_tenant_rollout.py::test_per_wave_asks_the_ready_tenants_and_a_late_one_asks_its_own_follow_up``.
"""

from __future__ import annotations

import pytest

from nexus_airflow.rollout_confirm import (
    ENDED,
    FENCE_TASK,
    LATE,
    ON_ITS_WAY,
    OWN_QUESTION,
    READY,
    past_the_armed_slots,
    question_decision,
    tenant_standing,
    waiting_text,
)

AT_CONFIRMATION = {"wait_for_short_drain": "success", "wait_for_drain": "success", "check_old_writers": "success",
                   "confirm_writers_stopped": "deferred"}  # the triggerer looks at its wave's answer


@pytest.mark.parametrize("steps, evidence, kind", [
    (AT_CONFIRMATION, True, READY),
    ({**AT_CONFIRMATION, "confirm_writers_stopped": "running"}, True, READY),  # its first look, or a look after one
    ({**AT_CONFIRMATION, "confirm_writers_stopped": "up_for_reschedule"}, True, READY),  # a wait begun rescheduling
    (AT_CONFIRMATION, False, ON_ITS_WAY),  # parked there, its evidence not yet published
    ({**AT_CONFIRMATION, "confirm_writers_stopped": "awaiting_input"}, True, OWN_QUESTION),
    ({"wait_for_short_drain": "deferred"}, False, LATE),  # its backlog is not short yet: not fenced, not waited for
    ({"wait_for_short_drain": "up_for_reschedule"}, False, LATE),
    ({"wait_for_short_drain": "success", "check_old_writers": "deferred"}, False, LATE),  # a live writer to stop
    ({"wait_for_short_drain": "running"}, False, ON_ITS_WAY),  # its first look, which may arm at once
    ({}, False, ON_ITS_WAY),  # its first steps
    ({"wait_for_short_drain": "success"}, False, ON_ITS_WAY),  # armed, its drain's first look to come
    ({"wait_for_short_drain": "success", "wait_for_drain": "running"}, False, ON_ITS_WAY),  # its first look
    # fenced, its residual drain deferred: its own pause, not its wave-mates' (bench-stack's fleet: waiting for it
    # held two drained tenants' pauses at 25-47 s against their own ~6 s)
    ({"wait_for_short_drain": "success", "wait_for_drain": "deferred"}, False, LATE),
    ({"wait_for_short_drain": "success", "check_old_writers": "running"}, False, ON_ITS_WAY),
    # waiting for an armed slot (issue 50, item 4): its slot frees when an armed wave-mate's pause ends, after the
    # question; waiting for it, the wave's armed tenants would wait for the question and it for their slots
    ({"wait_for_short_drain": "success", FENCE_TASK: "up_for_reschedule"}, False, LATE),
    ({"wait_for_short_drain": "success", FENCE_TASK: "queued"}, False, ON_ITS_WAY),  # about to look: seconds
])
def test_where_a_tenant_stands_is_read_from_its_waiting_steps(steps, evidence, kind):
    standing = tenant_standing(steps, evidence=evidence)
    assert standing["kind"] == kind
    if kind == LATE:
        assert "asked on its own when it is ready" in standing["status"]


def rows(*kinds: str) -> list[dict]:
    return [{"tenant": f"t{i}", "kind": k} for i, k in enumerate(kinds)]


def test_with_the_armed_slots_filled_by_the_wave_a_tenant_not_yet_armed_is_late_not_waited_for():
    wave = [{"tenant": "t0", "kind": READY, "armed": True}, {"tenant": "t1", "kind": READY, "armed": True},
            {"tenant": "t2", "kind": ON_ITS_WAY, "armed": False},  # its first steps: it cannot arm before t0 or t1 ends
            {"tenant": "t3", "kind": ON_ITS_WAY, "armed": True}]  # armed, on its way: arrives within seconds
    assert question_decision(wave) == "wait"  # no bound: waited for, as before
    assert past_the_armed_slots(wave, 0) == wave
    assert past_the_armed_slots(wave, 4) == wave  # slots left: t2 may arm and come
    bounded = past_the_armed_slots(wave, 3)
    assert [r["kind"] for r in bounded] == [READY, READY, LATE, ON_ITS_WAY]
    assert "waiting for an armed slot" in bounded[2]["status"]
    assert question_decision(bounded) == "wait"  # t3 is still on its way
    assert question_decision(past_the_armed_slots(wave[:3], 2)) == "ask"  # t0, t1 fill 2 slots: asked at once


def test_a_wave_with_one_slow_tenant_asks_the_ready_ones_without_waiting_for_it():
    assert question_decision(rows(READY, READY, LATE)) == "ask"
    assert question_decision(rows(READY, LATE, OWN_QUESTION, ENDED)) == "ask"


def test_a_tenant_on_its_way_is_waited_for_so_one_question_serves_it():
    assert question_decision(rows(READY, READY, ON_ITS_WAY)) == "wait"
    assert question_decision(rows(ON_ITS_WAY, LATE)) == "wait"
    assert "1 tenant(s) on their way to the confirmation: t2" in waiting_text(rows(READY, LATE, ON_ITS_WAY))


def test_with_only_late_tenants_left_the_question_waits_for_the_first_to_be_ready():
    assert question_decision(rows(LATE, LATE, ENDED)) == "wait"
    assert question_decision(rows(READY, LATE, ENDED)) == "ask"


def test_a_wave_whose_tenants_ended_or_ask_their_own_has_nothing_to_ask():
    assert question_decision(rows(ENDED, OWN_QUESTION)) == "nothing"
    assert question_decision(rows()) == "nothing"


@pytest.mark.parametrize("answer, shown, rollout, state", [
    ({"answer": "approved"}, {"t": "x"}, "running", "answered"),
    ({"answer": "rejected"}, None, "failed", "answered"),  # an answer, whatever it is, is the task's to judge
    (None, None, "failed", "rollout_ended"),
    (None, None, "DagRunState.SUCCESS", "rollout_ended"),
    (None, {"other": "x"}, "running", "not_shown"),  # asked without it: it asks its own follow-up
    (None, {"t": "x"}, "running", "waiting"),
    (None, None, "running", "waiting"),  # not asked yet
])
def test_a_tenant_waiting_for_its_waves_answer_resumes_on_one_rule(answer, shown, rollout, state):
    """The confirmation's look and its trigger's (``WaveAnswerPoller``) read the wave by the one rule."""
    from nexus_airflow.rollout import wave_wait_state

    assert wave_wait_state(answer, shown, rollout, "t") == state

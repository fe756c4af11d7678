"""``per_wave``: one writer-stop question for a wave's ready tenants (``tenant_rollout``'s ``confirm`` task).

Invariants:

* No tenant's pause waits for another tenant's backlog or writers. The question
  is asked once no tenant of the wave is *on its way* (between its start and its
  confirmation, in a step that is running or queued: it arrives within seconds)
  and at least one is *ready* (waiting at its confirmation with fresh evidence).
  A tenant that is *late* -- parked in a wait: for its old backlog before it arms
  (``wait_for_short_drain``), for the rest of it once fenced (``wait_for_drain``:
  its own pause, which must not become its wave-mates'), for a person to stop a
  live old writer (``check_old_writers``), or for an armed slot before it arms
  (``arm_fence`` rescheduled, or not yet armed while the wave's own armed tenants
  fill ``[nexus] armed_slots``) -- is not waited for: it is named in the question
  as not in it, and asks its own follow-up question when it is ready (its run's
  ``confirm_writers_stopped``, the same approvers and evidence rules).
* The tenants a question showed (XCom ``shown``, pushed before it is asked) are
  the only ones its answer confirms; each re-checks its own evidence time shown.
* The question is sent once, as it parks, as one message naming its tenants (:mod:`nexus_airflow.rollout_notify`).
* No default: a reject or a timeout fails the tenants the question showed
  (nothing written beyond their fences); the rejection is a decision, not
  counted against ``max_failed``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.providers.standard.operators.hitl import HITLOperator

from nexus_airflow import armed_slots, ledger, results
from nexus_airflow import rollout as ro
from nexus_airflow.declared import ARMED_WINDOWS
from nexus_airflow.rollout_lanes import wave_triggers
from nexus_airflow.rollout_render import wave_body
from nexus_cutover.projection.transition import CUTOVER

#: Where a tenant stands for its wave's question.
READY, ON_ITS_WAY, LATE, ENDED, OWN_QUESTION = "ready", "on its way", "late", "ended", "asked on its own"

#: The waits that can last (a backlog, a person), as declared (each wait's ``late``): step -> what a tenant parked in
#: it is doing. A tenant parked in one is late, not waited for.
LATE_WAITS = {step.name: step.wait.late for step in CUTOVER.waits if step.wait.late}
PARKED = ("deferred", "up_for_reschedule")
#: The step that asks a person to confirm the old writers stopped (declared role ``confirmation``).
CONFIRM_STEP = CUTOVER.with_role("confirmation").name
#: The task of the step that arms the fence: parked there (rescheduled), a tenant waits for an armed slot
#: (:mod:`nexus_airflow.armed_slots`), which frees only when a wave-mate's pause ends, after its answer: late, never
#: waited for (waiting for it, the wave's armed tenants would wait for the question, and it for their slots).
FENCE_TASK = ARMED_WINDOWS[CUTOVER.name][0]
WAITING_FOR_A_SLOT = "waiting for an armed slot before it arms (its admission open)"
LOOKED_AT = (*LATE_WAITS, FENCE_TASK, CONFIRM_STEP)

#: A tenant's ``confirm_writers_stopped`` waiting for its wave's answer, once it has published its evidence: it
#: waits deferred (the triggerer looks at the wave's answer: ``ConfirmWritersStoppedOperator._defer_to_the_wave``),
#: and between its first look and its deferral, or after a look, it is also scheduled, queued or running.
#: (``up_for_reschedule``: a run started before the deferral, when the wait rescheduled itself every poll.)
WAITING_FOR_THE_WAVE = ("deferred", "up_for_reschedule", "scheduled", "queued", "running")


class WaveConfirmOperator(HITLOperator):
    """``per_wave``: one writer-stop question for the wave's ready tenants (see the module invariants)."""

    approve_option = "Confirm: every old writer of every tenant of this wave stopped"
    reject_option = "Reject the wave"

    def __init__(self, *, wave: int, **kwargs) -> None:
        kwargs.setdefault("retries", 0)
        super().__init__(subject=f"Wave {wave}: confirm every old writer of its tenants stopped",
                         options=[self.approve_option, self.reject_option], defaults=None, multiple=False, **kwargs)
        self.wave = wave

    def execute(self, context):
        ti, params = context["ti"], context["params"]
        if params.get("approval") != "per_wave":
            return {"approval": "per_tenant"}
        triggers = wave_triggers(ti, self.wave) or []
        if ro.read_control(context["run_id"]) == "cancel":  # its tenants stop at their own next look
            ti.xcom_push(key=ro.ANSWER_KEY, value={"answer": "cancelled", "by": None, "at": None, "evidence": {}})
            raise ro.fail(f"rollout cancelled: wave {self.wave}'s question is not asked")
        rows = past_the_armed_slots(self._tenant_rows(ti, triggers), armed_slots.bound())
        decision = question_decision(rows)
        if decision == "wait":
            self.log.info("wave %d: waiting for %s", self.wave, waiting_text(rows))
            raise ro.later(ro.wait_s(params))
        ready = [r for r in rows if r["kind"] == READY]
        ti.xcom_push(key=ro.SHOWN_KEY, value={r["tenant"]: r["checked_at"] for r in ready})
        if not ready:  # every tenant ended or asks its own question
            ti.xcom_push(key=ro.ANSWER_KEY, value={"answer": "nothing to confirm", "tenants": []})
            return {"approval": "per_wave", "asked": False}
        if late := [r["tenant"] for r in rows if r["kind"] in (LATE, OWN_QUESTION)]:
            self.log.info("wave %d: asking for %d ready tenant(s); %d late tenant(s) ask their own question when ready: "
                          "%s", self.wave, len(ready), len(late), ", ".join(late))
        plan = ro.plan_of(ti) or {}
        from nexus_airflow.hitl import assigned_users

        excluded = set() if plan.get("allow_self_approval") else {n for n in [plan.get("requested_by")] if n}
        self.assigned_users = assigned_users(plan.get("approvers") or [], excluded)
        self.body = wave_body(self.wave, rows)
        confirm_timeout = int((triggers[0]["conf"].get("confirm_timeout") if triggers else None) or 86400)
        self.response_timeout = dt.timedelta(seconds=confirm_timeout)
        ledger.wave_asked(context, self.wave, ready, self.subject)
        from nexus_airflow.rollout_notify import wave_question

        wave_question(context, self.wave, rows, confirm_timeout)  # once, as it parks: the answer does not come back here
        return super().execute(context)

    @staticmethod
    def _tenant_rows(ti, triggers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each tenant's row of the question (its ``kind`` and ``status``), read together: one read of every
        run's waiting steps' states, one count of the runs that ended (halved to name them when some did), then
        the evidence and the drain of the tenants waiting at their confirmation. A look at a wave still on its
        way to the question costs two calls, not five per tenant."""
        run_ids = [t["trigger_run_id"] for t in triggers]
        states = ti.get_task_states(dag_id=ro.CUTOVER_DAG, task_ids=list(LOOKED_AT), run_ids=run_ids)
        ended = ro.ended_cutover_runs(ti, run_ids)
        rows = []
        for trigger in triggers:
            tenant, rid = trigger["conf"]["tenant"], trigger["trigger_run_id"]
            if rid in ended:
                run_state = ro.state_word(ti.get_dagrun_state(dag_id=ro.CUTOVER_DAG, run_id=rid))
                rows.append({"tenant": tenant, "kind": ENDED, "status": f"run {run_state}"})
                continue
            steps = {step: ro.state_word(state) for step, state in (states.get(rid) or {}).items() if state}
            ev = results.evidence_shown(ti, run_id=rid) if steps.get(CONFIRM_STEP) in WAITING_FOR_THE_WAVE else None
            row = {"tenant": tenant, **tenant_standing(steps, evidence=bool(ev)),
                   "armed": steps.get(FENCE_TASK) == "success"}
            if ev:
                row.update(checked_at=ev["checked_at"], evidence=ev, drain=results.drain(ti, run_id=rid).get("state") or "-")
            rows.append(row)
        return rows

    def execute_complete(self, context, event: dict[str, Any]) -> Any:
        from nexus_airflow.hitl import answered_by, answerer_refusal

        ti = context["ti"]
        plan = ro.plan_of(ti) or {}
        try:
            result = super().execute_complete(context, event)
        except Exception as exc:  # noqa: BLE001 - a timeout or a bad answer is never a confirmation
            timed_out = event.get("error_type") == "timeout" or "timeout" in type(exc).__name__.lower()
            self._answer(ti, "timed out" if timed_out else "no valid answer", None, None)
            raise ro.fail(f"wave {self.wave}: {'no answer in time' if timed_out else 'no valid answer'}: its tenants "
                        "stop before their checkpoints (fences stay armed)") from None
        who, at = answered_by(result.get("responded_by_user")), str(result.get("responded_at"))
        excluded = {n for n in [plan.get("requested_by")] if n}
        refusal = answerer_refusal(who, plan.get("approvers") or [], excluded, bool(plan.get("allow_self_approval")))
        if refusal:
            self._answer(ti, f"refused: {refusal}", who, at)
            raise ro.fail(f"wave {self.wave}: {refusal}; its tenants stop before their checkpoints")
        if list(result["chosen_options"]) != [self.approve_option]:
            self._answer(ti, "rejected", who, at)
            raise ro.fail(f"wave {self.wave} rejected by {who}: its tenants stop before their checkpoints "
                        "(fences stay armed)")
        shown = ro.wave_shown(ti, self.wave) or {}
        answer = self._answer(ti, "approved", who, at, shown)
        self.log.info("wave %d approved by %s for %d tenant(s)", self.wave, who, len(shown))
        return answer

    def _answer(self, ti, answer: str, who: str | None, at: str | None, shown: dict | None = None) -> dict[str, Any]:
        value = {"answer": answer, "by": who, "at": at, "evidence": shown or {}}
        ti.xcom_push(key=ro.ANSWER_KEY, value=value)
        ledger.wave_answered({"ti": ti}, self.wave, value)
        return value


def tenant_standing(steps: dict[str, str], *, evidence: bool) -> dict[str, str]:
    """Where one running tenant stands for the wave's question, from its run's task states (``step -> state``,
    the steps of :data:`LOOKED_AT` that have one): ``kind`` (one of the constants above) and the ``status`` the
    question shows. Parked at its confirmation with evidence: ready; parked there with a question of its own
    (``awaiting_input``): asked on its own; parked in a wait of :data:`LATE_WAITS`: late; else on its way."""
    confirm = steps.get(CONFIRM_STEP)
    if confirm in WAITING_FOR_THE_WAVE and evidence:
        return {"kind": READY, "status": "ready"}
    if confirm == "awaiting_input":
        return {"kind": OWN_QUESTION, "status": "asked on its own (a follow-up question in its run)"}
    late = {**LATE_WAITS, FENCE_TASK: WAITING_FOR_A_SLOT}
    for step, why in late.items():
        if steps.get(step) in PARKED:
            return {"kind": LATE, "status": f"late: {why}; asked on its own when it is ready"}
    return {"kind": ON_ITS_WAY, "status": "on its way to its confirmation"}


def past_the_armed_slots(rows: list[dict[str, Any]], bound: int) -> list[dict[str, Any]]:
    """``rows`` as the armed slots leave them: when the wave's own armed tenants (``armed``) fill ``bound`` (``[nexus]
    armed_slots``; 0: no bound), a tenant of the wave on its way but not armed cannot arm before one of them is
    released, which is after this question's answer: late, not waited for (waiting for it, the armed tenants' pauses
    would wait for its start-up steps)."""
    if bound <= 0 or sum(1 for r in rows if r.get("armed")) < bound:
        return rows
    return [{**r, "kind": LATE, "status": f"late: {WAITING_FOR_A_SLOT}; asked on its own when it is ready"}
            if r["kind"] == ON_ITS_WAY and not r.get("armed") else r for r in rows]


def question_decision(rows: list[dict[str, Any]]) -> str:
    """``ask`` (the ready tenants), ``wait`` or ``nothing`` (no tenant left to ask: each ended or asks its own).

    Wait while a tenant is on its way (it arrives soon, and one question serves it with the others), and while
    only late tenants are left (no tenant is ready, so nobody waits for them, and the first to be ready is asked
    with the wave). Never wait for a late tenant once one is ready."""
    kinds = {r["kind"] for r in rows}
    if ON_ITS_WAY in kinds:
        return "wait"
    if READY in kinds:
        return "ask"
    return "wait" if LATE in kinds else "nothing"


def waiting_text(rows: list[dict[str, Any]]) -> str:
    """What a waiting question waits for, for its log: the tenants on their way, and the late ones not waited for."""
    on_way = [r["tenant"] for r in rows if r["kind"] == ON_ITS_WAY]
    late = [r["tenant"] for r in rows if r["kind"] == LATE]
    parts = [f"{len(on_way)} tenant(s) on their way to the confirmation: {', '.join(on_way)}"] if on_way else []
    if late:
        parts.append(f"{len(late)} late tenant(s), not waited for once one is ready: {', '.join(late)}")
    return "; ".join(parts) or "nothing"

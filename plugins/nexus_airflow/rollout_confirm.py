"""``per_wave``: one writer-stop question for a whole wave (``tenant_rollout``'s ``confirm`` task).

Invariants: asked only when every tenant of the wave is waiting at its
confirmation with fresh evidence (or has ended); the answer records each
tenant's evidence time shown, which that tenant re-checks. No default: a reject
or a timeout fails the wave's tenants (nothing written beyond their fences); the
rejection is a decision, not counted against ``max_failed``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.providers.standard.operators.hitl import HITLOperator

from nexus_airflow import results
from nexus_airflow import rollout as ro
from nexus_airflow.rollout_lanes import wave_triggers
from nexus_airflow.rollout_render import wave_body

#: A tenant's ``confirm_writers_stopped`` waiting for its wave's answer, once it has published its evidence: it
#: reschedules itself every poll, so between two looks it is also scheduled, queued or running. Only
#: ``up_for_reschedule`` counted before, and a wave's tenants were seldom all in it at the same look (a 3-tenant
#: wave waited 7 minutes for its question in a loaded test run).
WAITING_FOR_THE_WAVE = ("up_for_reschedule", "scheduled", "queued", "running")


class WaveConfirmOperator(HITLOperator):
    """``per_wave``: one writer-stop question for the whole wave, asked once every tenant is waiting at it."""

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
        rows = self._tenant_rows(ti, triggers)
        waiting = [r["tenant"] for r in rows if r["status"] == "not ready"]
        if waiting:
            self.log.info("wave %d: waiting for %d tenant(s) to reach the confirmation: %s", self.wave, len(waiting),
                          ", ".join(waiting))
            raise ro.later(ro.wait_s(params))
        ready = [r for r in rows if r["status"] == "ready"]
        if not ready:
            ti.xcom_push(key=ro.ANSWER_KEY, value={"answer": "nothing to confirm", "tenants": []})
            return {"approval": "per_wave", "asked": False}
        ti.xcom_push(key=ro.SHOWN_KEY, value={r["tenant"]: r["checked_at"] for r in ready})
        plan = ro.plan_of(ti) or {}
        from nexus_airflow.hitl import assigned_users

        excluded = set() if plan.get("allow_self_approval") else {n for n in [plan.get("requested_by")] if n}
        self.assigned_users = assigned_users(plan.get("approvers") or [], excluded)
        self.body = wave_body(self.wave, rows)
        confirm_timeout = int((triggers[0]["conf"].get("confirm_timeout") if triggers else None) or 86400)
        self.response_timeout = dt.timedelta(seconds=confirm_timeout)
        return super().execute(context)

    @staticmethod
    def _tenant_rows(ti, triggers: list[dict[str, Any]]) -> list[dict[str, Any]]:
        """Each tenant's row of the question, read together: one read of every run's confirmation state, one
        count of the runs that ended (halved to name them when some did), then the evidence and the drain of
        the tenants waiting at their confirmation. A look at a wave still on its way to the question costs two
        calls, not five per tenant."""
        run_ids = [t["trigger_run_id"] for t in triggers]
        confirm_states = ti.get_task_states(dag_id=ro.CUTOVER_DAG, task_ids=["confirm_writers_stopped"],
                                            run_ids=run_ids)
        ended = ro.ended_cutover_runs(ti, run_ids)
        rows = []
        for trigger in triggers:
            tenant, rid = trigger["conf"]["tenant"], trigger["trigger_run_id"]
            if rid in ended:
                run_state = ro.state_word(ti.get_dagrun_state(dag_id=ro.CUTOVER_DAG, run_id=rid))
                rows.append({"tenant": tenant, "status": f"run {run_state}"})
                continue
            confirm = ro.state_word((confirm_states.get(rid) or {}).get("confirm_writers_stopped"))
            ev = results.evidence_shown(ti, run_id=rid) if confirm in WAITING_FOR_THE_WAVE else None
            if not ev:
                rows.append({"tenant": tenant, "status": "not ready"})
                continue
            drain = results.drain(ti, run_id=rid)
            rows.append({"tenant": tenant, "status": "ready", "checked_at": ev["checked_at"], "evidence": ev,
                         "drain": drain.get("state") or "-"})
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

    @staticmethod
    def _answer(ti, answer: str, who: str | None, at: str | None, shown: dict | None = None) -> dict[str, Any]:
        value = {"answer": answer, "by": who, "at": at, "evidence": shown or {}}
        ti.xcom_push(key=ro.ANSWER_KEY, value=value)
        return value

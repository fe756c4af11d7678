"""Human-in-the-loop steps of the cutover: confirm the old writers stopped; start the host by hand.

Invariants:

* No default answer: a timeout never confirms. A rejection or a timeout fails
  the task (``AirflowFailException``) with "cutover not performed" -- the run
  ends FAILED, never green with skipped tasks -- and the fence stays armed.
* The confirmation body is built at run time from a fresh read of
  ``_System_ProcessRegistry`` (and refuses to ask while an old writer is live).
* Evidence shown to a person is re-checked when the answer comes: a confirmed
  writer-stop is accepted only if the registry, read again then, shows no live
  old writer and none that started or heartbeated since the evidence was taken;
  otherwise the run fails ("cutover not performed"), nothing is confirmed and
  the fence stays armed. The answer's log and XCom say how old the evidence was.
* A question shows the evidence of the try that asks it, with its time and try number: a cleared step asks a
  question of its own (``nexus_airflow.compat``), and refuses to park under an earlier try's question that
  Airflow kept (apache/airflow#72155).
* On a dry run nothing is asked: the step logs what it would ask.
* Who may answer: with ``approvers`` set, only they (HITL ``assigned_users``, and
  checked again on the answer), and the user who triggered the run or its rollout
  is not one of them unless ``allow_self_approval`` is set. A refused answerer
  fails the run like a rejection. Without ``approvers``, anyone the auth manager
  lets answer may. Who answered is in the log and XCom.
* ``approval=per_wave`` (set by ``tenant_rollout``): the run pushes its evidence
  and waits (rescheduled, no worker slot held) for its wave's answer in the
  rollout run; the evidence the wave's question showed for this tenant is then
  re-checked exactly as a per-tenant answer would be. A tenant the wave's
  question was asked without (it was late) asks its own follow-up question, as
  ``per_tenant`` does: the wave's answer never confirms a tenant it did not show.
* A question parked while the run holds the tenant's fence parks until its fenced-tenant alert is due at the
  latest (:mod:`nexus_airflow.fence_watch`): Airflow's timeout sweep resumes it then, it alerts once and parks
  again on the same question (nothing asked again, nothing sent but the alert) for the rest of
  ``confirm_timeout``, which is counted from the first park (XCom ``question_deadline``). A person's answer in
  the meantime is handled as ever.
"""

from __future__ import annotations

import datetime as dt
import os
from typing import Any

from airflow.providers.standard.operators.hitl import HITLOperator

from nexus_airflow import ledger, results
from nexus_airflow.base import domain_errors, params_of, plan, stop, tenant_engine
from nexus_airflow.faults import fault_point
from nexus_airflow.notify import notify_needs_confirmation

NOT_PERFORMED = "cutover not performed"
#: XCom key: when a parked question's ``confirm_timeout`` ends (ISO, aware UTC), fixed when it is first asked.
QUESTION_DEADLINE_KEY = "question_deadline"


def answered_by(user: Any) -> str:
    """A person's name from HITL's ``responded_by_user`` (``{"id": ..., "name": ...}``), never a repr."""
    if isinstance(user, dict):
        return str(user.get("name") or user.get("id") or "someone")
    return str(user or "someone")


def requesters(context) -> set[str]:
    """Who asked for this run: its triggering user and, for a rollout's tenant, the rollout's."""
    p = params_of(context)
    names = {getattr(context.get("dag_run"), "triggering_user_name", None), p.rollout.get("requested_by")}
    return {str(n) for n in names if n}


def assigned_users(approvers: tuple[str, ...] | list[str], excluded: set[str]) -> list[dict[str, str]] | None:
    """HITL ``assigned_users`` for ``approvers`` minus ``excluded`` (None: anyone the auth manager allows)."""
    allowed = [a for a in approvers if a not in excluded]
    return [{"id": a, "name": a} for a in allowed] or None


def answerer_refusal(who: str, approvers, excluded: set[str], allow_self: bool) -> str | None:
    """Why ``who`` may not answer (None: allowed). Without ``approvers`` anyone the auth manager lets answer
    may (a single run's behaviour, e.g. one engineer with one login); with them, only they, and never the
    user who asked for the run unless ``allow_self``."""
    if not approvers:
        return None
    if who in excluded and not allow_self:
        return f"self-approval refused: {who} triggered this run (or its rollout); set allow_self_approval to allow it"
    if approvers and who not in approvers:
        return f"{who} is not an approver ({', '.join(approvers)})"
    return None


def _first_line(exc: BaseException) -> str:
    lines = str(exc).splitlines()
    return lines[0][:200] if lines else type(exc).__name__


def _timeout_text(context) -> str:
    try:
        seconds = params_of(context).confirm_timeout
    except Exception:  # noqa: BLE001 - a message, never a failure of its own
        return "the confirmation timeout"
    if seconds % 3600 == 0:
        return f"{seconds // 3600} h"
    return f"{seconds // 60} min" if seconds % 60 == 0 else f"{seconds} s"


class _StrictHITL(HITLOperator):
    """A HITL step whose only passing answer is ``approve_option``; anything else fails the task."""

    approve_option = ""
    reject_option = ""
    on_reject = ""
    #: What a person does after anything but the approving answer (a rejection, a timeout): retry or back out.
    after_reject = ""
    #: The question's subject, ``{tenant}`` filled in: Required actions lists questions by subject, so each names
    #: its tenant (one engineer answers for many tenants).
    subject_template = ""

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("retries", 0)
        super().__init__(options=[self.approve_option, self.reject_option], defaults=None, multiple=False, **kwargs)

    def _name_the_tenant(self, context) -> None:
        if self.subject_template:
            self.subject = self.subject_template.format(tenant=params_of(context).tenant)

    def _ask(self, context, body: str) -> None:
        p = params_of(context)
        self._name_the_tenant(context)
        self.body = body
        excluded = set() if p.allow_self_approval else requesters(context)
        self.assigned_users = assigned_users(p.approvers, excluded)
        self._refuse_a_carried_over_question(context)
        # Sent once, when the step parks; execute_complete (the answer) does not come back here.
        notify_needs_confirmation(context, f"{self.subject} (answer within {p.confirm_timeout} s)")
        deadline = dt.datetime.now(dt.UTC) + dt.timedelta(seconds=p.confirm_timeout)
        context["ti"].xcom_push(key=QUESTION_DEADLINE_KEY, value=deadline.isoformat())
        self.response_timeout = self._park_for(context, deadline)
        ledger.question_asked(context, self.task_id, self.subject, self.evidence(context, body))
        super().execute(context)

    def _park_for(self, context, deadline: dt.datetime) -> dt.timedelta:
        """How long the question parks: to ``deadline``, or to the run's fenced-tenant alert when that comes first
        (an alert already due is sent now)."""
        from nexus_airflow.fence_watch import look

        wake = look(context, self.task_id, self.log, question=True)
        return max(min(deadline, wake or deadline) - dt.datetime.now(dt.UTC), dt.timedelta(seconds=1))

    def _park_again_at_the_alert(self, context, event: dict[str, Any]) -> None:
        """A timeout before the question's own deadline is the fenced-tenant alert's wake-up: alert, park again."""
        ti = context.get("ti")
        if event.get("error_type") != "timeout" or ti is None:
            return
        raw = ti.xcom_pull(task_ids=self.task_id, key=QUESTION_DEADLINE_KEY)
        deadline = dt.datetime.fromisoformat(raw) if isinstance(raw, str) else None
        if deadline is None or deadline - dt.datetime.now(dt.UTC) < dt.timedelta(seconds=1):
            return  # the question's own timeout: handled as ever
        from airflow.sdk.exceptions import TaskAwaitingInput

        rest = self._park_for(context, deadline)
        self.log.info("still waiting for an answer to %r; parked again for %s", self.subject, rest)
        raise TaskAwaitingInput(method_name="execute_complete", timeout=rest)

    def evidence(self, context, body: str | None = None) -> Any:
        """What the question shows, whose digest the delivery ledger keeps with the question and its answer: its
        body here (None at the answer); a question with evidence of its own returns that."""
        return body

    def _answered(self, context, outcome: str, who: str | None = None, at: Any = None, reason: str | None = None,
                  **detail: Any) -> None:
        """The answer, in the delivery ledger, with the digest of the evidence it answers."""
        ledger.question_answered(context, self.task_id, outcome, who=who, at=at, shown=self.evidence(context),
                                 reason=reason, **detail)

    def _refuse_a_carried_over_question(self, context) -> None:
        """Stop rather than park under a question this try did not write (an earlier try's, kept by Airflow when
        a process without :mod:`nexus_airflow.compat` cleared the task): its evidence would be that try's."""
        from nexus_airflow.compat import stored_question

        subject, body = stored_question(self, context["ti"].id)
        if (subject, body) != (self.subject, self.body):
            stop(context, self.log, f"{NOT_PERFORMED}: Airflow kept the question of an earlier try of {self.task_id} "
                 "(apache/airflow#72155: the task was cleared by a process without the nexus plugins, e.g. the "
                 "airflow tasks clear command), so it would show that try's evidence, not this one's; nothing was "
                 f"asked. {self.on_reject}", {"stale_question": True},
                 next_action="clear check_old_writers from the Airflow UI, or trigger a new run for the tenant")

    def execute_complete(self, context, event: dict[str, Any]) -> Any:
        self._name_the_tenant(context)
        self._park_again_at_the_alert(context, event)
        try:
            result = super().execute_complete(context, event)
        except Exception as exc:  # noqa: BLE001 - timeout or bad answer: never a pass
            timed_out = event.get("error_type") == "timeout" or "timeout" in type(exc).__name__.lower()
            reason = f"no answer within {_timeout_text(context)}" if timed_out else f"no valid answer ({_first_line(exc)})"
            message = f"{NOT_PERFORMED}: {reason}. {self.state_now(context)}"
            self._answered(context, "timed out" if timed_out else "no valid answer", reason=reason)
            stop(context, self.log, message, {"message": message, "answered": False}, next_action=self.after_reject)
        chosen = list(result["chosen_options"])
        who = answered_by(result.get("responded_by_user"))
        p = params_of(context)
        refusal = answerer_refusal(who, p.approvers, requesters(context), p.allow_self_approval)
        if refusal:
            message = f"{NOT_PERFORMED}: {refusal}. {self.state_now(context)}"
            self._answered(context, "refused", who, result.get("responded_at"), refusal, chosen_options=chosen)
            stop(context, self.log, message, {"message": message, "answered_by": who, "refused": True})
        if chosen != [self.approve_option]:
            choice = " / ".join(chosen) or "nothing"
            verb = "rejected" if chosen == [self.reject_option] else f"chose {choice!r} for"
            message = f"{NOT_PERFORMED}: {who} {verb} \"{self.subject}\". {self.state_now(context)}"
            self._answered(context, "rejected", who, result.get("responded_at"), chosen_options=chosen)
            stop(context, self.log, message, {"message": message, "answered_by": who, "chosen_options": chosen},
                 next_action=self.after_reject)
        self.log.info("confirmed by %s", who)
        self._answered(context, "confirmed", who, result.get("responded_at"), chosen_options=chosen)
        answer = {"chosen_options": chosen, "responded_by": who, "responded_at": str(result.get("responded_at"))}
        return self.recheck(context, answer)

    def state_now(self, context) -> str:
        """What is true of the tenant now, for a stop message (the static ``on_reject`` when it cannot be read)."""
        return self.on_reject

    def recheck(self, context, answer: dict[str, Any]) -> dict[str, Any]:
        """Re-verify, when the answer arrives, what the question showed; the default trusts nothing shown."""
        return answer


class ConfirmWritersStoppedOperator(_StrictHITL):
    """Ask the engineer to confirm every old writer, materializer and worker is stopped (fence kept)."""

    approve_option = "Confirm: all old writers stopped"
    reject_option = "Reject"
    on_reject = "The fence stays armed; no checkpoint was written."
    after_reject = (
        "to try again, stop every old writer and clear check_old_writers in this run (it gathers fresh evidence "
        "and asks again), or trigger a new run for the tenant (it adopts the fence this failed run left). To back "
        "out instead: trigger connector_projection_back_out for the tenant (it releases the fence without a cutover, "
        "then restart the old writers; runbook, \"Rollback stance\"); admission stays paused until one of the two "
        "happens")

    def state_now(self, context) -> str:
        """The tenant's fence and checkpoints as the database shows them when the run stops."""
        try:
            from nexus_cutover.projection import steps

            p = params_of(context)
            packs = results.packs(context["ti"])
            with tenant_engine(p.conn_id, self.log) as engine:
                fence, done = steps.fence_and_checkpoints(engine, p.tenant, packs)
        except Exception as exc:  # noqa: BLE001 - the stop message must not fail on a state read
            self.log.warning("could not read the tenant's state for the message: %s", _first_line(exc))
            return self.on_reject
        checkpoints = f"{len(done)} of {len(packs)} pack(s) checkpointed"
        if fence is None:
            if packs and len(done) == len(packs):
                return f"This run wrote nothing; the tenant is already cut over ({checkpoints}, no cutover fence in force)."
            return f"This run wrote nothing; no cutover fence is in force; {checkpoints}."
        return (f"This run wrote no checkpoint. Now: cutover fence {fence['FenceId']} in force (held by "
                f"{fence['ArmedBy']}); {checkpoints}.")

    subject_template = "Confirm that every old-protocol writer of tenant {tenant} is stopped"

    def evidence(self, context, body: str | None = None) -> Any:
        """The registry evidence the question shows (XCom ``evidence``, pushed before it is asked); None without a
        task instance (a bare call: nothing to read it from)."""
        ti = context.get("ti")
        return results.evidence_shown(ti) if ti is not None else None

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("subject", "Confirm that every old-protocol writer of the tenant is stopped")
        super().__init__(**kwargs)

    def execute(self, context) -> Any:
        from nexus_airflow.rollout import stop_if_cancelled
        from nexus_cutover.projection import steps

        stop_if_cancelled(context, self.log, "the writer-stop confirmation")
        p = params_of(context)
        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            ev = steps.writer_evidence(engine, p.tenant, stale_heartbeat=dt.timedelta(seconds=p.stale_heartbeat))
        shown = steps.shown_with_the_controller(ev.as_json(), results.writers_stop(context["ti"]))  # + its answer
        context["ti"].xcom_push(key=results.EVIDENCE_KEY, value=shown)
        armed = results.fence(context["ti"])
        if armed is not None and armed.not_needed:
            self.log.info("nothing to confirm: every pack of %s is already checkpointed and no cutover fence is in force "
                          "(arm_fence found nothing to do); evidence:\n%s", p.tenant, ev.as_text())
            return {"outcome": "nothing_to_confirm", "evidence": ev.as_json()}
        if p.dry_run:
            plan(self.log, [])
            self.log.info("dry run: would ask to confirm; evidence:\n%s", ev.as_text())
            return {"dry_run": True, "evidence": ev.as_json()}
        if not ev.all_stopped_or_silent:
            stop(context, self.log, f"{NOT_PERFORMED}: old writers are live again: "
                 + ", ".join(x["process_id"] for x in ev.live) + ". Stop them, then clear check_old_writers.",
                 ev.as_json())
        fault_point("confirm_writers_stopped.before_ask")
        if p.approval == "per_wave":
            return self._await_wave(context, ev)
        self._ask(context, self._question(context, ev))

    def _question(self, context, ev, follow_up: str = "") -> str:
        """The tenant's own question (its words are the step's: :func:`~nexus_cutover.projection.steps.
        writers_question`), with this try's number and the writer-stop controller's answer."""
        from nexus_cutover.projection import steps

        stopped = steps.shown_with_the_controller({}, results.writers_stop(context["ti"])).get("writers_stop")
        return steps.writers_question(params_of(context).tenant, ev, context["ti"].try_number, stopped, follow_up)

    def _await_wave(self, context, ev) -> dict[str, Any]:
        """Wait for the wave's answer in the rollout run (rescheduled each poll), then re-check this tenant; a tenant
        the wave's question did not show (it was late) asks its own question instead."""
        from nexus_airflow import rollout as ro

        p = params_of(context)
        run_id, wave = p.rollout["run_id"], int(p.rollout["wave"])
        if context["run_id"] != ro.run_id_for(run_id, p.tenant):  # a wave answers only the rollout's own runs
            stop(context, self.log, f"{NOT_PERFORMED}: approval per_wave names rollout run {run_id}, which did not "
                 f"start this run; trigger one tenant with approval per_tenant. {self.on_reject}",
                 {"rollout": run_id, "run_id": context["run_id"]})
        ti = context["ti"]
        shown = ro.wave_shown(ti, wave, rollout_run_id=run_id)
        if shown is not None and p.tenant not in shown:  # late for the wave's question: asked on its own, as per_tenant
            self.log.info("wave %d's question was asked without this tenant (not ready then): asking its own "
                          "follow-up question", wave)
            self._ask(context, self._question(context, ev, follow_up=(
                f"Follow-up to wave {wave}'s question of rollout `{run_id}`: this tenant was not ready when the "
                "wave's question was asked, so it is asked on its own; the wave's answer does not confirm it.\n\n")))
            return None
        answer = ro.wave_answer(ti, wave, rollout_run_id=run_id)
        if not answer:
            state = ro.state_word(ti.get_dagrun_state(dag_id=ro.ROLLOUT_DAG, run_id=run_id))
            if ro.wave_wait_state(answer, shown, state, p.tenant) == "rollout_ended":
                stop(context, self.log, f"{NOT_PERFORMED}: rollout run {run_id} ended ({state}) without answering "
                     f"wave {wave}'s writer-stop question. {self.on_reject}")
            self.log.info("evidence published (taken %sZ); waiting for the answer to wave %d of rollout %s",
                          ev.checked_at.isoformat(), wave, run_id)
            self._defer_to_the_wave(context, run_id, wave)
        who = str(answer.get("by") or "someone")
        wave_answer = {"who": who, "at": answer.get("at"), "wave": wave, "rollout": run_id,
                       "evidence_checked_at": (answer.get("evidence") or {}).get(p.tenant)}
        if answer.get("answer") != "approved":
            ledger.question_answered(context, self.task_id, f"wave {answer.get('answer')}", **wave_answer)
            stop(context, self.log, f"{NOT_PERFORMED}: wave {wave} of rollout {run_id}: {answer.get('answer')} "
                 f"({who}). {self.state_now(context)}", {"wave_answer": answer})
        refusal = answerer_refusal(who, p.approvers, requesters(context), p.allow_self_approval)
        shown_at = (answer.get("evidence") or {}).get(p.tenant)
        if refusal or not shown_at:
            ledger.question_answered(context, self.task_id, "refused", reason=refusal or "its evidence was not in the "
                                     "wave's question", **wave_answer)
            stop(context, self.log, f"{NOT_PERFORMED}: wave {wave} answer not accepted for this tenant: "
                 f"{refusal or 'its evidence was not in the question'}. {self.state_now(context)}", {"wave_answer": answer})
        self.log.info("wave %d confirmed by %s", wave, who)
        ledger.question_answered(context, self.task_id, "confirmed", **wave_answer)
        return self.recheck(context, {"chosen_options": [self.approve_option], "responded_by": who,
                                      "responded_at": answer.get("at"), "wave": wave}, shown_at=shown_at)

    #: Seconds between the triggerer's looks at the wave's answer (one XCom read each; a wave has at most 16
    #: tenants waiting): an answer reaches every tenant of the wave within about this long.
    WAVE_LOOK_S = 2.0

    def _defer_to_the_wave(self, context, rollout_run_id: str, wave: int) -> None:
        """Wait for the wave's answer in the triggerer, holding no worker slot, and look again here
        (:meth:`wave_looked`) once it is answered, the rollout ended or the question was asked without this tenant.
        Before issue 36 this task rescheduled itself every ``poll_interval``: a wide wave's tenants took the task
        slots in turns and each saw the answer up to a poll late (docs/performance.md)."""
        from nexus_airflow.fence_watch import look
        from nexus_airflow.pollers import deadline_in
        from nexus_airflow.triggers import StatusPollTrigger

        p = params_of(context)
        kwargs = {"rollout_run_id": rollout_run_id, "wave": wave, "tenant": p.tenant,
                  "deadline": deadline_in(2 * p.confirm_timeout + 3600)}
        wake = look(context, self.task_id, self.log)  # fenced while it waits for the wave: alert once when due
        self.defer(trigger=StatusPollTrigger("nexus_airflow.pollers.WaveAnswerPoller", kwargs, self.WAVE_LOOK_S,
                                             wake_at=wake.isoformat() if wake else None),
                   method_name="wave_looked")

    def wave_looked(self, context, event: dict[str, Any] | None = None) -> Any:
        """The triggerer saw the wave's wait end (or fail), or woke it for the fenced-tenant alert: the whole step
        again, as a reschedule ran it -- the cancel check, the evidence, the alert's look, then the wave's answer,
        which decides here."""
        if isinstance(event, dict) and event.get("state") == "error":
            self.log.warning("looking for the wave's answer failed in the triggerer (%s); looking here",
                             event.get("message"))
        return self.execute(context)

    def recheck(self, context, answer: dict[str, Any], shown_at: str | None = None) -> dict[str, Any]:
        """The answer confirms the evidence only if the registry, read now, still agrees with it."""
        from nexus_airflow.rollout import stop_if_cancelled
        from nexus_cutover.projection import steps

        stop_if_cancelled(context, self.log, "the writer-stop confirmation (answered after the cancel)")
        p = params_of(context)
        shown = results.evidence_shown(context["ti"]) or {}
        if shown_at:  # the wave's question showed the evidence of an earlier poll: that is what was confirmed
            shown = {"checked_at": shown_at}
        if not shown.get("checked_at"):
            stop(context, self.log, f"{NOT_PERFORMED}: the evidence shown with the question is missing from XCom; "
                 "clear check_old_writers to gather it again.")
        from nexus_airflow.operators import cutover_run

        with domain_errors(context, self.log), tenant_engine(p.conn_id, self.log) as engine:
            answer_check = steps.accept_confirmation(cutover_run(context, self.log, engine),
                                                     dt.datetime.fromisoformat(shown["checked_at"]))
        check, recheck = answer_check.domain, answer_check.value
        context["ti"].xcom_push(key=results.RECHECK_KEY, value=recheck)
        if not answer_check.verdict.proceeds:
            stop(context, self.log,
                 f"{NOT_PERFORMED}: {answer['responded_by']} confirmed evidence taken {check.evidence_age_s:g} s earlier, "
                 f"but old writer(s) {', '.join(check.came_back)} are live or heartbeated since it was taken. Nothing was "
                 "confirmed; the fence stays armed. Stop them, then clear check_old_writers.", recheck)
        self.log.info("re-checked at the answer: evidence taken %s s earlier still holds (no old writer live or active "
                      "since)", check.evidence_age_s)
        return {**answer, "evidence_taken_at": shown["checked_at"], "evidence_age_s": check.evidence_age_s}


def _host_command_line(tenant: str, masked_dsn: str) -> str:
    """The shell line that starts the reference host for ``tenant`` (``nexus-host --namespace <tenant>``, or the
    deployment's ``nexus_host_command``), its DSN shown masked: what a person runs for a manual start."""
    import shlex

    from nexus_airflow.host_controllers import host_argv

    argv = [os.path.basename(argv0) if i == 0 else argv0 for i, argv0 in enumerate(host_argv(tenant))]
    return f"NEXUS_TENANT_DSN={shlex.quote(masked_dsn)} " + " ".join(shlex.quote(a) for a in argv)


class StartNewHostOperator(_StrictHITL):
    """Start the matching new host: ``manual`` asks the engineer, ``command``/``http`` start it themselves."""

    approve_option = "Host started"
    reject_option = "Abort"
    on_reject = "The fence stays armed; the checkpoints are kept."
    after_reject = (
        "start the new host, then clear start_new_host. Do not restart the old writers: the checkpoints are "
        "written, and anything an old writer admits now lands above the cutoff where no audit reads it. To pause "
        "here, keep the fence armed and come back with a rerun (runbook, \"Rollback stance\")")

    subject_template = "Start the new (ProjectionProtocol 1) host for tenant {tenant}"

    def __init__(self, **kwargs) -> None:
        kwargs.setdefault("subject", "Start the new (ProjectionProtocol 1) host for the tenant")
        super().__init__(**kwargs)

    def execute(self, context) -> Any:
        """The step's body (:func:`nexus_cutover.projection.steps.start_new_host`), the host started by
        ``host_controller``: ``command`` or ``http`` here, ``manual`` by a person asked here."""
        from nexus_airflow.operators import run_body

        def by_controller(run) -> None:
            run.start_host = lambda run, _live: self._start(context, run)

        return run_body(self, context, self.task_id, prepare=by_controller)

    def _start(self, context, run) -> dict[str, Any]:
        from nexus_airflow import host_controllers
        from nexus_airflow.hooks import NexusTenantHook
        from nexus_cutover.projection import steps

        p = params_of(context)
        if p.host_controller == "command":
            return host_controllers.start_command(
                p.tenant, NexusTenantHook(p.conn_id).dsn_for_child_process(), self.log,
                ready=lambda: steps.readiness(run.engine, p.tenant, stale_heartbeat=run.stale).ready)
        if p.host_controller == "http":
            return host_controllers.start_http(p.tenant, p.host_http_conn_id, self._packs(context),
                                               context["run_id"], self.log)
        self._ask(context, steps.host_question(
            p.tenant, self._packs(context), _host_command_line(p.tenant, NexusTenantHook(p.conn_id).masked_dsn),
            approve=self.approve_option, command_variable=host_controllers.HOST_COMMAND_VARIABLE))
        raise AssertionError("unreachable: asking a person defers the task")

    @staticmethod
    def _packs(context) -> list[str]:
        return results.packs(context["ti"])

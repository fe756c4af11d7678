"""The tasks of ``tenant_rollout``: plan, each wave's open / cutover / confirm / close, and the summary.

Invariants (the vocabulary is :mod:`nexus_airflow.rollout`):

* The plan refuses bad input before any tenant starts (the rollout fails with the
  reason in its summary): malformed, duplicated or no tenants, an unknown shared
  field, a shared value the per-tenant form would refuse (named with the schema's
  reason), more waves than the DAG declares, ``per_wave`` with a wave larger than
  ``max_parallel`` (its tenants must all wait at the question at once).
* Idempotent by tenant: a tenant already cut over is skipped; one whose earlier
  run failed (it left its fence, or this rollout run's own earlier run failed) is
  retried only with ``retry_failed``.
* A wave starts only after the previous wave's ``close`` passed: within
  ``max_failed``, its succeeded tenants' runs ended with their Asset event.
  Past the budget the rollout halts; later waves' tenants are never started.
* At most ``max_parallel`` tenants of a wave run at once: the wave runs in that
  many lanes, each starting its tenants one after another (deferred while one
  runs), so the bound holds by construction and nothing polls for a slot.
* Pause holds tenants not yet started (rescheduled, no slot held); cancel stops
  them and makes running tenants stop at their next safe point, before their
  checkpoints (fences stay armed and are reported).
* ``per_wave``: one question per wave, asked only when every tenant of the wave
  is waiting at its confirmation with fresh evidence (or has ended); the answer
  records each tenant's evidence time shown, which that tenant re-checks. No
  default: a reject or a timeout fails the wave's tenants (nothing written beyond
  their fences); the rejection is a decision, not counted against ``max_failed``.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from airflow.providers.standard.operators.hitl import HITLOperator
from airflow.sdk import BaseOperator

from nexus_airflow import rollout as ro
from nexus_airflow.params import ROLLOUT_FIELDS, SHARED_FIELDS, resolve

#: How often a waiting wave task looks again (s): the shared ``poll_interval`` when the rollout sets one.
WAIT_S = 30


def _state_word(state: Any) -> str:
    return str(getattr(state, "value", state)).rsplit(".", 1)[-1].lower()


def _wait_s(params: dict[str, Any]) -> int:
    return int((params.get("cutover_conf") or {}).get("poll_interval") or WAIT_S)


def _later(seconds: int):
    from airflow.sdk.exceptions import AirflowRescheduleException

    return AirflowRescheduleException(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds))  # Airflow: aware


def _fail(message: str):
    """The rollout stops here: the reason as the log's last lines, no retry, no traceback."""
    import logging

    from nexus_airflow.base import stopped

    return stopped(logging.getLogger("nexus.rollout"), message)


# --- plan -------------------------------------------------------------------------------------------------------

def _tenants(params: dict[str, Any]) -> list[str]:
    tenants = list(params.get("tenants") or [])
    if params.get("tenants_variable"):
        from airflow.sdk import Variable
        from airflow.sdk.exceptions import AirflowRuntimeError

        try:
            extra = Variable.get(params["tenants_variable"], deserialize_json=True)
        except (KeyError, ValueError, AirflowRuntimeError) as exc:  # missing, or not JSON: name the Variable
            raise ValueError(f"tenants_variable: Variable {params['tenants_variable']!r} is missing or not JSON "
                             f"({type(exc).__name__})") from None
        if not isinstance(extra, list) or not all(isinstance(t, str) for t in extra):
            raise ValueError(f"Variable {params['tenants_variable']} must hold a JSON list of tenant names")
        tenants += extra
    return tenants


def _shared_conf(params: dict[str, Any]) -> dict[str, Any]:
    """The shared per-tenant fields, each validated by the per-tenant form's own schema (the API's reason)."""
    from nexus_airflow.params import CUTOVER_FIELDS

    given = dict(params.get("cutover_conf") or {})
    unknown = sorted(set(given) - set(SHARED_FIELDS))
    if unknown:
        raise ValueError(f"cutover_conf: unknown or per-tenant fields {unknown}; allowed {', '.join(SHARED_FIELDS)}")
    for name, value in given.items():
        try:
            CUTOVER_FIELDS[name].param().resolve(value)
        except Exception as exc:  # noqa: BLE001 - ParamValidationError: its text is the schema's reason
            raise ValueError(f"cutover_conf.{name}={value!r} is refused by the per-tenant form: "
                             f"{str(exc).splitlines()[0][:300]}") from None
    return given


def _standing(tenant: str, log) -> dict[str, Any] | None:
    """The tenant's cutover standing, or None when its database cannot be read (its run will say why)."""
    from nexus_airflow.base import tenant_engine
    from nexus_airflow.params import conn_id_for
    from nexus_cutover.projection import steps

    try:
        with tenant_engine(conn_id_for(tenant), log) as engine:
            return steps.cutover_standing(engine, tenant)
    except Exception as exc:  # noqa: BLE001 - unreadable here; the tenant's own run reports it
        log.warning("tenant %s: standing not readable (%s); it runs and its run reports why",
                    tenant, str(exc).splitlines()[0][:200] if str(exc) else type(exc).__name__)
        return None


def _earlier_failure(ti, tenant: str, own_run_id: str, standing: dict[str, Any] | None) -> tuple[str | None, bool]:
    """(why the tenant failed before, whether this rollout run's own earlier run of it exists)."""
    exists = ti.get_dr_count(dag_id=ro.CUTOVER_DAG, run_ids=[own_run_id]) > 0
    if exists:
        state = _state_word(ti.get_dagrun_state(dag_id=ro.CUTOVER_DAG, run_id=own_run_id))
        if state == "success":
            return "succeeded", True
        if state == "failed":
            return f"failed in run {own_run_id}", True
        return f"still {state} in run {own_run_id}", True
    holder = (standing or {}).get("fence_held_by") or ""
    if not isinstance(holder, str):  # several cutover fences: their own runs say so (a refusal naming each)
        holder = ""
    prefix, _, rest = holder.partition(":")
    dag_id, _, run_id = rest.partition(":")
    if prefix == "airflow" and dag_id == ro.CUTOVER_DAG and run_id:
        try:
            state = _state_word(ti.get_dagrun_state(dag_id=dag_id, run_id=run_id))
        except Exception:  # noqa: BLE001 - the holder run is gone: treat as an earlier failure
            state = "failed"
        if state == "failed":
            return f"failed in run {run_id} (its fence is still armed)", False
    return None, False


def build_plan(params: dict[str, Any], run_id: str, requested_by: str | None, ti, log) -> dict[str, Any]:
    """The rollout's plan (XCom ``rollout``); raises ValueError naming what to fix."""
    import re

    from nexus_airflow.params import TENANT_PATTERN

    params = resolve(ROLLOUT_FIELDS, params)  # a field left empty on the form is its default
    tenants = _tenants(params)
    bad = [t for t in tenants if not re.match(TENANT_PATTERN, t)]
    dupes = sorted({t for t in tenants if tenants.count(t) > 1})
    if bad or dupes or not tenants:
        raise ValueError(f"tenants: malformed {bad}, duplicated {dupes}, or empty list")
    shared = _shared_conf(params)
    approval, max_parallel = params["approval"], params["max_parallel"]
    ro.failure_budget(params["max_failed"], 1)  # refuses a negative budget up front
    runnable, skipped, reset = [], {}, set()
    for tenant in tenants:
        own = ro.run_id_for(run_id, tenant)
        standing = _standing(tenant, log)
        if standing and standing.get("old_work_above_cutoff"):  # no run can pass it: a reviewed recovery decision
            skipped[tenant] = "stop: " + "; ".join(a["text"] for a in standing["old_work_above_cutoff"])
            continue
        if standing and standing["cut_over"]:
            skipped[tenant] = f"already cut over ({standing['checkpointed']} pack(s) checkpointed, admission resumed)"
            continue
        before, exists = _earlier_failure(ti, tenant, own, standing)
        if before == "succeeded" or (before and before.startswith("still")):
            skipped[tenant] = f"{before} (this rollout run)"
            continue
        if before and not params["retry_failed"]:
            skipped[tenant] = f"{before}; not retried (set retry_failed to retry it)"
            continue
        if exists:
            reset.add(tenant)  # the rerun of this rollout run's own failed run: cleared and run again
        runnable.append(tenant)
    canary = params["canary"]
    waves = ro.plan_waves(runnable, canary if isinstance(canary, int) else list(canary), params["wave_size"])
    widest = max((len(w["tenants"]) for w in waves), default=0)
    if approval == "per_wave" and widest > max_parallel:
        raise ValueError(f"approval per_wave needs every tenant of a wave waiting at once: the widest wave has "
                         f"{widest} tenants but max_parallel is {max_parallel}; lower wave_size or raise max_parallel")
    triggers = {t: _trigger(t, w["wave"], run_id, shared, params, requested_by, t in reset)
                for w in waves for t in w["tenants"]}
    return {"waves": waves, "approval": approval, "approvers": list(params["approvers"]),
            "allow_self_approval": params["allow_self_approval"], "max_failed": params["max_failed"],
            "max_parallel": max_parallel, "requested_by": requested_by, "skipped": skipped, "triggers": triggers}


def _trigger(tenant: str, wave: int, run_id: str, shared: dict[str, Any], params: dict[str, Any],
             requested_by: str | None, reset: bool) -> dict[str, Any]:
    conf = {"tenant": tenant, **shared, "approval": params["approval"], "approvers": list(params["approvers"]),
            "allow_self_approval": params["allow_self_approval"],
            "rollout": {"run_id": run_id, "wave": wave, "requested_by": requested_by}}
    return {"conf": conf, "trigger_run_id": ro.run_id_for(run_id, tenant), "reset_dag_run": reset}


# --- waves ------------------------------------------------------------------------------------------------------

def open_wave(wave: int, run_id: str, params: dict[str, Any], ti, log) -> list[dict[str, Any]]:
    """The wave's lanes (``max_parallel`` of them at most, tenant ``i`` in lane ``i % lanes``); skipped past the
    last wave, held while paused, failed when cancelled."""
    from airflow.sdk.exceptions import AirflowSkipException

    plan = ti.xcom_pull(task_ids="plan", key=ro.PLAN_KEY) or {}
    waves = plan.get("waves") or []
    if wave >= len(waves):
        raise AirflowSkipException(f"the rollout has {len(waves)} wave(s)")
    control = ro.read_control(run_id)
    if control == "pause":
        log.info("rollout paused (Variable %s): wave %d waits to start", ro.control_variable(run_id), wave)
        raise _later(_wait_s(params))
    if control == "cancel":
        raise _fail(f"rollout cancelled before wave {wave} started: its tenants were not started")
    tenants = waves[wave]["tenants"]
    lanes = max(1, min(int(plan.get("max_parallel") or 1), len(tenants)))
    log.info("wave %d (%s): %d tenant(s) in %d lane(s): %s", wave, waves[wave]["name"], len(tenants), lanes,
             ", ".join(tenants))
    return [{"lane": j, "triggers": [plan["triggers"][t] for t in tenants[j::lanes]]} for j in range(lanes)]


def wave_triggers(ti, wave: int) -> list[dict[str, Any]] | None:
    """Every tenant trigger of the wave's lanes, in the wave's order (None: the wave did not open)."""
    lanes = ti.xcom_pull(task_ids=f"{ro.wave_group(wave)}.open")
    if lanes is None:
        return None
    by_lane = [lane["triggers"] for lane in lanes]
    rounds = max((len(x) for x in by_lane), default=0)
    return [x[i] for i in range(rounds) for x in by_lane if i < len(x)]  # tenant k*lanes+j is lane j's k-th


class WaveLaneOperator(BaseOperator):
    """One lane of a wave: its tenants' cutover runs one after another, each triggered and then waited for
    deferred (no worker slot held while a tenant runs). ``max_parallel`` lanes bound the wave's parallelism by
    construction: nothing waits for a slot.

    Idempotent: a tenant whose run already ended is not started again (a cleared lane resumes where it was);
    one still running is waited for. Pause holds the lane before its next tenant (deferred); cancel starts no
    further tenant. The lane fails at its end if any of its tenants did not succeed (``close`` reports why).
    """

    def __init__(self, *, lane: int, triggers: list[dict[str, Any]], poke_interval: int = 30, **kwargs) -> None:
        super().__init__(**kwargs)
        self.lane = lane
        self.triggers = triggers
        self.poke_interval = poke_interval

    def execute(self, context):
        return self._advance(context, 0)

    def execute_complete(self, context, event: Any = None, resume_at: int | None = None):
        if resume_at is not None:  # back from a pause
            return self._advance(context, resume_at)
        _, data = event  # DagStateTrigger: (classpath, {"run_ids": [the tenant's run], ...})
        ids = [t["trigger_run_id"] for t in self.triggers]
        done = ids.index(data["run_ids"][0])
        self.log.info("lane %d: %s ended", self.lane, self.triggers[done]["conf"]["tenant"])
        return self._advance(context, done + 1)

    def _advance(self, context, i: int):
        from airflow.providers.standard.triggers.external_task import DagStateTrigger
        from airflow.providers.standard.triggers.temporal import TimeDeltaTrigger
        from airflow.sdk.exceptions import DagRunTriggerException

        ti, run_id = context["ti"], context["run_id"]
        for index in range(i, len(self.triggers)):
            trig = self.triggers[index]
            rid, tenant = trig["trigger_run_id"], trig["conf"]["tenant"]
            state = _state_word(ti.get_dagrun_state(dag_id=ro.CUTOVER_DAG, run_id=rid)) \
                if ti.get_dr_count(dag_id=ro.CUTOVER_DAG, run_ids=[rid]) else None
            if state == "success" or (state == "failed" and not trig.get("reset_dag_run")):
                continue  # this lane already ran it (a cleared lane resuming)
            if state in ("queued", "running"):
                self.defer(trigger=DagStateTrigger(dag_id=ro.CUTOVER_DAG, states=["success", "failed"],
                                                   execution_dates=None, run_ids=[rid],
                                                   poll_interval=self.poke_interval), method_name="execute_complete")
            control = ro.read_control(run_id)
            if control == "cancel":
                self.log.info("rollout cancelled: lane %d starts none of %s", self.lane,
                              ", ".join(t["conf"]["tenant"] for t in self.triggers[index:]))
                break
            if control == "pause":
                self.log.info("rollout paused: lane %d holds %s", self.lane, tenant)
                self.defer(trigger=TimeDeltaTrigger(dt.timedelta(seconds=_wait_s(context["params"]))),
                           method_name="execute_complete", kwargs={"resume_at": index})
            self.log.info("lane %d: starting %s (run %s)", self.lane, tenant, rid)
            raise DagRunTriggerException(
                trigger_dag_id=ro.CUTOVER_DAG, dag_run_id=rid, conf=trig["conf"], logical_date=None,
                reset_dag_run=bool(trig.get("reset_dag_run")) and state is not None, skip_when_already_exists=False,
                wait_for_completion=True, allowed_states=["success"], failed_states=["failed"],
                poke_interval=self.poke_interval, deferrable=True)
        states = {t["conf"]["tenant"]: _state_word(ti.get_dagrun_state(dag_id=ro.CUTOVER_DAG, run_id=t["trigger_run_id"]))
                  if ti.get_dr_count(dag_id=ro.CUTOVER_DAG, run_ids=[t["trigger_run_id"]]) else "not started"
                  for t in self.triggers}
        bad = {t: s for t, s in states.items() if s != "success"}
        if bad:
            raise _fail(f"lane {self.lane}: {len(bad)} tenant(s) did not succeed: "
                        + ", ".join(f"{t} ({s})" for t, s in bad.items()))
        return states


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
            ti.xcom_push(key="answer", value={"answer": "cancelled", "by": None, "at": None, "evidence": {}})
            raise _fail(f"rollout cancelled: wave {self.wave}'s question is not asked")
        rows = [self._tenant_row(ti, t) for t in triggers]
        waiting = [r["tenant"] for r in rows if r["status"] == "not ready"]
        if waiting:
            self.log.info("wave %d: waiting for %d tenant(s) to reach the confirmation: %s", self.wave, len(waiting),
                          ", ".join(waiting))
            raise _later(_wait_s(params))
        ready = [r for r in rows if r["status"] == "ready"]
        if not ready:
            ti.xcom_push(key="answer", value={"answer": "nothing to confirm", "tenants": []})
            return {"approval": "per_wave", "asked": False}
        ti.xcom_push(key="shown", value={r["tenant"]: r["checked_at"] for r in ready})
        plan = ti.xcom_pull(task_ids="plan", key=ro.PLAN_KEY) or {}
        from nexus_airflow.hitl import assigned_users

        excluded = set() if plan.get("allow_self_approval") else {n for n in [plan.get("requested_by")] if n}
        self.assigned_users = assigned_users(plan.get("approvers") or [], excluded)
        self.body = wave_body(self.wave, rows)
        confirm_timeout = int((triggers[0]["conf"].get("confirm_timeout") if triggers else None) or 86400)
        self.response_timeout = dt.timedelta(seconds=confirm_timeout)
        return super().execute(context)

    @staticmethod
    def _tenant_row(ti, trigger: dict[str, Any]) -> dict[str, Any]:
        tenant, rid = trigger["conf"]["tenant"], trigger["trigger_run_id"]
        if ti.get_dr_count(dag_id=ro.CUTOVER_DAG, run_ids=[rid]) == 0:
            return {"tenant": tenant, "status": "not ready"}
        run_state = _state_word(ti.get_dagrun_state(dag_id=ro.CUTOVER_DAG, run_id=rid))
        if run_state in ("success", "failed"):
            return {"tenant": tenant, "status": f"run {run_state}"}
        states = ti.get_task_states(dag_id=ro.CUTOVER_DAG, task_ids=["confirm_writers_stopped"], run_ids=[rid])
        confirm = _state_word((states.get(rid) or {}).get("confirm_writers_stopped"))
        ev = ti.xcom_pull(dag_id=ro.CUTOVER_DAG, run_id=rid, task_ids="confirm_writers_stopped", key="evidence",
                          map_indexes=-1)
        if confirm != "up_for_reschedule" or not ev:
            return {"tenant": tenant, "status": "not ready"}
        drain = ti.xcom_pull(dag_id=ro.CUTOVER_DAG, run_id=rid, task_ids="wait_for_drain", map_indexes=-1) or {}
        return {"tenant": tenant, "status": "ready", "checked_at": ev["checked_at"], "evidence": ev,
                "drain": drain.get("state") or "-"}

    def execute_complete(self, context, event: dict[str, Any]) -> Any:
        from nexus_airflow.hitl import answered_by, answerer_refusal

        ti = context["ti"]
        plan = ti.xcom_pull(task_ids="plan", key=ro.PLAN_KEY) or {}
        try:
            result = super().execute_complete(context, event)
        except Exception as exc:  # noqa: BLE001 - a timeout or a bad answer is never a confirmation
            timed_out = event.get("error_type") == "timeout" or "timeout" in type(exc).__name__.lower()
            self._answer(ti, "timed out" if timed_out else "no valid answer", None, None)
            raise _fail(f"wave {self.wave}: {'no answer in time' if timed_out else 'no valid answer'}: its tenants "
                        "stop before their checkpoints (fences stay armed)") from None
        who, at = answered_by(result.get("responded_by_user")), str(result.get("responded_at"))
        excluded = {n for n in [plan.get("requested_by")] if n}
        refusal = answerer_refusal(who, plan.get("approvers") or [], excluded, bool(plan.get("allow_self_approval")))
        if refusal:
            self._answer(ti, f"refused: {refusal}", who, at)
            raise _fail(f"wave {self.wave}: {refusal}; its tenants stop before their checkpoints")
        if list(result["chosen_options"]) != [self.approve_option]:
            self._answer(ti, "rejected", who, at)
            raise _fail(f"wave {self.wave} rejected by {who}: its tenants stop before their checkpoints "
                        "(fences stay armed)")
        shown = ti.xcom_pull(task_ids=self.task_id, key="shown") or {}
        answer = self._answer(ti, "approved", who, at, shown)
        self.log.info("wave %d approved by %s for %d tenant(s)", self.wave, who, len(shown))
        return answer

    @staticmethod
    def _answer(ti, answer: str, who: str | None, at: str | None, shown: dict | None = None) -> dict[str, Any]:
        value = {"answer": answer, "by": who, "at": at, "evidence": shown or {}}
        ti.xcom_push(key="answer", value=value)
        return value


def wave_body(wave: int, rows: list[dict[str, Any]]) -> str:
    """The wave question's table: tenant, live/stopped writers, last heartbeat age, drain result, evidence age."""
    from nexus_cutover.clock import utcnow

    lines = [f"## Wave {wave}: stop every old writer of these tenants before their checkpoints\n",
             "| tenant | writers live / stopped or silent | newest heartbeat age (s) | drain | evidence age (s) |",
             "|---|---|---|---|---|"]
    now = utcnow()
    for r in rows:
        if r["status"] != "ready":
            lines.append(f"| `{r['tenant']}` | {r['status']} (not in this question) | - | - | - |")
            continue
        ev = r["evidence"]
        procs = ev.get("processes") or []
        ages = [p.get("heartbeat_age_s") for p in procs if p.get("heartbeat_age_s") is not None]
        age = (now - dt.datetime.fromisoformat(ev["checked_at"])).total_seconds()
        lines.append(f"| `{r['tenant']}` | {len(ev.get('live') or [])} / {len(procs) - len(ev.get('live') or [])} | "
                     f"{min(ages) if ages else '-'} | {r['drain']} | {age:.0f} |")
    lines.append("\nConfirm only if every old ingress_writer, receipt_materializer, projection_worker and "
                 "dependency_resolver of every tenant above is stopped and will not be restarted. Each tenant "
                 "re-checks its own registry when the answer arrives and fails alone if a writer came back. "
                 "**Reject** (or no answer in time) fails the wave's tenants: cutover not performed.")
    return "\n".join(lines)


def tenant_outcome(ti, trigger: dict[str, Any]) -> dict[str, Any]:
    """One tenant's outcome: its run's state and, when it did not succeed, the failed task and its reason."""
    rid = trigger["trigger_run_id"]
    if ti.get_dr_count(dag_id=ro.CUTOVER_DAG, run_ids=[rid]) == 0:
        return {"run_id": rid, "state": "not triggered", "failed_tasks": [], "reason": "the run was never created"}
    state = _state_word(ti.get_dagrun_state(dag_id=ro.CUTOVER_DAG, run_id=rid))
    out: dict[str, Any] = {"run_id": rid, "state": state, "failed_tasks": []}
    confirmed = ti.xcom_pull(dag_id=ro.CUTOVER_DAG, run_id=rid, task_ids="confirm_writers_stopped", map_indexes=-1)
    if isinstance(confirmed, dict) and confirmed.get("responded_by"):
        out["approved_by"] = confirmed["responded_by"]  # who confirmed this tenant's writer stop
    if state != "success":
        states = ti.get_task_states(dag_id=ro.CUTOVER_DAG, run_ids=[rid]).get(rid, {})
        failed = sorted(t for t, s in states.items() if _state_word(s) == "failed")  # causes, not upstream_failed
        out["failed_tasks"] = failed
        if failed:
            task, _, index = failed[0].rpartition("_")
            task, index = (task, int(index)) if index.isdigit() else (failed[0], -1)  # a mapped task: <id>_<index>
            report = ti.xcom_pull(dag_id=ro.CUTOVER_DAG, run_id=rid, task_ids=task, key="report", map_indexes=index)
            out["reason"] = (report.get("message") if isinstance(report, dict) else None) or "see the task's log"
    return out


def close_wave(wave: int, run_id: str, ti, log) -> dict[str, Any]:
    """The wave's outcome (XCom ``wave``); halts the rollout past ``max_failed``."""
    from airflow.sdk.exceptions import AirflowSkipException

    group = ro.wave_group(wave)
    triggers = wave_triggers(ti, wave)
    plan = ti.xcom_pull(task_ids="plan", key=ro.PLAN_KEY) or {}
    if triggers is None:
        if ro.read_control(run_id) == "cancel" and wave < len(plan.get("waves") or []):
            outcome = {"wave": wave, "state": "cancelled", "succeeded": [], "failed": {}, "approval": None}
            ti.xcom_push(key=ro.WAVE_KEY, value=outcome)
            raise _fail(f"rollout cancelled: wave {wave} not started")
        raise AirflowSkipException(f"wave {wave} did not start")
    outcomes = {t["conf"]["tenant"]: tenant_outcome(ti, t) for t in triggers}
    answer = ti.xcom_pull(task_ids=f"{group}.confirm", key="answer")
    succeeded = [t for t, o in outcomes.items() if o["state"] == "success"]
    failed = {t: {"task": (o["failed_tasks"] or ["-"])[0], "reason": o.get("reason", o["state"]), "run_id": o["run_id"]}
              for t, o in outcomes.items() if o["state"] != "success"}
    decided = bool(answer) and answer.get("answer") not in ("approved", "nothing to confirm")
    budget = ro.failure_budget(plan.get("max_failed", 0), len(triggers))
    state = "rejected" if decided else "succeeded"
    cancelled = ro.read_control(run_id) == "cancel"
    if cancelled:
        state = "cancelled"
        for t, f in failed.items():
            if outcomes[t]["state"] == "not triggered":
                f["reason"] = "cancelled before it started"
    elif not decided and len(failed) > budget:
        state = "halted"
    outcome = {"wave": wave, "state": state, "succeeded": succeeded, "failed": failed, "budget": budget,
               "approved_by": {t: o["approved_by"] for t, o in outcomes.items() if o.get("approved_by")},
               "approval": None if not answer or answer.get("answer") == "nothing to confirm" else
               {"by": answer.get("by"), "at": answer.get("at"), "answer": answer.get("answer")}}
    ti.xcom_push(key=ro.WAVE_KEY, value=outcome)
    progress_metrics(ti, plan, wave, outcome, run_id)
    log.info("wave %d %s: %d succeeded, %d failed (budget %d)%s", wave, state, len(succeeded), len(failed), budget,
             "".join(f"\n  {t}: {f['task']}: {f['reason']}" for t, f in failed.items()))
    if state in ("halted", "cancelled"):
        raise _fail(f"rollout {state} after wave {wave}: {len(failed)} tenant(s) failed, budget {budget}"
                    if state == "halted" else f"rollout cancelled during wave {wave}")
    return outcome


def summarize(run_id: str, ti, log) -> dict[str, Any]:
    """Every tenant's outcome across the waves (XCom ``summary``); fails the rollout unless all succeeded."""
    plan = ti.xcom_pull(task_ids="plan", key=ro.PLAN_KEY)
    if not plan:
        reason = ti.xcom_pull(task_ids="plan", key="refusal") or "the plan task failed (see its log)"
        ti.xcom_push(key=ro.SUMMARY_KEY, value={"tenants": {}, "succeeded": [], "not_succeeded": [], "refusal": reason})
        raise _fail(f"the rollout started no tenant: {reason}")
    tenants: dict[str, Any] = {}
    halted = None
    for w in plan["waves"]:
        closed = ti.xcom_pull(task_ids=ro.close_task(w["wave"]), key=ro.WAVE_KEY)
        if closed and closed["state"] in ("halted", "cancelled") and halted is None:
            halted = f"{closed['state']} after wave {w['wave']}"
        for t in w["tenants"]:
            if not closed or (closed["state"] == "cancelled" and t not in closed["succeeded"] and t not in closed["failed"]):
                tenants[t] = {"wave": w["wave"], "state": "not run", "reason": halted or "its wave did not run"}
            elif t in closed["succeeded"]:
                tenants[t] = {"wave": w["wave"], "state": "success", "run_id": ro.run_id_for(run_id, t),
                              "approved_by": (closed.get("approved_by") or {}).get(t)}
            else:
                tenants[t] = {"wave": w["wave"], "state": "failed", **closed["failed"][t]}
    pauses = admission_pauses(ti, tenants)
    lines = [f"{'tenant':<24}  wave  outcome"] + [
        f"{t:<24}  {o['wave']:>4}  {o['state']}" + (f" ({o.get('task')}: {o.get('reason')})" if o["state"] == "failed" else "")
        + pause_text(o)
        + (f" ({o['reason']})" if o["state"] == "not run" else "") for t, o in tenants.items()] + [
        f"{t:<24}     -  skipped ({why})" for t, why in plan["skipped"].items()] + pause_lines(pauses)
    log.info("rollout %s:\n%s", run_id, "\n".join(lines))
    ok = [t for t, o in tenants.items() if o["state"] == "success"]
    result = {"tenants": tenants, "succeeded": ok, "not_succeeded": [t for t in tenants if t not in ok],
              "skipped": plan["skipped"], "halted": halted, "admission_pause": pauses}
    ti.xcom_push(key=ro.SUMMARY_KEY, value=result)
    ti.xcom_push(key="summary_text", value="\n".join(lines))
    if result["not_succeeded"]:
        raise _fail(f"{len(result['not_succeeded'])} of {len(tenants)} tenant(s) did not succeed"
                    + (f" ({halted})" if halted else "") + ": " + ", ".join(result["not_succeeded"]))
    return result


# --- the admission pause per tenant (issue 27) -----------------------------------------------------------------

def admission_pauses(ti, tenants: dict[str, Any]) -> dict[str, Any] | None:
    """Each tenant's admission pause, as its run's release step recorded it (``admission_pause_s`` added to the
    tenant's entry, None when its run released no fence), and median / p95 / max over the rollout (None: none)."""
    from nexus_airflow.metrics import pause_summary

    for o in tenants.values():
        if o.get("run_id"):
            released = ti.xcom_pull(dag_id=ro.CUTOVER_DAG, run_id=o["run_id"], task_ids="resume_admission",
                                    map_indexes=-1)
            o["admission_pause_s"] = released.get("admission_pause_s") if isinstance(released, dict) else None
    return pause_summary(o["admission_pause_s"] for o in tenants.values() if o.get("admission_pause_s") is not None)


def pause_text(outcome: dict[str, Any]) -> str:
    pause = outcome.get("admission_pause_s")
    return "" if pause is None else f"  admission paused {pause:.1f} s"


def pause_lines(summary: dict[str, Any] | None) -> list[str]:
    if not summary:
        return []
    return [f"admission pause over {summary['tenants']} tenant(s): median {summary['median_s']:.1f} s, "
            f"p95 {summary['p95_s']:.1f} s, max {summary['max_s']:.1f} s"]


def progress_metrics(ti, plan: dict[str, Any], wave: int, outcome: dict[str, Any], run_id: str) -> None:
    """``nexus.rollout.tenants`` (done / failed / waiting) and ``nexus.rollout.wave.eta`` at a wave's close:
    this wave's outcome plus the earlier waves' (their ``close`` XComs)."""
    from nexus_airflow.metrics import emit_rollout, rollout_progress

    closed = [outcome] + [ti.xcom_pull(task_ids=ro.close_task(k), key=ro.WAVE_KEY) or {} for k in range(wave)]
    done = sum(len(c.get("succeeded") or []) for c in closed)
    failed = sum(len(c.get("failed") or {}) for c in closed)
    total = sum(len(w["tenants"]) for w in plan.get("waves") or [])
    emit_rollout(run_id, rollout_progress(total, done, failed, _elapsed_s()))


def _elapsed_s() -> float | None:
    """Seconds since this rollout run started (None outside a task's context)."""
    from airflow.sdk import get_current_context

    try:
        started = get_current_context()["dag_run"].start_date
    except Exception:  # noqa: BLE001 - no context (a unit call): no ETA rather than no metrics
        return None
    return (dt.datetime.now(dt.UTC) - started).total_seconds() if started else None

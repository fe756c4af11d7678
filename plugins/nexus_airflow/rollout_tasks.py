"""The rollout's outcomes (``tenant_rollout``'s ``close`` and ``summary`` tasks): each tenant's run read through one
function (:func:`tenant_outcomes`), each wave's outcome and the rollout's summary.

The other tasks: the plan :mod:`.rollout_plan`, the lanes :mod:`.rollout_lanes`, the wave question
:mod:`.rollout_confirm` (its text :mod:`.rollout_render`).

Invariants (the vocabulary is :mod:`nexus_airflow.rollout`):

* A tenant's run is read through :func:`tenant_outcomes` only (its state, the failed task and the reason its stop
  reported, who confirmed its writer stop: :mod:`nexus_airflow.results`).
* A wave's ``close`` passes within ``max_failed`` (its succeeded tenants' runs ended with their Asset event); past
  the budget the rollout halts and later waves' tenants are never started. A rejected wave is a decision, not
  counted against ``max_failed``; a cancel is reported as such.
* The summary fails the rollout unless every planned tenant succeeded, and sends the rollout's one end message
  (:func:`nexus_airflow.rollout_notify.ended`: succeeded, halted, cancelled or failed, with done / failed / not run).
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from nexus_airflow import results
from nexus_airflow import rollout as ro
from nexus_airflow.rollout_lanes import wave_triggers
from nexus_airflow.rollout_notify import ended, summary_facts

_fail, _state_word = ro.fail, ro.state_word


def tenant_outcomes(ti, triggers: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Each tenant's outcome (:func:`tenant_outcome`), the runs' states read together (:func:`ro.cutover_run_states`:
    one read when all succeeded)."""
    states = ro.cutover_run_states(ti, [t["trigger_run_id"] for t in triggers])
    return {t["conf"]["tenant"]: tenant_outcome(ti, t, states[t["trigger_run_id"]]) for t in triggers}


def tenant_outcome(ti, trigger: dict[str, Any], state: str) -> dict[str, Any]:
    """One tenant's outcome: its run's ``state`` and, when it did not succeed, the failed task and its reason."""
    rid = trigger["trigger_run_id"]
    if state == "not started":
        return {"run_id": rid, "state": "not triggered", "failed_tasks": [], "reason": "the run was never created"}
    out: dict[str, Any] = {"run_id": rid, "state": state, "failed_tasks": []}
    confirmed = results.confirmation(ti, run_id=rid)
    if confirmed and confirmed.get("responded_by"):
        out["approved_by"] = confirmed["responded_by"]  # who confirmed this tenant's writer stop
    if state != "success":
        states = ti.get_task_states(dag_id=ro.CUTOVER_DAG, run_ids=[rid]).get(rid, {})
        failed = sorted(t for t, s in states.items() if _state_word(s) == "failed")  # causes, not upstream_failed
        out["failed_tasks"] = failed
        if failed:
            task, _, index = failed[0].rpartition("_")
            task, index = (task, int(index)) if index.isdigit() else (failed[0], -1)  # a mapped task: <id>_<index>
            report = results.stop_report(ti, task, run_id=rid, map_index=index)
            out["reason"] = (report or {}).get("message") or "see the task's log"
    return out


def close_wave(wave: int, run_id: str, ti, log) -> dict[str, Any]:
    """The wave's outcome (XCom ``wave``); halts the rollout past ``max_failed``."""
    from airflow.sdk.exceptions import AirflowSkipException

    triggers = wave_triggers(ti, wave)
    plan = ro.plan_of(ti) or {}
    if triggers is None:
        if ro.read_control(run_id) == "cancel" and wave < len(plan.get("waves") or []):
            outcome = {"wave": wave, "state": "cancelled", "succeeded": [], "failed": {}, "approval": None}
            ti.xcom_push(key=ro.WAVE_KEY, value=outcome)
            raise _fail(f"rollout cancelled: wave {wave} not started")
        raise AirflowSkipException(f"wave {wave} did not start")
    outcomes = tenant_outcomes(ti, triggers)
    answer = ro.wave_answer(ti, wave)
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
    if ro.preflight_mode(ti) == "preflight":
        return preflight_only(ti, log)
    plan = ro.plan_of(ti)
    if not plan:
        reason = ro.refusal(ti) or "the plan task failed (see its log)"
        ti.xcom_push(key=ro.SUMMARY_KEY, value={"tenants": {}, "succeeded": [], "not_succeeded": [], "refusal": reason})
        ended("FAILED", f"{run_id}: it started no tenant", [f"the rollout started no tenant: {reason}"])
        raise _fail(f"the rollout started no tenant: {reason}")
    tenants: dict[str, Any] = {}
    halted = None
    for w in plan["waves"]:
        closed = ro.wave_outcome(ti, w["wave"])
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
    ti.xcom_push(key=ro.SUMMARY_TEXT_KEY, value="\n".join(lines))
    outcome = (halted.split(" ", 1)[0].upper() if halted else "FAILED") if result["not_succeeded"] else "SUCCEEDED"
    ended(outcome, f"{run_id}: {len(ok)} of {len(tenants)} tenant(s) cut over" + (f", {halted}" if halted else ""),
          lines, summary_facts(tenants, plan["skipped"]))
    if result["not_succeeded"]:
        raise _fail(f"{len(result['not_succeeded'])} of {len(tenants)} tenant(s) did not succeed"
                    + (f" ({halted})" if halted else "") + ": " + ", ".join(result["not_succeeded"]))
    return result


def preflight_only(ti, log) -> dict[str, Any]:
    """The summary of ``mode: preflight``: the preflight's counts and the tenants a rollout would skip; succeeds."""
    from nexus_airflow.rollout_preflight import stopped_tenants
    from nexus_cutover.projection.preflight import counts

    rows = ro.preflight_rows(ti) or []
    result = {"mode": "preflight", "preflight": counts(rows), "tenants": {}, "succeeded": [], "not_succeeded": [],
              "skipped": {}, "would_skip": stopped_tenants(rows), "halted": None, "admission_pause": None}
    text = (f"preflight only: {len(rows)} tenant(s), " + ", ".join(f"{n} {v}" for v, n in result["preflight"].items())
            + "; no fence armed, no tenant run started")
    log.info("%s%s", text, "".join(f"\n  {t}: {why}" for t, why in result["would_skip"].items()))
    ti.xcom_push(key=ro.SUMMARY_KEY, value=result)
    ti.xcom_push(key=ro.SUMMARY_TEXT_KEY, value=text)
    ended("PREFLIGHT DONE", text, [f"{t}: {why}" for t, why in result["would_skip"].items()])
    return result


# --- the admission pause per tenant (issue 27) -----------------------------------------------------------------

def admission_pauses(ti, tenants: dict[str, Any]) -> dict[str, Any] | None:
    """Each tenant's admission pause, as its run's release step recorded it (``admission_pause_s`` added to the
    tenant's entry, None when its run released no fence), and median / p95 / max over the rollout (None: none)."""
    from nexus_airflow.metrics import pause_summary

    for o in tenants.values():
        if o.get("run_id"):
            o["admission_pause_s"] = (results.release(ti, run_id=o["run_id"]) or {}).get("admission_pause_s")
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
    """``nexus.rollout.tenants`` (done / failed / waiting), ``nexus.rollout.wave.eta`` and ``nexus.rollout.halted``
    at a wave's close: this wave's outcome plus the earlier waves' (their ``close`` XComs)."""
    from nexus_airflow.metrics import emit_rollout, rollout_progress

    closed = [outcome] + [ro.wave_outcome(ti, k) or {} for k in range(wave)]
    done = sum(len(c.get("succeeded") or []) for c in closed)
    failed = sum(len(c.get("failed") or {}) for c in closed)
    total = sum(len(w["tenants"]) for w in plan.get("waves") or [])
    emit_rollout(run_id, rollout_progress(total, done, failed, _elapsed_s()), halted=outcome["state"] == "halted")


def _elapsed_s() -> float | None:
    """Seconds since this rollout run started (None outside a task's context)."""
    from airflow.sdk import get_current_context

    try:
        started = get_current_context()["dag_run"].start_date
    except Exception:  # noqa: BLE001 - no context (a unit call): no ETA rather than no metrics
        return None
    return (dt.datetime.now(dt.UTC) - started).total_seconds() if started else None

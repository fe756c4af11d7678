"""What a run is doing and what to do about it: its state, the current or failed task, the reason, the next action.

Used by the tenant view (each tenant's latest cutover and Field History runs)
and by the rollout page (each tenant's cutover run of a rollout). Read only,
from the Airflow metadata DB, a fixed number of indexed queries per call
(``task_instance`` by ``(dag_id, run_id)``, ``xcom`` by its task-instance
index), in chunks of ``CHUNK`` runs: never one query per tenant.

Invariants:

* the step shown is the failed task if one failed, else the task that is
  running, deferred, waiting for a person (``awaiting_input``) or queued; of a
  fused task (``nexus_airflow.declared.FUSED``), the step in it that stopped
  (its report names it) or, while the task waits, the wait that leads it;
* the reason of a failed task is what it pushed as XCom ``report`` (its
  ``message``, which ``nexus_airflow.base.stop`` ends with the next action),
  redacted (:mod:`nexus_status.redact`); without one: "read the task log";
* the next action is the one the stop's message names for its cause (after
  "Next:"), else the step's from ``nexus_cutover.projection.next_actions`` (the
  one source; ``docs/runbook.md``'s table shows the same texts, a test keeps
  them equal): shown for a failed step and for a step waiting for a person;
* the link is the run in the Airflow UI: ``/dags/<dag_id>/runs/<run_id>``;
* with the tenant's state (:func:`with_tenant_state`, the row's), a cutover run waiting at a declared waiting
  step (deferred, rescheduled or running a step of a role of :data:`WAIT_RESULTS`: ``wait_for_drain``,
  ``check_old_writers``, ``verify_readiness``) says
  what it waits for -- the step's own verdict on that state: the live old writers by id, a stuck drain's causes
  with their counts, the host's reasons -- and the step's ``wait_action`` as the next action; a cutover run that
  succeeded, with no Field History run yet and Field History not at its last stage, names that DAG as next.
"""

from __future__ import annotations

import json
from typing import Any
from urllib.parse import quote

from nexus_airflow.compat import model
from nexus_airflow.compat import session as metadata_session

ACTIVE = ("awaiting_input", "running", "deferred", "up_for_reschedule", "up_for_retry", "restarting", "queued",
          "scheduled")
STOPPED = ("failed",)
CHUNK = 500


def run_link(dag_id: str, run_id: str) -> str:
    return f"/dags/{quote(dag_id, safe='')}/runs/{quote(run_id, safe='')}"


def _chunks(items: list, size: int = CHUNK):
    for i in range(0, len(items), size):
        yield items[i:i + size]


def task_states(session, dag_id: str, run_ids: list[str]) -> dict[str, list[tuple[str, str]]]:
    """run_id -> [(task_id, state)] of the tasks of ``dag_id``'s runs that are active or failed."""
    TI = model("TaskInstance")
    from sqlalchemy import select

    out: dict[str, list[tuple[str, str]]] = {}
    for chunk in _chunks(sorted(set(run_ids))):
        rows = session.execute(
            select(TI.run_id, TI.task_id, TI.state)
            .where(TI.dag_id == dag_id, TI.run_id.in_(chunk), TI.state.in_(ACTIVE + STOPPED))
        ).all()
        for run_id, task_id, state in rows:
            out.setdefault(run_id, []).append((task_id, str(state)))
    return out


def failure_reports(session, dag_id: str, failed: dict[str, str]) -> dict[str, Any]:
    """run_id -> the XCom ``report`` of its failed task (``failed``: run_id -> task_id)."""
    XComModel = model("XComModel")
    from sqlalchemy import select

    out: dict[str, Any] = {}
    for chunk in _chunks(sorted(failed)):
        rows = session.execute(
            select(XComModel.run_id, XComModel.task_id, XComModel.value).where(
                XComModel.dag_id == dag_id, XComModel.task_id.in_(sorted({failed[r] for r in chunk})),
                XComModel.run_id.in_(chunk), XComModel.key == "report")
        ).all()
        out.update({run_id: xcom_value(value) for run_id, task_id, value in rows if failed.get(run_id) == task_id})
    return out


def xcom_value(raw: Any) -> Any:
    """An XCom value as stored (JSON text in the metadata DB), decoded; anything else as it is."""
    if isinstance(raw, str | bytes):
        try:
            return json.loads(raw)
        except ValueError:
            return raw
    return raw


def reason_of(report: Any) -> str:
    """A failed task's reason from its ``report`` XCom (redacted); "read the task log" without one."""
    from nexus_status.redact import redact

    if isinstance(report, dict):
        for key in ("message", "summary", "reason", "error"):
            if report.get(key):
                return redact(report[key])[:1200]
    elif isinstance(report, str) and report:
        return redact(report)[:1200]
    return "no reason recorded: read the task log"


def _step(tasks: list[tuple[str, str]]) -> tuple[str | None, str | None]:
    failed = sorted(t for t, s in tasks if s in STOPPED)
    if failed:
        return failed[0], "failed"
    for state in ACTIVE:
        current = sorted(t for t, s in tasks if s == state)
        if current:
            return current[0], state
    return None, None


def step_shown(dag_id: str, task: str | None, task_state: str | None, report: Any) -> str | None:
    """The declared step a run is at, for its task ``task`` in ``task_state`` (see the module invariants)."""
    from nexus_airflow.declared import steps_of

    steps = steps_of(dag_id, task) if task else ()
    if len(steps) < 2:
        return task
    if task_state == "failed":
        named = report.get("step") if isinstance(report, dict) else None
        return named if named in steps else task
    return steps[0] if task_state in ("deferred", "up_for_reschedule") else task


def summarize(dag_id: str, run_id: str, run_state: str, tasks: list[tuple[str, str]], report: Any) -> dict[str, Any]:
    """One run as the pages show it (see the module invariants)."""
    from nexus_cutover.projection.next_actions import next_action

    task, task_state = _step(tasks)
    task = step_shown(dag_id, task, task_state, report)
    out: dict[str, Any] = {"dag_id": dag_id, "run_id": run_id, "state": run_state, "task": task,
                           "task_state": task_state, "reason": None, "next_action": None,
                           "link": run_link(dag_id, run_id)}
    stated_next = None
    if task_state == "failed":
        # a stop's message ends with the next action it chose for its cause (nexus_airflow.base.stop)
        out["reason"], _, stated_next = reason_of(report).partition(" Next: ")
    elif task_state == "awaiting_input":
        out["reason"] = "waiting for a person: answer it in Required actions"
    elif task_state == "deferred":
        out["reason"] = "waiting (deferred to the triggerer): its progress is in the task log"
    if task_state in ("failed", "awaiting_input") and task:
        out["next_action"] = stated_next or next_action(task) or "see docs/runbook.md for this task"
    return out


def summaries(session, dag_id: str, runs: dict[str, str]) -> dict[str, dict[str, Any]]:
    """run_id -> :func:`summarize` for ``runs`` (run_id -> run state) of ``dag_id``: two queries per chunk."""
    tasks = task_states(session, dag_id, list(runs))
    failed = {r: t for r, ts in tasks.items() for t, s in sorted(ts) if s in STOPPED}
    reports = failure_reports(session, dag_id, failed) if failed else {}
    return {r: summarize(dag_id, r, state, tasks.get(r, []), reports.get(r)) for r, state in runs.items()}


def latest_runs(tenants: list[str], holders: dict[str, str | None] | None = None) -> dict[str, dict[str, Any]]:
    """tenant -> {"runs": {"cutover": ..., "field_history": ...}, "proofs": ...}; {} without a metadata DB.

    Each run is the one that matters (:func:`nexus_status.proofs.runs_that_matter`: for the cutover, the holder of
    the tenant's fence, ``holders[tenant]``); runs triggered after it are listed in its ``later``.
    """
    from nexus_status import proofs

    try:

        with metadata_session() as session:
            chosen = proofs.runs_that_matter(session, set(tenants), holders)
            xcoms = proofs._xcoms(session, {k: c.run_id for k, c in chosen.items()})
            by_dag: dict[str, dict[str, str]] = {}
            for (dag_id, _tenant), c in chosen.items():
                by_dag.setdefault(dag_id, {}).update([(c.run_id, c.state), *c.later])
            summary = {dag: summaries(session, dag, runs) for dag, runs in by_dag.items() if runs}
    except Exception as exc:  # noqa: BLE001 - no metadata DB (a unit call): the tenant databases still show
        proofs.log.warning("the latest runs could not be read from the metadata DB: %s", exc)
        return {}
    found = proofs.proofs_for({k: c.run_id for k, c in chosen.items()}, xcoms)
    out: dict[str, dict[str, Any]] = {}
    for (dag_id, tenant), c in chosen.items():
        entry = out.setdefault(tenant, {"runs": {}, "proofs": found.get(tenant, {})})
        run = dict(summary[dag_id][c.run_id])
        run["later"] = [summary[dag_id][r] for r, _s in c.later]
        entry["runs"]["cutover" if dag_id == proofs.CUTOVER_DAG else "field_history"] = run
    return out


#: The waiting steps of the cutover by their declared role (``nexus_cutover.projection.transition``): the section of
#: the tenant's state (``nexus_cutover.tenant_status``) it is read from, and how it reads as the result their verdict
#: judges.
WAIT_RESULTS = {
    "drain": ("drain", lambda st: {"state": (st.get("drain") or {}).get("state"),
                                   "remaining": (st.get("drain") or {}).get("remaining"),
                                   "blocker_totals": (st.get("drain") or {}).get("blockers") or {}}),
    "writers": ("host", lambda st: {"live": (st.get("host") or {}).get("live_old_writers") or []}),
    "readiness": ("host", lambda st: {"ready": (st.get("host") or {}).get("ready"),
                                      "reasons": (st.get("host") or {}).get("reasons") or []}),
}
WAITING_STATES = ("deferred", "up_for_reschedule", "running", "queued", "scheduled")
FIELD_HISTORY_LAST_STAGE = 3


def with_tenant_state(runs: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """``runs`` (a row's ``{"cutover": ..., "field_history": ...}``) with the waits and the step after a success
    explained from the tenant's ``state`` (see the module invariants); a section that could not be read adds
    nothing."""
    runs = _field_history_next(runs, state)
    cutover = runs.get("cutover")
    if not cutover:
        return runs
    from nexus_cutover.projection.transition import CUTOVER

    cutover = dict(cutover)
    task = cutover.get("task")
    declared = CUTOVER.get(task) if isinstance(task, str) else None
    if declared is not None and declared.role in WAIT_RESULTS and cutover.get("task_state") in WAITING_STATES:
        cutover.update(_wait_explained(task, state))
    elif cutover.get("state") == "failed" and (released := _released_by_another(cutover, state)):
        cutover["next_action"] = released
    elif cutover.get("state") == "success" and not runs.get("field_history"):
        fh = state.get("field_history") or {}
        if "error" not in fh and int(fh.get("stage") or 0) < FIELD_HISTORY_LAST_STAGE:
            from nexus_cutover.field_history.steps import next_stage_action

            cutover["next_action"] = (f"trigger field_history_eligibility for this tenant (Field History: "
                                      f"{fh.get('stage_text') or 'not started'}): "
                                      + next_stage_action(int(fh.get("stage") or 0)))
    return {**runs, "cutover": cutover}


def _field_history_next(runs: dict[str, Any], state: dict[str, Any]) -> dict[str, Any]:
    """A Field History run that succeeded below the last stage (its target_stage was lower) is not the end: its
    What now? names the next run and what it needs (issue 51, item 2: a first run looked finished after stage 1)."""
    run, fh = runs.get("field_history"), state.get("field_history") or {}
    if not run or run.get("state") != "success" or "error" in fh:
        return runs
    stage = int(fh.get("stage") or 0)
    if stage >= FIELD_HISTORY_LAST_STAGE:
        return runs
    from nexus_cutover.field_history.steps import next_stage_action

    said = (f"Field History is at {fh.get('stage_text') or f'stage {stage}'}, not done: trigger "
            f"field_history_eligibility again: {next_stage_action(stage)}")
    return {**runs, "field_history": {**run, "next_action": said}}


def _released_by_another(run: dict[str, Any], state: dict[str, Any]) -> str | None:
    """What to do after a failed run whose fence someone else released without a cutover (a back-out, or by hand):
    its own stop's next action (retry it, or back out) no longer holds. None when the fence is not that run's."""
    from nexus_cutover.holders import airflow_run_named

    fence = state.get("fence") or {}
    last = fence.get("last_fence") or {}
    armed_by = airflow_run_named(last.get("ArmedBy"))
    if fence.get("armed") or not last or armed_by is None or armed_by[1] != run.get("run_id"):
        return None
    if not last.get("ReleasedBy") or last.get("ReleasedBy") == last.get("ArmedBy"):
        return None
    return (f"nothing for this run: the fence it left (fence {last.get('FenceId')}) was released without a cutover at "
            f"{last.get('ReleasedAt')} by {last.get('ReleasedBy')} (backed out); restart the old writers you stopped. "
            "To cut the tenant over later, trigger connector_projection_cutover again (a new fence, a new question)")


def _wait_explained(task: str, state: dict[str, Any]) -> dict[str, Any]:
    from nexus_cutover.projection.transition import CUTOVER
    from nexus_cutover.transition import Outcome

    step = CUTOVER[task]
    section, result_of = WAIT_RESULTS[step.role]
    if "error" in (state.get(section) or {}) or "stale" in state:
        return {}  # no reading of the tenant to explain the wait with: the task log's word stands
    verdict = step.verdict(result_of(state))
    if verdict.outcome is Outcome.PROCEED:
        return {"reason": f"waiting: its next look should pass ({task} is done by the tenant's state); the run goes "
                          "on by itself"}
    reason = verdict.reason if verdict.outcome is Outcome.STOP else f"waiting for {verdict.reason}"
    return {"reason": reason, "next_action": step.wait_action}

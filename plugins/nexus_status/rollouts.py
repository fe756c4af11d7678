"""The rollout page's data: the latest ``tenant_rollout`` runs, their waves, tenants, approvals, controls and ETA.

Read only, from the Airflow metadata DB, a fixed number of indexed queries per
refresh whatever the fleet's size (``dag_run`` by ``dag_id``/``run_after``,
``xcom`` by task instance, ``task_instance`` by ``(dag_id, run_id)``, chunked
by 500 runs; ``variable`` by key): never one query per tenant. The names come
from ``nexus_airflow.rollout`` (the contract with ``dags/tenant_rollout.py``).

The XCom contract this page reads (what exists; a wave still running has no
``wave`` XCom yet, a rollout still running has no ``summary``):

* task ``plan``, key ``rollout``::

    {"waves": [{"wave": 0, "name": "canary", "tenants": [...]}, ...],
     "approval": "per_wave" | "per_tenant", "approvers": [...], "max_failed": ...,
     "skipped": {tenant: reason}}

* task ``wave_NN.close`` (``rollout.wave_group(k) + ".close"``), key ``wave``::

    {"wave": k, "state": "succeeded" | "halted" | "cancelled", "succeeded": [...],
     "failed": {tenant: {"task": ..., "reason": ...}},
     "approval": {"by": ..., "at": ..., "answer": "approved" | "rejected" | "timed out"} | null}

* task ``summary``, key ``summary``: the rollout's summary (shown as it is, redacted);
* task ``preflight``, key ``preflight``: the preflight's table, one dict per tenant
  (``nexus_cutover.projection.preflight.COLUMNS``); shown with its counts and a link to
  its CSV (``/api/rollouts/preflight.csv?run_id=``, :func:`preflight_rows`);
* each tenant's cutover run has the run id ``rollout.run_id_for(rollout_run_id, tenant)``:
  its state and step come from ``nexus_status.runs`` (the failed task's XCom ``report``);
* the control is the Variable ``rollout.control_variable(run_id)`` (``pause`` /
  ``resume`` / ``cancel``; none, ``resume`` or anything else means run).

ETA: a tenant's from its drain samples (``history.drain_eta``: the measured
rate), a running wave's is its slowest tenant's, the rollout's is the running
wave's plus, for each wave not started, the median duration of this rollout's
finished tenant runs times the wave's rounds (``ceil(tenants / max_parallel)``).
Unknown is said, never guessed.
"""

from __future__ import annotations

import math
import statistics
from typing import Any

from nexus_airflow.compat import model
from nexus_airflow.compat import session as metadata_session
from nexus_status.runs import xcom_value as _json

LATEST = 5


def _rollout_runs(session, limit: int, run_id: str | None = None) -> list[dict[str, Any]]:
    DagRun = model("DagRun")
    from sqlalchemy import select

    from nexus_airflow import rollout as contract

    query = select(DagRun.id, DagRun.run_id, DagRun.state, DagRun.start_date, DagRun.end_date).where(
        DagRun.dag_id == contract.ROLLOUT_DAG)
    query = query.where(DagRun.run_id == run_id) if run_id else query.order_by(DagRun.run_after.desc()).limit(limit)
    return [{"run_id": r, "state": str(s), "start_date": _iso(a), "end_date": _iso(b), "_pk": pk}
            for pk, r, s, a, b in session.execute(query).all()]


def _iso(value) -> str | None:
    return value.isoformat() if value is not None else None


def _rollout_xcoms(session, runs: list[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """run_id -> {"plan": ..., "waves": {k: ...}, "summary": ...} from one XCom query (on the primary key's
    ``dag_run_id`` prefix: a rollout's history of XComs is never scanned)."""
    XComModel = model("XComModel")
    from sqlalchemy import select

    from nexus_airflow import rollout as contract

    out: dict[str, dict[str, Any]] = {r["run_id"]: {"plan": None, "waves": {}, "summary": None, "summary_text": None,
                                                    "preflight": None, "answers": {}}
                                      for r in runs}
    if not runs:
        return out
    rows = session.execute(
        select(XComModel.run_id, XComModel.task_id, XComModel.key, XComModel.value).where(
            XComModel.dag_run_id.in_([r["_pk"] for r in runs]),
            XComModel.key.in_([contract.PLAN_KEY, contract.WAVE_KEY, contract.SUMMARY_KEY, contract.SUMMARY_TEXT_KEY,
                               contract.PREFLIGHT_KEY, contract.ANSWER_KEY]))
    ).all()
    for run_id, task_id, key, value in rows:
        value = _json(value)
        if key == contract.PREFLIGHT_KEY and task_id == contract.PREFLIGHT_TASK and isinstance(value, list):
            out[run_id]["preflight"] = value
        elif key == contract.PLAN_KEY and isinstance(value, dict):
            out[run_id]["plan"] = value
        elif key == contract.WAVE_KEY and isinstance(value, dict) and task_id.endswith("." + contract.CLOSE_TASK):
            wave = value.get("wave")
            if isinstance(wave, int) and task_id == contract.close_task(wave):
                out[run_id]["waves"][wave] = value
        elif key == contract.ANSWER_KEY and isinstance(value, dict) and task_id.endswith("." + contract.CONFIRM_TASK):
            # the wave's answer as soon as it is given (its close records it again when the wave ends)
            wave = _wave_number(task_id)
            if wave is not None and task_id == contract.wave_task(wave, contract.CONFIRM_TASK):
                out[run_id]["answers"][wave] = value
        elif key == contract.SUMMARY_KEY and task_id == contract.SUMMARY_TASK:
            out[run_id]["summary"] = value
        elif key == contract.SUMMARY_TEXT_KEY and task_id == contract.SUMMARY_TASK and isinstance(value, str):
            out[run_id]["summary_text"] = value
    return out


#: How a wave's ETA begins while its question waits for a person.
WAITING_FOR = "waiting for "


def _wave_number(task_id: str) -> int | None:
    """The wave of a wave task's id (``wave_01.confirm`` -> 1), or None."""
    group = task_id.split(".", 1)[0]
    digits = group.rsplit("_", 1)[-1]
    return int(digits) if group.startswith("wave_") and digits.isdigit() else None


def approval_of(answer: dict[str, Any] | None) -> dict[str, Any] | None:
    """A wave question's answer as the page shows it (who, when, what), or None (none given, nothing to confirm)."""
    if not isinstance(answer, dict) or not answer.get("answer") or answer.get("answer") == "nothing to confirm":
        return None
    return {"by": answer.get("by"), "at": answer.get("at"), "answer": answer.get("answer")}


def _controls(session, run_ids: list[str]) -> dict[str, str]:
    """rollout run_id -> the raw value of its control Variable (absent: none set)."""
    Variable = model("Variable")
    from sqlalchemy import select

    from nexus_airflow import rollout as contract

    names = {contract.control_variable(r): r for r in run_ids}
    if not names:
        return {}
    rows = session.execute(select(Variable).where(Variable.key.in_(list(names)))).scalars().all()
    return {names[v.key]: str(v.get_val() or "") for v in rows}


def control_state(raw: str | None) -> str:
    """``pause``, ``cancel`` or ``run`` for a stored control value (the one rule: ``nexus_airflow.rollout``)."""
    from nexus_airflow.rollout import control_state as rule

    return rule(raw)


def _tenant_runs(session, run_ids: list[str]) -> dict[str, dict[str, Any]]:
    """cutover run_id -> {"state", "start_date", "end_date"} for the runs that exist (chunked IN queries)."""
    DagRun = model("DagRun")
    from sqlalchemy import select

    from nexus_airflow import rollout as contract
    from nexus_status.runs import _chunks

    out = {}
    for chunk in _chunks(sorted(set(run_ids))):
        rows = session.execute(select(DagRun.run_id, DagRun.state, DagRun.start_date, DagRun.end_date).where(
            DagRun.dag_id == contract.CUTOVER_DAG, DagRun.run_id.in_(chunk))).all()
        out.update({r: {"state": str(s), "start_date": a, "end_date": b} for r, s, a, b in rows})
    return out


def membership(rollout_run_id: str | None) -> tuple[str | None, dict[str, int]]:
    """(the rollout run, tenant -> wave) of ``rollout_run_id`` or the latest rollout run ({} if none)."""

    with metadata_session() as session:
        runs = _rollout_runs(session, 1, rollout_run_id)
        if not runs:
            return rollout_run_id, {}
        run_id = runs[0]["run_id"]
        plan = _rollout_xcoms(session, runs)[run_id]["plan"] or {}
    return run_id, {t: w.get("wave", i) for i, w in enumerate(plan.get("waves") or []) for t in w.get("tenants") or []}


def rollouts(limit: int = LATEST, cache=None) -> dict[str, Any]:
    """The latest ``limit`` rollout runs as the page shows them (see the module docstring)."""

    from nexus_airflow import rollout as contract
    from nexus_status.runs import summaries, task_states

    with metadata_session() as session:
        runs = _rollout_runs(session, limit)
        ids = [r["run_id"] for r in runs]
        xcoms = _rollout_xcoms(session, runs)
        controls = _controls(session, ids)
        wanted = {contract.run_id_for(r, t): (r, t) for r in ids for t in _plan_tenants(xcoms[r]["plan"])}
        tenant_runs = _tenant_runs(session, list(wanted))
        steps = summaries(session, contract.CUTOVER_DAG, {k: v["state"] for k, v in tenant_runs.items()})
        own = task_states(session, contract.ROLLOUT_DAG, ids)
    etas = _tenant_etas(tenant_runs, steps, wanted, cache)
    return {"rollouts": [_rollout(r, xcoms[r["run_id"]], controls.get(r["run_id"]), tenant_runs, steps, etas,
                                  own.get(r["run_id"], [])) for r in runs]}


def preflight_rows(run_id: str) -> list[dict[str, Any]] | None:
    """The preflight table of the rollout run ``run_id`` (None: no such run, or no table yet)."""

    with metadata_session() as session:
        runs = _rollout_runs(session, 1, run_id)
        return _rollout_xcoms(session, runs)[run_id]["preflight"] if runs else None


#: A preflight of more tenants shows only its wait and stop rows on the page (at most PAGE_ROWS; every row is in
#: its CSV): the page refreshes every 10 s and a fleet of 2,000 proceeding tenants says nothing to act on.
PAGE_ROWS = 200


def preflight_view(run_id: str, rows: list[dict[str, Any]] | None) -> dict[str, Any] | None:
    """The page's preflight section: the rows (see :data:`PAGE_ROWS`), their counts and the CSV's link."""
    from urllib.parse import quote

    from nexus_cutover.projection.preflight import PROCEED, counts

    if rows is None:
        return None
    shown = rows if len(rows) <= PAGE_ROWS else [r for r in rows if r.get("verdict") != PROCEED][:PAGE_ROWS]
    return {"rows": shown, "total": len(rows), "counts": counts(rows),
            "csv": "api/rollouts/preflight.csv?run_id=" + quote(run_id, safe="")}


def _plan_tenants(plan: dict[str, Any] | None) -> list[str]:
    return [t for w in (plan or {}).get("waves") or [] for t in w.get("tenants") or []]


def _tenant_etas(tenant_runs, steps, wanted, cache) -> dict[str, dict[str, Any]]:
    """cutover run_id -> drain ETA, for the runs still going (their tenants read through the shared cache)."""
    from nexus_status import history, tenants

    active = {r: wanted[r][1] for r, v in tenant_runs.items() if v["state"] in ("running", "queued")}
    known = set(tenants.tenant_conn_ids()) if active else set()
    conn_ids = [tenants.PREFIX + t for t in active.values() if tenants.PREFIX + t in known]
    if conn_ids:
        (cache or tenants.CACHE).get(conn_ids)
    out = {r: history.drain_eta(history.samples(t)) for r, t in active.items()}
    for r in out:  # past its drain, a tenant waiting for a person has no rate to measure
        if steps.get(r, {}).get("task_state") == "awaiting_input":
            out[r] = {**out[r], "eta_min": None, "text": "waits for a person (its confirmation)"}
    return out


def _tenant(rollout_run_id: str, tenant: str, tenant_runs, steps, etas) -> dict[str, Any]:
    from nexus_airflow import rollout as contract
    from nexus_status.runs import run_link

    run_id = contract.run_id_for(rollout_run_id, tenant)
    run = tenant_runs.get(run_id)
    if run is None:
        return {"tenant": tenant, "run_id": run_id, "state": "not started", "task": None, "task_state": None,
                "reason": None, "next_action": None, "link": None, "eta": None, "minutes": None}
    out = {**steps[run_id], "tenant": tenant, "link": run_link(contract.CUTOVER_DAG, run_id),
           "eta": etas.get(run_id), "minutes": None}
    if run["start_date"] and run["end_date"] and run["state"] == "success":
        out["minutes"] = round((run["end_date"] - run["start_date"]).total_seconds() / 60.0, 2)
    return out


def _wave_state(outcome: dict[str, Any] | None, tenants: list[dict[str, Any]]) -> str:
    if outcome:
        return str(outcome.get("state"))
    return "running" if any(t["state"] != "not started" for t in tenants) else "pending"


def _wave(plan_wave: dict[str, Any], outcome: dict[str, Any] | None, tenants: list[dict[str, Any]]) -> dict[str, Any]:
    state = _wave_state(outcome, tenants)
    for t in tenants:  # the wave's record names the reason when the tenant's run left none (e.g. a rejected wave)
        recorded = ((outcome or {}).get("failed") or {}).get(t["tenant"]) or {}
        if recorded.get("reason") and (not t.get("reason") or t["reason"].startswith("no reason recorded")):
            t["reason"] = str(recorded["reason"])
    eta, eta_text = _wave_eta(state, outcome, [t for t in tenants if t["state"] in ("running", "queued")])
    return {"wave": plan_wave.get("wave"), "name": plan_wave.get("name"), "state": state, "tenants": tenants,
            "succeeded": (outcome or {}).get("succeeded"), "failed": (outcome or {}).get("failed") or {},
            "approval": (outcome or {}).get("approval"), "closed": outcome is not None,
            "eta_min": eta, "eta_text": eta_text}


def _wave_eta(state: str, outcome, going: list[dict[str, Any]]) -> tuple[int | None, str]:
    """A wave's ETA: 0 once closed; while running, its slowest tenant's (None while one is unmeasured)."""
    if outcome:
        return 0, "closed"
    if state != "running":
        return None, "not started"
    unknown = [t["tenant"] for t in going if (t.get("eta") or {}).get("eta_min") is None]
    if unknown:
        return None, f"unknown: {', '.join(unknown[:10])} without a measured drain rate"
    eta = max([t["eta"]["eta_min"] for t in going], default=0)
    return eta, (f"~{eta} min" if going else "every tenant finished: closing")


def wave_step(wave: int, tasks: list[tuple[str, str]]) -> dict[str, str] | None:
    """The wave's own task that is active or failed (e.g. ``wave_01.confirm`` awaiting its approval), if any."""
    from nexus_airflow import rollout as contract
    from nexus_status.runs import ACTIVE, STOPPED

    prefix = contract.wave_group(wave) + "."
    mine = sorted((t, st) for t, st in tasks if t.startswith(prefix))
    for state in STOPPED + ACTIVE:
        for task, st in mine:
            if st == state:
                return {"task": task, "state": st}
    return None


def _rollout(run, xc, control_raw, tenant_runs, steps, etas, own_tasks=()) -> dict[str, Any]:
    from nexus_airflow import rollout as contract
    from nexus_status.runs import run_link

    plan = xc["plan"] or {}
    waves = []
    for i, w in enumerate(plan.get("waves") or []):
        k = w.get("wave", i)
        ts = [_tenant(run["run_id"], t, tenant_runs, steps, etas) for t in w.get("tenants") or []]
        wave = {**_wave({**w, "wave": k}, xc["waves"].get(k), ts), "step": wave_step(k, list(own_tasks))}
        if wave["approval"] is None:  # answered, not yet closed: who approved, and when
            wave["approval"] = approval_of((xc.get("answers") or {}).get(k))
        step = wave["step"] or {}
        if wave["approval"] is None and step.get("task", "").endswith("." + contract.CONFIRM_TASK) \
                and step.get("state") == "awaiting_input":  # the wave waits for a person, not for a drain
            who = ", ".join(plan.get("approvers") or []) or "an approver"
            wave["eta_min"], wave["eta_text"] = None, f"{WAITING_FOR}{who} to answer the wave's question"
        waves.append(wave)
    run = {k: v for k, v in run.items() if k != "_pk"}
    return {**run, "link": run_link(contract.ROLLOUT_DAG, run["run_id"]), "planned": bool(xc["plan"]),
            "approval": plan.get("approval"), "approvers": plan.get("approvers") or [],
            "max_failed": plan.get("max_failed"), "max_parallel": plan.get("max_parallel"),
            "skipped": plan.get("skipped") or {}, "waves": waves, "summary": xc["summary"],
            "summary_text": xc.get("summary_text"),
            "preflight": preflight_view(run["run_id"], xc.get("preflight")),
            "control": {"variable": contract.control_variable(run["run_id"]), "value": control_raw,
                        "state": control_state(control_raw)},
            "eta": rollout_eta(run["state"], waves, plan.get("max_parallel"))}


def rollout_eta(run_state: str, waves: list[dict[str, Any]], max_parallel: int | None) -> dict[str, Any]:
    """The rollout's ETA in minutes (see the module docstring), or None with the reason."""
    if run_state in ("success", "failed"):
        halted = [w["name"] for w in waves if w["state"] in ("halted", "cancelled")]
        text = f"halted at {halted[-1]}: no later wave starts" if halted and run_state == "failed" else "finished"
        return {"eta_min": 0 if run_state == "success" else None, "text": f"{text} ({run_state})", "final": run_state}
    done = [t["minutes"] for w in waves for t in w["tenants"] if t.get("minutes") is not None]
    total = 0.0
    for w in waves:
        if w["closed"]:
            continue
        if w["eta_text"].startswith(WAITING_FOR):  # a person's answer: no figure can say when it comes
            return {"eta_min": None, "text": f"{w['name']}: {w['eta_text']}"}
        if w["state"] == "running":
            if w["eta_min"] is None:
                return {"eta_min": None, "text": f"{w['name']}: {w['eta_text']}"}
            total += w["eta_min"]
        elif not done:
            return {"eta_min": None, "text": "unknown until a tenant of this rollout has finished"}
        else:
            rounds = math.ceil(len(w["tenants"]) / max(1, int(max_parallel or len(w["tenants"]) or 1)))
            total += statistics.median(done) * rounds
    if total == 0:
        return {"eta_min": 0, "text": "the open wave's tenants have all finished: waiting for it to close"}
    return {"eta_min": math.ceil(total), "text": f"~{math.ceil(total)} min"}

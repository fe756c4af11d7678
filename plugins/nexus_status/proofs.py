"""What each tenant's latest runs proved, read from the Airflow metadata DB (read only).

The tenant database holds no digest: the proofs live with the runs that made
them. For each tenant (a run's ``conf["tenant"]``), the latest run of

* the cutover DAG: the ``history_digest`` summary (hash, rows, chunks) and
  whether ``final_old_writer_check`` verified it (or the differences it named);
* the Field History DAG: the decisions digest of ``stage_2_materialize`` and
  the read-equivalence comparison of ``stage_3``.

Only summaries leave this module (never chunks, never a connection). The
steps are the ones declared with the proofs' roles (:data:`PROOF_ROLES`);
:mod:`nexus_airflow.results` maps them to task ids and reads their values (a step
the declaration lacks is a KeyError, never an empty proof).
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass, field
from typing import Any

from nexus_airflow import results
from nexus_airflow.compat import model
from nexus_airflow.compat import session as metadata_session

CUTOVER_DAG = "connector_projection_cutover"
FIELD_HISTORY_DAG = "field_history_eligibility"
log = logging.getLogger(__name__)
MAX_RUNS = 5000  # the newest runs looked at, all tenants together (a fleet of 2,000 has two DAGs)
#: Per DAG, the declared roles (:attr:`nexus_cutover.transition.Step.role`) of the steps whose results are the
#: proofs: the cutover's history digest and the final check that verifies it; Field History's decisions digest of
#: the materialization and the read-equivalence comparison of the read switch.
PROOF_ROLES = {CUTOVER_DAG: ("digest", "final"), FIELD_HISTORY_DAG: ("decisions", "read_switch")}
#: The declared steps whose results are the proofs, per DAG.
TASKS = {dag_id: tuple(results.step_with(role, dag_id) for role in roles) for dag_id, roles in PROOF_ROLES.items()}


def _value(raw: Any) -> Any:
    if isinstance(raw, str | bytes):
        with contextlib.suppress(ValueError):
            return json.loads(raw)
    return raw


#: How many runs newer than the one that matters a row names (each with its state and reason).
LATER_RUNS = 3


@dataclass
class ChosenRun:
    """The run of one DAG a tenant's row describes, and the runs triggered after it."""

    run_id: str
    state: str
    later: list[tuple[str, str]] = field(default_factory=list)  # (run_id, state), newest first


def holds(holder: str | None, dag_id: str, run_id: str) -> bool:
    """Whether the stored fence holder ``holder`` (``ArmedBy``) is run ``run_id`` of ``dag_id``: stored spellings
    compared (:func:`nexus_cutover.holders.same_holder`), so a run id too long to store whole is still matched."""
    from nexus_airflow.base import holder_of_run
    from nexus_cutover.holders import same_holder

    return same_holder(holder, holder_of_run(dag_id, run_id))


def runs_that_matter(session, tenants: set[str], holders: dict[str, str | None] | None = None
                     ) -> dict[tuple[str, str], ChosenRun]:
    """(dag_id, tenant) -> the run its row describes (one indexed query over the newest runs).

    For the cutover DAG that is the run named by ``holders[tenant]`` (the holder of the tenant's cutover fence
    in force, else of the last one released): the run that holds the tenant or last changed it. A run
    triggered after it (a second run refused while the tenant is held, a dry run) does not take its place: it
    is listed in ``later``. Without a holder among the runs, and for the Field History DAG, the newest run.
    """
    DagRun = model("DagRun")
    from sqlalchemy import select

    rows = session.execute(
        select(DagRun.dag_id, DagRun.run_id, DagRun.conf, DagRun.state)
        .where(DagRun.dag_id.in_(list(TASKS)))
        .order_by(DagRun.run_after.desc())
        .limit(MAX_RUNS)
    ).all()
    newest_first: dict[tuple[str, str], list[tuple[str, str]]] = {}
    for dag_id, run_id, conf, state in rows:
        tenant = (_value(conf) or {}).get("tenant")
        if tenant in tenants:
            newest_first.setdefault((dag_id, tenant), []).append((run_id, str(state)))
    chosen: dict[tuple[str, str], ChosenRun] = {}
    for (dag_id, tenant), runs in newest_first.items():
        holder = (holders or {}).get(tenant)
        at = next((i for i, (run_id, _s) in enumerate(runs) if holds(holder, dag_id, run_id)), 0)
        chosen[(dag_id, tenant)] = ChosenRun(*runs[at], later=runs[:at][:LATER_RUNS])
    return chosen


def _latest_runs(session, tenants: set[str]) -> dict[tuple[str, str], str]:
    """(dag_id, tenant) -> run_id of the newest run of each DAG for each tenant."""
    return {key: run.run_id for key, run in runs_that_matter(session, tenants).items()}


def _xcoms(session, runs: dict[tuple[str, str], str]) -> dict[tuple[str, str, str], Any]:
    """(run_id, task_id, key) -> value of the proof tasks' ``return_value`` and ``report`` XComs of ``runs``."""
    XComModel = model("XComModel")
    from sqlalchemy import select

    if not runs:
        return {}
    rows = session.execute(
        select(XComModel.run_id, XComModel.task_id, XComModel.key, XComModel.value).where(
            XComModel.dag_id.in_(list(TASKS)), XComModel.run_id.in_(list(set(runs.values()))),
            XComModel.task_id.in_(results.task_ids(TASKS)), XComModel.key.in_(results.keys_of(TASKS)),
        )
    ).all()
    return {(run_id, task_id, key): _value(value) for run_id, task_id, key, value in rows}


def cutover_proof(run_id: str, xcoms: dict[tuple[str, str, str], Any]) -> dict[str, Any]:
    """The history digest of one cutover run and its verification, as the page shows it."""
    digest_step, final_step = TASKS[CUTOVER_DAG]
    digest = results.stored(xcoms, run_id, digest_step, dag_id=CUTOVER_DAG)
    final = results.stored(xcoms, run_id, final_step, dag_id=CUTOVER_DAG) or {}
    stopped = results.stored(xcoms, run_id, final_step, dag_id=CUTOVER_DAG, key=results.REPORT_KEY)
    report = (stopped or {}).get("history")
    out: dict[str, Any] = {"run_id": run_id, "digest": None, "verified": None}
    if not digest or "hash" not in digest:
        out["text"] = "no history digest yet"
        return out
    out["digest"] = {k: digest.get(k) for k in ("hash", "rows", "chunks", "taken_at")}
    rows = ", ".join(f"{n.removeprefix('_System_')} {r}" for n, r in (digest.get("rows") or {}).items())
    if (final.get(digest_step) or {}).get("verified"):  # the final check reports its verification under its name
        out["verified"] = True
        out["text"] = f"history digest {digest['hash']} ({rows}) verified: no history row changed"
    elif report:
        out["verified"] = False
        out["differences"] = len(report.get("differences", []))
        out["text"] = f"history digest {digest['hash']} NOT verified: {report.get('summary', '')}"[:600]
    else:
        out["text"] = f"history digest {digest['hash']} ({rows}) taken {digest.get('taken_at', '')}; verified at the run's end"
    return out


def field_history_proof(run_id: str, xcoms: dict[tuple[str, str, str], Any]) -> dict[str, Any]:
    """The decisions digest of stage 2 and the read-equivalence comparison of stage 3 of one Field History run."""
    out: dict[str, Any] = {"run_id": run_id}
    decisions, read_switch = TASKS[FIELD_HISTORY_DAG]  # each proof shown under its step's name
    stage_2 = _report(xcoms, run_id, decisions)
    counts = stage_2.get("counts") or {}
    if "decided_digest" in counts:
        out[decisions] = {"passed": stage_2.get("passed"), "decided_rows": counts.get("decided_rows"),
                                      "decided_digest": counts["decided_digest"]}
    comparison = _report(xcoms, run_id, read_switch).get("comparison") or {}
    if comparison:
        out[read_switch] = {"equal": comparison.get("equal"), "chunks": comparison.get("chunks"),
                          "compat_accepted": comparison.get("compat_accepted"),
                          "boolean_only_accepted": comparison.get("boolean_only_accepted"),
                          "differences": len(comparison.get("differences") or [])}
    return out


def _report(xcoms: dict[tuple[str, str, str], Any], run_id: str, step: str) -> dict[str, Any]:
    """A gate's report: its return value, or the report it pushed when it stopped."""
    value = (results.stored(xcoms, run_id, step, dag_id=FIELD_HISTORY_DAG)
             or results.stored(xcoms, run_id, step, dag_id=FIELD_HISTORY_DAG, key=results.REPORT_KEY) or {})
    return value if isinstance(value, dict) else {}


def latest_proofs(tenants: list[str]) -> dict[str, dict[str, Any]]:
    """tenant -> {"cutover": ..., "field_history": ...} for the tenants that have runs; {} without a metadata DB."""
    try:

        with metadata_session() as session:
            runs = _latest_runs(session, set(tenants))
            xcoms = _xcoms(session, runs)
    except Exception as exc:  # noqa: BLE001 - no metadata DB (a unit call): the tenant databases still show
        log.warning("the runs' proofs could not be read from the metadata DB: %s", exc)
        return {}
    return proofs_for(runs, xcoms)


def proofs_for(runs: dict[tuple[str, str], str], xcoms: dict[tuple[str, str, str], Any]) -> dict[str, dict[str, Any]]:
    """tenant -> its proofs, from :func:`_latest_runs` and :func:`_xcoms` (no query here)."""
    out: dict[str, dict[str, Any]] = {}
    for (dag_id, tenant), run_id in runs.items():
        proofs = out.setdefault(tenant, {})
        if dag_id == CUTOVER_DAG:
            proofs["cutover"] = cutover_proof(run_id, xcoms)
        else:
            proofs["field_history"] = field_history_proof(run_id, xcoms)
    return out

"""The fleet rollout's shared vocabulary: tenant run ids, wave XCom keys and the pause/resume/cancel control.

Used by ``dags/tenant_rollout.py`` (its tasks), by the per-tenant cutover's wave
confirmation and by the status view's rollout page, so each rule lives here once.

Invariants:

* a tenant's cutover run of a rollout has the run id :func:`run_id_for` (one per
  tenant per rollout run: deterministic, so a rerun finds it);
* the rollout's plan publishes XCom ``rollout`` (:data:`PLAN_KEY`): the waves in
  order (wave 0 is the canary) with their tenants, the approval mode, approvers
  and failure budget, and the tenants it skipped because they are already cut over;
* each wave's ``close`` task publishes XCom ``wave`` (:data:`WAVE_KEY`): its state
  (``succeeded`` / ``halted`` / ``cancelled``), succeeded and failed tenants (with
  the failing task and reason) and its approval (who, when, what);
* the rollout DAG's task ids and XCom keys are declared here, once, and every read of
  a rollout task's XCom goes through a reader of this module (:func:`plan_of`,
  :func:`preflight_rows`, :func:`wave_answer`, ...: see "what the rollout's tasks pass
  each other" below): no other plugin module spells a task id of the rollout DAG;
* the control of a rollout run is the Airflow Variable :func:`control_variable`
  holding ``pause``, ``resume`` or ``cancel``; no Variable means run. Pause stops
  new tenants from starting (running ones finish); cancel also stops running
  tenants at their next safe point, which is always before a checkpoint.
"""

from __future__ import annotations

import hashlib
import re
from collections.abc import Callable

ROLLOUT_DAG = "tenant_rollout"
CUTOVER_DAG = "connector_projection_cutover"
PLAN_KEY = "rollout"
WAVE_KEY = "wave"
SUMMARY_KEY = "summary"
SUMMARY_TEXT_KEY = "summary_text"  # the summary as the lines a person reads (the task log's)
PREFLIGHT_KEY = "preflight"  # the preflight's table: one row per tenant
MODE_KEY = "mode"  # the preflight's: the form's mode (``preflight`` ends the rollout there)
REFUSAL_KEY = "refusal"  # the preflight's or the plan's: why the form was refused
ANSWER_KEY = "answer"  # a wave's confirm: the wave question's answer
SHOWN_KEY = "shown"  # a wave's confirm: tenant -> the evidence time its question showed
PREFLIGHT_TASK = "preflight"
PLAN_TASK = "plan"
SUMMARY_TASK = "summary"
OPEN_TASK = "open"
LANE_TASK = "cutover"
CONFIRM_TASK = "confirm"
CLOSE_TASK = "close"
#: Each wave group's tasks: open (its lanes), cutover (mapped per lane), confirm (per-wave question), close.
WAVE_TASKS = (OPEN_TASK, LANE_TASK, CONFIRM_TASK, CLOSE_TASK)
CONTROL_ACTIONS = ("pause", "resume", "cancel")
#: Most waves of one rollout (the DAG declares this many wave groups; unused ones are skipped).
MAX_WAVES = 20


def run_id_for(rollout_run_id: str, tenant: str) -> str:
    """The run id of ``tenant``'s cutover run started by the rollout run ``rollout_run_id``: ``rollout__<rollout run
    id>__<tenant>`` when that is a run id as it is (Airflow's 250 characters, its characters); otherwise the rollout
    run id's safe characters, cut, with ``__h`` and a digest of it, then the whole tenant. Never cut at the end:
    two tenants (or two rollout runs) never get one run id."""
    plain = f"rollout__{rollout_run_id}__{tenant}"
    safe = re.sub(r"[^A-Za-z0-9_.~:+-]", "_", plain)
    if safe == plain and len(plain) <= 250:
        return plain
    digest = hashlib.sha256(rollout_run_id.encode("utf-8")).hexdigest()[:32]
    head = re.sub(r"[^A-Za-z0-9_.~:+-]", "_", rollout_run_id)[: 250 - len("rollout__") - 3 - len(digest) - 2 - len(tenant)]
    return f"rollout__{head}__h{digest}__{tenant}"


def wave_group(wave: int) -> str:
    """The task group of wave ``wave`` (``wave_00`` is the canary)."""
    return f"wave_{wave:02d}"


def wave_task(wave: int, name: str) -> str:
    """The task id of wave ``wave``'s task ``name`` (one of :data:`WAVE_TASKS`)."""
    return f"{wave_group(wave)}.{name}"


def close_task(wave: int) -> str:
    """The task id of wave ``wave``'s ``close`` (its XCom ``wave`` is the wave's outcome)."""
    return wave_task(wave, CLOSE_TASK)


def unused_wave_tasks(planned_waves: int) -> list[str]:
    """The task ids of every wave group past the plan's ``planned_waves`` (skipped by ``plan`` in one call)."""
    return [wave_task(k, name) for k in range(planned_waves, MAX_WAVES) for name in WAVE_TASKS]


# --- what the rollout's tasks pass each other: every read of a rollout task's XCom, by its declared task id ---

def plan_of(ti) -> dict | None:
    """``plan``'s XCom ``rollout``: the waves, the approval, the budget, the skipped tenants, the triggers."""
    return ti.xcom_pull(task_ids=PLAN_TASK, key=PLAN_KEY)


def plan_of_run(ti, rollout_run_id: str) -> dict | None:
    """The plan (:func:`plan_of`) of the rollout run ``rollout_run_id``, read from one of its tenants' runs."""
    return ti.xcom_pull(dag_id=ROLLOUT_DAG, run_id=rollout_run_id, task_ids=PLAN_TASK, key=PLAN_KEY)


def wave_order(ti, rollout: dict) -> list[str]:
    """The tenants of the wave a tenant's run belongs to, in the wave's declared order (``rollout``: its conf's
    ``rollout``); empty when the run is no rollout's or its plan cannot be read."""
    if not rollout.get("run_id") or not isinstance(rollout.get("wave"), int):
        return []
    waves = (plan_of_run(ti, rollout["run_id"]) or {}).get("waves") or []
    return list(waves[rollout["wave"]]["tenants"]) if rollout["wave"] < len(waves) else []


def preflight_rows(ti) -> list | None:
    """``preflight``'s table (XCom ``preflight``): one row per tenant; None when the preflight published none."""
    return ti.xcom_pull(task_ids=PREFLIGHT_TASK, key=PREFLIGHT_KEY)


def preflight_mode(ti) -> str | None:
    """The form's ``mode`` as the preflight read it (``preflight``: the rollout ends after it)."""
    return ti.xcom_pull(task_ids=PREFLIGHT_TASK, key=MODE_KEY)


def refusal(ti) -> str | None:
    """Why the form was refused: the preflight's reason, else the plan's; None when neither refused it."""
    return ti.xcom_pull(task_ids=PREFLIGHT_TASK, key=REFUSAL_KEY) or ti.xcom_pull(task_ids=PLAN_TASK, key=REFUSAL_KEY)


def wave_lanes(ti, wave: int) -> list | None:
    """Wave ``wave``'s ``open``: its lanes (each with its tenants' triggers); None when the wave did not open."""
    return ti.xcom_pull(task_ids=wave_task(wave, OPEN_TASK))


def wave_answer(ti, wave: int, *, rollout_run_id: str | None = None) -> dict | None:
    """Wave ``wave``'s ``confirm``: the answer to its question (XCom ``answer``), of this rollout run, or of the
    rollout run ``rollout_run_id`` (read from a tenant's cutover run); None before it was answered."""
    if rollout_run_id is None:
        return ti.xcom_pull(task_ids=wave_task(wave, CONFIRM_TASK), key=ANSWER_KEY)
    return ti.xcom_pull(dag_id=ROLLOUT_DAG, run_id=rollout_run_id, task_ids=wave_task(wave, CONFIRM_TASK),
                        key=ANSWER_KEY, map_indexes=-1)


def wave_shown(ti, wave: int, *, rollout_run_id: str | None = None) -> dict | None:
    """Wave ``wave``'s ``confirm``: tenant -> the evidence time its question showed (XCom ``shown``, pushed before
    it is asked), of this rollout run or of ``rollout_run_id``; None before the question was asked."""
    if rollout_run_id is None:
        return ti.xcom_pull(task_ids=wave_task(wave, CONFIRM_TASK), key=SHOWN_KEY)
    return ti.xcom_pull(dag_id=ROLLOUT_DAG, run_id=rollout_run_id, task_ids=wave_task(wave, CONFIRM_TASK),
                        key=SHOWN_KEY, map_indexes=-1)


def wave_wait_state(answer: dict | None, shown: dict | None, rollout_state: str, tenant: str) -> str:
    """Where a tenant waiting for its wave's answer stands (the one rule its confirmation and its trigger share):
    ``answered``; ``rollout_ended`` (the rollout run ended with no answer); ``not_shown`` (the wave's question was
    asked without this tenant: it asks its own); else ``waiting``."""
    if answer:
        return "answered"
    if state_word(rollout_state) in ("success", "failed"):
        return "rollout_ended"
    if shown is not None and tenant not in shown:
        return "not_shown"
    return "waiting"


def wave_outcome(ti, wave: int) -> dict | None:
    """Wave ``wave``'s ``close``: the wave's outcome (XCom ``wave``); None before it closed."""
    return ti.xcom_pull(task_ids=close_task(wave), key=WAVE_KEY)


CONTROL_PREFIX = "nexus_rollout_control__"


def control_variable(rollout_run_id: str) -> str:
    """The Airflow Variable that pauses, resumes or cancels the rollout run ``rollout_run_id``: the prefix and the
    run id as it is when it has only letters, digits, ``_``, ``.`` and ``-`` and fits; otherwise its safe characters
    (others as ``_``), cut, and ``__h`` with a digest of the whole run id, so two rollout runs never share a
    control (``a:b`` and ``a_b`` differ, and so do two long ids equal in their first 200 characters). The rollouts
    page shows each run's control name."""
    safe = re.sub(r"[^A-Za-z0-9_.-]", "_", rollout_run_id)
    if safe == rollout_run_id and len(safe) <= 200:
        return CONTROL_PREFIX + safe
    digest = hashlib.sha256(rollout_run_id.encode("utf-8")).hexdigest()[:32]
    return CONTROL_PREFIX + safe[: 200 - 3 - len(digest)] + "__h" + digest


def plan_waves(tenants: list[str], canary: int | list[str], wave_size: int) -> list[dict]:
    """The waves of a rollout: wave 0 the canary (the first ``canary`` tenants, or those named), then waves of
    ``wave_size`` in the order given. Raises ``ValueError`` naming what to fix."""
    if wave_size < 1:
        raise ValueError("wave_size must be at least 1")
    if isinstance(canary, list):
        unknown = sorted(set(canary) - set(tenants))
        if unknown:
            raise ValueError(f"canary names tenant(s) not in the rollout: {unknown}")
        first = [t for t in tenants if t in set(canary)]
    else:
        if canary < 0:
            raise ValueError("canary must be a count >= 0 or a list of tenants")
        first = tenants[:canary]
    rest = [t for t in tenants if t not in set(first)]
    waves = [first] if first else []
    waves += [rest[i:i + wave_size] for i in range(0, len(rest), wave_size)]
    if len(waves) > MAX_WAVES:
        raise ValueError(f"{len(tenants)} tenants make {len(waves)} waves, more than {MAX_WAVES}: raise wave_size "
                         f"to at least {-(-len(rest) // (MAX_WAVES - (1 if first else 0)))}")
    return [{"wave": i, "name": "canary" if (i == 0 and first) else f"wave {i}", "tenants": w}
            for i, w in enumerate(waves)]


def failure_budget(max_failed: int | float, wave_tenants: int) -> int:
    """How many tenants of a wave may fail before the rollout halts: a count, or a fraction of the wave
    (``0.2`` of 5 tenants is 1). Past it the rollout halts before the next wave."""
    if isinstance(max_failed, float) and 0 <= max_failed < 1:
        return int(max_failed * wave_tenants)
    if max_failed < 0:
        raise ValueError("max_failed must be a count >= 0 or a fraction in [0, 1)")
    return int(max_failed)


def stop_if_cancelled(context, log, safe_point: str) -> None:
    """At a safe point of a tenant's cutover run started by a rollout: stop if that rollout was cancelled.

    Safe points come before the checkpoint (the writer-stop confirmation, the audit); the fence stays armed
    and is reported by the run's stop message."""
    rollout = (context["params"].get("rollout") or {}) if "params" in context else {}
    if not rollout.get("run_id"):
        return
    if read_control(rollout["run_id"]) == "cancel":
        from nexus_airflow.base import stop

        stop(context, log, f"cancelled: rollout run {rollout['run_id']} was cancelled; this tenant stopped at "
             f"{safe_point}, before its checkpoint. Its admission fence stays armed (rerun the tenant to finish).",
             {"cancelled_by_rollout": rollout["run_id"], "safe_point": safe_point})


def read_control(rollout_run_id: str) -> str:
    """``pause``, ``cancel`` or ``run`` (no Variable, ``resume``, or anything else: run) for a rollout run."""
    from airflow.sdk import Variable

    return control_state(Variable.get(control_variable(rollout_run_id), default=""))


def control_state(raw: str | None) -> str:
    """The control a stored Variable value means: ``pause``, ``cancel``, else ``run``."""
    value = str(raw or "").strip().lower()
    return value if value in ("pause", "cancel") else "run"


# --- what every rollout task shares --------------------------------------------------------------------------

#: How often a waiting wave task looks again (s): the shared ``poll_interval`` when the rollout sets one.
WAIT_S = 30


def state_word(state) -> str:
    """A DagRun/TaskInstance state as one lowercase word (an enum, its repr or its value)."""
    return str(getattr(state, "value", state)).rsplit(".", 1)[-1].lower()


def run_states(run_ids: list[str], *, succeeded: Callable[[list[str]], int],
               exists: Callable[[str], bool], state_of: Callable[[str], str]) -> dict[str, str]:
    """Each run's state word ("not started" for a run that does not exist), with as few reads as it takes.

    ``succeeded(ids)`` counts the succeeded runs among ``ids`` in one read: when every run succeeded (a wave's
    usual end) that one read answers for all of them. Else the runs are halved until a half has all succeeded
    or one run is left, which is read by itself: about log2(n) + 2 reads per run that did not succeed, instead
    of two reads per run (Airflow's Task SDK reads one run's state per call).
    """
    if not run_ids:
        return {}
    if succeeded(run_ids) == len(run_ids):
        return dict.fromkeys(run_ids, "success")
    if len(run_ids) == 1:
        (rid,) = run_ids
        return {rid: state_word(state_of(rid)) if exists(rid) else "not started"}
    half = len(run_ids) // 2
    return {**run_states(run_ids[:half], succeeded=succeeded, exists=exists, state_of=state_of),
            **run_states(run_ids[half:], succeeded=succeeded, exists=exists, state_of=state_of)}


def runs_matching(run_ids: list[str], *, count: Callable[[list[str]], int]) -> set[str]:
    """The runs among ``run_ids`` that ``count(ids)`` counts (one read per call): one read when none matches, else
    the runs are halved down to the matching ones, about 2 log2(n) reads per match instead of a read per run."""
    if not run_ids or count(run_ids) == 0:
        return set()
    if len(run_ids) == 1:
        return set(run_ids)
    half = len(run_ids) // 2
    return runs_matching(run_ids[:half], count=count) | runs_matching(run_ids[half:], count=count)


def ended_cutover_runs(ti, run_ids: list[str]) -> set[str]:
    """The cutover runs among ``run_ids`` that ended (succeeded or failed): :func:`runs_matching` over Task SDK
    counts, one call while none has ended."""
    return runs_matching(list(run_ids), count=lambda ids: ti.get_dr_count(
        dag_id=CUTOVER_DAG, run_ids=ids, states=["success", "failed"]))


def cutover_run_states(ti, run_ids: list[str]) -> dict[str, str]:
    """:func:`run_states` of cutover runs, read through the task's Task SDK calls."""
    return run_states(
        list(run_ids),
        succeeded=lambda ids: ti.get_dr_count(dag_id=CUTOVER_DAG, run_ids=ids, states=["success"]),
        exists=lambda rid: bool(ti.get_dr_count(dag_id=CUTOVER_DAG, run_ids=[rid])),
        state_of=lambda rid: ti.get_dagrun_state(dag_id=CUTOVER_DAG, run_id=rid))


def wait_s(params: dict) -> int:
    return int((params.get("cutover_conf") or {}).get("poll_interval") or WAIT_S)


def later(seconds: int):
    """Reschedule the task in ``seconds`` (no slot held meanwhile)."""
    import datetime as dt

    from airflow.sdk.exceptions import AirflowRescheduleException

    return AirflowRescheduleException(dt.datetime.now(dt.UTC) + dt.timedelta(seconds=seconds))  # Airflow: aware


def fail(message: str):
    """The rollout stops here: the reason as the log's last lines, no retry, no traceback."""
    import logging

    from nexus_airflow.base import stopped

    return stopped(logging.getLogger("nexus.rollout"), message)

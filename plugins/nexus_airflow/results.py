"""What the cutover's tasks pass each other, read in one place: each step's result by its declared name.

A step's result is serialized once, by the task that produces it (its
``as_json()``, XCom ``return_value``, or one of the keys below); every other
task, the HITL steps and the rollout read it back here, typed, by the step's
name from :data:`~nexus_cutover.projection.transition.CUTOVER` (never a task id
string of their own); a reader that needs one specific step's result asks for the
step by its declared role (:func:`step_with`: ``packs``, ``fence``, ``digest``, ...),
never by a name of its own. A name the declaration does not have is a programming
error (KeyError), not an empty result. The status view, which reads many runs'
XComs in one query, names the steps and reads the values here too
(:func:`task_ids`, :func:`stored`), by the declaration of the DAG that ran them
(the cutover or Field History, :func:`transition_of`).

Light to import: domain types are imported inside the readers.
"""

from __future__ import annotations

from typing import Any

#: XCom keys besides ``return_value``: the full history digest (its summary is the return value), the evidence a
#: person was shown, the re-check when the answer arrived, a refused audit's findings, a stop's report.
DIGEST_KEY = "digest"
EVIDENCE_KEY = "evidence"
RECHECK_KEY = "recheck"
FINDINGS_KEY = "findings"
REPORT_KEY = "report"
RETURN_KEY = "return_value"
#: The product version a step of the cutover or Field History ran on (:mod:`nexus_cutover.code_version`): the run's
#: first step's is the version the run started with.
VERSION_KEY = "product_version"


def transition_of(dag_id: str):
    """The declared transition the DAG ``dag_id`` runs (the cutover's, the back-out's or Field History's); KeyError
    for any other."""
    from nexus_cutover.field_history.transition import FIELD_HISTORY
    from nexus_cutover.projection.transition import BACK_OUT, CUTOVER

    return {t.name: t for t in (CUTOVER, BACK_OUT, FIELD_HISTORY)}[dag_id]


def step_with(role: str, dag_id: str | None = None) -> str:
    """The name of the declared step with the role ``role`` (:attr:`~nexus_cutover.transition.Step.role`) in the
    DAG ``dag_id`` (the cutover's when None); KeyError when no step has it."""
    from nexus_cutover.projection.transition import CUTOVER

    return transition_of(CUTOVER.name if dag_id is None else dag_id).with_role(role).name


def task_id(step: str, dag_id: str | None = None) -> str:
    """The task id that runs the declared step ``step`` of the DAG ``dag_id`` (the cutover's when None)."""
    return location(step, dag_id=dag_id)[0]


def location(step: str, key: str = RETURN_KEY, *, dag_id: str | None = None) -> tuple[str, str]:
    """Where the XCom ``key`` of the declared step ``step`` is: ``(task id, XCom key)``. A step of a fused task
    (:data:`nexus_airflow.declared.FUSED`) keeps its value under its own name; its other keys are the task's."""
    from nexus_airflow.declared import steps_of, task_of
    from nexus_cutover.projection.transition import CUTOVER

    dag = CUTOVER.name if dag_id is None else dag_id
    name = transition_of(dag)[step].name
    task = task_of(dag, name)
    return task, (name if key == RETURN_KEY and len(steps_of(dag, task)) > 1 else key)


def task_ids(steps: dict[str, tuple[str, ...]]) -> list[str]:
    """The task ids of ``steps`` (DAG id -> declared step names), for a query over several DAGs' XComs."""
    return list(dict.fromkeys(task_id(step, dag_id) for dag_id, names in steps.items() for step in names))


def keys_of(steps: dict[str, tuple[str, ...]], keys: tuple[str, ...] = (RETURN_KEY, REPORT_KEY)) -> list[str]:
    """The XCom keys the ``keys`` of ``steps`` (DAG id -> declared step names) are stored under, for that query."""
    return sorted({location(step, key, dag_id=dag_id)[1] for dag_id, names in steps.items() for step in names
                   for key in keys})


def stored(xcoms: dict[tuple[str, str, str], Any], run_id: str, step: str, *, dag_id: str | None = None,
           key: str = RETURN_KEY) -> Any:
    """The XCom ``key`` of the declared step ``step`` in the run ``run_id`` of ``dag_id`` (the cutover's when
    None), from XComs read in bulk (``(run_id, task_id, key) -> value``); None when absent."""
    return xcoms.get((run_id, *location(step, key, dag_id=dag_id)))


def pulled(ti, step: str, *, key: str = RETURN_KEY, dag_id: str | None = None, run_id: str | None = None,
           map_indexes: int | None = None) -> Any:
    """The XCom ``key`` of the declared step ``step`` (of this run, or of the cutover run ``run_id``): a step this
    run's own DAG declares (the back-out's steps in its run) by that declaration, any other as the cutover's."""
    from nexus_cutover.projection.transition import CUTOVER

    task, xcom_key = location(step, key, dag_id=dag_id or _declaring(ti, step, run_id) or CUTOVER.name)
    where: dict[str, Any] = {} if run_id is None else {"dag_id": dag_id or CUTOVER.name, "run_id": run_id}
    if map_indexes is not None:
        where["map_indexes"] = map_indexes
    return ti.xcom_pull(task_ids=task, key=xcom_key, **where)


def _declaring(ti, step: str, run_id: str | None) -> str | None:
    """The DAG of ``ti`` when it declares ``step`` and the XCom is this run's (None otherwise)."""
    own = getattr(ti, "dag_id", None)
    try:
        return own if run_id is None and own and step in transition_of(own).names else None
    except KeyError:  # a DAG that declares no steps (the rollout's)
        return None


def versions_before(ti) -> list[tuple[str, str | None]]:
    """The product versions the code pin of this task compares with (:func:`nexus_airflow.base.pin_the_code`), as
    ``(recorded by, version)``: the run's first declared step's (the run's pin) and the declared step's just before
    this one (every map index of a mapped one; its own pin saw the ones before it, so a run cannot be re-pinned by
    clearing its first step alone). Empty for the first step: it records the pin. KeyError: not a declared step of
    the cutover or Field History."""
    from nexus_airflow.declared import steps_of, task_of

    transition = transition_of(ti.dag_id)
    names = transition.names
    first_step = steps_of(ti.dag_id, ti.task_id)[0]  # a fused task's first step: the one before it is another task's
    position = names.index(first_step) if first_step in names else -1
    if position < 0:
        raise KeyError(ti.task_id)
    compared = list(dict.fromkeys([names[0], names[position - 1]])) if position > 0 else []
    found: list[tuple[str, str | None]] = []
    for step in compared:
        values = ti.xcom_pull(task_ids=[task_of(ti.dag_id, transition[step].name)], key=VERSION_KEY)
        found += [(step, value) for value in (values or []) if value is not None]
    return found


def each(raw: Any) -> list[dict[str, Any]]:
    """A task's results as a list: a mapped task's one per map index, one pack's the dict itself."""
    return [r for r in ([raw] if isinstance(raw, dict) else list(raw or [])) if isinstance(r, dict)]


def packs(ti) -> list[str]:
    """The step with the role ``packs`` (``resolve_packs``): the run's packs, ascending."""
    return list(pulled(ti, step_with("packs")) or [])


def fence(ti):
    """The step with the role ``fence`` (``arm_fence``): its
    :class:`~nexus_cutover.projection.cutover_fence.FenceResult`, or None before it ran."""
    from nexus_cutover.projection.steps import FenceResult

    raw = pulled(ti, step_with("fence"))
    return FenceResult.from_json(raw) if isinstance(raw, dict) and "outcome" in raw else None


def cut_over_before(ti) -> str | None:
    """When the run found its tenant cut over before it (its fence step: ``not_needed``), what it says: when and by
    which run (:func:`nexus_cutover.projection.steps.already_cut_over`); else None."""
    from nexus_cutover.projection.steps import already_cut_over

    found = fence(ti)
    return already_cut_over(found.as_json()) if found is not None and found.not_needed else None


def checkpoints(ti) -> dict[str, int | None]:
    """The step with the role ``checkpoints`` (``audit_and_checkpoint``): pack -> its LegacyMaxOrdinal (None when
    not written), over every map index."""
    return {r["pack_install_id"]: r.get("legacy_max_ordinal") for r in each(pulled(ti, step_with("checkpoints")))}


def digest(ti):
    """The step with the role ``digest`` (``history_digest``): the full
    :class:`~nexus_cutover.projection.digest.HistoryDigest`, or None if absent."""
    from nexus_cutover.projection.steps import HistoryDigest

    raw = pulled(ti, step_with("digest"), key=DIGEST_KEY)
    return None if raw is None else HistoryDigest.from_json(raw)


def evidence_shown(ti, *, run_id: str | None = None) -> dict[str, Any] | None:
    """The step with the role ``confirmation`` (``confirm_writers_stopped``): the old-writer evidence shown to the
    person (its ``as_json()``), if any."""
    raw = pulled(ti, step_with("confirmation"), key=EVIDENCE_KEY, run_id=run_id, map_indexes=-1 if run_id else None)
    return raw if isinstance(raw, dict) else None


def writers_stop(ti, *, run_id: str | None = None) -> dict[str, Any] | None:
    """The step with the role ``writers_stop`` (``stop_old_writers``): the writer-stop controller's answer (``manual``:
    ``{"controller": "manual"}``), if any."""
    raw = pulled(ti, step_with("writers_stop"), run_id=run_id, map_indexes=-1 if run_id else None)
    return raw if isinstance(raw, dict) else None


def release(ti, *, run_id: str | None = None) -> dict[str, Any] | None:
    """The step with the role ``release`` (``resume_admission``): the release's result (its ``admission_pause_s``,
    ``armed_at``, ``released_at``), if any."""
    raw = pulled(ti, step_with("release"), run_id=run_id, map_indexes=-1 if run_id else None)
    return raw if isinstance(raw, dict) else None


def confirmation(ti, *, run_id: str | None = None) -> dict[str, Any] | None:
    """The step with the role ``confirmation``: the accepted answer (``responded_by``, the evidence's age), if any."""
    raw = pulled(ti, step_with("confirmation"), run_id=run_id, map_indexes=-1 if run_id else None)
    return raw if isinstance(raw, dict) else None


def drain(ti, *, run_id: str | None = None) -> dict[str, Any]:
    """The step with the role ``drain`` (``wait_for_drain``): the last drain report (its ``as_json()``), empty
    before the step ran."""
    raw = pulled(ti, step_with("drain"), run_id=run_id, map_indexes=-1 if run_id else None)
    return raw if isinstance(raw, dict) else {}


def stop_report(ti, step: str, *, run_id: str, map_index: int = -1) -> dict[str, Any] | None:
    """The report a stopped step pushed (:func:`nexus_airflow.base.stop`) in the cutover run ``run_id``."""
    raw = pulled(ti, step, key=REPORT_KEY, run_id=run_id, map_indexes=map_index)
    return raw if isinstance(raw, dict) else None

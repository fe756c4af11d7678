"""A DAG's tasks built from a declared transition (:mod:`nexus_cutover.transition`): the order is the declaration's.

A DAG file names its operators by declared role or kind (never a step's name); :func:`build` creates one task per
declared step, in the declared order, inside one TaskGroup per declared stage (when the stage names one), each with
the task doc the declaration gives it (and its dry run), maps a per-pack step over the step it is declared per pack
of, and chains them. A step no operator is given for fails the parse: the DAG cannot drift from the declaration,
and its docs (:func:`steps_md`, the task docs) are the declaration's.

A fused task (:data:`FUSED`, declared by its steps' ``fused_into``) runs consecutive steps of one declared stage that
no person and no wait separate (a wait may lead them: the task waits, then runs the rest without a handoff), each step
still its own record: its value in XCom under the step's name, its log section, its metric (issue 36, item 4). Whoever
reads a step's result or names its task asks here (:func:`task_of`, :func:`steps_of`), never spells a task id of its own.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from typing import Any

from nexus_cutover import settings
from nexus_cutover.field_history.transition import FIELD_HISTORY
from nexus_cutover.projection.transition import BACK_OUT, CUTOVER
from nexus_cutover.transition import Kind

__all__ = ["ARMED_WINDOWS", "BACK_OUT", "CUTOVER", "FIELD_HISTORY", "FUSED", "HEAVY_READS", "Kind", "PRIORITY_ARMED",
           "PRIORITY_BEFORE_ARMING", "build",
           "steps_md", "steps_of", "task_of"]

#: Absolute task priorities (``weight_rule="absolute"``): Airflow's scheduler and executors take queued work by
#: priority, and its default rule (``downstream``) ranks a run's first tasks above its last ones, so a new tenant's
#: first tasks went before an armed tenant's remaining ones (16 lanes on 4 slots: an 86 s median admission pause,
#: docs/performance.md). Every task of a run after it armed the fence, and a rollout's wave question, outrank the
#: tasks before arming (issue 36, item 3).
PRIORITY_ARMED, PRIORITY_BEFORE_ARMING = 1000, 1  # 1000: above any downstream-weighted task of ours (<= ~100)

#: DAG -> the steps whose reads weigh on the tenant's database cluster (declared
#: :attr:`~nexus_cutover.transition.Step.heavy_read`): their task instances run in the run's ``read_pool``
#: (:mod:`nexus_airflow.policies`).
HEAVY_READS = {t.name: tuple(s.name for s in t if s.heavy_read) for t in (CUTOVER, FIELD_HISTORY)}


def armed_window(transition) -> tuple[str, str, tuple[str, ...]] | None:
    """The tasks of a transition's admission pause: ``(fence task, release task, the tasks after the fence up to and
    including the release)``, read from the steps declared with the roles ``fence`` and ``release``; None when the
    transition arms no fence."""
    try:
        fence, release = transition.with_role("fence").name, transition.with_role("release").name
    except KeyError:
        return None
    names = transition.names[transition.names.index(fence) + 1: transition.names.index(release) + 1]
    tasks = tuple(dict.fromkeys(task_of(transition.name, name) for name in names))
    return task_of(transition.name, fence), task_of(transition.name, release), tasks


def fused_tasks(transition) -> dict[str, tuple[str, ...]]:
    """The fused tasks the declaration asks for (:attr:`~nexus_cutover.transition.Step.fused_into`): task id -> its
    steps, in the declared order (:func:`check_fused` checks their shape when the DAG is built)."""
    out: dict[str, tuple[str, ...]] = {}
    for step in transition:
        if step.fused_into is not None:
            out[step.fused_into] = (*out.get(step.fused_into, ()), step.name)
    return out


#: DAG -> its fused tasks: task id -> the consecutive steps of one declared stage it runs, in order, as declared
#: (:func:`fused_tasks`). Inside the admission pause every task costs Airflow a start and a handoff (~1.5 s,
#: docs/performance.md): the new host's readiness wait and the release are one task, named for what it does to the
#: tenant. The final check stays its own task: it is a heavy read that queues for the cluster's read pool, which must
#: never delay the release.
#:
#: ``NEXUS_FUSED_TASKS=0`` (:data:`FUSED_ENV`) runs every step as its own task, as before: the switch that measures
#: this lever alone (``make bench-stack``, part ``levers``). It changes the DAG's shape, so every Airflow component
#: that parses the DAG or reads its XComs (the DAG processor, the workers, the API server) must see the same value,
#: and no run may be in flight when it changes.
FUSED_ENV = settings.BY_NAME["fused_tasks"].alias
FUSED: dict[str, dict[str, tuple[str, ...]]] = {} if not settings.value("fused_tasks") else {
    t.name: fused for t in (CUTOVER, FIELD_HISTORY) if (fused := fused_tasks(t))}


def task_of(dag_id: str, step: str) -> str:
    """The task id that runs the declared step ``step`` of the DAG ``dag_id`` (its own name unless fused)."""
    for task_id, steps in FUSED.get(dag_id, {}).items():
        if step in steps:
            return task_id
    return step


def steps_of(dag_id: str, task_id: str) -> tuple[str, ...]:
    """The declared steps the task ``task_id`` of the DAG ``dag_id`` runs, in order."""
    return FUSED.get(dag_id, {}).get(task_id, (task_id,))


#: DAG -> its admission pause's tasks (:func:`armed_window`): the fence step's task waits for an armed slot
#: (:mod:`nexus_airflow.armed_slots`), the window's tasks run in the armed pool (:mod:`nexus_airflow.policies`).
ARMED_WINDOWS = {t.name: window for t in (CUTOVER,) if (window := armed_window(t))}


def check_fused(transition) -> None:
    """A fused task's steps are consecutive steps of one declared stage, none asks a person, only the first may
    wait, none is per pack (each would be a task of its own); its id is one of them. Else the parse fails."""
    from nexus_cutover.transition import Kind

    for task_id, steps in FUSED.get(transition.name, {}).items():
        stage = next((st for st in transition.stages if steps[0] in [s.name for s in st.steps]), None)
        names = [s.name for s in stage.steps] if stage is not None else []
        at = names.index(steps[0]) if steps[0] in names else 0
        declared = [transition[s] for s in steps if s in transition.names]
        if (task_id not in steps or names[at:at + len(steps)] != list(steps)
                or any(s.kind is Kind.ASKS or s.per_pack_of is not None for s in declared)
                or any(s.kind is Kind.WAITS for s in declared[1:])):
            raise ValueError(f"{transition.name}: fused task {task_id} {list(steps)} is not consecutive steps of one "
                             "stage led by at most one wait, with no person's question and no per-pack step")


@dataclass(frozen=True)
class TaskSpec:
    operator: type
    doc_md: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def build(transition, operators: Mapping[Any, type], *, default: type | None = None, first: type | None = None,
          last: Mapping[str, Any] | None = None, armed_by: str | None = None) -> dict[str, Any]:
    """Inside a ``with DAG(...)`` block: the declared steps as tasks (by name), chained in the declared order, each
    with its task doc from the declaration (:attr:`~nexus_cutover.transition.Step.task_doc` and its dry run).

    A step's operator is the one ``operators`` names for its declared role, else for its kind, else ``first`` for
    the first declared step (the run's form is checked there), else ``default``; a step none of them gives fails
    the parse, naming it. ``last``: further operator arguments of the last declared step (the run's outlets, its
    success notice). ``armed_by``: the step that arms the admission fence; the steps after it get
    :data:`PRIORITY_ARMED`, it and those before it :data:`PRIORITY_BEFORE_ARMING` (None: Airflow's default)."""
    from airflow.sdk import TaskGroup, chain

    check_fused(transition)
    task_ids = list(dict.fromkeys(task_of(transition.name, name) for name in transition.names))
    specs: dict[str, TaskSpec] = {}
    for i, step in enumerate(transition):
        operator = operators.get(step.role) if step.role is not None else None
        operator = operator or operators.get(step.kind) or (first if i == 0 else None) or default
        if operator is not None:
            kwargs = dict(last or {}) if step.name == transition.names[-1] else {}
            specs[step.name] = TaskSpec(operator, step.task_doc or declared_doc(step), kwargs)
    if missing := [name for name in transition.names if name not in specs]:
        raise ValueError(f"{transition.name}: declared steps without an operator {missing} (give their role or kind "
                         "one, or a default)")
    tasks: dict[str, Any] = {}
    weights = priorities(transition, armed_by)
    for stage in transition.stages:
        if stage.group_id is None:
            _add(transition, stage.steps, specs, tasks, weights)
            continue
        with TaskGroup(stage.group_id, prefix_group_id=False, tooltip=f"{stage.number}. {stage.title}"):
            _add(transition, stage.steps, specs, tasks, weights)
    chain(*(tasks[name] for name in task_ids))
    return tasks


def priorities(transition, armed_by: str | None) -> dict[str, dict[str, Any]]:
    """step -> its priority arguments (see :data:`PRIORITY_ARMED`); empty without ``armed_by``."""
    if armed_by is None:
        return {}
    fenced_from = transition.names.index(armed_by) + 1
    weights = {name: {"priority_weight": PRIORITY_ARMED if i >= fenced_from else PRIORITY_BEFORE_ARMING,
                      "weight_rule": "absolute"} for i, name in enumerate(transition.names)}
    by_task: dict[str, dict[str, Any]] = {}
    for name, weight in weights.items():  # a fused task: as its first step
        by_task.setdefault(task_of(transition.name, name), weight)
    return by_task


def _add(transition, steps, specs: dict[str, TaskSpec], tasks: dict[str, Any], weights: dict[str, dict[str, Any]]) -> None:
    for step in steps:
        task_id = task_of(transition.name, step.name)
        if task_id in tasks:  # a fused task's later step: the task exists
            continue
        spec, fused = _spec_of(transition, task_id, specs), steps_of(transition.name, task_id)
        kwargs = {**weights.get(task_id, {}), **spec.kwargs, **({"steps": fused} if len(fused) > 1 else {})}
        doc = spec.doc_md if "**Dry run**" in spec.doc_md else f"{spec.doc_md}\n\n**Dry run**: {step.dry_run}."
        if step.per_pack_of is None:
            tasks[task_id] = spec.operator(task_id=task_id, doc_md=doc, **kwargs)
        else:
            # the UI names each mapped instance by its pack, not by map index 0, 1, ...
            tasks[task_id] = spec.operator.partial(task_id=task_id, doc_md=doc,
                                                   map_index_template="{{ task.pack_install_id }}",
                                                   **kwargs).expand(pack_install_id=tasks[step.per_pack_of].output)


def _spec_of(transition, task_id: str, specs: dict[str, TaskSpec]) -> TaskSpec:
    """A task's spec: its step's; a fused task's, its first step's operator, every step's arguments and its doc
    (each step's, under its name, with its dry run) in order."""
    fused = steps_of(transition.name, task_id)
    if len(fused) == 1:
        return specs[task_id]
    kwargs: dict[str, Any] = {}
    for name in fused:
        kwargs.update(specs[name].kwargs)
    doc = "Steps run as one task (no handoff between them), each its own record: its XCom value under its name, " \
          "its log section, its metric.\n\n" + "\n\n".join(
              f"**{name}**: {specs[name].doc_md}" + ("" if "**Dry run**" in specs[name].doc_md
                                                     else f" **Dry run**: {transition[name].dry_run}.")
              for name in fused)
    return TaskSpec(specs[fused[0]].operator, doc + "\n\n**Dry run**: see each step above.", kwargs)


def declared_doc(step) -> str:
    """A step's task doc from its declaration: what it does, its dry run, what to do when it stops."""
    return (f"{str(step.kind).capitalize()}. **Dry run**: {step.dry_run}. **When it stops**: {step.next_action}.")


def steps_md(transition) -> str:
    """The DAG's tasks as its doc's numbered list, from the declaration: per stage its title, then each task (a
    fused task with the steps it runs) with what it does (its kind, or its declared ``kind_text``). The names are
    the DAG's task ids, so the doc never names a task the DAG does not have."""
    lines = []
    for stage in transition.stages:
        tasks = list(dict.fromkeys(task_of(transition.name, s.name) for s in stage.steps))
        parts = []
        for task_id in tasks:
            steps = [transition[name] for name in steps_of(transition.name, task_id)]
            said = "; then ".join(f"{s.kind_text or s.kind}{', one per pack' if s.per_pack_of else ''}" for s in steps)
            fused = f": {', then '.join(s.name for s in steps)} in one task" if len(steps) > 1 else ""
            parts.append(f"**{task_id}** ({said}{fused})")
        lines.append(f"{stage.number}. {stage.title}: {', '.join(parts)};")
    return "\n".join(lines)

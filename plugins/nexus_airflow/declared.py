"""A DAG's tasks built from a declared transition (:mod:`nexus_cutover.transition`): the order is the declaration's.

A DAG file names, per step, the operator class and the task doc a UI user
reads (:func:`task`), to which the step's declared dry run is added; :func:`build`
creates one task per declared step, in the declared order, inside one TaskGroup per declared stage (when the stage names
one), maps a per-pack step over the step it is declared per pack of, and chains
them. A step the DAG file does not name, or a name the declaration lacks,
fails the parse: the DAG cannot drift from the declaration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nexus_cutover.field_history.transition import FIELD_HISTORY
from nexus_cutover.projection.transition import CUTOVER

__all__ = ["CUTOVER", "FIELD_HISTORY", "HEAVY_READS", "PRIORITY_ARMED", "PRIORITY_BEFORE_ARMING", "build", "steps_md", "task"]

#: Absolute task priorities (``weight_rule="absolute"``): Airflow's scheduler and executors take queued work by
#: priority, and its default rule (``downstream``) ranks a run's first tasks above its last ones, so a new tenant's
#: first tasks went before an armed tenant's remaining ones (16 lanes on 4 slots: an 86 s median admission pause,
#: docs/performance.md). Every task of a run after it armed the fence, and a rollout's wave question, outrank the
#: tasks before arming (issue 36, item 3).
PRIORITY_ARMED, PRIORITY_BEFORE_ARMING = 1000, 1  # 1000: above any downstream-weighted task of ours (<= ~100)

#: DAG -> the steps whose reads weigh on the tenant's database cluster (the full history digest and its verification,
#: the materialization's batches): their task instances run in the run's ``read_pool`` (:mod:`nexus_airflow.policies`).
HEAVY_READS = {CUTOVER.name: ("history_digest", "final_old_writer_check"), FIELD_HISTORY.name: ("stage_2_materialize",)}


@dataclass(frozen=True)
class TaskSpec:
    operator: type
    doc_md: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def task(operator: type, doc_md: str, **kwargs: Any) -> TaskSpec:
    """How the DAG runs one declared step: its operator class, its task doc and any other operator argument."""
    return TaskSpec(operator, doc_md, kwargs)


def build(transition, specs: dict[str, TaskSpec], *, armed_by: str | None = None,
          default: type | None = None) -> dict[str, Any]:
    """Inside a ``with DAG(...)`` block: the declared steps as tasks (by name), chained in the declared order.

    ``default``: the operator of a declared step ``specs`` does not name (its task doc then says what the
    declaration says of it); without one such a step fails the parse.

    ``armed_by``: the step that arms the admission fence; the steps after it get :data:`PRIORITY_ARMED`, it and
    those before it :data:`PRIORITY_BEFORE_ARMING` (None: Airflow's default priorities)."""
    from airflow.sdk import TaskGroup, chain

    unknown, missing = set(specs) - set(transition.names), set(transition.names) - set(specs)
    if default is not None:
        specs = {**{name: task(default, declared_doc(transition[name])) for name in missing}, **specs}
        missing = set()
    if unknown or missing:
        raise ValueError(f"{transition.name}: tasks without a declared step {sorted(unknown)}, "
                         f"declared steps without a task {sorted(missing)}")
    tasks: dict[str, Any] = {}
    weights = priorities(transition, armed_by)
    for stage in transition.stages:
        if stage.group_id is None:
            _add(stage.steps, specs, tasks, weights)
            continue
        with TaskGroup(stage.group_id, prefix_group_id=False, tooltip=f"{stage.number}. {stage.title}"):
            _add(stage.steps, specs, tasks, weights)
    chain(*(tasks[name] for name in transition.names))
    return tasks


def priorities(transition, armed_by: str | None) -> dict[str, dict[str, Any]]:
    """step -> its priority arguments (see :data:`PRIORITY_ARMED`); empty without ``armed_by``."""
    if armed_by is None:
        return {}
    fenced_from = transition.names.index(armed_by) + 1
    return {name: {"priority_weight": PRIORITY_ARMED if i >= fenced_from else PRIORITY_BEFORE_ARMING,
                   "weight_rule": "absolute"} for i, name in enumerate(transition.names)}


def _add(steps, specs: dict[str, TaskSpec], tasks: dict[str, Any], weights: dict[str, dict[str, Any]]) -> None:
    for step in steps:
        spec = specs[step.name]
        kwargs = {**weights.get(step.name, {}), **spec.kwargs}
        doc = spec.doc_md if "**Dry run**" in spec.doc_md else f"{spec.doc_md}\n\n**Dry run**: {step.dry_run}."
        if step.per_pack_of is None:
            tasks[step.name] = spec.operator(task_id=step.name, doc_md=doc, **kwargs)
        else:
            # the UI names each mapped instance by its pack, not by map index 0, 1, ...
            tasks[step.name] = spec.operator.partial(task_id=step.name, doc_md=doc,
                                                     map_index_template="{{ task.pack_install_id }}",
                                                     **kwargs).expand(pack_install_id=tasks[step.per_pack_of].output)


def declared_doc(step) -> str:
    """A step's task doc from its declaration: what it does, its dry run, what to do when it stops."""
    return (f"{str(step.kind).capitalize()}. **Dry run**: {step.dry_run}. **When it stops**: {step.next_action}.")


def steps_md(transition) -> str:
    """The declared steps as the DAG doc's numbered list: per stage its title, then each step with its kind."""
    lines = []
    for stage in transition.stages:
        steps = ", ".join(f"**{s.name}** ({s.kind}{', one per pack' if s.per_pack_of else ''})" for s in stage.steps)
        lines.append(f"{stage.number}. {stage.title}: {steps};")
    return "\n".join(lines)

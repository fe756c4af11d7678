"""A DAG's tasks built from a declared transition (:mod:`nexus_cutover.transition`): the order is the declaration's.

A DAG file names, per step, the operator class and the task doc a UI user
reads (:func:`task`); :func:`build` creates one task per declared step, in the
declared order, inside one TaskGroup per declared stage (when the stage names
one), maps a per-pack step over the step it is declared per pack of, and chains
them. A step the DAG file does not name, or a name the declaration lacks,
fails the parse: the DAG cannot drift from the declaration.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from nexus_cutover.field_history.transition import FIELD_HISTORY
from nexus_cutover.projection.transition import CUTOVER

__all__ = ["CUTOVER", "FIELD_HISTORY", "build", "steps_md", "task"]


@dataclass(frozen=True)
class TaskSpec:
    operator: type
    doc_md: str
    kwargs: dict[str, Any] = field(default_factory=dict)


def task(operator: type, doc_md: str, **kwargs: Any) -> TaskSpec:
    """How the DAG runs one declared step: its operator class, its task doc and any other operator argument."""
    return TaskSpec(operator, doc_md, kwargs)


def build(transition, specs: dict[str, TaskSpec]) -> dict[str, Any]:
    """Inside a ``with DAG(...)`` block: the declared steps as tasks (by name), chained in the declared order."""
    from airflow.sdk import TaskGroup, chain

    unknown, missing = set(specs) - set(transition.names), set(transition.names) - set(specs)
    if unknown or missing:
        raise ValueError(f"{transition.name}: tasks without a declared step {sorted(unknown)}, "
                         f"declared steps without a task {sorted(missing)}")
    tasks: dict[str, Any] = {}
    for stage in transition.stages:
        if stage.group_id is None:
            _add(stage.steps, specs, tasks)
            continue
        with TaskGroup(stage.group_id, prefix_group_id=False, tooltip=f"{stage.number}. {stage.title}"):
            _add(stage.steps, specs, tasks)
    chain(*(tasks[name] for name in transition.names))
    return tasks


def _add(steps, specs: dict[str, TaskSpec], tasks: dict[str, Any]) -> None:
    for step in steps:
        spec = specs[step.name]
        if step.per_pack_of is None:
            tasks[step.name] = spec.operator(task_id=step.name, doc_md=spec.doc_md, **spec.kwargs)
        else:
            # the UI names each mapped instance by its pack, not by map index 0, 1, ...
            tasks[step.name] = spec.operator.partial(task_id=step.name, doc_md=spec.doc_md,
                                                     map_index_template="{{ task.pack_install_id }}",
                                                     **spec.kwargs).expand(pack_install_id=tasks[step.per_pack_of].output)


def steps_md(transition) -> str:
    """The declared steps as the DAG doc's numbered list: per stage its title, then each step with its kind."""
    lines = []
    for stage in transition.stages:
        steps = ", ".join(f"**{s.name}** ({s.kind}{', one per pack' if s.per_pack_of else ''})" for s in stage.steps)
        lines.append(f"{stage.number}. {stage.title}: {steps};")
    return "\n".join(lines)

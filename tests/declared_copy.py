"""A copy of the cutover's declaration with one step added in one place (issue 35, item 1): the DAG, ``run`` and
``plan`` are loops over a declaration, so the added step shows up in all three without another edit.

The added step, ``count_history``, reads how many history Events the tenant has (read only) right after the
history digest; its body is :func:`count_history` below, named by the declaration alone.
"""

from __future__ import annotations

from dataclasses import replace

from sqlalchemy import func, select

from nexus_cutover import catalog, tx
from nexus_cutover.projection.transition import CUTOVER
from nexus_cutover.transition import Kind, Step, StepResult, Transition

ADDED = Step("count_history", Kind.READS, "tests.declared_copy:count_history", key="history_count",
             dry_run="the same read", next_action="it is read only: clear it")


def count_history(run) -> StepResult:
    """The added step's body: the tenant's Events, counted (read only; the same on a dry run)."""
    with tx.reading(run.engine, "counting the tenant's events") as conn:
        n = conn.execute(select(func.count()).select_from(catalog.Event)
                         .where(catalog.Event.c.Namespace == run.namespace)).scalar_one()
    run.say(f"history: {n} events")
    return StepResult({"events": int(n)})


def with_added_step(after: str = "history_digest") -> Transition:
    """The cutover's declaration with :data:`ADDED` right after ``after`` (in its stage)."""
    stages = []
    for stage in CUTOVER.stages:
        steps = []
        for step in stage.steps:
            steps.append(step)
            if step.name == after:
                steps.append(ADDED)
        stages.append(replace(stage, steps=tuple(steps)))
    return Transition(CUTOVER.name, tuple(stages))

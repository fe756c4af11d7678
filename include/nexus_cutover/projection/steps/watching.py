"""The cutover's watches: a waiting step looked at again and again, over one :class:`~.context.CutoverRun`.

Each waiting step's module holds its watch (a :class:`CutoverWatch` whose :meth:`~nexus_cutover.watch.Watch.poll`
says what one look saw); the declaration names it (:attr:`~nexus_cutover.transition.Wait.watch`). The command
line's wait, the Airflow trigger and a ``poke`` sensor all poll the same watch.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable
from typing import Any

from ...events import Event
from ...watch import Watch
from .context import CutoverRun, run_step


class CutoverWatch(Watch):
    """A watch over one waiting step of the cutover. ``run``: the caller's run (the command line's, whose earlier
    looks a rate spans); None: one of the watch's own, read only (a trigger's, a sensor's)."""

    def __init__(self, engine, namespace: str, step: str, deadline: str | dt.datetime, *,
                 stale_heartbeat_s: float, record: Callable[[list[Event]], None] | None = None,
                 run: CutoverRun | None = None, **more: Any) -> None:
        super().__init__(engine, namespace, step, deadline, record=record)
        self.run = run or CutoverRun(engine, namespace, "(a wait's poll)", deadline=self.deadline,
                                     stale_heartbeat_s=float(stale_heartbeat_s), **more)

    def look(self):
        """One run of the waiting step's body (read only): its :class:`~nexus_cutover.transition.StepResult`."""
        return run_step(self.step, self.run)

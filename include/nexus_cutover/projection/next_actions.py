"""What the delivery engineer does next when a cutover step stops: one text per step, declared with the step.

The texts live in :data:`~nexus_cutover.projection.transition.CUTOVER` (each
:class:`~nexus_cutover.transition.Step`'s ``next_action``); ``docs/runbook.md``'s
task table shows the same texts in its last column (a test keeps them equal);
the Airflow tasks append the step's text to every stop message, and the status
view and the CLI can show it.
"""

from __future__ import annotations

from .transition import CUTOVER

NEXT_ACTION: dict[str, str] = CUTOVER.next_actions()


def next_action(step: str) -> str | None:
    """The runbook's next action for the step named ``step`` (its Airflow task id too), as plain text; None if unknown."""
    text = NEXT_ACTION.get(step)
    return None if text is None else text.replace("**", "").replace("`", "")

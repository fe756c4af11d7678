"""One human-in-the-loop question per try: a cleared task asks its own question, not its first try's.

Airflow 3.3.2 carries a HITL task's question over to its next try: a clear (or a retry) archives the try into
``task_instance_history`` / ``hitl_detail_history`` and gives the task instance a new id, ``hitl_detail.ti_id``
follows that id (``ON UPDATE CASCADE``), and the Execution API's upsert keeps an existing row's subject, body,
options and params, resetting only the answer (apache/airflow#72155; the fix proposed upstream, #73235, refreshes
the row instead). So after "Reject, then clear check_old_writers" the new try's question showed the first try's
writer evidence, as old as that try (issue 34.4).

Invariant installed here (:func:`install`): when Airflow archives a try's question into ``hitl_detail_history``,
the live ``hitl_detail`` row of that try is deleted in the same flush, before the task instance gets its new id.
The next try's upsert then creates its own row, with the subject and body that try built; the archived try keeps
its question and answer (``.../hitlDetails/tries/{n}``). Between the clear and the new try's ask nothing is
pending, so nobody can answer the old question for the new try.

Installed by the status-view plugin in the API server (the process that serves the UI's and REST's clears and the
Execution API's retries). A clear made by a process without it (the ``airflow tasks clear`` command) still carries
the old question over; ``_StrictHITL._ask`` then refuses to park under a question it did not write.
"""

from __future__ import annotations

from typing import Any

HISTORY_TABLE = "hitl_detail_history"
_installed = False


def _drop_archived_questions(session, flush_context, instances) -> None:
    """``before_flush``: delete the live question of every try whose question this flush archives."""
    archived = [obj.ti_history_id for obj in session.new if getattr(obj, "__tablename__", None) == HISTORY_TABLE]
    if not archived:
        return
    from airflow.models.hitl import HITLDetail

    for obj in [o for o in session.identity_map.values() if isinstance(o, HITLDetail) and o.ti_id in archived]:
        session.expunge(obj)  # deleted below, by id, before the flush moves the task instance to its new id
    table = HITLDetail.__table__
    session.connection().execute(table.delete().where(table.c.ti_id.in_(archived)))


def install() -> None:
    """Register :func:`_drop_archived_questions` on every SQLAlchemy ORM session of this process (idempotent)."""
    global _installed
    if _installed:
        return
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    event.listen(Session, "before_flush", _drop_archived_questions)
    _installed = True


def stored_question(operator: Any, ti_id: Any) -> tuple[str, str | None]:
    """Write ``operator``'s question for ``ti_id`` the way ``HITLOperator.execute`` does (the same upsert, so its
    own call afterwards changes nothing) and return the subject and body Airflow then holds for that task instance:
    an earlier try's when the row was carried over.

    Airflow offers no public way to read a stored question back: this sends the Task SDK's own message
    (``CreateHITLDetailPayload``, whose answer is the stored row) through the task's supervisor, as
    ``airflow.sdk.execution_time.hitl.upsert_hitl_detail`` does; the users go as plain mappings, which the message
    model validates (no private module of Airflow is imported). Re-check on an Airflow upgrade."""
    from airflow.sdk.execution_time.comms import CreateHITLDetailPayload
    from airflow.sdk.execution_time.task_runner import SUPERVISOR_COMMS

    stored = SUPERVISOR_COMMS.send(msg=CreateHITLDetailPayload(
        ti_id=ti_id, options=operator.options, subject=operator.subject, body=operator.body,
        defaults=operator.defaults, params=operator.serialized_params, multiple=operator.multiple,
        assigned_users=[{"id": u["id"], "name": u["name"]} for u in operator.assigned_users or []],
    ))
    return stored.subject, stored.body

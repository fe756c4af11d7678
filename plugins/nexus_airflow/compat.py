"""Everything nexus-cutover uses of Airflow that Airflow does not publish, in this one module (issue 49).

Known for ``apache-airflow`` :data:`KNOWN_FOR` (3.3.2 up to, not including, 3.4). ``tests/dags/test_compat.py`` is
its contract: it fails on an Airflow whose version is outside that range or that changed any name, column or message
used here, so an upgrade is re-validated here and nowhere else. Everything else in ``plugins/`` reaches Airflow through
its public interfaces (the Task SDK, the HITL operators and notifiers, the plugin, provider and ``airflow.policy``
entry points, the REST API); ``tests/test_architecture.py`` fails on a private import anywhere else.

What is here, and why there is no public way:

* :func:`session` and :func:`model` -- the status view's reads of the metadata database (runs, XComs, task
  instances, Variables, connections). The view is a plugin's FastAPI app inside the API server; Airflow 3.3 gives a
  plugin no in-process read API (the REST API would call the same server over HTTP with a person's token). Read only.
* :func:`pool_exists` -- whether a pool exists, for the cluster policy, which runs inside the transaction that creates
  task instances (Airflow passes the run, not a pool API).
* :func:`stored_question` and :func:`install_question_per_try` -- one HITL question per try, working around
  apache/airflow#72155 (Airflow 3.3.2 carries a cleared task's question over to its next try; the fix proposed
  upstream is apache/airflow#73235): the Task SDK's own upsert message through the task's supervisor (the stored
  question read back), and a ``before_flush`` listener on the API server's ORM sessions that drops a try's live
  question as Airflow archives it. **Switch:** ``NEXUS_AIRFLOW_COMPAT_QUESTION_PER_TRY=0`` installs no listener; a
  cleared confirmation then stops rather than park under an earlier try's question (it never shows old evidence).
  Remove both once the supported Airflow has the upstream fix.
* :func:`xcom_of_run` and :func:`dag_run_state` -- a rollout wave's answer, read from a trigger (the triggerer has no
  task context to call the Task SDK's public ``xcom_pull`` from).
"""

from __future__ import annotations

from contextlib import AbstractContextManager
from typing import Any

from nexus_cutover import settings

#: The Airflow versions this module is known for: [lowest, first not known).
KNOWN_FOR = ("3.3.2", "3.4")
#: Airflow's models the status view reads, by the name this module gives them.
MODELS = {
    "DagRun": "airflow.models.dagrun",
    "XComModel": "airflow.models.xcom",
    "TaskInstance": "airflow.models.taskinstance",
    "Variable": "airflow.models.variable",
    "Connection": "airflow.models.connection",
    "Pool": "airflow.models.pool",
    "HITLDetail": "airflow.models.hitl",
}
#: The table Airflow archives a try's HITL question into (apache/airflow#72155).
HITL_HISTORY_TABLE = "hitl_detail_history"
#: Set to ``0`` to leave Airflow's ORM sessions untouched (see the module's docstring).
QUESTION_PER_TRY_ENV = settings.BY_NAME["airflow_compat_question_per_try"].alias

_listening = False


def model(name: str) -> Any:
    """One of Airflow's ORM models (:data:`MODELS`), imported when first asked for (the API server has them)."""
    import importlib

    return getattr(importlib.import_module(MODELS[name]), name)


def session() -> AbstractContextManager[Any]:
    """A metadata-database session of this Airflow process (Airflow's own ``create_session``: committed on exit)."""
    from airflow.utils.session import create_session

    return create_session()


def pool_exists(pool: str, dag_run: Any) -> bool | None:
    """Whether Airflow has the pool ``pool``, read on the session ``dag_run`` belongs to (the transaction that is
    creating its task instances); None when the run has no session to read on."""
    from sqlalchemy import select
    from sqlalchemy.orm import object_session

    session_of_run = object_session(dag_run) if dag_run is not None else None
    if session_of_run is None:
        return None
    pools = model("Pool")
    with session_of_run.no_autoflush:
        return session_of_run.scalar(select(pools.id).where(pools.pool == pool)) is not None


def xcom_of_run(*, key: str, dag_id: str, task_id: str, run_id: str, map_index: int = -1) -> Any:
    """One XCom value of another run, read from a trigger (the Task SDK's own reader)."""
    from airflow.sdk.bases.xcom import BaseXCom

    return BaseXCom.get_one(key=key, dag_id=dag_id, task_id=task_id, run_id=run_id, map_index=map_index)


def dag_run_state(dag_id: str, run_id: str) -> Any:
    """The state of another run, read from a trigger (the Task SDK's own reader)."""
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    return RuntimeTaskInstance.get_dagrun_state(dag_id, run_id)


# -- one HITL question per try (apache/airflow#72155) -------------------------------------------------------------

def _drop_archived_questions(session_: Any, flush_context: Any, instances: Any) -> None:
    """``before_flush``: delete the live question of every try whose question this flush archives, before the flush
    moves the task instance to its new id (the next try's upsert then creates its own row)."""
    archived = [obj.ti_history_id for obj in session_.new if getattr(obj, "__tablename__", None) == HITL_HISTORY_TABLE]
    if not archived:
        return
    detail = model("HITLDetail")
    for obj in [o for o in session_.identity_map.values() if isinstance(o, detail) and o.ti_id in archived]:
        session_.expunge(obj)  # deleted below, by id
    table = detail.__table__
    session_.connection().execute(table.delete().where(table.c.ti_id.in_(archived)))


def question_per_try_enabled() -> bool:
    return bool(settings.value("airflow_compat_question_per_try"))


def install_question_per_try() -> bool:
    """Register :func:`_drop_archived_questions` on this process's ORM sessions (the API server's: it serves the UI's
    and REST's clears and the Execution API's retries), once; nothing when switched off. Whether it is installed."""
    global _listening
    if not question_per_try_enabled():
        return False
    if not _listening:
        from sqlalchemy import event
        from sqlalchemy.orm import Session

        event.listen(Session, "before_flush", _drop_archived_questions)
        _listening = True
    return True


def stored_question(operator: Any, ti_id: Any) -> tuple[str, str | None]:
    """Write ``operator``'s question for ``ti_id`` the way ``HITLOperator.execute`` does (the same upsert, so its own
    call afterwards changes nothing) and return the subject and body Airflow then holds for that task instance: an
    earlier try's when the row was carried over. The Task SDK's own message (``CreateHITLDetailPayload``, whose
    answer is the stored row) through the task's supervisor, as ``airflow.sdk.execution_time.hitl`` sends it."""
    from airflow.sdk.execution_time.comms import CreateHITLDetailPayload
    from airflow.sdk.execution_time.task_runner import SUPERVISOR_COMMS

    stored = SUPERVISOR_COMMS.send(msg=CreateHITLDetailPayload(
        ti_id=ti_id, options=operator.options, subject=operator.subject, body=operator.body,
        defaults=operator.defaults, params=operator.serialized_params, multiple=operator.multiple,
        assigned_users=[{"id": u["id"], "name": u["name"]} for u in operator.assigned_users or []],
    ))
    return stored.subject, stored.body

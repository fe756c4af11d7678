"""The contract of ``nexus_airflow.compat`` (issue 49, item 1): everything it reaches of Airflow that Airflow does not
publish still has the names, columns and messages it relies on, on the Airflow installed here, and that Airflow is in
the range it is known for. An upgrade that changes any of it fails here, before a platform team deploys it."""

from __future__ import annotations

import inspect
from importlib.metadata import version

import pytest
from packaging.version import Version

from nexus_airflow import compat

#: The columns the status view's reads select or filter on, per model (plugins/nexus_status).
USED_COLUMNS = {
    "DagRun": ("id", "dag_id", "run_id", "state", "conf", "start_date", "end_date", "run_after"),
    "XComModel": ("dag_run_id", "dag_id", "run_id", "task_id", "key", "value", "map_index"),
    "TaskInstance": ("dag_id", "run_id", "task_id", "state", "map_index"),
    "Variable": ("key",),
    "Connection": ("conn_id",),
    "Pool": ("id", "pool"),
    "HITLDetail": ("ti_id",),
}


def test_the_installed_airflow_is_in_the_range_the_module_is_known_for():
    lowest, first_not_known = compat.KNOWN_FOR
    assert Version(lowest) <= Version(version("apache-airflow")) < Version(first_not_known)


@pytest.mark.parametrize("name", sorted(compat.MODELS))
def test_every_model_it_reads_has_the_columns_it_uses(name):
    table = compat.model(name).__table__
    missing = [c for c in USED_COLUMNS[name] if c not in table.c]
    assert not missing, f"{name} ({table.name}) lost {missing}: re-validate nexus_airflow.compat for this Airflow"


def test_the_hitl_archive_and_the_supervisor_message_are_as_the_question_per_try_fix_knows_them():
    from airflow.models import hitl_history  # noqa: F401 - registers the archive's model with the ORM
    from airflow.sdk.execution_time import comms, task_runner
    from sqlalchemy import inspect as sa_inspect

    tables = {m.local_table.name for m in compat.model("HITLDetail").registry.mappers}
    assert compat.HITL_HISTORY_TABLE in tables  # the table whose inserts the listener watches
    history = next(m for m in compat.model("HITLDetail").registry.mappers
                   if m.local_table.name == compat.HITL_HISTORY_TABLE)
    assert "ti_history_id" in {c.key for c in sa_inspect(history.class_).columns}
    fields = set(comms.CreateHITLDetailPayload.model_fields)
    assert {"ti_id", "options", "subject", "body", "defaults", "params", "multiple", "assigned_users"} <= fields
    # declared in the module (bound in a task process by its supervisor): the name stored_question sends through
    assert "SUPERVISOR_COMMS" in inspect.get_annotations(task_runner)


def test_the_trigger_readers_exist_with_the_arguments_it_passes():
    from airflow.sdk.bases.xcom import BaseXCom
    from airflow.sdk.execution_time.task_runner import RuntimeTaskInstance

    assert {"key", "dag_id", "task_id", "run_id", "map_index"} <= set(inspect.signature(BaseXCom.get_one).parameters)
    assert list(inspect.signature(RuntimeTaskInstance.get_dagrun_state).parameters)[:2] == ["dag_id", "run_id"]


def test_a_session_reads_the_metadata_database(airflow_db):
    from sqlalchemy import func, select

    with compat.session() as session:
        assert session.scalar(select(func.count()).select_from(compat.model("Pool"))) >= 1  # default_pool


def test_the_switch_leaves_airflows_sessions_untouched(monkeypatch):
    from sqlalchemy import event
    from sqlalchemy.orm import Session

    monkeypatch.setattr(compat, "_listening", False)
    was = event.contains(Session, "before_flush", compat._drop_archived_questions)
    if was:
        event.remove(Session, "before_flush", compat._drop_archived_questions)
    try:
        monkeypatch.setenv(compat.QUESTION_PER_TRY_ENV, "0")
        assert compat.install_question_per_try() is False
        assert not event.contains(Session, "before_flush", compat._drop_archived_questions)
        monkeypatch.setenv(compat.QUESTION_PER_TRY_ENV, "1")
        assert compat.install_question_per_try() is True
        assert event.contains(Session, "before_flush", compat._drop_archived_questions)
    finally:
        if not was and event.contains(Session, "before_flush", compat._drop_archived_questions):
            event.remove(Session, "before_flush", compat._drop_archived_questions)
        elif was and not event.contains(Session, "before_flush", compat._drop_archived_questions):
            event.listen(Session, "before_flush", compat._drop_archived_questions)

"""The Airflow harness (and the conftest built on it) is executed once per process: one AIRFLOW_HOME.

Nothing here imports Airflow; it runs in a process that collected other DAG test
modules too, each importing the harness.
"""

from __future__ import annotations

import importlib.util
import os
import pathlib
import sys

import pytest

from tests.dags import airflow_harness

HARNESS = pathlib.Path(airflow_harness.__file__).resolve()
CONFTEST = HARNESS.with_name("conftest.py")


def _modules_from(path: pathlib.Path) -> list[str]:
    found = []
    for name, module in list(sys.modules.items()):
        file = getattr(module, "__file__", None)
        if file and pathlib.Path(file).resolve() == path:
            found.append(name)
    return sorted(found)


def test_the_harness_body_ran_once_and_made_one_airflow_home():
    runs = sys.modules[airflow_harness.LOADS_KEY].runs
    assert runs == [("tests.dags.airflow_harness", str(airflow_harness.AIRFLOW_HOME))]
    assert os.environ["AIRFLOW_HOME"] == str(airflow_harness.AIRFLOW_HOME)
    assert os.environ["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"] == f"sqlite:///{airflow_harness.AIRFLOW_HOME / 'airflow.db'}"


def test_harness_and_conftest_are_each_one_module():
    assert _modules_from(HARNESS) == ["tests.dags.airflow_harness"]
    assert len(_modules_from(CONFTEST)) == 1, _modules_from(CONFTEST)
    assert "tests.dags.conftest" not in sys.modules


def test_the_conftest_fixtures_use_the_same_harness_module():
    (conftest_name,) = _modules_from(CONFTEST)
    assert sys.modules[conftest_name].migrate_metadata_db is airflow_harness.migrate_metadata_db


def test_a_second_execution_under_another_name_is_refused_before_it_touches_the_environment(monkeypatch):
    spec = importlib.util.spec_from_file_location("airflow_harness_again", HARNESS)
    module = importlib.util.module_from_spec(spec)
    monkeypatch.setenv("NEXUS_TEST_AIRFLOW_HOME", "/nonexistent/second-home")
    before = dict(os.environ)
    with pytest.raises(RuntimeError, match="executing a second time, as 'airflow_harness_again'"):
        spec.loader.exec_module(module)
    assert dict(os.environ) == before
    assert len(sys.modules[airflow_harness.LOADS_KEY].runs) == 1

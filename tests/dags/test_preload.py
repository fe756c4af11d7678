"""A Celery worker imports the nexus modules once, before it forks its tasks (issue 36, item 4).

Real Airflow settings (``airflow_local_settings`` found in the plugins folder by Airflow itself, nothing of ours
on ``PYTHONPATH``) and Celery's real loader sending ``import_modules`` as a worker's main process does, in a
fresh interpreter. The figures (what a task saves) are ``bench/bench_preload.py``'s, never asserted here.
"""

from __future__ import annotations

import json
import logging
import os
import pathlib
import subprocess
import sys
import textwrap

import pytest

from nexus_airflow import preload

REPO = pathlib.Path(__file__).resolve().parents[2]

WORKER = textwrap.dedent(
    """
    import json, sys
    import airflow.settings  # Airflow imports airflow_local_settings from the plugins folder here
    from celery.signals import import_modules
    from airflow.providers.celery.executors import celery_executor_utils
    connected = any("nexus_cutover.preload" in str(key) for key, _ in import_modules.receivers)
    before = set(sys.modules)
    celery_executor_utils.app.loader.import_default_modules()  # a worker's main process, before its pool forks
    preloaded = set(sys.modules) - before
    from nexus_airflow.preload import preload_names
    from airflow.dag_processing.dagbag import BundleDagBag
    after_preload = set(sys.modules)
    bag = BundleDagBag(dag_folder=sys.argv[1], bundle_path=sys.argv[2], bundle_name="dags-folder", load_op_links=False)
    import nexus_cutover.projection.steps, sqlalchemy.dialects.mysql.pymysql  # noqa: E401,F401 -- a step's body
    task_imports = sorted(m for m in set(sys.modules) - after_preload if m.startswith(("nexus_", "sqlalchemy", "pymysql")))
    print("RESULT " + json.dumps({"connected": connected, "missing": sorted(set(preload_names()) - set(sys.modules)),
                                  "preloaded": len(preloaded), "dags": sorted(bag.dags), "errors": bag.import_errors,
                                  "task_imports": task_imports, "plugins_on_pythonpath": "plugins" in
                                  __import__("os").environ.get("PYTHONPATH", "")}))
    """
)


def _worker(tmp_path: pathlib.Path, *, plugins: pathlib.Path, **more_env: str) -> dict:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW") and k not in ("PYTHONPATH",
                                                                                          preload.PRELOAD_ENV)}
    env.update(more_env)
    env.update({"AIRFLOW_HOME": str(tmp_path), "AIRFLOW__CORE__PLUGINS_FOLDER": str(plugins),
                "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"), "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
                "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{tmp_path}/airflow.db"})
    dag_file = REPO / "dags" / "connector_projection_cutover.py"
    out = subprocess.run([sys.executable, "-c", WORKER, str(dag_file), str(dag_file.parent)], capture_output=True,
                         text=True, env=env, timeout=300, check=False, cwd=tmp_path)
    lines = [line for line in out.stdout.splitlines() if line.startswith("RESULT ")]
    assert out.returncode == 0 and lines, out.stderr[-3000:]
    return json.loads(lines[-1].removeprefix("RESULT "))


def test_a_worker_imports_every_module_a_cutover_task_imports_before_it_forks(tmp_path):
    got = _worker(tmp_path, plugins=REPO / "plugins")
    assert got["plugins_on_pythonpath"] is False  # Airflow found the plugins folder itself
    assert got["connected"] is True
    assert got["missing"] == []
    assert got["preloaded"] >= len(preload.preload_names())
    assert got["dags"] == ["connector_projection_cutover"] and got["errors"] == {}
    # what the forked task would import of ours after the preload: nothing (it inherits them)
    assert got["task_imports"] == []


@pytest.mark.parametrize("how", ["no local settings", "switched off"])
def test_without_the_preload_a_worker_imports_nothing_of_ours_before_it_forks(tmp_path, how):
    """The same worker with a plugins folder that has no ``airflow_local_settings``, or with the preload switched
    off (``NEXUS_CELERY_PRELOAD=0``): Airflow's own preload only, so the task process imports our modules itself
    (the difference the preload makes)."""
    if how == "switched off":
        got = _worker(tmp_path, plugins=REPO / "plugins", NEXUS_CELERY_PRELOAD="0")
    else:
        bare = tmp_path / "plugins"
        bare.mkdir()
        (bare / "nexus_airflow").symlink_to(REPO / "plugins" / "nexus_airflow")
        got = _worker(tmp_path, plugins=bare)
    assert got["connected"] is False
    assert "nexus_cutover.projection.steps" in got["task_imports"]
    assert "nexus_airflow.operators" in got["task_imports"]


class _Lines(logging.Handler):
    def __init__(self):
        super().__init__(logging.INFO)
        self.lines: list[str] = []

    def emit(self, record):
        self.lines.append(record.getMessage())


def test_a_module_that_fails_to_import_is_logged_and_skipped(monkeypatch):
    monkeypatch.setattr(preload, "MODULES", (*preload.MODULES, "nexus_no_such_module"))
    lines, logger = _Lines(), logging.getLogger(preload.log.name)
    logger.addHandler(lines)
    monkeypatch.setattr(logger, "level", logging.INFO)
    try:
        assert preload.preload() == ["nexus_no_such_module"]
    finally:
        logger.removeHandler(lines)
    assert any(line.startswith("nexus-cutover preload: nexus_no_such_module not imported (ModuleNotFoundError")
               for line in lines.lines), lines.lines
    assert lines.lines[-1] == (f"nexus-cutover preload: {len(preload.preload_names()) - 1} modules imported before "
                               "the worker forks, 1 failed")


@pytest.mark.parametrize("package", preload.PACKAGES)
def test_every_module_of_the_product_packages_is_preloaded(package):
    names = preload.preload_names()
    base = REPO / ("plugins" if package == "nexus_airflow" else "include")
    modules = {".".join(p.relative_to(base).with_suffix("").parts).removesuffix(".__init__")
               for p in (base / package).rglob("*.py")}
    assert modules <= set(names), sorted(modules - set(names))

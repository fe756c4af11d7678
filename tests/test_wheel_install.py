"""The wheel, as a team installs it (issue 37, items 1 and 2; issue 49, item 4): ``pip install "nexus-cutover[airflow]"
-c constraints.txt -c <Airflow's constraints>`` into a fresh venv with no checkout on ``sys.path`` (the dev lock
constraints-dev.txt stands in for Airflow's constraints file, which this CI cannot reach: it pins the same Airflow and
what Airflow brought when ``make test`` passed; tests/test_constraints.py proves the release's file alone resolves with
a fresh Airflow), a real ``airflow standalone`` there whose dags folder holds only the loader the installed package
writes (``python -m nexus_cutover_airflow.dags_loader <dags folder>``) and whose plugins folder is empty, the
deployment's own ``airflow_local_settings.py`` importing the product's. The plugin must come from the entry point, the DAGs from the
installed package, the status view must answer and a dry-run cutover of a MariaDB tenant must succeed. The wheel has no
``nexus_sim``. The tenant is seeded from this (checkout) process; the Airflow under test never sees the checkout."""

from __future__ import annotations

import json
import os
import pathlib
import shutil
import subprocess
import sys
import time
import tomllib
import zipfile

import pytest
from sqlalchemy.engine import make_url

from nexus_cutover.db import make_engine
from nexus_cutover.schema import create_legacy_schema
from scripts.demo_airflow import LOCAL_SETTINGS_IMPORT, AirflowStack
from tests.dags.cutover_support import NS, base_conf, draining_tenant

pytestmark = pytest.mark.airflow

REPO = pathlib.Path(__file__).resolve().parents[1]
VERSION = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
#: The release's constraints (what ``make dist`` ships) and the stand-in for Airflow's own (see the docstring).
RELEASE_CONSTRAINTS, AIRFLOWS_CONSTRAINTS = REPO / "constraints.txt", REPO / "constraints-dev.txt"
DAG_IDS = {"connector_projection_cutover", "connector_projection_back_out", "field_history_eligibility", "tenant_rollout"}


def run(cmd: list[str], *, cwd: pathlib.Path, env: dict[str, str] | None = None, timeout: float = 900) -> str:
    done = subprocess.run(cmd, cwd=cwd, env=env, capture_output=True, text=True, timeout=timeout)
    assert done.returncode == 0, f"{' '.join(cmd)} exited {done.returncode}:\n{done.stdout[-3000:]}\n{done.stderr[-3000:]}"
    return done.stdout


@pytest.fixture(scope="module")
def wheel(tmp_path_factory) -> pathlib.Path:
    """Built from a clean copy of what the wheel is made of (setuptools' build/ folder keeps files a checkout deleted)."""
    out, source = tmp_path_factory.mktemp("dist"), tmp_path_factory.mktemp("source")
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")  # include/nexus_sim too: the mapping must leave it out
    for name in ("pyproject.toml", "README.md", "LICENSE"):
        shutil.copy(REPO / name, source / name)
    for folder in ("include", "plugins", "dags"):
        shutil.copytree(REPO / folder, source / folder, ignore=ignore)
    run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(out), str(source)], cwd=out)
    (built,) = out.glob("nexus_cutover-*.whl")
    return built


@pytest.fixture(scope="module")
def venv(wheel, tmp_path_factory) -> pathlib.Path:
    """A fresh venv with the wheel and its [airflow] extra, pinned by the release's constraints and the stand-in for
    Airflow's, installed from a temp dir."""
    where = tmp_path_factory.mktemp("team")
    run([sys.executable, "-m", "venv", str(where / "venv")], cwd=where)
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    run([str(where / "venv" / "bin" / "pip"), "install", "-q", f"{wheel}[airflow]", "-c", str(RELEASE_CONSTRAINTS),
         "-c", str(AIRFLOWS_CONSTRAINTS)], cwd=where, env=env)
    return where / "venv"


def test_the_wheel_carries_the_product_the_plugins_and_the_dags_and_no_simulator(wheel):
    names = zipfile.ZipFile(wheel).namelist()
    tops = {n.split("/")[0] for n in names if not n.split("/")[0].endswith(".dist-info")}
    assert tops == {"nexus_cutover", "nexus_airflow", "nexus_status", "nexus_cutover_airflow", "nexus_cutover_dags"}, tops
    assert not [n for n in names if "nexus_sim" in n]
    for member in ("nexus_status/page.html", "nexus_status/rollouts.html", "nexus_status/embedded.js",
                   "nexus_cutover_airflow/nexus_status_plugin.py",
                   "nexus_cutover_airflow/airflow_local_settings.py", "nexus_cutover_airflow/dags_loader.py",
                   *(f"nexus_cutover_dags/{d}.py" for d in DAG_IDS)):
        assert member in names, member
    # what a team's pip sees (issue 49): the license, the classifiers, the extras a deployment installs (no test tools)
    assert [n for n in names if n.endswith(".dist-info/licenses/LICENSE")], names
    metadata = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith(".dist-info/METADATA"))
    assert "License-Expression: Apache-2.0" in metadata and "Classifier: Framework :: Apache Airflow :: Provider" in metadata
    assert [line for line in metadata.splitlines() if line.startswith("Provides-Extra:")] == [
        "Provides-Extra: airflow", "Provides-Extra: stack"]
    assert "pytest" not in metadata and "hypothesis" not in metadata
    entry_points = next(zipfile.ZipFile(wheel).read(n).decode() for n in names if n.endswith(".dist-info/entry_points.txt"))
    assert "[airflow.plugins]\nnexus_status = nexus_cutover_airflow.nexus_status_plugin:NexusStatusPlugin" in entry_points
    assert "[apache_airflow_provider]\nprovider_info = nexus_airflow.provider:get_provider_info" in entry_points


def test_the_installed_packages_come_from_the_venv_not_the_checkout(venv):
    probe = (
        "import importlib.util, json, nexus_cutover, nexus_airflow, nexus_status, nexus_cutover_airflow, nexus_cutover_dags\n"
        "print(json.dumps({'files': [nexus_cutover.__file__, nexus_airflow.__file__, nexus_status.__file__,"
        " *nexus_cutover_airflow.__path__, *nexus_cutover_dags.__path__], 'version': nexus_cutover.__version__,"
        " 'sim': importlib.util.find_spec('nexus_sim') is not None}))\n"
    )
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}
    got = json.loads(run([str(venv / "bin" / "python"), "-c", probe], cwd=venv.parent, env=env))
    site = str(venv / "lib")  # the two folders without __init__.py (plugins/, dags/) are namespace packages
    assert all(f.startswith(site) and "site-packages" in f for f in got["files"]), got["files"]
    assert got["version"] == VERSION  # one source: pyproject's version, read through importlib.metadata
    assert got["sim"] is False


@pytest.fixture(scope="module")
def team_airflow(venv, tmp_path_factory):
    home = tmp_path_factory.mktemp("team-airflow")
    (home / "dags").mkdir()
    env = {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}  # the dags folder holds the loader only, as the
    run([str(venv / "bin" / "python"), "-m", "nexus_cutover_airflow.dags_loader", str(home / "dags")],  # package wrote it
        cwd=home, env=env)
    assert [p.name for p in (home / "dags").iterdir()] == ["load_nexus_cutover_dags.py"]
    # AirflowStack's environment (scripts.demo_airflow.airflow_env) leaves the plugins folder empty and writes the
    # deployment's config/airflow_local_settings.py with the one documented import (LOCAL_SETTINGS_IMPORT)
    stack = AirflowStack(home, parallelism=2, bin_dir=venv / "bin",
                         extra_env={"AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags")})
    try:
        stack.start(timeout_s=600)
        yield stack
    finally:
        stack.stop()


def airflow_json(stack: AirflowStack, *args: str):
    """``airflow <args> -o json``'s answer: its last line (warnings such as graphviz's come first on stdout)."""
    out = run([str(stack.bin_dir / "airflow"), *args, "-o", "json"], cwd=stack.home, env=stack.env, timeout=300)
    return json.loads(out.strip().splitlines()[-1])


def test_a_team_airflow_runs_the_installed_package(team_airflow, mysql_url):
    stack = team_airflow
    assert (stack.home / "config" / "airflow_local_settings.py").read_text() == LOCAL_SETTINGS_IMPORT
    assert not any((stack.home / "plugins").iterdir())
    plugins = airflow_json(stack, "plugins")
    (ours,) = [p for p in plugins if p["name"] == "nexus_status"]
    assert ours["source"].startswith(f"nexus-cutover=={VERSION}: EntryPoint("), ours  # the entry point, not a folder

    for dag_id in sorted(DAG_IDS):
        stack.wait_for_dag(dag_id, timeout_s=300)
    assert airflow_json(stack, "dags", "list-import-errors") == []
    listed = {d["dag_id"]: d for d in airflow_json(stack, "dags", "list")}
    assert set(listed) >= DAG_IDS, sorted(listed)

    assert "tenants" in stack.request("GET", "/nexus-status/api/tenants", timeout=120)  # the status view answers

    engine = make_engine(mysql_url)
    try:
        create_legacy_schema(engine)
        draining_tenant().write(engine)
    finally:
        engine.dispose()
    u = make_url(mysql_url)
    conn_id = f"nexus_tenant_{NS}"
    stack.put_connection(conn_id, "mysql", host=u.host, port=u.port or 3306, login=u.username,
                         password=u.password or "", schema=u.database)
    run_id = stack.trigger("connector_projection_cutover", base_conf(conn_id, dry_run=True))["dag_run_id"]
    deadline = time.monotonic() + 600
    while (state := stack.dag_run("connector_projection_cutover", run_id)["state"]) not in ("success", "failed"):
        assert time.monotonic() < deadline, f"dry run still {state}"
        time.sleep(3)
    states = {ti["task_id"]: ti["state"] for ti in stack.task_instances("connector_projection_cutover", run_id)}
    assert state == "success", states
    assert stack.xcom("connector_projection_cutover", run_id, "arm_fence")["outcome"] == "would_arm"

"""``make demo-tenant TENANT=<name>`` (issue 34, item 3): one documented command adds a second demo tenant.

Against a real Airflow metadata database (``airflow db migrate`` in a temporary ``AIRFLOW_HOME``, as ``make
airflow`` leaves one): the script seeds the tenant's SQLite file, creates ``nexus_tenant_<name>`` with type
``sqlite`` (the Airflow CLI stores that type now that the sqlite provider is installed, not ``generic``), and
starts the tenant's old runtime. The cutover's own hook, in a fresh process on that ``AIRFLOW_HOME``, resolves the
stored connection to the seeded tenant.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import subprocess
import sys

import pytest

pytestmark = pytest.mark.airflow

REPO = pathlib.Path(__file__).resolve().parents[2]
AIRFLOW = pathlib.Path(sys.executable).with_name("airflow")


def _env(home: pathlib.Path) -> dict[str, str]:
    return {**os.environ, "AIRFLOW_HOME": str(home), "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
            "AIRFLOW__CORE__LOAD_EXAMPLES": "False"}


@pytest.fixture(scope="module")
def state(tmp_path_factory) -> pathlib.Path:
    state = tmp_path_factory.mktemp("airflow-state")
    (state / "home").mkdir()
    migrated = subprocess.run([str(AIRFLOW), "db", "migrate"], env=_env(state / "home"), capture_output=True, text=True,
                              timeout=300)
    assert migrated.returncode == 0, migrated.stderr[-2000:]
    return state


def _add(state: pathlib.Path, *args: str) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, str(REPO / "scripts" / "add_demo_tenant.py"), *args, "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=300)


def test_one_command_adds_a_tenant_whose_connection_the_cutover_resolves(state):
    added = _add(state, "demo2")
    assert added.returncode == 0, added.stdout + added.stderr
    pid = int(added.stdout.split("old runtime pid ")[1].split()[0].rstrip(","))
    try:
        assert 'trigger connector_projection_cutover with {"tenant": "demo2"}' in added.stdout
        got = subprocess.run([str(AIRFLOW), "connections", "get", "nexus_tenant_demo2", "-o", "json"],
                             env=_env(state / "home"), capture_output=True, text=True, timeout=120)
        (conn,) = json.loads(got.stdout)
        assert conn["conn_type"] == "sqlite" and conn["host"] == str(state / "tenant-demo2.db"), conn
        resolve = ("from nexus_airflow.hooks import NexusTenantHook\n"
                   "from sqlalchemy import select\n"
                   "from nexus_cutover.catalog import PackInstall\n"
                   "engine = NexusTenantHook('nexus_tenant_demo2').get_engine()\n"
                   "with engine.connect() as c: print(sorted(set(c.execute(select(PackInstall.c.Namespace)).scalars())))\n")
        # The connection exactly as Airflow stored it, handed to the hook the way a secrets backend would (a process
        # outside a task has no supervisor to ask for connections).
        stored = json.dumps({"conn_type": conn["conn_type"], "host": conn["host"]})
        env = {**_env(state / "home"), "AIRFLOW_CONN_NEXUS_TENANT_DEMO2": stored,
               "PYTHONPATH": os.pathsep.join([str(REPO / "plugins"), str(REPO / "include")])}
        read = subprocess.run([sys.executable, "-c", resolve], env=env, capture_output=True, text=True, timeout=120)
        assert read.returncode == 0 and read.stdout.strip() == "['demo2']", read.stdout + read.stderr
        os.kill(pid, 0)  # its old runtime runs (it stops by itself after a fenced drain)
        again = _add(state, "demo2")
        assert again.returncode != 0 and "was added before" in again.stderr, again.stderr
    finally:
        os.kill(pid, signal.SIGTERM)


@pytest.mark.parametrize("name", ["Demo2", "demo 2", ""])
def test_a_name_the_form_would_refuse_is_refused(state, name):
    refused = _add(state, name)
    assert refused.returncode != 0 and "is not a tenant name the form takes" in refused.stderr, refused.stderr


def test_the_scenario_seeder_creates_a_new_sqlite_tenant_file(tmp_path):
    """``python -m nexus_sim.scenario`` refused a file that did not exist yet ("does not exist"): seeding creates it."""
    target = tmp_path / "tenant-t2.db"
    env = {**os.environ, "NEXUS_TENANT_DSN": f"sqlite:///{target}"}
    done = subprocess.run([sys.executable, "-m", "nexus_sim.scenario", "--namespace", "t2", "--registry-stopped-rows", "10"],
                          env=env, capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["namespace"] == "t2" and target.stat().st_size > 0

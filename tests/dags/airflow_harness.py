"""The Airflow harness of the DAG tests: real task execution, real metadata DB, real tenant DB.

A plain module, imported as ``tests.dags.airflow_harness`` and nothing else:
``tests/dags/conftest.py`` imports it first (its fixtures are built on it), test
modules import their helpers from it. Its body sets up the process's Airflow
environment and must run exactly once per process, so it refuses a second
execution under another module name (a second run would create a second
``AIRFLOW_HOME`` and point the environment at it after Airflow read the first).

What it provides (one Airflow home per pytest process):

* a temporary ``AIRFLOW_HOME`` (:data:`AIRFLOW_HOME`) with an SQLite metadata DB,
  set up *before* anything imports Airflow: this module sets the environment at
  import time, the ``airflow_db`` fixture migrates it once per session
  (:func:`migrate_metadata_db`);
* ``AIRFLOW__CORE__DAGS_FOLDER`` = the real ``dags/`` and the plugins folder = the
  real ``plugins/`` (``dag.test()`` re-parses the DAG from the bundle);
* :func:`connection_json` -- the Airflow connection for a tenant DB URL (a
  ``mysql`` connection for MariaDB/TiDB, a ``sqlite`` one for the embedded
  default), exposed the way a deployment does it (``AIRFLOW_CONN_<ID>``, the
  ``tenant_connection`` fixture);
* :func:`run_dag` -- ``dag.test()`` with a conf and a fixed logical date, then
  the run's task states and XComs (:class:`RunResult`, :func:`collect`);
* :func:`clear_and_rerun` -- run every task again with the same conf on the
  state a failed run left (``dag.test()`` cannot resume a finished run);
* :class:`HitlAnswerer` -- answers a human-in-the-loop task from a background
  thread through the same REST API (``PATCH .../hitlDetails``) a person's
  browser uses, while ``dag.test()`` runs in the main thread.

The first ``dag.test()`` of a process costs ~12 s; later ones well under 1 s.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import pathlib
import sys
import tempfile
import threading
import time
import types
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy.engine import make_url

#: A process-wide record of this module's executions (one per process, or the guard below fails).
LOADS_KEY = "_nexus_airflow_harness_loads"
_loads = sys.modules.setdefault(LOADS_KEY, types.ModuleType(LOADS_KEY, "Executions of tests/dags/airflow_harness.py"))
if not hasattr(_loads, "runs"):
    _loads.runs = []  # [(module name, AIRFLOW_HOME)]
if _loads.runs:
    raise RuntimeError(
        f"tests/dags/airflow_harness.py is executing a second time, as {__name__!r} (first as {_loads.runs[0][0]!r}, "
        f"AIRFLOW_HOME {_loads.runs[0][1]}): import it only as tests.dags.airflow_harness"
    )
if "airflow" in sys.modules:
    # Airflow reads its configuration once, at import; a harness set up afterwards would be ignored.
    raise RuntimeError(
        "tests/dags/airflow_harness.py (imported by tests/dags/conftest.py) must be loaded before anything imports airflow"
    )

REPO = pathlib.Path(__file__).resolve().parents[2]
DAGS_FOLDER = REPO / "dags"
PLUGINS_FOLDER = REPO / "plugins"

AIRFLOW_HOME = pathlib.Path(os.environ.get("NEXUS_TEST_AIRFLOW_HOME") or tempfile.mkdtemp(prefix="nexus-airflow-"))
_AIRFLOW_ENV = {
    "AIRFLOW_HOME": str(AIRFLOW_HOME),
    "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS_FOLDER),
    "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS_FOLDER),
    "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
    "AIRFLOW__CORE__UNIT_TEST_MODE": "False",
    "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{AIRFLOW_HOME / 'airflow.db'}",
    "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_ALL_ADMINS": "True",
    "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
    "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
}
os.environ.update(_AIRFLOW_ENV)
_loads.runs.append((__name__, str(AIRFLOW_HOME)))

LOGICAL_DATE = dt.datetime(2026, 1, 1, tzinfo=dt.UTC)
_run_counter = iter(range(1, 10**9))


def next_logical_date() -> dt.datetime:
    """A logical date no other run of this session used (``dag.test()`` reuses a run with the same date)."""
    return LOGICAL_DATE + dt.timedelta(minutes=next(_run_counter))


def migrate_metadata_db() -> pathlib.Path:
    """Reset and migrate the metadata DB of :data:`AIRFLOW_HOME` (~7 s); the ``airflow_db`` fixture does it once."""
    from airflow.utils import db

    db.resetdb()
    return AIRFLOW_HOME


# ---------------------------------------------------------------------------
# Connections
# ---------------------------------------------------------------------------


def connection_json(url: str) -> str:
    """The Airflow connection (JSON form) for a tenant SQLAlchemy URL."""
    u = make_url(url)
    if u.drivername.startswith("sqlite"):
        return json.dumps({"conn_type": "sqlite", "host": u.database})
    if u.drivername.split("+")[0] in ("mysql", "mariadb"):
        return json.dumps(
            {
                "conn_type": "mysql",
                "host": u.host,
                "port": u.port or 3306,
                "login": u.username,
                "password": u.password,
                "schema": u.database,
            }
        )
    raise ValueError(f"no Airflow connection type for {u.drivername!r}")


# ---------------------------------------------------------------------------
# Running DAGs
# ---------------------------------------------------------------------------


@dataclass
class RunResult:
    dag_id: str
    run_id: str
    state: str
    task_states: dict[str, str]  # "task_id" or "task_id[map_index]" -> state
    xcoms: dict[tuple[str, int, str], Any] = field(default_factory=dict)  # (task_id, map_index, key) -> value
    conf: dict[str, Any] = field(default_factory=dict)

    def xcom(self, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
        return self.xcoms.get((task_id, map_index, key))

    def state_of(self, task_id: str) -> str | None:
        return self.task_states.get(task_id)


def load_dag(dag_id: str):
    """The DAG ``dag_id`` as parsed from the real ``dags/`` folder."""
    from airflow.dag_processing.dagbag import DagBag

    bag = DagBag(dag_folder=str(DAGS_FOLDER))
    assert not bag.import_errors, bag.import_errors
    dag = bag.get_dag(dag_id)
    assert dag is not None, f"DAG {dag_id!r} not found in {DAGS_FOLDER}"
    return dag


def collect(dag_id: str, run_id: str) -> RunResult:
    """States and XComs of a run, read from the metadata DB."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.models.xcom import XComModel
    from airflow.utils.session import create_session
    from sqlalchemy import select

    with create_session() as session:
        dr = session.scalar(select(DagRun).where(DagRun.dag_id == dag_id, DagRun.run_id == run_id))
        tis = session.scalars(
            select(TaskInstance).where(TaskInstance.dag_id == dag_id, TaskInstance.run_id == run_id)
        ).all()
        states = {}
        for ti in tis:
            name = ti.task_id if ti.map_index < 0 else f"{ti.task_id}[{ti.map_index}]"
            states[name] = str(ti.state.value if hasattr(ti.state, "value") else ti.state)
        rows = session.scalars(select(XComModel).where(XComModel.dag_id == dag_id, XComModel.run_id == run_id)).all()
        xcoms = {}
        for row in rows:
            value = row.value
            if isinstance(value, (str, bytes)):
                with contextlib.suppress(ValueError):
                    value = json.loads(value)
            xcoms[(row.task_id, row.map_index, row.key)] = value
        state = str(dr.state.value if hasattr(dr.state, "value") else dr.state)
        return RunResult(dag_id, run_id, state, states, xcoms)


def run_dag(dag, conf: dict[str, Any], *, logical_date: dt.datetime | None = None) -> RunResult:
    """Run ``dag`` once with ``conf`` (``dag.test()``, main thread) and collect the outcome."""
    assert threading.current_thread() is threading.main_thread(), "dag.test() must run in the main thread"
    dr = dag.test(logical_date=logical_date or next_logical_date(), run_conf=conf)
    result = collect(dag.dag_id, dr.run_id)
    result.conf = dict(conf)
    return result


def clear_and_rerun(dag, result: RunResult) -> RunResult:
    """Run every task again, with ``result``'s conf, on the tenant state the failed run left.

    ``dag.test()`` cannot resume a finished run: it replaces a run of the same
    logical date and clears all of its task instances. So the rerun is a new run
    in which *every* task -- the ones that succeeded before too -- executes again:
    a stricter convergence test than clearing the failed task alone.
    """
    return run_dag(dag, result.conf)


# ---------------------------------------------------------------------------
# Human in the loop, answered through the public REST API
# ---------------------------------------------------------------------------


class HitlAnswerer(threading.Thread):
    """Answer HITL tasks of ``dag_id`` as they become pending, like a person in the browser.

    ``answers`` maps task_id -> chosen option (a str) or a callable
    ``(detail_json) -> str | None`` (None: leave this one unanswered). Every
    answer goes through ``PATCH /api/v2/dags/{dag_id}/dagRuns/{run_id}/
    taskInstances/{task_id}/{map_index}/hitlDetails``. ``seen`` keeps each
    pending detail as the API returned it (subject, body, options...).
    """

    def __init__(self, dag_id: str, answers: dict[str, Any], *, timeout: float = 300.0, poll: float = 0.5):
        super().__init__(daemon=True, name=f"hitl-answerer-{dag_id}")
        self.dag_id = dag_id
        self.answers = dict(answers)
        self.timeout = timeout
        self.poll = poll
        self.seen: list[dict[str, Any]] = []
        self.responses: list[tuple[int, Any]] = []
        self.errors: list[BaseException] = []
        self.transient: list[Exception] = []  # failed polls and answers, retried (a test may assert on them)
        self._halt = threading.Event()
        self._answered: set[tuple] = set()

    def stop(self) -> None:
        self._halt.set()
        self.join(timeout=10)

    def __enter__(self) -> HitlAnswerer:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

    def run(self) -> None:
        try:
            from airflow.api_fastapi.app import create_app
            from fastapi.testclient import TestClient

            client = None
            deadline = time.monotonic() + self.timeout
            while not self._halt.is_set() and time.monotonic() < deadline:
                try:
                    client = client or TestClient(create_app(apps="core"))
                    resp = client.get(f"/api/v2/dags/{self.dag_id}/dagRuns/~/hitlDetails", params={"limit": 100})
                    if resp.status_code == 200:
                        for detail in resp.json().get("hitl_details", []):
                            self._maybe_answer(client, detail)
                except Exception as exc:  # noqa: BLE001 - e.g. SQLite's "database is locked" while dag.test writes
                    # A person whose click failed clicks again: retried at the next poll. Ending the thread here
                    # would leave dag.test() waiting for input forever (it has no deadline of its own).
                    self.transient.append(exc)
                self._halt.wait(self.poll)
        except BaseException as exc:  # noqa: BLE001 - surfaced to the test through .errors
            self.errors.append(exc)

    def _maybe_answer(self, client, detail: dict[str, Any]) -> None:
        ti = detail.get("task_instance") or {}
        task_id = ti.get("task_id")
        run_id = ti.get("dag_run_id") or ti.get("run_id")
        map_index = ti.get("map_index", -1)
        key = (task_id, run_id, map_index, ti.get("try_number"))
        if detail.get("response_received") or key in self._answered or task_id not in self.answers:
            return
        if ti.get("state") != "awaiting_input":
            # Not parked yet (the worker writes the question, then parks): an answer now is stored but resumes
            # nothing, and dag.test() then waits for input forever (seen in a clean-clone run). A person answers
            # what the UI lists as waiting; asked again at the next poll.
            return
        answer = self.answers[task_id]
        chosen = answer(detail) if callable(answer) else answer
        if chosen is None:
            self._answered.add(key)
            self.seen.append(detail)
            return
        resp = client.patch(
            f"/api/v2/dags/{self.dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}/hitlDetails",
            json={"chosen_options": [chosen], "params_input": {}},
        )
        if resp.status_code >= 500:  # the server failed, not the answer: asked again at the next poll
            self.transient.append(RuntimeError(f"PATCH hitlDetails {task_id}: HTTP {resp.status_code}"))
            return
        self._answered.add(key)
        self.seen.append(detail)
        self.responses.append((resp.status_code, resp.json() if resp.content else None))

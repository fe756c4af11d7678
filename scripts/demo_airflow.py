"""A real local Airflow (``airflow standalone`` on its own SQLite metadata DB) for the demo, ``make airflow`` and tests.

:class:`AirflowStack` starts it in its own process group with SIGINT restored
(so SIGINT stops every component cleanly), waits for ``/api/v2/monitor/health``,
logs in through ``POST /auth/token`` with the generated admin password, and
talks to the public REST API (the same one the UI uses). :meth:`AirflowStack.stop`
sends SIGINT, waits, then terminates whatever is left of *its own* process group.

Settings for a 2-core machine: LocalExecutor with low parallelism, DAGs unpaused
at creation, no examples, the repository's ``dags/`` and the installed package's plugin and local settings. Nothing
here holds a tenant password: tenant connections are created by the caller.
"""

from __future__ import annotations

import contextlib
import json
import os
import pathlib
import re
import signal
import socket
import subprocess
import sys
import time
import urllib.error
import urllib.request
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
BIN = pathlib.Path(sys.executable).parent


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


#: A deployment's own ``$AIRFLOW_HOME/config/airflow_local_settings.py`` adds the product's (the cluster policy, the
#: Celery preload) with this line (README, "Install into your Airflow"); the local stacks write it as a team would.
LOCAL_SETTINGS_IMPORT = "from nexus_cutover_airflow.airflow_local_settings import *  # noqa: F403\n"


def deploy_like_a_team(home: pathlib.Path) -> pathlib.Path:
    """``home``'s ``config/airflow_local_settings.py`` (the product's settings, imported) and an empty plugins folder:
    the plugin comes from the installed package's entry point, as in a team's Airflow. Returns the plugins folder."""
    (home / "config").mkdir(parents=True, exist_ok=True)
    (home / "config" / "airflow_local_settings.py").write_text(LOCAL_SETTINGS_IMPORT, encoding="utf-8")
    plugins = home / "plugins"
    plugins.mkdir(exist_ok=True)
    return plugins


def airflow_env(home: pathlib.Path, port: int, *, parallelism: int = 4) -> dict[str, str]:
    """The configuration of one local stack; every port is its own, so several stacks can run side by side. The
    repository's DAG files, the installed nexus-cutover (plugin by entry point, settings by import: ``deploy_like_a_team``)."""
    base = f"http://127.0.0.1:{port}"
    return {
        "AIRFLOW_HOME": str(home),
        "AIRFLOW__CORE__DAGS_FOLDER": str(REPO / "dags"),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(deploy_like_a_team(home)),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "LocalExecutor",
        "AIRFLOW__CORE__PARALLELISM": str(parallelism),
        "AIRFLOW__CORE__DAGS_ARE_PAUSED_AT_CREATION": "False",
        "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": "admin:admin",
        "AIRFLOW__CORE__EXECUTION_API_SERVER_URL": f"{base}/execution/",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home / 'airflow.db'}",
        "AIRFLOW__API__HOST": "127.0.0.1",
        "AIRFLOW__API__PORT": str(port),
        "AIRFLOW__API__BASE_URL": base,
        "AIRFLOW__API__WORKERS": "1",
        "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": "30",
        "AIRFLOW__SCHEDULER__ENABLE_HEALTH_CHECK": "False",
        "AIRFLOW__LOGGING__LOGGING_LEVEL": "INFO",
        # a task's start call to the execution API (default 5 s) timed out on a loaded 2-core machine and the
        # task ended failed while still "queued"; slow is not wrong, so give it a minute
        "AIRFLOW__WORKERS__EXECUTION_API_TIMEOUT": "60",
        # a task's supervisor notices its process's exit on a socket's EOF; when the EOF comes a moment before the
        # exit it sleeps until its next heartbeat check, [workers] min_heartbeat_interval (5 s): 48 of the 130 tasks of
        # a rollout of 11 held their slot 5 s after their end (bench-stack). 1 s bounds that, for a heartbeat a second
        "AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL": "1",
        "AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port()),
        "AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port()),
        "PATH": f"{BIN}{os.pathsep}{os.environ.get('PATH', '')}",
        # The delivery ledger's embedded default: a SQLite file beside this Airflow (issue 38; runbook, "The
        # delivery ledger"); a deployment defines `nexus_ledger` on MySQL/MariaDB/TiDB or PostgreSQL instead.
        "AIRFLOW_CONN_NEXUS_LEDGER": json.dumps({"conn_type": "sqlite", "host": str(ledger_file(home)),
                                                 "description": "the delivery ledger (embedded SQLite)"}),
    }


def ledger_file(home: pathlib.Path) -> pathlib.Path:
    """The delivery ledger's SQLite file of the local stack whose Airflow home is ``home``."""
    return pathlib.Path(home) / "nexus-ledger.db"


def _foreign_airflow_setting(key: str) -> bool:
    """Airflow configuration inherited from the caller (e.g. a test harness) must not leak into this stack;
    connections and variables (``AIRFLOW_CONN_*``, ``AIRFLOW_VAR_*``) may."""
    return key == "AIRFLOW_HOME" or key.startswith("AIRFLOW__") or key == "AIRFLOW_CONFIG"


def _restore_sigint() -> None:
    signal.signal(signal.SIGINT, signal.SIG_DFL)


class ApiError(RuntimeError):
    def __init__(self, method: str, path: str, status: int, body: str):
        super().__init__(f"{method} {path}: HTTP {status}: {body[:500]}")
        self.status = status


class AirflowApi:
    """The public REST API (the one the UI uses) of a local Airflow whose ``AIRFLOW_HOME`` is ``home``:
    login with the generated admin password, then the calls the demo and the tests make."""

    home: pathlib.Path
    base_url: str
    token: str | None = None

    def admin_password(self) -> str:
        path = self.home / "simple_auth_manager_passwords.json.generated"
        return json.loads(path.read_text())["admin"]

    def login(self) -> str:
        body = self.request("POST", "/auth/token", {"username": "admin", "password": self.admin_password()},
                            auth=False)
        self.token = body["access_token"]
        return self.token

    # -- REST ---------------------------------------------------------------

    def request(self, method: str, path: str, body: Any = None, *, auth: bool = True, timeout: float = 30.0) -> Any:
        data = json.dumps(body).encode() if body is not None else None
        req = urllib.request.Request(f"{self.base_url}{path}", data=data, method=method)
        req.add_header("Content-Type", "application/json")
        req.add_header("Accept", "application/json")
        if auth and self.token:
            req.add_header("Authorization", f"Bearer {self.token}")
        try:
            with urllib.request.urlopen(req, timeout=timeout) as resp:
                raw = resp.read()
        except urllib.error.HTTPError as exc:
            raise ApiError(method, path, exc.code, exc.read().decode(errors="replace")) from None
        return json.loads(raw) if raw else None

    def wait_for_dag(self, dag_id: str, timeout_s: float = 120.0) -> dict:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                return self.request("GET", f"/api/v2/dags/{dag_id}")
            except ApiError as exc:
                if exc.status != 404 or time.monotonic() > deadline:
                    raise
            time.sleep(2.0)

    def put_connection(self, conn_id: str, conn_type: str, **fields: Any) -> None:
        """Create or replace an Airflow connection through the REST API (as an engineer would in the UI)."""
        self.put("/api/v2/connections", conn_id, {"connection_id": conn_id, "conn_type": conn_type, **fields})

    def put(self, collection: str, name: str, body: dict[str, Any]) -> None:
        """Create ``name`` in the REST collection ``collection`` (POST), or replace it when it exists (PATCH)."""
        try:
            self.request("POST", collection, body)
        except ApiError as exc:
            if exc.status != 409:
                raise
            self.request("PATCH", f"{collection}/{name}", body)

    def trigger(self, dag_id: str, conf: dict, run_id: str | None = None) -> dict:
        body: dict[str, Any] = {"logical_date": None, "conf": conf}
        if run_id:
            body["dag_run_id"] = run_id
        return self.request("POST", f"/api/v2/dags/{dag_id}/dagRuns", body)

    def dag_run(self, dag_id: str, run_id: str) -> dict:
        return self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}")

    def task_instances(self, dag_id: str, run_id: str) -> list[dict]:
        return self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances?limit=100")["task_instances"]

    def xcom(self, dag_id: str, run_id: str, task_id: str, key: str = "return_value", map_index: int = -1) -> Any:
        try:
            entry = self.request(
                "GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/xcomEntries/{key}"
                f"?map_index={map_index}&deserialize=true&stringify=false")
        except ApiError as exc:
            if exc.status == 404:
                return None
            raise
        return entry.get("value")

    def paged(self, path: str, key: str) -> list[dict]:
        """Every entry ``key`` of a list endpoint, page by page: the API serves at most 100 a page (its
        ``maximum_page_limit``) whatever ``limit`` asks. ``path`` may carry filters, not limit or offset."""
        out: list[dict] = []
        sep = "&" if "?" in path else "?"
        while True:
            page = self.request("GET", f"{path}{sep}limit=100&offset={len(out)}")
            out += page.get(key, [])
            if not page.get(key) or len(out) >= int(page.get("total_entries", len(out))):
                return out

    def pending_hitl(self, dag_id: str, run_id: str) -> list[dict]:
        body = self.request("GET", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/hitlDetails")
        return [d for d in body.get("hitl_details", []) if not d.get("response_received")]

    def answer_hitl(self, dag_id: str, run_id: str, task_id: str, option: str, map_index: int = -1) -> dict:
        """Answer a waiting question once the scheduler has handled the exit of the try that asked it
        (:meth:`park_handled`): answered sooner, Airflow 3.3.2 can fail the task instead of resuming it."""
        deadline = time.monotonic() + 120
        while not self.park_handled(dag_id, run_id, task_id, map_index):
            if time.monotonic() > deadline:
                raise RuntimeError(f"the scheduler never logged the exit of {dag_id}.{task_id} ({run_id}) parked "
                                   f"awaiting input; see {', '.join(map(str, self.scheduler_logs()))}")
            time.sleep(0.5)
        return self.request(
            "PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}/{map_index}/hitlDetails",
            {"chosen_options": [option], "params_input": {}})

    def scheduler_logs(self) -> list[pathlib.Path]:
        """The files this deployment's scheduler logs to (none known: answers are not held back; the
        production stack's tests answer after their own waits, and its scheduler restarts in them)."""
        return []

    def park_handled(self, dag_id: str, run_id: str, task_id: str, map_index: int = -1) -> bool:
        """Whether the scheduler logged the end of the try that parked this task awaiting input.

        Airflow 3.3.2 resumes an answered question at once (the task goes back to the queue) while the
        parked try's exit may still wait in the executor's event buffer (seconds on a loaded machine); an
        event handled after the requeue finds the task "queued" and fails it ("Executor reported that the
        task instance ... finished with state success, but the task instance's state attribute is queued"):
        the answer is lost and nothing after it runs. A person needs seconds to answer; a script does not.
        """
        paths = [p for p in self.scheduler_logs() if p.exists()]
        if not paths:
            return True
        path = f"/api/v2/dags/{dag_id}/dagRuns/{run_id}/taskInstances/{task_id}"
        ti = self.request("GET", path + (f"/{map_index}" if map_index >= 0 else ""))
        parked = re.compile(re.escape(f"TaskInstance Finished: dag_id={dag_id}, task_id={task_id}, run_id={run_id}, "
                                      f"map_index={map_index},").encode()
                            + rb"[^\n]* state=awaiting_input,[^\n]* try_number=" + str(ti["try_number"]).encode() + b",")
        return any(parked.search(p.read_bytes()) for p in paths)


class AirflowStack(AirflowApi):
    """``airflow standalone`` under ``home``, its REST API at ``base_url``."""

    def __init__(self, home: pathlib.Path, *, port: int | None = None, parallelism: int = 4,
                 extra_env: dict[str, str] | None = None, bin_dir: pathlib.Path = BIN):
        """``bin_dir``: the venv whose ``airflow`` runs (default: this interpreter's); another venv (a wheel installed
        as a team would, tests/test_wheel_install.py) gets its own ``bin`` first on ``PATH``, no ``PYTHONPATH``, and
        ``home`` as its working directory, so nothing of the checkout is on its ``sys.path``."""
        self.home = pathlib.Path(home).resolve()
        self.bin_dir = pathlib.Path(bin_dir)
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        inherited = {k: v for k, v in os.environ.items() if not _foreign_airflow_setting(k)}
        self.env = {**inherited, **airflow_env(self.home, self.port, parallelism=parallelism), **(extra_env or {})}
        if self.bin_dir != BIN:
            self.env.pop("PYTHONPATH", None)
            self.env["PATH"] = f"{self.bin_dir}{os.pathsep}{self.env['PATH']}"
        self.proc: subprocess.Popen | None = None
        self.token: str | None = None
        self.log_path = self.home / "standalone.log"

    def scheduler_logs(self) -> list[pathlib.Path]:
        return [self.home / "standalone.log"]  # every component's lines, prefixed with its name

    # -- lifecycle ----------------------------------------------------------

    def start(self, timeout_s: float = 180.0) -> None:
        self.home.mkdir(parents=True, exist_ok=True)
        with open(self.log_path, "ab") as out:
            self.proc = subprocess.Popen(
                [str(self.bin_dir / "airflow"), "standalone"], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                stdin=subprocess.DEVNULL, cwd=None if self.bin_dir == BIN else self.home, start_new_session=True,
                preexec_fn=_restore_sigint,
            )
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                self.stop()  # its components may outlive it
                raise RuntimeError(f"airflow standalone exited with {self.proc.returncode}; see {self.log_path}")
            if self._healthy():
                break
            time.sleep(1.0)
        else:
            self.stop()  # never leave a half-started stack behind
            raise RuntimeError(f"airflow standalone not healthy after {timeout_s:.0f}s; see {self.log_path}")
        self.login()

    def _healthy(self) -> bool:
        try:
            with urllib.request.urlopen(f"{self.base_url}/api/v2/monitor/health", timeout=3) as resp:
                body = json.loads(resp.read())
        except (OSError, ValueError):
            return False
        return all(body.get(c, {}).get("status") == "healthy" for c in ("metadatabase", "scheduler", "triggerer",
                                                                          "dag_processor"))

    def stop(self, timeout_s: float = 60.0) -> None:
        """SIGINT (clean stop of every component), then TERM/KILL what is left of this stack's process group."""
        if self.proc is None or self.proc.poll() is not None and not _group_alive(self.proc.pid):
            return
        pgid = self.proc.pid
        with contextlib.suppress(ProcessLookupError):
            os.kill(pgid, signal.SIGINT)  # the standalone supervisor stops its components itself
        for sig, wait in ((None, timeout_s), (signal.SIGTERM, 15.0), (signal.SIGKILL, 5.0)):
            if sig is not None:
                with contextlib.suppress(ProcessLookupError):
                    os.killpg(pgid, sig)
            deadline = time.monotonic() + wait
            while time.monotonic() < deadline:
                self.proc.poll()
                if not _group_alive(pgid):
                    return
                time.sleep(0.5)

    def __enter__(self) -> AirflowStack:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

def _group_alive(pgid: int) -> bool:
    try:
        os.killpg(pgid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    # a group whose only members are zombies of ours counts as gone
    for pid in _group_members(pgid):
        try:
            with open(f"/proc/{pid}/stat") as f:
                state = f.read().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z":
            return True
    return False


def _group_members(pgid: int) -> list[int]:
    out = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                fields = f.read().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(fields[2]) == pgid:
            out.append(int(entry))
    return out

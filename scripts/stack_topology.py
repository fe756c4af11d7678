"""The production topology of ``scripts/stack.py``: :class:`ProductionStack`, PostgreSQL + Redis + Airflow with
CeleryExecutor (the components of :data:`COMPONENTS`, each a separate process), all under one root folder.

* Start: PostgreSQL, Redis, ``airflow db migrate``, then every component in :data:`COMPONENTS` order, then a wait
  until the stack is healthy (:meth:`ProductionStack.problems` empty: every component running, the health
  endpoint's parts healthy, each worker "ready" since its latest start, two triggerers heartbeating) and a login.
  A start that fails stops whatever it had started before it raises.
* Stop: the components in waves (workers and triggerers, then scheduler and dag-processor, then the api-server),
  then the sweep of every process carrying the stack's marker, then Redis, then PostgreSQL; afterwards
  :meth:`ProductionStack.leftovers` is empty.
* Every Airflow process gets the same environment: the stack's marker, one set of secrets (Fernet key, JWT secret,
  API secret key: each process would otherwise make its own), the settings of ``deploy/airflow-settings.toml``; none
  of the caller's own Airflow configuration (``AIRFLOW_HOME``, ``AIRFLOW__*``, ``AIRFLOW_CONFIG``) leaks in, its
  connections and variables may; ``extra_env`` goes last (a test's or the bench's own settings).

Settings: ``deploy/airflow-settings.toml`` (:data:`DEPLOY_SETTINGS`, read by :mod:`scripts.deploy_settings`), the one
source of truth the deployment recipe (``deploy/Dockerfile``, ``deploy/helm-values*.yaml``) agrees with
(``tests/deploy``): its Airflow configuration and the product's switches in every process's environment, its
triggerers and workers (:data:`COMPONENTS`), each worker's ``--concurrency`` and each triggerer's ``--capacity``, its
pools (created once the API answers), and ``[metrics]`` (the StatsD lines go to a listener of the stack's own, whose
``nexus.*`` lines are appended to ``logs/metrics.log``). :data:`SETTINGS` is the short form ``make stack`` prints. The
values are chosen for 2 cores; the runbook's "distributed Airflow" section quotes them and says why.

Of the stack's modules this one imports ``scripts/stack_processes.py`` and ``scripts/stack_services.py`` (and
``scripts/deploy_settings.py``, ``scripts/metrics_log.py``);
``scripts/stack.py`` (the command) imports it.
"""

from __future__ import annotations

import base64
import os
import pathlib
import secrets
import subprocess
import time
import uuid
from typing import Any

from scripts.demo_airflow import (
    BIN,
    AirflowApi,
    ApiError,
    _foreign_airflow_setting,
    airflow_env,
    free_port,
)
from scripts.deploy_settings import config_env, pools, product_env
from scripts.deploy_settings import load as load_deploy_settings
from scripts.stack_processes import STACK_ID_ENV, Component, _ready_lines, _tail, alive, parent_of, pids_with_env, sweep
from scripts.stack_services import Postgres, Redis, StackError, require_python_packages

#: ``deploy/airflow-settings.toml``: what the stack runs with, and what the deployment recipe ships.
DEPLOY_SETTINGS: dict[str, Any] = load_deploy_settings()

#: The short form of :data:`DEPLOY_SETTINGS` that ``make stack`` prints (and that ``scripts.stack`` exports).
SETTINGS: dict[str, Any] = {
    "parallelism": DEPLOY_SETTINGS["config"]["core"]["parallelism"],
    "worker_concurrency": DEPLOY_SETTINGS["config"]["celery"]["worker_concurrency"],
    "worker_prefetch_multiplier": DEPLOY_SETTINGS["config"]["celery"]["worker_prefetch_multiplier"],
    "triggerer_capacity": DEPLOY_SETTINGS["config"]["triggerer"]["capacity"],
    "task_instance_heartbeat_timeout": DEPLOY_SETTINGS["config"]["scheduler"]["task_instance_heartbeat_timeout"],
    "dag_processor_refresh_interval": DEPLOY_SETTINGS["config"]["dag_processor"]["refresh_interval"],
    "scheduler_idle_sleep_time": DEPLOY_SETTINGS["config"]["scheduler"]["scheduler_idle_sleep_time"],
    "min_heartbeat_interval": DEPLOY_SETTINGS["config"]["workers"]["min_heartbeat_interval"],
    "triggerers": DEPLOY_SETTINGS["topology"]["triggerers"],
    "workers": DEPLOY_SETTINGS["topology"]["workers"],
}

#: The Airflow components, started in this order (stopped in the reverse order).
COMPONENTS = ("api-server", "scheduler", "dag-processor",
              *(f"triggerer-{i}" for i in range(1, SETTINGS["triggerers"] + 1)),
              *(f"worker-{i}" for i in range(1, SETTINGS["workers"] + 1)))


class ProductionStack(AirflowApi):
    """PostgreSQL + Redis + Airflow (CeleryExecutor; 2 triggerers, 2 workers), all under ``root``.

    Logs: ``root/logs/<component>.log`` (plus ``postgres.log``, ``redis.log``); task logs under
    ``root/airflow/logs``. The REST API (login, trigger, HITL, XCom) is :class:`AirflowApi`'s.
    """

    def __init__(self, root: pathlib.Path, *, port: int | None = None, extra_env: dict[str, str] | None = None):
        self.root = pathlib.Path(root).resolve()
        self.home = self.root / "airflow"
        self.logs = self.root / "logs"
        self.port = port or free_port()
        self.base_url = f"http://127.0.0.1:{self.port}"
        self.stack_id = uuid.uuid4().hex
        self.extra_env = dict(extra_env or {})
        self.postgres: Postgres | None = None
        self.redis: Redis | None = None
        self.components: dict[str, Component] = {}
        self.token = None
        self.env: dict[str, str] = {}
        self.metrics = None  # the StatsD listener (scripts.metrics_log.MetricsLog) while the stack runs, when statsd_on

    # -- environment ----------------------------------------------------------

    def _env(self) -> dict[str, str]:
        assert self.postgres and self.redis
        return self.environment(self.postgres.url, self.redis.url)

    def environment(self, metadata_url: str, broker_url: str) -> dict[str, str]:
        """Every Airflow process's environment (see the module docstring), on the metadata database and broker of
        these URLs; the settings file's values over the local stack's defaults, ``extra_env`` over everything."""
        from cryptography.fernet import Fernet

        inherited = {k: v for k, v in os.environ.items()
                     if not _foreign_airflow_setting(k) and k not in ("NEXUS_MIN_POLL_INTERVAL_S", "NEXUS_TEST_MYSQL_URL")}
        env = {**inherited, **airflow_env(self.home, self.port, parallelism=SETTINGS["parallelism"])}
        env.update({
            STACK_ID_ENV: self.stack_id,
            "AIRFLOW__CORE__EXECUTOR": DEPLOY_SETTINGS["airflow"]["executor"],
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": metadata_url,
            "AIRFLOW__CELERY__BROKER_URL": broker_url,
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + metadata_url,  # psycopg2: SQLAlchemy 2.1 means psycopg 3
            # one set of secrets for every process (each would otherwise generate its own)
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "AIRFLOW__API_AUTH__JWT_SECRET": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.home / "logs"),
        })
        env.update(config_env(DEPLOY_SETTINGS))
        env.update(product_env(DEPLOY_SETTINGS))
        if self.metrics is not None:  # [metrics] statsd_on: to the stack's own listener
            env.update({"AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1", "AIRFLOW__METRICS__STATSD_PORT": str(self.metrics.port)})
        env.update(self.extra_env)
        return env

    def _component_args(self, name: str) -> tuple[list[str], dict[str, str]]:
        if name.startswith("worker-"):
            return (["celery", "worker", "--celery-hostname", f"{name}@%h",
                     "--concurrency", str(SETTINGS["worker_concurrency"])],
                    {"AIRFLOW__LOGGING__WORKER_LOG_SERVER_PORT": str(free_port())})
        if name.startswith("triggerer-"):
            return (["triggerer", "--capacity", str(SETTINGS["triggerer_capacity"])],
                    {"AIRFLOW__LOGGING__TRIGGER_LOG_SERVER_PORT": str(free_port())})
        return [name], {}

    # -- lifecycle --------------------------------------------------------------

    def start(self, timeout_s: float = 240.0) -> None:
        require_python_packages()
        self.root.mkdir(parents=True, exist_ok=True)
        self.logs.mkdir(parents=True, exist_ok=True)
        self.home.mkdir(parents=True, exist_ok=True)
        deadline = time.monotonic() + timeout_s
        try:
            self.postgres = Postgres(self.logs / "postgres.log", free_port())
            self.postgres.start()
            self.redis = Redis(self.root, self.logs / "redis.log", free_port())
            self.redis.start()
            if DEPLOY_SETTINGS["config"].get("metrics", {}).get("statsd_on"):
                from scripts.metrics_log import MetricsLog

                self.metrics = MetricsLog(self.logs / "metrics.log")
                self.metrics.start()
            self.env = self._env()
            self._migrate(timeout_s=max(30.0, deadline - time.monotonic()))
            for name in COMPONENTS:
                args, extra = self._component_args(name)
                self.components[name] = Component(name, args, {**self.env, **extra}, self.logs / f"{name}.log")
                self.components[name].start()
            self.wait_healthy(max(30.0, deadline - time.monotonic()))
            self.login()
            self.create_pools()
        except BaseException:
            self.stop()
            raise

    def create_pools(self) -> None:
        """The settings file's pools, created (or set to its slots) through the REST API, as a deployment's
        ``airflow pools import`` does."""
        for name, pool in pools(DEPLOY_SETTINGS).items():
            self.put("/api/v2/pools", name, {"name": name, **pool})

    def _migrate(self, timeout_s: float) -> None:
        log = self.logs / "db-migrate.log"
        with open(log, "ab") as out:
            r = subprocess.run([str(BIN / "airflow"), "db", "migrate"], env=self.env, stdout=out, stderr=subprocess.STDOUT,
                               stdin=subprocess.DEVNULL, timeout=timeout_s)
        if r.returncode != 0:
            raise StackError(f"airflow db migrate failed ({r.returncode}); see {log}:\n{_tail(log)}")

    def problems(self) -> list[str]:
        """What is not (yet) healthy: components down, the health endpoint, triggerers and workers not ready."""
        out = [f"{c.name} exited with {c.proc.returncode}" for c in self.components.values() if not c.running()]
        health = self._health()
        for part in ("metadatabase", "scheduler", "triggerer", "dag_processor"):
            if (health.get(part) or {}).get("status") != "healthy":
                out.append(f"{part} not healthy")
        for name, c in self.components.items():
            if name.startswith("worker-") and f"{name}@" not in _ready_lines(c.log, c.starts):
                out.append(f"{name} not ready")
        if not out and self.live_triggerers() < SETTINGS["triggerers"]:
            out.append(f"fewer than {SETTINGS['triggerers']} triggerers heartbeating")
        return out

    def wait_healthy(self, timeout_s: float = 120.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            left = self.problems()
            if not left:
                return
            if any("exited" in p for p in left) or time.monotonic() > deadline:
                raise StackError(f"the stack is not healthy after {timeout_s:.0f}s: {'; '.join(left)}\n{self.log_tails()}")
            time.sleep(1.0)

    def _health(self) -> dict:
        try:
            return self.request("GET", "/api/v2/monitor/health", auth=False, timeout=5)
        except (OSError, ValueError, ApiError):
            return {}

    def metadata(self, sql: str, args: tuple = ()) -> list[tuple]:
        """A read of the metadata database (PostgreSQL), for checks the REST API does not expose."""
        import psycopg2

        assert self.postgres
        conn = psycopg2.connect(host="127.0.0.1", port=self.postgres.port, user="airflow", password=self.postgres.password,
                                dbname="airflow", connect_timeout=5)
        try:
            with conn.cursor() as cur:
                cur.execute(sql, args)
                return cur.fetchall()
        finally:
            conn.close()

    def live_triggerers(self) -> int:
        rows = self.metadata("SELECT count(*) FROM job WHERE job_type = 'TriggererJob' AND state = 'running' "
                             "AND latest_heartbeat > now() - interval '30 seconds'")
        return int(rows[0][0])

    def restart(self, name: str, *, wait: bool = True) -> None:
        """Stop one component cleanly (SIGTERM) and start it again; wait until the stack is healthy."""
        c = self.components[name]
        c.stop()
        c.start()
        if wait:
            self.wait_healthy()
            if name == "api-server":
                self.login()

    def kill(self, name: str) -> list[int]:
        """SIGKILL one component and every process under it (its task processes too)."""
        return self.components[name].kill()

    def component_of(self, pid: int) -> str | None:
        """The component whose process tree holds ``pid`` (e.g. the worker running a task instance)."""
        mains = {c.pid: name for name, c in self.components.items() if c.running()}
        seen = 0
        while pid and pid > 1 and seen < 64:
            if pid in mains:
                return mains[pid]
            pid = parent_of(pid) or 0
            seen += 1
        return None

    def log_tails(self, lines: int = 30) -> str:
        parts = [f"----- {c.name} ({c.log}) -----\n{c.tail(lines)}" for c in self.components.values()]
        for extra in ("postgres.log", "redis.log", "db-migrate.log"):
            path = self.logs / extra
            if path.exists():
                parts.append(f"----- {extra} -----\n{_tail(path, lines)}")
        return "\n".join(parts)

    def stop(self) -> None:
        """Every component (reverse order, SIGTERM then SIGKILL), whatever still carries the stack's marker
        (task processes, new hosts started by runs), then Redis and PostgreSQL. Leaves no process behind."""
        # in waves, each wave's processes at once (a triggerer takes ~12 s to stop cleanly)
        from concurrent.futures import ThreadPoolExecutor

        waves = [[n for n in self.components if n.startswith(("worker-", "triggerer-"))],
                 [n for n in self.components if n in ("scheduler", "dag-processor")],
                 [n for n in self.components if n == "api-server"]]
        for wave in waves:
            with ThreadPoolExecutor(max(1, len(wave))) as pool:
                list(pool.map(lambda n: self.components[n].stop(), wave))
        sweep(self.stack_id)
        if self.redis:
            self.redis.stop()
        if self.postgres:
            self.postgres.stop()
        if self.metrics is not None:
            self.metrics.stop()
            self.metrics = None

    def leftovers(self) -> list[int]:
        """Processes of this stack still alive (the marker, Redis, the postmaster)."""
        out = pids_with_env(STACK_ID_ENV, self.stack_id)
        if self.redis and self.redis.proc and self.redis.proc.poll() is None:
            out.append(self.redis.proc.pid)
        if self.postgres and self.postgres.pid() and alive(self.postgres.pid()):
            out.append(self.postgres.pid())
        return out

    def __enter__(self) -> ProductionStack:
        self.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop()

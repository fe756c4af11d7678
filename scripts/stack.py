"""``make stack`` / ``make stack-down``: the production topology of issue 13 on one machine.

One separate process per component, each with its own log file under one log folder:

* a throwaway **PostgreSQL** cluster as the metadata database (own temp dir, own port,
  ``initdb`` + ``pg_ctl``; run as the ``postgres`` user when started by root, which
  postgres refuses), password auth (scram), the password only in the environment;
* a throwaway **Redis** as the Celery broker (own port, no persistence, a password in
  a 0600 config file, not on the command line);
* Airflow with **CeleryExecutor**: ``scheduler``, ``dag-processor``, ``api-server``,
  **two** ``triggerer`` and **two** ``celery worker`` processes, on the repository's
  ``dags/`` and ``plugins/`` unchanged (the plugins folder is on ``sys.path`` as in the
  demo; ``include/`` is the installed package);
* tenant databases on the MySQL-protocol server of ``NEXUS_TEST_MYSQL_URL`` (``make stack``
  runs under ``scripts/with-mariadb.sh``, which starts a throwaway MariaDB).

``python scripts/stack.py up`` brings it up, seeds the demo tenant on MariaDB (connection
``nexus_tenant_demo``; the old-protocol runtime drains it and stops by itself once the fence
is armed), prints the UI URL and login, and waits; Ctrl-C or ``python scripts/stack.py down``
(``make stack-down``, from another terminal) stops every process it started. Every process of
the stack carries ``NEXUS_STACK_ID`` in its environment (so do the task processes and any new
host a cutover run starts); the stop ends with a sweep of whatever still carries it.

Settings (:data:`SETTINGS`, chosen for 2 cores; the runbook's "distributed Airflow" section
quotes them): parallelism 4; each worker runs 2 task slots (``worker_concurrency=2``,
prefetch 1); each triggerer takes up to 2,000 triggers (``[triggerer] capacity``: either one
alone must carry every waiting tenant, and the rollouts' own waits, when the other dies);
a task whose worker died is failed after 30 s without a heartbeat
(``task_instance_heartbeat_timeout``; the DAGs have ``retries=0``, so it ends failed and an
engineer clears it).
"""

from __future__ import annotations

import argparse
import base64
import contextlib
import datetime as dt
import glob
import json
import os
import pathlib
import pwd
import secrets
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import uuid
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path[:0] = [str(REPO), str(REPO / "plugins")]

from scripts.demo_airflow import (  # noqa: E402
    BIN,
    AirflowApi,
    ApiError,
    _foreign_airflow_setting,
    _restore_sigint,
    airflow_env,
    free_port,
)

STACK_ID_ENV = "NEXUS_STACK_ID"

#: The settings of the reference topology (documented in docs/runbook.md, "distributed Airflow").
SETTINGS: dict[str, Any] = {
    "parallelism": 4,  # [core] parallelism: task slots the scheduler hands out at once, all workers together
    "worker_concurrency": 2,  # [celery] worker_concurrency, per worker (2 workers: 4 slots)
    "worker_prefetch_multiplier": 1,  # a worker takes one message per free slot: a slow task does not hold others
    # [triggerer] capacity, per triggerer: one alone takes over every trigger (1,000 waiting tenants filled a
    # 1,000 survivor and left a rollout's own wait unassigned: bench-stack)
    "triggerer_capacity": 2000,
    "task_instance_heartbeat_timeout": 30,  # [scheduler]: a task of a dead worker is failed after this
    "dag_processor_refresh_interval": 30,
    # [scheduler]: an idle loop sleeps this long; a tenant's next task waits for the loop after its last one ended
    "scheduler_idle_sleep_time": 0.25,
}

#: The Airflow components, started in this order (stopped in the reverse order).
COMPONENTS = ("api-server", "scheduler", "dag-processor", "triggerer-1", "triggerer-2", "worker-1", "worker-2")


def say(msg: str) -> None:
    print(f"[{dt.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


class StackError(RuntimeError):
    pass


# ---------------------------------------------------------------------------
# processes
# ---------------------------------------------------------------------------


def _stat(pid: int) -> list[str] | None:
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()
    except OSError:
        return None


def alive(pid: int) -> bool:
    st = _stat(pid)
    return st is not None and st[0] != "Z"


def parent_of(pid: int) -> int | None:
    st = _stat(pid)
    return int(st[1]) if st else None


def descendants(pid: int) -> list[int]:
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if entry.isdigit():
            st = _stat(int(entry))
            if st:
                children.setdefault(int(st[1]), []).append(int(entry))
    out, todo = [], [pid]
    while todo:
        for c in children.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def pids_with_env(key: str, value: str) -> list[int]:
    """Live processes whose environment holds ``key=value`` (the stack's marker)."""
    marker = f"{key}={value}".encode()
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = pathlib.Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
        except OSError:
            continue
        if marker in env and alive(int(entry)):
            found.append(int(entry))
    return found


def signal_all(pids: list[int], sig: int) -> None:
    for pid in pids:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.kill(pid, sig)


def wait_gone(pids: list[int], timeout_s: float) -> list[int]:
    deadline = time.monotonic() + timeout_s
    while True:
        left = [p for p in pids if alive(p)]
        if not left or time.monotonic() > deadline:
            return left
        time.sleep(0.2)


def kill_tree(pid: int, sig: int = signal.SIGKILL) -> list[int]:
    """Send ``sig`` to ``pid`` and every descendant (the task processes are in process groups of their own)."""
    hit: list[int] = []
    for _ in range(5):  # a process may fork while we walk: walk again until nothing new
        tree = [p for p in [pid, *descendants(pid)] if p not in hit and alive(p)]
        if not tree:
            break
        signal_all(tree, sig)
        hit += tree
        if sig != signal.SIGKILL:
            break
    return hit


class Component:
    """One Airflow process (``airflow <args>``) in its own session, its output in ``log``."""

    def __init__(self, name: str, args: list[str], env: dict[str, str], log: pathlib.Path):
        self.name, self.args, self.env, self.log = name, args, env, log
        self.proc: subprocess.Popen | None = None
        self.starts = 0

    @property
    def pid(self) -> int | None:
        return self.proc.pid if self.proc else None

    def start(self) -> None:
        self.starts += 1
        with open(self.log, "ab") as out:
            out.write(f"\n===== {dt.datetime.now().isoformat()} start #{self.starts}: airflow {' '.join(self.args)}\n".encode())
            out.flush()
            self.proc = subprocess.Popen([str(BIN / "airflow"), *self.args], env=self.env, stdout=out,
                                         stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL, start_new_session=True,
                                         preexec_fn=_restore_sigint)

    def running(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def stop(self, timeout_s: float = 30.0) -> None:
        """SIGTERM (each component shuts down cleanly on it), then SIGKILL to whatever is left of its tree."""
        if self.proc is None:
            return
        tree = [self.proc.pid, *descendants(self.proc.pid)]
        if self.running():
            with contextlib.suppress(ProcessLookupError):
                os.kill(self.proc.pid, signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        left = wait_gone(tree, 3.0)
        if self.running():
            left += kill_tree(self.proc.pid)
        signal_all(left, signal.SIGKILL)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        wait_gone(left, 10.0)

    def kill(self) -> list[int]:
        """SIGKILL the component and every process under it at once, as when its machine dies; returns the pids."""
        assert self.proc is not None
        hit = kill_tree(self.proc.pid)
        with contextlib.suppress(subprocess.TimeoutExpired):
            self.proc.wait(10)
        wait_gone(hit, 10.0)
        return hit

    def tail(self, lines: int = 40) -> str:
        try:
            return "\n".join(self.log.read_text(errors="replace").splitlines()[-lines:])
        except OSError as exc:
            return f"(no log: {exc})"


# ---------------------------------------------------------------------------
# PostgreSQL and Redis
# ---------------------------------------------------------------------------


def pg_bindir() -> pathlib.Path:
    found = sorted(glob.glob("/usr/lib/postgresql/*/bin/initdb"), key=lambda p: int(p.split("/")[4]))
    if found:
        return pathlib.Path(found[-1]).parent
    exe = shutil.which("initdb")
    if exe:
        return pathlib.Path(exe).resolve().parent
    raise StackError("PostgreSQL is not installed: run `make deps` (scripts/bootstrap.sh: apt-get install -y postgresql)")


def redis_server() -> str:
    exe = shutil.which("redis-server") or ("/usr/bin/redis-server" if os.path.exists("/usr/bin/redis-server") else None)
    if not exe:
        raise StackError("redis-server is not installed: run `make deps` (scripts/bootstrap.sh: apt-get install -y redis-server)")
    return exe


def require_python_packages() -> None:
    """The stack's PyPI packages, checked by distribution (importing airflow here would configure it in this process)."""
    from importlib import metadata

    missing = []
    for dist in ("apache-airflow-providers-celery", "celery", "redis", "psycopg2-binary", "asyncpg"):
        try:
            metadata.version(dist)
        except metadata.PackageNotFoundError:
            missing.append(dist)
    if missing:
        raise StackError(f"missing Python packages {', '.join(missing)}: run `make deps` "
                         "(pip install -e '.[airflow,test,stack]')")


class Postgres:
    """A throwaway cluster in its own temp dir (socket there too), listening on 127.0.0.1:``port``."""

    def __init__(self, log: pathlib.Path, port: int):
        self.bindir = pg_bindir()
        self.port = port
        self.visible_log = log  # under the stack's log folder: a link while it runs, a copy after the stop
        self.password = secrets.token_urlsafe(18)
        self.dir = pathlib.Path(tempfile.mkdtemp(prefix="nexus-stack-pg-"))
        self.data = self.dir / "data"
        self.log = self.dir / "postgres.log"  # in the cluster's own dir: the stack's may not be reachable by postgres
        self.user = "postgres" if os.geteuid() == 0 else pwd.getpwuid(os.geteuid()).pw_name

    def _run(self, argv: list[str], **kw) -> subprocess.CompletedProcess:
        if os.geteuid() == 0:
            argv = ["runuser", "-u", self.user, "--", *argv]
        env = {k: v for k, v in os.environ.items() if k != STACK_ID_ENV and not k.startswith("AIRFLOW")}
        env["LC_ALL"] = "C"
        return subprocess.run(argv, env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL, **kw)

    def start(self) -> None:
        if os.geteuid() == 0:
            try:
                pw = pwd.getpwnam(self.user)
            except KeyError:
                raise StackError("postgres refuses to run as root and there is no `postgres` user: "
                                 "apt-get install -y postgresql creates it") from None
            os.chown(self.dir, pw.pw_uid, pw.pw_gid)
        self.visible_log.unlink(missing_ok=True)
        self.visible_log.symlink_to(self.log)
        pwfile = self.dir / "pw"
        pwfile.write_text(self.password + "\n")
        pwfile.chmod(0o600)
        if os.geteuid() == 0:
            os.chown(pwfile, pw.pw_uid, pw.pw_gid)
        r = self._run([str(self.bindir / "initdb"), "-D", str(self.data), "-U", "airflow", f"--pwfile={pwfile}",
                       "--auth=scram-sha-256", "-E", "UTF8", "--no-locale", "--no-sync"], timeout=120)
        pwfile.unlink()
        if r.returncode != 0:
            raise StackError(f"initdb failed ({r.returncode}): {r.stdout[-2000:]}{r.stderr[-2000:]}")
        # A throwaway cluster: no fsync (durability is not what this stack tests); enough connections for
        # seven Airflow processes, their task processes and the Celery result backend.
        opts = (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=200 "
                "-c shared_buffers=64MB -c fsync=off -c synchronous_commit=off -c full_page_writes=off")
        r = self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", opts, "-w", "-t", "60",
                       "start"], timeout=90, start_new_session=True)
        if r.returncode != 0:
            raise StackError(f"pg_ctl start failed ({r.returncode}): {r.stdout[-2000:]}{r.stderr[-2000:]}")
        import psycopg2

        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="airflow", password=self.password, dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute("CREATE DATABASE airflow")
        conn.close()

    @property
    def url(self) -> str:
        return f"postgresql+psycopg2://airflow:{self.password}@127.0.0.1:{self.port}/airflow"

    def pid(self) -> int | None:
        try:
            return int((self.data / "postmaster.pid").read_text().split()[0])
        except (OSError, ValueError, IndexError):
            return None

    def stop(self) -> None:
        if self.pid() is not None:
            self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop"], timeout=60)
        visible = getattr(self, "visible_log", None)
        if visible is not None and self.log.exists():
            visible.unlink(missing_ok=True)
            shutil.copyfile(self.log, visible)
        shutil.rmtree(self.dir, ignore_errors=True)


class Redis:
    def __init__(self, root: pathlib.Path, log: pathlib.Path, port: int):
        self.exe = redis_server()
        self.port, self.log = port, log
        self.dir = root / "redis"
        self.password = secrets.token_urlsafe(18)
        self.proc: subprocess.Popen | None = None

    def start(self, timeout_s: float = 20.0) -> None:
        self.dir.mkdir(parents=True, exist_ok=True)
        conf = self.dir / "redis.conf"
        conf.write_text(f"port {self.port}\nbind 127.0.0.1\nsave \"\"\nappendonly no\ndir {self.dir}\n"
                        f"logfile {self.log}\ndaemonize no\nrequirepass {self.password}\n")
        conf.chmod(0o600)
        env = {k: v for k, v in os.environ.items() if k != STACK_ID_ENV}
        self.proc = subprocess.Popen([self.exe, str(conf)], env=env, stdin=subprocess.DEVNULL, stdout=subprocess.DEVNULL,
                                     stderr=subprocess.DEVNULL, start_new_session=True)
        import redis

        client = redis.Redis(host="127.0.0.1", port=self.port, password=self.password, socket_timeout=1)
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                client.ping()
                return
            except redis.RedisError:
                if self.proc.poll() is not None or time.monotonic() > deadline:
                    raise StackError(f"redis-server did not answer within {timeout_s:.0f}s; see {self.log}") from None
                time.sleep(0.2)

    @property
    def url(self) -> str:
        return f"redis://:{self.password}@127.0.0.1:{self.port}/0"

    def stop(self) -> None:
        if self.proc and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)


# ---------------------------------------------------------------------------
# the stack
# ---------------------------------------------------------------------------


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

    # -- environment ----------------------------------------------------------

    def _env(self) -> dict[str, str]:
        from cryptography.fernet import Fernet

        assert self.postgres and self.redis
        inherited = {k: v for k, v in os.environ.items()
                     if not _foreign_airflow_setting(k) and k not in ("NEXUS_MIN_POLL_INTERVAL_S", "NEXUS_TEST_MYSQL_URL")}
        env = {**inherited, **airflow_env(self.home, self.port, parallelism=SETTINGS["parallelism"])}
        env.update({
            STACK_ID_ENV: self.stack_id,
            "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": self.postgres.url,
            "AIRFLOW__CELERY__BROKER_URL": self.redis.url,
            "AIRFLOW__CELERY__RESULT_BACKEND": "db+" + self.postgres.url,  # psycopg2: SQLAlchemy 2.1 means psycopg 3
            "AIRFLOW__CELERY__WORKER_CONCURRENCY": str(SETTINGS["worker_concurrency"]),
            "AIRFLOW__CELERY__WORKER_PREFETCH_MULTIPLIER": str(SETTINGS["worker_prefetch_multiplier"]),
            "AIRFLOW__TRIGGERER__CAPACITY": str(SETTINGS["triggerer_capacity"]),
            "AIRFLOW__SCHEDULER__TASK_INSTANCE_HEARTBEAT_TIMEOUT": str(SETTINGS["task_instance_heartbeat_timeout"]),
            "AIRFLOW__DAG_PROCESSOR__REFRESH_INTERVAL": str(SETTINGS["dag_processor_refresh_interval"]),
            "AIRFLOW__SCHEDULER__SCHEDULER_IDLE_SLEEP_TIME": str(SETTINGS["scheduler_idle_sleep_time"]),
            # one set of secrets for every process (each would otherwise generate its own)
            "AIRFLOW__CORE__FERNET_KEY": Fernet.generate_key().decode(),
            "AIRFLOW__API_AUTH__JWT_SECRET": base64.urlsafe_b64encode(os.urandom(32)).decode(),
            "AIRFLOW__API__SECRET_KEY": secrets.token_urlsafe(32),
            "AIRFLOW__LOGGING__BASE_LOG_FOLDER": str(self.home / "logs"),
        })
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
            self.env = self._env()
            self._migrate(timeout_s=max(30.0, deadline - time.monotonic()))
            for name in COMPONENTS:
                args, extra = self._component_args(name)
                self.components[name] = Component(name, args, {**self.env, **extra}, self.logs / f"{name}.log")
                self.components[name].start()
            self.wait_healthy(max(30.0, deadline - time.monotonic()))
            self.login()
        except BaseException:
            self.stop()
            raise

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
        if not out and self.live_triggerers() < 2:
            out.append("fewer than 2 triggerers heartbeating")
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


def sweep(stack_id: str, timeout_s: float = 15.0) -> list[int]:
    """SIGTERM, then SIGKILL, every process carrying the stack's marker; returns what it found."""
    found = pids_with_env(STACK_ID_ENV, stack_id)
    if found:
        signal_all(found, signal.SIGTERM)
        signal_all(wait_gone(found, timeout_s), signal.SIGKILL)
        wait_gone(found, 5.0)
    return found


def _tail(path: pathlib.Path, lines: int = 30) -> str:
    try:
        return "\n".join(path.read_text(errors="replace").splitlines()[-lines:])
    except OSError:
        return ""


def _ready_lines(log: pathlib.Path, start_no: int) -> str:
    """The Celery 'ready.' lines logged since the component's latest start."""
    try:
        text = log.read_text(errors="replace")
    except OSError:
        return ""
    text = text.split(f"start #{start_no}:", 1)[-1]
    return "\n".join(line for line in text.splitlines() if " ready." in line)


# ---------------------------------------------------------------------------
# tenants on the MySQL-protocol server
# ---------------------------------------------------------------------------


def wait_for(what: str, cond, timeout_s: float, every_s: float = 2.0):
    """``cond()`` until it is truthy (returned), at most ``timeout_s`` (then TimeoutError naming ``what``)."""
    deadline = time.monotonic() + timeout_s
    while True:
        value = cond()
        if value:
            return value
        if time.monotonic() > deadline:
            raise TimeoutError(f"not {what} within {timeout_s:.0f}s")
        time.sleep(every_s)


def mariadb_tenant(server_url: str, database: str, build, *, charset: str = "utf8mb4") -> dict[str, Any]:
    """Create ``database`` (``charset`` and its default collation: a production tenant's, case-insensitive and PAD
    SPACE for utf8mb4) on the server of ``server_url`` with a user of its own (random password), build the
    tenant in it with ``build(engine)``; returns the Airflow connection fields (``conn``) and the DSN (``dsn``).
    The password lives only in what is returned (the connection, a child's environment): never print it."""
    from sqlalchemy import text
    from sqlalchemy.engine import make_url

    from nexus_cutover.db import make_engine

    server = make_url(server_url)
    user, password = f"nx_{uuid.uuid4().hex[:10]}", secrets.token_urlsafe(18)
    admin = make_engine(server.set(database="mysql"))
    try:
        with admin.begin() as conn:
            conn.execute(text(f"DROP DATABASE IF EXISTS `{database}`"))
            if not charset.isalnum():
                raise ValueError(f"not a character set name: {charset!r}")
            conn.execute(text(f"CREATE DATABASE `{database}` CHARACTER SET {charset}"))
            conn.execute(text(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'"))
            conn.execute(text(f"GRANT ALL ON `{database}`.* TO '{user}'@'%'"))
    finally:
        admin.dispose()
    url = server.set(username=user, password=password, database=database)
    dsn = url.render_as_string(hide_password=False)
    engine = make_engine(dsn)
    try:
        build(engine)
    finally:
        engine.dispose()
    conn = {"conn_type": "mysql", "host": url.host, "port": url.port or 3306, "login": user, "password": password,
            "schema": database}
    return {"conn": conn, "dsn": dsn}


def build_demo_tenant(namespace: str, *, production: bool = True, built: dict[str, Any] | None = None):
    """The demo tenant of ``scripts/demo_seed.py`` for :func:`mariadb_tenant`: the production-shaped one (issues
    24, 25; live old work to drain beside ordinary work, hostile lanes and receipt ids, 10,000 stopped registry
    rows), or with ``production=False`` the small clean one. ``built`` (a dict) receives ``scenario`` and
    ``planted`` (None for the clean tenant): what a test checks afterwards and what live traffic sends."""

    def build(engine) -> None:
        from scripts.demo_seed import build_tenant

        scenario, planted = build_tenant(engine, namespace, production=production)
        if built is not None:
            built.update(scenario=scenario, planted=planted)

    return build


# ---------------------------------------------------------------------------
# make stack / make stack-down
# ---------------------------------------------------------------------------


def _state_file(state_dir: pathlib.Path) -> pathlib.Path:
    return state_dir / "stack.json"


def up(state_dir: pathlib.Path, port: int) -> int:
    from scripts.demo import Child
    from scripts.demo_old_runtime import __file__ as old_runtime_py

    server_url = os.environ.get("NEXUS_TEST_MYSQL_URL", "").strip()
    if not server_url:
        raise StackError("NEXUS_TEST_MYSQL_URL is not set: run `make stack` (it starts a throwaway MariaDB "
                         "with scripts/with-mariadb.sh)")
    state_file = _state_file(state_dir)
    if state_file.exists():
        old = json.loads(state_file.read_text())
        if alive(int(old["pid"])):
            raise StackError(f"a stack is already up (pid {old['pid']}): `make stack-down` first")
    if state_dir.exists():
        shutil.rmtree(state_dir)
    state_dir.mkdir(parents=True)
    started = time.monotonic()
    stack = ProductionStack(state_dir, port=port)
    stop = {"now": False}
    signal.signal(signal.SIGTERM, lambda *_: stop.update(now=True))
    old_runtime = None
    try:
        say(f"starting PostgreSQL, Redis and Airflow (CeleryExecutor: {', '.join(COMPONENTS)}); logs in {stack.logs}")
        state_file.write_text(json.dumps({"pid": os.getpid(), "stack_id": stack.stack_id, "root": str(state_dir)}))
        stack.start()
        state_file.write_text(json.dumps({"pid": os.getpid(), "stack_id": stack.stack_id, "root": str(state_dir),
                                          "redis_pid": stack.redis.proc.pid, "postgres_dir": str(stack.postgres.dir),
                                          "postgres_user": stack.postgres.user}))
        say(f"   up in {time.monotonic() - started:.0f}s")
        stack.wait_for_dag("connector_projection_cutover")
        tenant = mariadb_tenant(server_url, "nexus_demo", build_demo_tenant("demo"))
        stack.put_connection("nexus_tenant_demo", description="demo tenant (MariaDB)", **tenant["conn"])
        env = {**stack.env, "NEXUS_TENANT_DSN": tenant["dsn"]}
        old_runtime = Child("old runtime", [sys.executable, old_runtime_py, "--namespace", "demo",
                                            "--stop-after-fenced-drain"], env, stack.logs / "old-runtime.log")
        c = tenant["conn"]
        print(f"""
The production topology is up ({time.monotonic() - started:.0f}s): {stack.base_url}
  login:        admin / {stack.admin_password()}
  metadata DB:  PostgreSQL on 127.0.0.1:{stack.postgres.port}; broker: Redis on 127.0.0.1:{stack.redis.port}
  processes:    {', '.join(f'{n} (pid {stack.components[n].pid})' for n in COMPONENTS)}
  logs:         {stack.logs}/<process>.log
  settings:     {json.dumps(SETTINGS)}
  tenant:       demo (connection nexus_tenant_demo, MariaDB {c['host']}:{c['port']}/{c['schema']}); the old runtime
                (pid {old_runtime.proc.pid}) drains it and stops by itself once the fence is armed
  cutover:      trigger connector_projection_cutover with {{"tenant": "demo", "host_controller": "command"}}
Ctrl-C (or `make stack-down` in another terminal) stops everything.""", flush=True)
        while not stop["now"]:
            time.sleep(1)
            for name, comp in stack.components.items():
                if not comp.running() and not getattr(comp, "_reported", False):
                    comp._reported = True  # type: ignore[attr-defined]
                    say(f"   {name} exited with {comp.proc.returncode}; see {comp.log}")
    except KeyboardInterrupt:
        pass
    finally:
        say("stopping every process of the stack ...")
        signal.signal(signal.SIGINT, signal.SIG_IGN)  # a second Ctrl-C must not interrupt the stop
        if old_runtime:
            old_runtime.stop()
        stack.stop()
        left = stack.leftovers()
        state_file.unlink(missing_ok=True)
        say(f"   stopped{'' if not left else f'; STILL ALIVE: {left}'}")
    return 0


def down(state_dir: pathlib.Path, timeout_s: float = 120.0) -> int:
    state_file = _state_file(state_dir)
    if not state_file.exists():
        say(f"no stack is up ({state_file} does not exist)")
        return 0
    state = json.loads(state_file.read_text())
    pid = int(state["pid"])
    if alive(pid):
        say(f"stopping the stack (pid {pid}) ...")
        os.kill(pid, signal.SIGTERM)
        if wait_gone([pid], timeout_s):
            say(f"   pid {pid} did not stop within {timeout_s:.0f}s: killing what is left")
    found = sweep(state["stack_id"])
    # only when the stack died before its own stop: Redis and PostgreSQL do not carry the marker
    redis_pid = state.get("redis_pid")
    if redis_pid and alive(redis_pid) and b"redis-server" in pathlib.Path(f"/proc/{redis_pid}/cmdline").read_bytes():
        signal_all([redis_pid], signal.SIGTERM)
        found.append(redis_pid)
    pg_dir = state.get("postgres_dir")
    if pg_dir and (pathlib.Path(pg_dir) / "data" / "postmaster.pid").exists():
        pg = Postgres.__new__(Postgres)
        pg.bindir, pg.dir, pg.user = pg_bindir(), pathlib.Path(pg_dir), state["postgres_user"]
        pg.data, pg.log = pg.dir / "data", pg.dir / "postgres.log"
        pg.stop()
        found.append(-1)
    state_file.unlink(missing_ok=True)
    say("stopped" + (f" (swept {len(found)} leftover processes)" if found else ""))
    return 0


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("up", "down"))
    parser.add_argument("--state-dir", default=str(REPO / ".run" / "stack"))
    parser.add_argument("--port", type=int, default=0, help="the api-server's port (default: a free one)")
    args = parser.parse_args()
    state_dir = pathlib.Path(args.state_dir).resolve()
    try:
        return up(state_dir, args.port or free_port()) if args.command == "up" else down(state_dir)
    except StackError as exc:
        print(f"stack: {exc}", file=sys.stderr)
        return 1


if __name__ == "__main__":
    raise SystemExit(main())

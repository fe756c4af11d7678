"""``make stack`` / ``make stack-down``: the production topology of issue 13 on one machine.

One separate process per component, each with its own log file under one log folder:

* a throwaway **PostgreSQL** cluster as the metadata database (own temp dir, own port,
  ``initdb`` + ``pg_ctl``; run as the ``postgres`` user when started by root, which
  postgres refuses), password auth (scram), the password only in the environment;
* a throwaway **Redis** as the Celery broker (own port, no persistence, a password in
  a 0600 config file, not on the command line);
* Airflow with **CeleryExecutor**: ``scheduler``, ``dag-processor``, ``api-server``,
  **two** ``triggerer`` and **two** ``celery worker`` processes, on the repository's
  ``dags/`` unchanged and the installed nexus-cutover (its plugin through the entry point, its
  local settings imported by ``$AIRFLOW_HOME/config/airflow_local_settings.py``, as a team installs it);
* tenant databases on the MySQL-protocol server of ``NEXUS_TEST_MYSQL_URL`` (``make stack``
  runs under ``scripts/with-mariadb.sh``, which starts a throwaway MariaDB).

``python scripts/stack.py up`` brings it up, seeds the demo tenant on MariaDB (connection
``nexus_tenant_demo``; the old-protocol runtime drains it and stops by itself once the fence
is armed), prints the UI URL and login, and waits; Ctrl-C or ``python scripts/stack.py down``
(``make stack-down``, from another terminal) stops every process it started. Every process of
the stack carries ``NEXUS_STACK_ID`` in its environment (so do the task processes and any new
host a cutover run starts); the stop ends with a sweep of whatever still carries it.

Settings: ``deploy/airflow-settings.toml`` (:data:`scripts.stack_topology.DEPLOY_SETTINGS`), the file the deployment
recipe (``deploy/Dockerfile``, ``deploy/helm-values*.yaml``) agrees with; chosen for 2 cores; the runbook's
"distributed Airflow" section quotes them. The demo tenant's connection names the file's first pool as its
heavy-reads pool (extra ``nexus_read_pool``), as a deployment's tenants name their cluster's.

The code, each module importing only those listed before it:

* ``scripts/stack_processes.py``: processes found, signalled and waited for through /proc; one Airflow process
  (:class:`~scripts.stack_processes.Component`) with its log; the sweep of the stack's marker;
* ``scripts/stack_services.py``: PostgreSQL, Redis, tenant databases on the MySQL-protocol server;
* ``scripts/stack_topology.py``: :class:`~scripts.stack_topology.ProductionStack` (composition, start and stop,
  health, the Airflow settings);
* this file: the command (``up``, ``down``), and the names the tests and the bench import from ``scripts.stack``
  (:data:`__all__`), kept here so that every ``from scripts.stack import ...`` goes on working.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
import os
import pathlib
import shutil
import signal
import sys
import time

REPO = pathlib.Path(__file__).resolve().parents[1]
if str(REPO) not in sys.path:
    sys.path[:0] = [str(REPO)]  # scripts.*; the nexus packages are the installed ones (make deps)

from scripts.demo_airflow import free_port  # noqa: E402
from scripts.stack_processes import alive, descendants, pids_with_env, signal_all, sweep, wait_for, wait_gone  # noqa: E402
from scripts.stack_services import Postgres, StackError, build_demo_tenant, mariadb_tenant, pg_bindir  # noqa: E402
from scripts.stack_topology import COMPONENTS, DEPLOY_SETTINGS, SETTINGS, ProductionStack  # noqa: E402

__all__ = [
    "COMPONENTS",
    "SETTINGS",
    "ProductionStack",
    "StackError",
    "build_demo_tenant",
    "descendants",
    "mariadb_tenant",
    "pids_with_env",
    "signal_all",
    "wait_for",
]


def say(msg: str) -> None:
    print(f"[{dt.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


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
        read_pool = next(iter(DEPLOY_SETTINGS["pools"]), None)
        stack.put_connection("nexus_tenant_demo", description="demo tenant (MariaDB)", **tenant["conn"],
                             **({"extra": json.dumps({"nexus_read_pool": read_pool})} if read_pool else {}))
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
  settings:     deploy/airflow-settings.toml: {json.dumps(SETTINGS)}
  metrics:      the nexus.* StatsD lines in {stack.logs}/metrics.log
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

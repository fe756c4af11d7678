"""The services of the production stack (``scripts/stack.py``) beside Airflow: its metadata database, its broker,
and the tenant databases on the MySQL-protocol server.

* :class:`Postgres`: a throwaway cluster in a temp dir of its own (its socket there too), on its own port
  (``initdb`` + ``pg_ctl``), run as the ``postgres`` user when started by root (postgres refuses root); scram
  password auth, the password in memory and in the stack's environment only (the password file is deleted once
  ``initdb`` read it). Its log lives in the cluster's dir, linked under the stack's log folder while it runs and
  copied there at its stop; the stop removes the dir.
* :class:`Redis`: the Celery broker on its own port, no persistence, the password in a 0600 config file, never on
  a command line.
* Neither carries the stack's marker (:data:`~scripts.stack_processes.STACK_ID_ENV` is taken out of their
  environment): the stack stops them itself, after the sweep of its marked processes.
* :func:`mariadb_tenant`: one tenant database with a user of its own; the password lives only in what it returns.
* A missing program or package is a :class:`StackError` naming the fix (``make deps``).

Of the stack's modules this one imports only ``scripts/stack_processes.py``.
"""

from __future__ import annotations

import glob
import os
import pathlib
import pwd
import secrets
import shutil
import subprocess
import tempfile
import time
import uuid
from typing import Any

from scripts.stack_processes import STACK_ID_ENV


class StackError(RuntimeError):
    pass


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
                         "(scripts/bootstrap.sh: pip install -e '.[airflow,stack]')")


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
# tenants on the MySQL-protocol server
# ---------------------------------------------------------------------------


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

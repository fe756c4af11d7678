"""A throwaway PostgreSQL for the delivery ledger's tests: the stack's own (``scripts/stack_services.Postgres``),
which a test may also stop and start again on its data (a ledger outage in the middle of a run)."""

from __future__ import annotations

import contextlib
import pathlib
import tempfile
import uuid
from collections.abc import Iterator

from scripts.demo_airflow import free_port
from scripts.stack_services import Postgres


class LedgerPostgres(Postgres):
    """A throwaway cluster (``initdb`` + ``pg_ctl``, its own port and temp dir) with :meth:`pause` / :meth:`resume`."""

    def __init__(self) -> None:
        self.logs = pathlib.Path(tempfile.mkdtemp(prefix="nexus-ledger-pg-log-"))
        super().__init__(self.logs / "postgres.log", free_port())

    def _opts(self) -> str:
        return (f"-p {self.port} -k {self.dir} -c listen_addresses=127.0.0.1 -c max_connections=100 "
                "-c shared_buffers=32MB -c fsync=off -c synchronous_commit=off -c full_page_writes=off")

    def pause(self) -> None:
        """Stop the server (its data kept): the ledger is down."""
        r = self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-m", "fast", "-w", "-t", "30", "stop"],
                      timeout=60)
        assert r.returncode == 0, r.stderr

    def resume(self) -> None:
        """Start it again on the same data: the ledger is back."""
        r = self._run([str(self.bindir / "pg_ctl"), "-D", str(self.data), "-l", str(self.log), "-o", self._opts(),
                       "-w", "-t", "60", "start"], timeout=90, start_new_session=True)
        assert r.returncode == 0, r.stdout + r.stderr

    def database_url(self) -> str:
        """A fresh, empty database of this server (its URL, password included)."""
        import psycopg2

        name = f"ledger_{uuid.uuid4().hex[:12]}"
        conn = psycopg2.connect(host="127.0.0.1", port=self.port, user="airflow", password=self.password,
                                dbname="postgres")
        conn.autocommit = True
        with conn.cursor() as cur:
            cur.execute(f"CREATE DATABASE {name}")
        conn.close()
        return f"postgresql+psycopg2://airflow:{self.password}@127.0.0.1:{self.port}/{name}"


@contextlib.contextmanager
def ledger_postgres() -> Iterator[LedgerPostgres]:
    server = LedgerPostgres()
    try:
        server.start()
        yield server
    finally:
        server.stop()

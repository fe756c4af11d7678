"""The delivery ledger: a durable, append-only record of every cutover's events, in a database of its own.

One row per event of a run -- a fence armed, adopted or released (its holder), the drain done, the evidence shown
to a person (its digest), the answer (who, when, on which evidence), each checkpoint (pack, cutoff), the host
started, the history digest and its verification, every stop with its reason, a wave's question and answer, a Field
History gate -- so a reviewer can read who approved what, on what evidence, long after Airflow's metadata (XCom,
task instances) was cleaned (``nexus-cutover report``, the status view's Report link).

Invariants:

* Its own database (a SQLite file, MySQL/MariaDB/TiDB or PostgreSQL: :func:`ledger_engine`), never a tenant's: the
  tenant schema does not grow. The table is created when missing (:func:`ensure_table`).
* INSERT only: nothing here updates or deletes a row. :func:`append` is idempotent: each event has a unique key
  (:attr:`LedgerEvent.key`: tenant, DAG, run, step, map index, try, kind), so an event written twice (a spooled
  event caught up after it was written after all, a replayed spool) is one row.
* The row id (``event_id``) is unique and random: never an order (TiDB's AUTO_INCREMENT is not ordered either).
  The order is ``recorded_at`` (when the event happened, not when the row landed: ``written_at``), then ``seq``
  (the event's declared place in its run), then the key.
* Dialect-neutral SQLAlchemy Core with bound parameters; no RETURNING, no dialect-only upsert. Each call writes
  in transactions of at most :data:`BATCH` rows. Every read the report makes is on an index
  (``tenant, recorded_at, seq``).
* Bad input (an unknown kind, a missing tenant) is :class:`~nexus_cutover.errors.BadInput` before anything is
  written: a batch is written whole or not at all.
"""

from __future__ import annotations

import csv
import datetime as dt
import hashlib
import io
import json
import os
import time
import uuid
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import (
    BigInteger,
    Column,
    DateTime,
    Engine,
    Index,
    Integer,
    MetaData,
    String,
    Table,
    Text,
    create_engine,
    inspect,
    select,
)
from sqlalchemy import exc as sa_exc
from sqlalchemy.dialects import mysql
from sqlalchemy.engine import URL, make_url

from .clock import utc_text
from .db import (
    DSN_ENV_LEDGER,
    is_write_conflict,
    make_engine,  # TLS as the tenant connections have it, the session checked
    mask_dsn,
)
from .errors import BadInput, Unreachable
from .events import (  # re-exported: the ledger's readers name the kinds from here
    ANSWER,
    BACKED_OUT,
    CHECKPOINT,
    DIGEST_TAKEN,
    DIGEST_VERIFIED,
    DRAIN_DONE,
    EVIDENCE_SHOWN,
    FENCE_ADOPTED,
    FENCE_ARMED,
    FENCE_RELEASED,
    FENCE_REUSED,
    GATE_PASSED,
    HOST_STARTED,
    STOPPED,
    WAVE_ANSWER,
    WAVE_ASKED,
    WRITERS_STOPPED,
    digest_of,
)
from .events import LEDGER_KINDS as KINDS
from .spreadsheet import safe_cell

__all__ = ["ANSWER", "BACKED_OUT", "CHECKPOINT", "DIGEST_TAKEN", "DIGEST_VERIFIED", "DRAIN_DONE", "DSN_ENV_LEDGER", "EVIDENCE_SHOWN",
           "FENCE_ADOPTED", "FENCE_ARMED", "FENCE_RELEASED", "FENCE_REUSED", "GATE_PASSED", "HOST_STARTED", "KINDS",
           "LedgerEvent", "STOPPED", "WAVE_ANSWER", "WAVE_ASKED", "WRITERS_STOPPED", "append", "digest_of", "history", "ledger_engine",
           "to_csv"]
TABLE = "nexus_delivery_ledger"
#: Rows per transaction (TiDB: small transactions).
BATCH = 200
#: The bound of a connection attempt and of a statement on the ledger: a ledger outage costs a step a few seconds.
DEFAULT_TIMEOUT_S = 3.0

# -- the events --------------------------------------------------------------------------------------------------

# The kinds are the run's events' (one definition: nexus_cutover.events); the ledger records those in KINDS.

#: The columns of a report row, in a CSV's order.
COLUMNS = ("recorded_at", "tenant", "dag_id", "run_id", "step", "map_index", "try_number", "kind", "outcome", "actor",
           "holder", "digest", "pack", "cutoff", "reason", "detail", "seq", "written_at", "event_id")

_metadata = MetaData()
#: Microseconds on MySQL/MariaDB/TiDB too (their DATETIME keeps none by default): two events of a step stay apart.
_INSTANT = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")

ledger_table = Table(
    TABLE, _metadata,
    Column("event_id", String(32), primary_key=True),  # random (uuid4 hex): unique, never an order
    Column("event_key", String(64), nullable=False, unique=True),  # sha256 of the event's identity: replays are one row
    Column("tenant", String(190), nullable=False),
    Column("dag_id", String(250), nullable=False),
    Column("run_id", String(250), nullable=False),
    Column("step", String(100), nullable=False),
    Column("map_index", Integer, nullable=False),
    Column("try_number", Integer, nullable=False),
    Column("kind", String(40), nullable=False),
    Column("seq", Integer, nullable=False),
    Column("recorded_at", _INSTANT, nullable=False),
    Column("written_at", _INSTANT, nullable=False),
    Column("outcome", String(100)),
    Column("actor", String(250)),
    Column("holder", String(250)),
    Column("digest", String(128)),
    Column("pack", String(190)),
    Column("cutoff", BigInteger),
    Column("reason", Text),
    Column("detail", Text),  # JSON
    mysql_charset="utf8mb4", mysql_collate="utf8mb4_bin",  # any text kept as is; a tenant equals only itself
)
Index("ix_nexus_delivery_ledger_tenant_order", ledger_table.c.tenant, ledger_table.c.recorded_at, ledger_table.c.seq)
Index("ix_nexus_delivery_ledger_run", ledger_table.c.dag_id, ledger_table.c.run_id)


def _utc(value: dt.datetime | str) -> dt.datetime:
    when = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).astimezone(dt.UTC)


@dataclass(frozen=True)
class LedgerEvent:
    """One event of one run. Its identity (:attr:`key`) is who recorded it -- tenant, DAG, run, step, map index,
    try -- and its ``kind``; everything else describes it."""

    tenant: str
    dag_id: str
    run_id: str
    step: str
    kind: str
    recorded_at: dt.datetime
    seq: int = 0
    map_index: int = -1
    try_number: int = 1
    outcome: str | None = None
    actor: str | None = None
    holder: str | None = None
    digest: str | None = None
    pack: str | None = None
    cutoff: int | None = None
    reason: str | None = None
    detail: dict[str, Any] = field(default_factory=dict)

    @property
    def key(self) -> str:
        parts = (self.tenant, self.dag_id, self.run_id, self.step, str(self.map_index), str(self.try_number), self.kind)
        if self.pack is not None:  # a command's per-pack step has no map index: two packs are two events
            parts += (self.pack,)
        return hashlib.sha256("\x1f".join(parts).encode("utf-8")).hexdigest()

    def problem(self) -> str | None:
        """What makes this event unwritable (None: it is fine)."""
        if self.kind not in KINDS:
            return f"unknown ledger event kind {self.kind!r} (one of {', '.join(KINDS)})"
        for name in ("tenant", "dag_id", "run_id", "step"):
            if not getattr(self, name):
                return f"a ledger event without {name} ({self.kind})"
        if self.recorded_at.tzinfo is None:
            return f"a ledger event's recorded_at without a time zone ({self.kind} of {self.tenant})"
        return None

    def as_json(self) -> dict[str, Any]:
        """The event as JSON (the spool's line): :meth:`from_json` reads it back."""
        return {"tenant": self.tenant, "dag_id": self.dag_id, "run_id": self.run_id, "step": self.step,
                "kind": self.kind, "recorded_at": self.recorded_at.isoformat(), "seq": self.seq,
                "map_index": self.map_index, "try_number": self.try_number, "outcome": self.outcome,
                "actor": self.actor, "holder": self.holder, "digest": self.digest, "pack": self.pack,
                "cutoff": self.cutoff, "reason": self.reason, "detail": self.detail}

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> LedgerEvent:
        try:
            return cls(**{**raw, "recorded_at": _utc(raw["recorded_at"]), "detail": dict(raw.get("detail") or {})})
        except (KeyError, TypeError, ValueError) as exc:
            raise BadInput(f"not a ledger event: {exc}") from None

    def row(self, written_at: dt.datetime) -> dict[str, Any]:
        naive = lambda t: t.astimezone(dt.UTC).replace(tzinfo=None)  # noqa: E731 - stored as UTC, zone-less
        return {**{k: v for k, v in self.as_json().items() if k not in ("detail", "recorded_at")},
                "event_id": uuid.uuid4().hex, "event_key": self.key, "recorded_at": naive(self.recorded_at),
                "written_at": naive(written_at), "reason": (self.reason or None) and self.reason[:4000],
                "detail": json.dumps(self.detail, sort_keys=True, default=str) if self.detail else None}


# -- the database ------------------------------------------------------------------------------------------------

_SQLITE, _MYSQL, _POSTGRES = ("sqlite", "sqlite+pysqlite"), ("mysql", "mariadb"), ("postgresql",)


def ledger_url(dsn: str | URL) -> URL:
    """``dsn`` validated as a ledger's: SQLite, MySQL-protocol (MySQL, MariaDB, TiDB) or PostgreSQL;
    :class:`BadInput` naming what to fix (never the password)."""
    try:
        url = dsn if isinstance(dsn, URL) else make_url(dsn)
    except (sa_exc.ArgumentError, ValueError):
        raise BadInput("malformed ledger DSN: expected an SQLAlchemy URL such as sqlite:////var/lib/nexus/ledger.db, "
                       "mysql+pymysql://user:pw@host:3306/nexus_ledger or postgresql+psycopg2://user:pw@host/nexus_ledger"
                       ) from None
    family = url.drivername.split("+")[0]
    if url.drivername in _SQLITE:
        if not url.database or url.database == ":memory:":
            raise BadInput("the ledger's SQLite DSN names no file (an in-memory ledger keeps nothing)")
        return url
    if family in _MYSQL + _POSTGRES:
        if not url.host or not url.database:
            raise BadInput(f"ledger DSN {mask_dsn(url)} needs a host and a database")
        return url
    raise BadInput(f"ledger DSN {mask_dsn(url)}: unsupported scheme {url.drivername!r}; use sqlite:///, "
                   "mysql+pymysql:// or postgresql+psycopg2://")


def ledger_engine(dsn: str | URL, *, timeout_s: float = DEFAULT_TIMEOUT_S, create: bool = True) -> Engine:
    """An engine on the ledger database, each connection attempt bounded by ``timeout_s`` (a ledger that is down
    costs a few seconds, never a step). A SQLite ledger's file (and directory) is created when missing, unless
    ``create`` is false (a reader: :class:`BadInput` naming the missing file)."""
    url = ledger_url(dsn)
    if url.drivername in _SQLITE:
        if not create and not os.path.exists(url.database):
            raise BadInput(f"the ledger's SQLite file {url.database!r} does not exist (nothing was ever recorded there)")
        os.makedirs(os.path.dirname(os.path.abspath(url.database)), exist_ok=True)
        return create_engine(url, connect_args={"timeout": timeout_s, "check_same_thread": False})
    if url.drivername.split("+")[0] in _MYSQL:

        return make_engine(url, connect_timeout=timeout_s)
    if url.drivername == "postgresql":
        url = url.set(drivername="postgresql+psycopg2")
    return create_engine(url, pool_pre_ping=True, connect_args={
        "connect_timeout": max(1, int(timeout_s)), "options": f"-c statement_timeout={int(timeout_s * 1000) + 2000}"})


_ready: set[str] = set()  # the ledgers whose table this process saw or created


def ensure_table(engine: Engine) -> None:
    """Create the ledger's table and indexes when missing (once per process per ledger); a concurrent creator's
    table is taken as it is."""
    where = engine.url.render_as_string(hide_password=True)
    if where in _ready:
        return
    try:
        _metadata.create_all(engine, checkfirst=True)
    except sa_exc.DBAPIError:  # another process created it between the check and the CREATE: fine if it is there now
        if TABLE not in inspect(engine).get_table_names():
            raise
    _ready.add(where)


def append(engine: Engine, events: Sequence[LedgerEvent]) -> int:
    """INSERT ``events`` that are not in the ledger yet (by their key); returns how many rows were written.

    Idempotent: an event already in the ledger is not written again. Each batch of :data:`BATCH` is one
    transaction: it reads which of its keys exist (on the unique index), then inserts the others; a concurrent
    writer inserting one of them in between (a duplicate key, or MariaDB's deadlock on the key's gap) makes the batch
    roll back and try again (:data:`CONFLICT_ATTEMPTS`). Nothing else is ever written: no UPDATE, no DELETE."""
    for event in events:
        if problem := event.problem():
            raise BadInput(problem)
    unique = list({e.key: e for e in events}.values())
    if not unique:
        return 0
    ensure_table(engine)
    written = 0
    for start in range(0, len(unique), BATCH):
        batch = unique[start:start + BATCH]
        for attempt in range(1, CONFLICT_ATTEMPTS + 1):
            try:
                written += _insert_missing(engine, batch)
                break
            except sa_exc.DBAPIError as exc:
                if attempt == CONFLICT_ATTEMPTS or not is_write_conflict(exc):
                    raise
                time.sleep(0.05 * attempt)
    return written


#: How often a batch that met a concurrent writer of the same events is tried again (read again, insert the rest).
CONFLICT_ATTEMPTS = 5

def _insert_missing(engine: Engine, batch: list[LedgerEvent]) -> int:
    t = ledger_table
    now = dt.datetime.now(dt.UTC)
    with engine.begin() as conn:
        present = set(conn.execute(select(t.c.event_key).where(t.c.event_key.in_([e.key for e in batch]))).scalars())
        rows = [e.row(now) for e in batch if e.key not in present]
        if rows:
            conn.execute(t.insert(), rows)
    return len(rows)


# -- the reads of the report -------------------------------------------------------------------------------------

#: The most rows one report reads (a tenant's whole history is a few dozen per run).
REPORT_LIMIT = 100_000


def history(engine: Engine, tenant: str, *, limit: int = REPORT_LIMIT) -> list[dict[str, Any]]:
    """Every event of ``tenant`` in order (``recorded_at``, ``seq``, key), on the index (tenant, recorded_at, seq);
    an empty list when the ledger has no table yet. Times are ISO 8601 UTC; ``detail`` is parsed."""

    if not tenant:
        raise BadInput("report: give the tenant (-namespace)")
    try:
        if TABLE not in inspect(engine).get_table_names():
            return []
        t = ledger_table
        with engine.connect() as conn:
            rows = conn.execute(select(*[t.c[c] for c in COLUMNS])
                                .where(t.c.tenant == tenant)
                                .order_by(t.c.recorded_at, t.c.seq, t.c.event_key).limit(limit)).mappings().all()
    except sa_exc.OperationalError as exc:
        raise Unreachable(f"cannot read the ledger {mask_dsn(engine.url)}: {str(exc.orig).splitlines()[0][:200]}") from None
    return [_readable(dict(r)) for r in rows]


def _readable(row: dict[str, Any]) -> dict[str, Any]:
    for name in ("recorded_at", "written_at"):
        if isinstance(row[name], dt.datetime):
            row[name] = row[name].replace(tzinfo=dt.UTC).isoformat()
    row["detail"] = json.loads(row["detail"]) if row.get("detail") else {}
    return row


def to_csv(rows: Iterable[dict[str, Any]]) -> str:
    """``rows`` (:func:`history`'s) as CSV: one header line of :data:`COLUMNS`, RFC 4180 quoting, ``detail`` as
    JSON text. A text cell a spreadsheet would run as a formula (a reason, an actor, a step starting with ``=``,
    ``+``, ``-``, ``@``, a tab or a carriage return) gets a leading ``'`` (:func:`nexus_cutover.spreadsheet.safe_cell`,
    the preflight's rule); numbers (``map_index`` -1, a cutoff) are written as numbers."""

    out = io.StringIO()
    writer = csv.DictWriter(out, fieldnames=COLUMNS, lineterminator="\r\n", extrasaction="ignore")
    writer.writeheader()
    for row in rows:
        cells = {**row, "detail": json.dumps(row.get("detail") or {}, sort_keys=True, default=str)}
        writer.writerow({k: safe_cell(v) if isinstance(v, str) else v for k, v in cells.items()})
    return out.getvalue()


def line_of(row: dict[str, Any]) -> str:
    """One event as a line a person reads (the command's text output, the page's rows are the same fields)."""
    parts = [row["recorded_at"], row["dag_id"], row["run_id"], row["step"] + (f"[{row['map_index']}]" if row["map_index"] >= 0 else ""),
             row["kind"]]
    for name in ("outcome", "actor", "holder", "pack", "cutoff", "digest", "reason"):
        if row.get(name) not in (None, ""):
            parts.append(f"{name}={row[name]}")
    return "  ".join(str(p) for p in parts) + "".join(f"\n    {line}" for line in evidence_lines(row))


def _zoned(value: Any) -> str:
    """A kept time as a person reads it, with its zone (``-`` for none); a value that is no time, as it is."""
    try:
        return utc_text(value)
    except (TypeError, ValueError):
        return str(value)


def evidence_lines(row: dict[str, Any]) -> list[str]:
    """The evidence a person was shown, as the report prints it under its row: the writer table (process, role,
    version, state, last heartbeat, stopped at), or the text, and the writer-stop controller's answer (its own event's
    too); none for any other event."""
    if row.get("kind") == WRITERS_STOPPED:
        return controller_lines(row.get("detail") or {})
    kept = (row.get("detail") or {}).get("evidence") or {}
    if "text" in kept:
        return [*str(kept["text"]).splitlines()[:50]]
    rows = kept.get("processes")
    if rows is None:
        return []
    lines = [f"shown at {kept.get('checked_at')}: {kept.get('rows_total', len(rows))} writer(s)"
             + (f", {kept['rows_kept']} kept here" if kept.get("rows_kept") != kept.get("rows_total") else "")
             + (f"; live: {', '.join(kept['live'])}" if kept.get("live") else "; none live")]
    for p in rows:
        lines.append(f"{p.get('process_id')}  {p.get('role')}  {p.get('binary_version')}  {p.get('state')}  "
                     f"heartbeat {_zoned(p.get('last_heartbeat_at'))}  stopped {_zoned(p.get('stopped_at'))}")
    if isinstance(kept.get("writers_stop"), dict):
        lines += ["with the writer-stop controller's answer:", *controller_lines(kept["writers_stop"])]
    return lines


def controller_lines(answer: dict[str, Any]) -> list[str]:
    """A writer-stop controller's answer as the report prints it: what ran, when, its answer, the old writers live
    before and after it, its output's last lines."""
    said = f"HTTP {answer['http_status']}" if answer.get("http_status") is not None else f"exit {answer.get('exit_code')}"
    lines = [f"{answer.get('ran')}: {said}{', timed out' if answer.get('timed_out') else ''} at "
             f"{answer.get('finished_at')} ({answer.get('seconds')} s); live before: "
             f"{', '.join(answer.get('live_before') or []) or 'none'}; still live: "
             f"{', '.join(answer.get('still_live') or []) or 'none'}"]
    return lines + [f"| {line}" for line in str(answer.get("output_tail") or "").strip().splitlines()[-10:]]

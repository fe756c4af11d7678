"""Producer inventory: Field History producers in ``_System_ProcessRegistry`` and Audit V2 outbox work.

Invariants:

* A *deployed* process is one with ``StoppedAt IS NULL``, whatever its heartbeat
  age: a silent process may come back, so a gate counts it until it is marked
  stopped (the report shows the heartbeat so an operator can tell).
* A process is *live* by the one rule of :mod:`nexus_cutover.liveness` (not
  stopped and a heartbeat at most ``heartbeat_window_s`` old, boundary
  inclusive), evaluated at the time of the read that measured
  ``heartbeat_age_s``; used only to tell whether outbox work can progress.
* *Pre-cutover* means a BinaryVersion / ProducerVersion older than the release
  named by the caller (:func:`.versions.older_than`; an unreadable version is older).
* Outbox work is *open* while ``pending`` or ``processing``; ``failed`` work is
  undelivered and cannot finish on its own; ``delivered`` is done.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import asdict, dataclass

from sqlalchemy import Connection, func, select

from .. import catalog
from ..clock import utcnow
from ..liveness import DEFAULT_STALE_HEARTBEAT_S, LIVE, process_state
from .versions import older_than

Process = catalog.ProcessRegistry
Outbox = catalog.AuditOutbox

PRODUCER_ROLES = (catalog.ROLE_RUNTIME_API, catalog.ROLE_SERVICE_MANAGER, catalog.ROLE_AUDIT_OUTBOX_WORKER)
OUTBOX_OPEN = ("pending", "processing")
OUTBOX_FAILED = "failed"
#: Any fixed instant: a process's state depends only on its heartbeat age at the read.
_AGE_ORIGIN = dt.datetime(2000, 1, 1)
#: The stale-heartbeat window default (kept under this name for :mod:`.gates`): the liveness default.
DEFAULT_HEARTBEAT_WINDOW_S = DEFAULT_STALE_HEARTBEAT_S


@dataclass(frozen=True)
class ProducerProcess:
    process_id: str
    role: str
    binary_version: str
    stopped: bool
    heartbeat_age_s: float

    def deployed(self) -> bool:
        return not self.stopped

    def state(self, heartbeat_window_s: float = DEFAULT_HEARTBEAT_WINDOW_S) -> str:
        """``live`` / ``silent`` / ``stopped`` (:func:`nexus_cutover.liveness.process_state`) as of the read.

        ``heartbeat_age_s`` is ``now - LastHeartbeatAt`` of that read, so the rule is
        evaluated on a clock whose "now" is the read time.
        """
        read_at = _AGE_ORIGIN
        beat = read_at - dt.timedelta(seconds=self.heartbeat_age_s)
        return process_state(read_at if self.stopped else None, beat, read_at, heartbeat_window_s)

    def live(self, heartbeat_window_s: float = DEFAULT_HEARTBEAT_WINDOW_S) -> bool:
        return self.state(heartbeat_window_s) == LIVE

    def as_json(self) -> dict:
        return {**asdict(self), "heartbeat_age_s": round(self.heartbeat_age_s, 1)}


@dataclass(frozen=True)
class OutboxCount:
    producer_version: str
    status: str
    rows: int

    def as_json(self) -> dict:
        return asdict(self)


def producer_processes(conn: Connection, namespace: str | None = None, *, deployed_only: bool = False) -> list[ProducerProcess]:
    """Every process of a producer role (stopped ones included, flagged), ordered by role and id; never capped.

    ``deployed_only``: only the processes not stopped, chosen in SQL (``StoppedAt IS NULL``: with a namespace, a
    range of ``ix_ProcessRegistry_Role``), as the gates read them: a long-lived registry's thousands of stopped
    rows are not read at all (contract, "Process registry").
    """
    stmt = select(Process.c.ProcessId, Process.c.Role, Process.c.BinaryVersion, Process.c.StoppedAt, Process.c.LastHeartbeatAt)
    stmt = stmt.where(Process.c.Role.in_(PRODUCER_ROLES)).order_by(Process.c.Role, Process.c.ProcessId)
    if deployed_only:
        stmt = stmt.where(Process.c.StoppedAt.is_(None))
    if namespace is not None:
        stmt = stmt.where(Process.c.Namespace == namespace)
    now = utcnow()
    return [
        ProducerProcess(pid, role, version, stopped is not None, max(0.0, (now - beat).total_seconds()))
        for pid, role, version, stopped, beat in conn.execute(stmt)
    ]


def live_outbox_workers(
    conn: Connection, namespace: str | None = None, heartbeat_window_s: float = DEFAULT_HEARTBEAT_WINDOW_S
) -> list[ProducerProcess]:
    """The deployed ``audit_outbox_worker`` processes that are live now: what can still deliver open outbox work."""
    return [
        p for p in producer_processes(conn, namespace, deployed_only=True)
        if p.role == catalog.ROLE_AUDIT_OUTBOX_WORKER and p.live(heartbeat_window_s)
    ]


def lagging(processes: list[ProducerProcess], roles: tuple[str, ...], release: str) -> list[ProducerProcess]:
    """Deployed processes of ``roles`` running a binary older than ``release``."""
    return [p for p in processes if p.deployed() and p.role in roles and older_than(p.binary_version, release)]


def outbox_counts(conn: Connection) -> list[OutboxCount]:
    """Outbox rows grouped by (ProducerVersion, Status): an index-only read of ``ix_AuditOutbox_Status``."""
    stmt = (
        select(Outbox.c.ProducerVersion, Outbox.c.Status, func.count())
        .group_by(Outbox.c.Status, Outbox.c.ProducerVersion)
        .order_by(Outbox.c.Status, Outbox.c.ProducerVersion)
    )
    return [OutboxCount(v, s, n) for v, s, n in conn.execute(stmt)]


def pre_cutover_outbox(counts: list[OutboxCount], release: str, statuses: tuple[str, ...]) -> list[OutboxCount]:
    return [c for c in counts if c.status in statuses and older_than(c.producer_version, release)]


def outbox_examples(conn: Connection, release: str, statuses: tuple[str, ...], limit: int = 10) -> list[dict]:
    """A few pre-cutover outbox rows in ``statuses`` (ids for the report), oldest first."""
    versions = [c.producer_version for c in pre_cutover_outbox(outbox_counts(conn), release, statuses)]
    if not versions:
        return []
    stmt = (
        select(Outbox.c.OutboxId, Outbox.c.ProducerVersion, Outbox.c.Status, Outbox.c.Attempts)
        .where(Outbox.c.Status.in_(statuses), Outbox.c.ProducerVersion.in_(sorted(set(versions))))
        .order_by(Outbox.c.OutboxId)
        .limit(limit)
    )
    return [{"outbox_id": i, "producer_version": v, "status": s, "attempts": a} for i, v, s, a in conn.execute(stmt)]

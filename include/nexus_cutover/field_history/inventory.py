"""Producer inventory: Field History producers in ``_System_ProcessRegistry`` and Audit V2 outbox work.

Invariants:

* A *deployed* process is one with ``StoppedAt IS NULL``, whatever its heartbeat
  age: a silent process may come back, so a gate counts it until it is marked
  stopped (the report shows the heartbeat so an operator can tell).
* A process is *live* while deployed and its heartbeat is at most
  ``heartbeat_window_s`` old (used only to tell whether outbox work can progress).
* *Pre-cutover* means a BinaryVersion / ProducerVersion older than the release
  named by the caller (:func:`.versions.older_than`; an unreadable version is older).
* Outbox work is *open* while ``pending`` or ``processing``; ``failed`` work is
  undelivered and cannot finish on its own; ``delivered`` is done.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass

from sqlalchemy import Connection, func, select

from .. import catalog
from ..clock import utcnow
from .versions import older_than

Process = catalog.ProcessRegistry
Outbox = catalog.AuditOutbox

PRODUCER_ROLES = (catalog.ROLE_RUNTIME_API, catalog.ROLE_SERVICE_MANAGER, catalog.ROLE_AUDIT_OUTBOX_WORKER)
OUTBOX_OPEN = ("pending", "processing")
OUTBOX_FAILED = "failed"
DEFAULT_HEARTBEAT_WINDOW_S = 120.0


@dataclass(frozen=True)
class ProducerProcess:
    process_id: str
    role: str
    binary_version: str
    stopped: bool
    heartbeat_age_s: float

    def deployed(self) -> bool:
        return not self.stopped

    def live(self, heartbeat_window_s: float = DEFAULT_HEARTBEAT_WINDOW_S) -> bool:
        return not self.stopped and self.heartbeat_age_s <= heartbeat_window_s

    def as_dict(self) -> dict:
        return {**asdict(self), "heartbeat_age_s": round(self.heartbeat_age_s, 1)}


@dataclass(frozen=True)
class OutboxCount:
    producer_version: str
    status: str
    rows: int

    def as_dict(self) -> dict:
        return asdict(self)


def producer_processes(conn: Connection, namespace: str | None = None) -> list[ProducerProcess]:
    """Every process of a producer role (stopped ones included, flagged), ordered by role and id."""
    stmt = select(Process.c.ProcessId, Process.c.Role, Process.c.BinaryVersion, Process.c.StoppedAt, Process.c.LastHeartbeatAt)
    stmt = stmt.where(Process.c.Role.in_(PRODUCER_ROLES)).order_by(Process.c.Role, Process.c.ProcessId)
    if namespace is not None:
        stmt = stmt.where(Process.c.Namespace == namespace)
    now = utcnow()
    return [
        ProducerProcess(pid, role, version, stopped is not None, max(0.0, (now - beat).total_seconds()))
        for pid, role, version, stopped, beat in conn.execute(stmt)
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

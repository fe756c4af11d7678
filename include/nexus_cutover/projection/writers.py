"""Process evidence from ``_System_ProcessRegistry``: old writers stopped (step 3), new host ready (step 5).

Invariants:

* An old writer is a ``ProjectionProtocol = 0`` process of the namespace in one
  of :data:`~nexus_cutover.catalog.OLD_WRITER_ROLES` (ingress_writer,
  receipt_materializer, projection_worker, dependency_resolver).
* A process is *live* while ``StoppedAt IS NULL`` and its heartbeat is within
  the stale-heartbeat window; *silent* when not stopped but its heartbeat is
  older; *stopped* when ``StoppedAt`` is set: the one rule of
  :mod:`nexus_cutover.liveness` (boundary inclusive). The database cannot prove an old
  binary will never resume (seed 000, step 3): this is evidence for the human
  confirmation, not a substitute for it.
* Readiness = a registered ``ProjectionProtocol = 1`` ``integration_host`` with
  ``ActivatedAt`` set and a fresh heartbeat, and no live old writer.
* A long-lived registry keeps every process that ever ran: thousands of stopped
  rows (every restart adds one). Every read that decides whether a process is
  live applies the liveness rule in SQL (:func:`~nexus_cutover.liveness.live_clause`),
  on ``ix_ProcessRegistry_Role`` (Namespace, Role, ``StoppedAt IS NULL``), and is
  never capped before that rule: a live process is found wherever its row sorts.
  Only what is shown for the person is bounded: silent processes (not stopped)
  in full, stopped ones as a count per role and the :data:`STOPPED_SHOWN` most
  recently stopped of each role.
* Read only; every query is a range of ``ix_ProcessRegistry_Role``.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, func, or_, select

from .. import catalog, tx
from ..catalog import ProcessRegistry
from ..clock import utc_text, utcnow
from ..liveness import LIVE, STOPPED, heartbeat_cutoff, live_clause, process_state

#: Most recently stopped processes shown per role (the rest are counted): evidence for a person, never a decision.
STOPPED_SHOWN = 5


def _process(row, now: dt.datetime, stale: dt.timedelta) -> dict[str, Any]:
    m = row._mapping
    state = process_state(m["StoppedAt"], m["LastHeartbeatAt"], now, stale)
    return {
        "process_id": m["ProcessId"],
        "role": m["Role"],
        "binary_version": m["BinaryVersion"],
        "projection_protocol": m["ProjectionProtocol"],
        "state": state,
        "started_at": m["StartedAt"].isoformat(),
        "last_heartbeat_at": m["LastHeartbeatAt"].isoformat(),
        "heartbeat_age_s": round((now - m["LastHeartbeatAt"]).total_seconds(), 1),
        "activated_at": m["ActivatedAt"].isoformat() if m["ActivatedAt"] else None,
        "stopped_at": m["StoppedAt"].isoformat() if m["StoppedAt"] else None,
    }


def _of(namespace: str, roles, protocol: int):
    """The registry rows of ``namespace`` in ``roles`` under ``protocol``: an equality prefix of ix_ProcessRegistry_Role."""
    t = ProcessRegistry
    return [t.c.Namespace == namespace, t.c.Role.in_(list(roles)), t.c.ProjectionProtocol == protocol]


def live_statement(namespace: str, roles, protocol: int, now: dt.datetime, stale: dt.timedelta):
    """Every live process of ``roles`` (the liveness rule in SQL; no cap): exposed for EXPLAIN tests."""
    t = ProcessRegistry
    return select(t).where(*_of(namespace, roles, protocol), live_clause(now, stale)).order_by(t.c.Role, t.c.ProcessId)


def silent_statement(namespace: str, roles, protocol: int, now: dt.datetime, stale: dt.timedelta):
    """Every process of ``roles`` not stopped whose heartbeat is stale (it may come back): exposed for EXPLAIN tests."""
    t = ProcessRegistry
    return (
        select(t)
        .where(*_of(namespace, roles, protocol), t.c.StoppedAt.is_(None), t.c.LastHeartbeatAt < heartbeat_cutoff(now, stale))
        .order_by(t.c.Role, t.c.ProcessId)
    )


def stopped_counts_statement(namespace: str, roles, protocol: int):
    """Stopped processes per role, counted in the index (``StoppedAt IS NOT NULL``)."""
    t = ProcessRegistry
    return (
        select(t.c.Role, func.count())
        .where(*_of(namespace, roles, protocol), t.c.StoppedAt.is_not(None))
        .group_by(t.c.Role)
    )


def recently_stopped_statement(namespace: str, role: str, protocol: int, limit: int = STOPPED_SHOWN):
    """The ``limit`` most recently stopped processes of one role (a backward range of the index)."""
    t = ProcessRegistry
    return (
        select(t)
        .where(*_of(namespace, [role], protocol), t.c.StoppedAt.is_not(None))
        .order_by(t.c.StoppedAt.desc(), t.c.ProcessId)
        .limit(limit)
    )


def _live(conn: Connection, namespace: str, roles, protocol: int, now, stale) -> list[dict[str, Any]]:
    return [_process(r, now, stale) for r in conn.execute(live_statement(namespace, roles, protocol, now, stale))]


def _not_stopped(conn: Connection, namespace: str, roles, protocol: int, now, stale) -> list[dict[str, Any]]:
    """Live then silent processes (every one: neither list is capped), each in (Role, ProcessId) order."""
    silent = [_process(r, now, stale) for r in conn.execute(silent_statement(namespace, roles, protocol, now, stale))]
    return _live(conn, namespace, roles, protocol, now, stale) + silent


@dataclass
class WriterEvidence:
    """Every old-protocol writer of the namespace with its state (live / silent / stopped)."""

    namespace: str
    checked_at: dt.datetime
    stale_heartbeat_s: float
    #: Every live and silent process, then the most recently stopped ones of each role (:data:`STOPPED_SHOWN`).
    processes: list[dict[str, Any]]
    #: Stopped processes per role, all of them counted.
    stopped_by_role: dict[str, int] = field(default_factory=dict)

    @property
    def live(self) -> list[dict[str, Any]]:
        return [p for p in self.processes if p["state"] == LIVE]

    @property
    def stopped_total(self) -> int:
        return sum(self.stopped_by_role.values())

    @property
    def stopped_not_shown(self) -> int:
        return self.stopped_total - sum(1 for p in self.processes if p["state"] == STOPPED)

    @property
    def all_stopped_or_silent(self) -> bool:
        return not self.live

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "checked_at": self.checked_at.isoformat(),
            "stale_heartbeat_s": self.stale_heartbeat_s,
            "all_stopped_or_silent": self.all_stopped_or_silent,
            "live": [p["process_id"] for p in self.live],
            "processes": self.processes,
            "stopped_by_role": dict(self.stopped_by_role),
            "stopped_not_shown": self.stopped_not_shown,
        }

    def as_text(self) -> str:
        """The evidence as a task log or a terminal shows it: aligned plain columns, no markdown markup (the question's
        page renders :meth:`WriterEvidence.as_markdown`)."""
        head = (f"old-protocol writers of namespace {self.namespace} at {self.checked_at.isoformat()}Z (live = not stopped "
                f"and heartbeat within {self.stale_heartbeat_s:g} s):")
        if not self.processes and not self.stopped_total:
            return head + "\n  none registered (no ingress_writer, receipt_materializer, projection_worker or dependency_resolver)"
        table = [("process", "role", "version", "state", "last heartbeat (age s)", "stopped at")] + [
            (str(p["process_id"]), str(p["role"]), str(p["binary_version"]), str(p["state"]),
             f"{utc_text(p['last_heartbeat_at'])} ({p['heartbeat_age_s']})", utc_text(p["stopped_at"])) for p in self.processes]
        widths = [max(len(row[i]) for row in table) for i in range(len(table[0]))]
        lines = ["  " + "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True)).rstrip() for row in table]
        if self.stopped_not_shown:
            counts = ", ".join(f"{role} {n}" for role, n in sorted(self.stopped_by_role.items()))
            lines.append(f"  {self.stopped_not_shown} older stopped process(es) not listed ({self.stopped_total} stopped in all: "
                         f"{counts}); every live and silent one is listed")
        return "\n".join([head, *lines])

    def as_markdown(self) -> str:
        """The evidence table shown to the engineer in the confirmation step."""
        head = (
            f"Old-protocol writers of namespace `{self.namespace}` at {self.checked_at.isoformat()}Z "
            f"(live = not stopped and heartbeat within {self.stale_heartbeat_s:g}s):\n\n"
        )
        if not self.processes and not self.stopped_total:
            return head + "_No old-protocol ingress_writer, receipt_materializer, projection_worker or " \
                "dependency_resolver is registered._\n"
        rows = ["| process | role | version | state | last heartbeat (age s) | stopped at |", "|---|---|---|---|---|---|"]
        for p in self.processes:
            rows.append(
                f"| `{p['process_id']}` | {p['role']} | {p['binary_version']} | **{p['state']}** | "
                f"{utc_text(p['last_heartbeat_at'])} ({p['heartbeat_age_s']}) | {utc_text(p['stopped_at'])} |"
            )
        tail = ""
        if self.stopped_not_shown:
            counts = ", ".join(f"{role} {n}" for role, n in sorted(self.stopped_by_role.items()))
            tail = (f"\n_{self.stopped_not_shown} older stopped process(es) not listed ({self.stopped_total} stopped in "
                    f"all: {counts}); every live and silent one is listed._\n")
        return head + "\n".join(rows) + "\n" + tail


def old_writer_evidence(
    bind: Engine | Connection, namespace: str, *, stale_heartbeat: dt.timedelta, now: dt.datetime | None = None
) -> WriterEvidence:
    """Evidence that every old writer of the namespace is stopped or silent (read only)."""
    now = now or utcnow()
    roles, old = catalog.OLD_WRITER_ROLES, catalog.PROTOCOL_OLD
    with tx.reading(bind, "reading the process registry") as conn:
        procs = _not_stopped(conn, namespace, roles, old, now, stale_heartbeat)
        stopped = {role: int(n) for role, n in conn.execute(stopped_counts_statement(namespace, roles, old))}
        for role in sorted(stopped):
            procs += [_process(r, now, stale_heartbeat) for r in conn.execute(recently_stopped_statement(namespace, role, old))]
        return WriterEvidence(namespace, now, stale_heartbeat.total_seconds(), procs, stopped)


@dataclass
class Readiness:
    """Whether a new (protocol 1) host serves the namespace and no old writer is live."""

    namespace: str
    checked_at: dt.datetime
    hosts: list[dict[str, Any]]
    live_old_writers: list[dict[str, Any]]
    reasons: list[str] = field(default_factory=list)

    @property
    def ready_hosts(self) -> list[dict[str, Any]]:
        return [h for h in self.hosts if h["state"] == "live" and h["activated_at"]]

    @property
    def ready(self) -> bool:
        return not self.reasons

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "checked_at": self.checked_at.isoformat(),
            "ready": self.ready,
            "reasons": list(self.reasons),
            "ready_hosts": [h["process_id"] for h in self.ready_hosts],
            "hosts": self.hosts,
            "live_old_writers": [p["process_id"] for p in self.live_old_writers],
        }


def readiness(
    bind: Engine | Connection, namespace: str, *, stale_heartbeat: dt.timedelta, now: dt.datetime | None = None
) -> Readiness:
    """Readiness of the new host (read only); ``reasons`` says what is missing."""
    now = now or utcnow()
    with tx.reading(bind, "reading the process registry") as conn:
        hosts = _not_stopped(conn, namespace, [catalog.ROLE_INTEGRATION_HOST], catalog.PROTOCOL_RANGES, now, stale_heartbeat)
        old = _live(conn, namespace, catalog.OLD_WRITER_ROLES, catalog.PROTOCOL_OLD, now, stale_heartbeat)
        result = Readiness(namespace, now, hosts, old)
        if not result.ready_hosts:
            if not [h for h in hosts if h["state"] == "live"]:
                result.reasons.append("no live ProjectionProtocol=1 integration_host with a fresh heartbeat")
            else:
                result.reasons.append("the live ProjectionProtocol=1 integration_host has not activated (ActivatedAt unset)")
        if old:
            result.reasons.append("live old-protocol writer(s): " + ", ".join(p["process_id"] for p in old))
        return result


def processes_since_statement(namespace: str, since: dt.datetime):
    """Old-protocol writers that started or heartbeated at/after ``since``: exposed for EXPLAIN tests.

    The namespace's old-writer rows of ix_ProcessRegistry_Role, every state: a stopped row counts too, since an
    old binary that resumes may heartbeat without registering again (its ``StoppedAt`` stays set). The rule is
    applied in SQL; nothing is capped. Read once per run, after the release.
    """
    t = ProcessRegistry
    return (
        select(t)
        .where(
            *_of(namespace, catalog.OLD_WRITER_ROLES, catalog.PROTOCOL_OLD),
            or_(t.c.LastHeartbeatAt >= since, t.c.StartedAt >= since),
        )
        .order_by(t.c.ProcessId)
    )


def old_processes_since(
    bind: Engine | Connection, namespace: str, since: dt.datetime, *, now: dt.datetime | None = None
) -> list[dict[str, Any]]:
    """Old-protocol writers that started or heartbeated at/after ``since`` (every one: no cap)."""
    now = now or utcnow()
    with tx.reading(bind, "reading the process registry") as conn:
        return [_process(r, now, dt.timedelta(0)) for r in conn.execute(processes_since_statement(namespace, since))]

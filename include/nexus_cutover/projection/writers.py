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
* Read only; queries use ``ix_ProcessRegistry_Role`` (Namespace, Role, StoppedAt).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, or_, select

from .. import catalog
from ..catalog import ProcessRegistry
from ..clock import utcnow
from ..db import connection_of, translate_errors
from ..liveness import process_state

PROCESS_CAP = 1000


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


def _processes(conn: Connection, namespace: str, roles, protocol: int, now, stale) -> list[dict[str, Any]]:
    rows = conn.execute(
        select(ProcessRegistry)
        .where(
            ProcessRegistry.c.Namespace == namespace,
            ProcessRegistry.c.Role.in_(list(roles)),
            ProcessRegistry.c.ProjectionProtocol == protocol,
        )
        .order_by(ProcessRegistry.c.Role, ProcessRegistry.c.ProcessId)
        .limit(PROCESS_CAP)
    ).all()
    return [_process(r, now, stale) for r in rows]


@dataclass
class WriterEvidence:
    """Every old-protocol writer of the namespace with its state (live / silent / stopped)."""

    namespace: str
    checked_at: dt.datetime
    stale_heartbeat_s: float
    processes: list[dict[str, Any]]

    @property
    def live(self) -> list[dict[str, Any]]:
        return [p for p in self.processes if p["state"] == "live"]

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
        }

    def as_markdown(self) -> str:
        """The evidence table shown to the engineer in the confirmation step."""
        head = (
            f"Old-protocol writers of namespace `{self.namespace}` at {self.checked_at.isoformat()}Z "
            f"(live = not stopped and heartbeat within {self.stale_heartbeat_s:g}s):\n\n"
        )
        if not self.processes:
            return head + "_No old-protocol ingress_writer, receipt_materializer, projection_worker or " \
                "dependency_resolver is registered._\n"
        rows = ["| process | role | version | state | last heartbeat (age s) | stopped at |", "|---|---|---|---|---|---|"]
        for p in self.processes:
            rows.append(
                f"| `{p['process_id']}` | {p['role']} | {p['binary_version']} | **{p['state']}** | "
                f"{p['last_heartbeat_at']} ({p['heartbeat_age_s']}) | {p['stopped_at'] or '-'} |"
            )
        return head + "\n".join(rows) + "\n"


def old_writer_evidence(
    bind: Engine | Connection, namespace: str, *, stale_heartbeat: dt.timedelta, now: dt.datetime | None = None
) -> WriterEvidence:
    """Evidence that every old writer of the namespace is stopped or silent (read only)."""
    now = now or utcnow()
    with translate_errors("reading the process registry"), connection_of(bind) as conn:
        procs = _processes(conn, namespace, catalog.OLD_WRITER_ROLES, catalog.PROTOCOL_OLD, now, stale_heartbeat)
        return WriterEvidence(namespace, now, stale_heartbeat.total_seconds(), procs)


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
    with translate_errors("reading the process registry"), connection_of(bind) as conn:
        hosts = _processes(conn, namespace, [catalog.ROLE_INTEGRATION_HOST], catalog.PROTOCOL_RANGES, now, stale_heartbeat)
        old = old_writer_evidence(conn, namespace, stale_heartbeat=stale_heartbeat, now=now).live
        result = Readiness(namespace, now, hosts, old)
        if not result.ready_hosts:
            if not [h for h in hosts if h["state"] == "live"]:
                result.reasons.append("no live ProjectionProtocol=1 integration_host with a fresh heartbeat")
            else:
                result.reasons.append("the live ProjectionProtocol=1 integration_host has not activated (ActivatedAt unset)")
        if old:
            result.reasons.append("live old-protocol writer(s): " + ", ".join(p["process_id"] for p in old))
        return result


def old_processes_since(
    bind: Engine | Connection, namespace: str, since: dt.datetime, *, now: dt.datetime | None = None
) -> list[dict[str, Any]]:
    """Old-protocol writers that started or heartbeated at/after ``since`` (diagnosis only)."""
    now = now or utcnow()
    with translate_errors("reading the process registry"), connection_of(bind) as conn:
        rows = conn.execute(
            select(ProcessRegistry)
            .where(
                ProcessRegistry.c.Namespace == namespace,
                ProcessRegistry.c.Role.in_(list(catalog.OLD_WRITER_ROLES)),
                ProcessRegistry.c.ProjectionProtocol == catalog.PROTOCOL_OLD,
                or_(ProcessRegistry.c.LastHeartbeatAt >= since, ProcessRegistry.c.StartedAt >= since),
            )
            .order_by(ProcessRegistry.c.ProcessId)
            .limit(PROCESS_CAP)
        ).all()
        return [_process(r, now, dt.timedelta(0)) for r in rows]

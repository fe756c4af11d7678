"""Drain status of old projection work (cutover step 2) and stuck-blocker classification.

Invariants (contract, "Drain"):

* Old projection work = ``_System_WorkItem`` rows of the namespace with
  ``WorkClass = 'projection'`` and ``InputStartOrdinal IS NULL`` (every
  projection row when the column does not exist yet). It has drained when none
  is ``pending``, ``blocked``, ``retry`` or ``processing``.
* A drain is *stuck* when what remains provably cannot finish on its own before
  the deadline. Causes, each reported with the offending WorkIds:
  - ``retry_not_due``: a retry item whose ``NextAttemptAt`` is after the deadline;
  - ``blocked_external``: blocked items waiting on an external dependency
    (``BlockedOn`` set) while no live old-protocol ``dependency_resolver`` of the
    namespace heartbeats. With a live resolver, blocked items are progressing
    (the resolver releases them) and are not a blocker; whatever is still blocked
    at the deadline is reported with the rest (``still_live_at_timeout``). A
    blocked item without ``BlockedOn`` names no dependency a resolver could be
    missing for: it is not a blocker before the deadline either;
  - ``expired_lease``: a processing item whose lease has expired (nobody will finish it);
  - ``no_live_old_worker``: pending (or due retry) items while no live old-protocol
    ``projection_worker`` heartbeats.
* *Live* is the one rule of :mod:`nexus_cutover.liveness` (``StoppedAt IS NULL``
  and a heartbeat within the stale-heartbeat window, boundary inclusive); the
  live old workers and resolvers are listed in the report.
* Ordinary work (``WorkClass = 'ordinary'``) is not waited for: it runs before,
  during and after the cutover (contract, "Ordinary work"). Its live count is
  reported (:attr:`DrainReport.ordinary_live`) so a reader sees it is not what
  the drain waits for.
* Read only: nothing here writes; a WorkItem's status is never changed and
  nothing like ``RunUntilDrained`` is invoked.
* Every query is an equality prefix of ``ix_WorkItem_State`` (Namespace,
  WorkClass, Status) or ``ix_ProcessRegistry_Role``; listings are capped
  (``sample_limit``) and come with exact totals.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, and_, func, or_, select

from .. import catalog, tx
from ..catalog import ProcessRegistry, WorkItem
from ..clock import utcnow
from ..liveness import live_clause
from ..schema import has_column

CAUSE_RETRY_NOT_DUE = "retry_not_due"
CAUSE_BLOCKED_EXTERNAL = "blocked_external"
CAUSE_EXPIRED_LEASE = "expired_lease"
CAUSE_NO_LIVE_OLD_WORKER = "no_live_old_worker"
#: Not a cause of its own: what was still live when the deadline passed.
CAUSE_TIMED_OUT = "still_live_at_timeout"

CAUSE_HELP = {
    CAUSE_RETRY_NOT_DUE: "retry items not due before the drain deadline",
    CAUSE_BLOCKED_EXTERNAL: "items blocked on an external dependency while no live old-protocol dependency_resolver heartbeats",
    CAUSE_EXPIRED_LEASE: "processing items whose lease expired (their worker is gone)",
    CAUSE_NO_LIVE_OLD_WORKER: "pending items while no live old-protocol projection_worker heartbeats",
    CAUSE_TIMED_OUT: "items still live when the drain timeout passed",
}


def blockers_text(totals: dict[str, int]) -> str:
    """A stuck drain's causes in words with their counts (``blocker_totals``), e.g. "6 processing items whose lease
    expired (their worker is gone); 24 pending items while no live ..."; empty when none."""
    return "; ".join(f"{n} {CAUSE_HELP.get(cause, cause)}" for cause, n in totals.items() if n)


@dataclass
class DrainReport:
    """One look at the drain: remaining counts by status and the blockers grouped by cause."""

    namespace: str
    checked_at: dt.datetime
    deadline: dt.datetime
    counts: dict[str, int]
    live_old_workers: list[str]
    live_old_resolvers: list[str] = field(default_factory=list)
    blockers: dict[str, list[dict[str, Any]]] = field(default_factory=dict)
    blocker_totals: dict[str, int] = field(default_factory=dict)
    timed_out: bool = False
    #: Live ordinary WorkItems of the namespace: reported, never waited for.
    ordinary_live: int = 0

    @property
    def remaining(self) -> int:
        return sum(self.counts.values())

    @property
    def drained(self) -> bool:
        return self.remaining == 0

    @property
    def stuck(self) -> bool:
        """True when the drain provably cannot finish before the deadline (or the deadline passed)."""
        return not self.drained and (self.timed_out or any(self.blocker_totals.values()))

    @property
    def state(self) -> str:
        return "drained" if self.drained else "stuck" if self.stuck else "draining"

    def counts_text(self) -> str:
        parts = [f"{s} {self.counts.get(s, 0)}" for s in catalog.WORK_LIVE_STATUSES]
        return f"{self.remaining} old projection WorkItems remaining ({', '.join(parts)})" + self.ordinary_text()

    def ordinary_text(self) -> str:
        """What the report says of ordinary work: empty when none is live."""
        if not self.ordinary_live:
            return ""
        return f"; {self.ordinary_live} live ordinary WorkItem(s), not waited for (ordinary work runs on through the cutover)"

    def report_text(self) -> str:
        """A human report: counts, then every blocker grouped by cause, then what to do."""
        lines = [f"namespace {self.namespace!r}: {self.counts_text()}"]
        if self.drained:
            return lines[0] + "; drained"
        if self.counts.get("blocked") and self.live_old_resolvers:
            lines.append(
                f"- blocked items are progressing: live old-protocol dependency_resolver(s) {', '.join(self.live_old_resolvers)}"
            )
        for cause, total in self.blocker_totals.items():
            if not total:
                continue
            items = self.blockers.get(cause, [])
            lines.append(f"- {CAUSE_HELP[cause]}: {total}")
            for item in items:
                lines.append("    " + ", ".join(f"{k}={v}" for k, v in item.items()))
            if total > len(items):
                lines.append(f"    ... and {total - len(items)} more")
        if self.stuck:
            lines.append(
                "The drain cannot finish on its own before the deadline. Nothing was changed: resolve these "
                "items with the old runtime (or a separately reviewed operational decision), then clear "
                "wait_for_drain to resume. Do not change WorkItem status to proceed."
            )
        return "\n".join(lines)

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "state": self.state,
            "checked_at": self.checked_at.isoformat(),
            "deadline": self.deadline.isoformat(),
            "remaining": self.remaining,
            "counts": dict(self.counts),
            "live_old_workers": list(self.live_old_workers),
            "live_old_resolvers": list(self.live_old_resolvers),
            "timed_out": self.timed_out,
            "ordinary_live": self.ordinary_live,
            "ordinary_work": "not waited for",
            "blocker_totals": {k: v for k, v in self.blocker_totals.items() if v},
            "blockers": {k: v for k, v in self.blockers.items() if v},
        }


def _old_work(namespace: str, status: str | tuple[str, ...], range_column: bool):
    """The WHERE clause of old projection work in ``status`` (one, or several): a prefix of ix_WorkItem_State."""
    clause = and_(
        WorkItem.c.Namespace == namespace,
        WorkItem.c.WorkClass == catalog.WORK_CLASS_PROJECTION,
        WorkItem.c.Status == status if isinstance(status, str) else WorkItem.c.Status.in_(status),
    )
    if range_column:
        clause = and_(clause, catalog.INPUT_START_ORDINAL.column.is_(None))
    return clause


def ordinary_live_statement(namespace: str):
    """Live ordinary work of the namespace, counted (ranges on ix_WorkItem_State): reported, not waited for."""
    return select(func.count()).select_from(WorkItem).where(
        WorkItem.c.Namespace == namespace,
        WorkItem.c.WorkClass == catalog.WORK_CLASS_ORDINARY,
        WorkItem.c.Status.in_(catalog.WORK_LIVE_STATUSES),
    )


def live_counts_statement(namespace: str, range_column: bool):
    """Old projection work of the namespace per live status, in one statement (ranges on ix_WorkItem_State)."""
    return (
        select(WorkItem.c.Status, func.count())
        .where(_old_work(namespace, catalog.WORK_LIVE_STATUSES, range_column))
        .group_by(WorkItem.c.Status)
    )


#: Most live old projection WorkIds one look of the pre-arm wait reads (a backlog larger than this is timed by its
#: count alone): a few thousand ids on the state index, well inside one transaction's budget.
BACKLOG_ID_LIMIT = 5000


def live_old_work_ids_statement(namespace: str, range_column: bool, limit: int = BACKLOG_ID_LIMIT):
    """The WorkIds of the namespace's live old projection work, at most ``limit`` (on ix_WorkItem_State)."""
    return select(WorkItem.c.WorkId).where(_old_work(namespace, catalog.WORK_LIVE_STATUSES, range_column)).limit(limit)


def live_old_work_ids(bind: Engine | Connection, namespace: str, *, range_column: bool | None = None,
                      limit: int = BACKLOG_ID_LIMIT) -> frozenset[int] | None:
    """The WorkIds of the live old projection work (read only); None when there are more than ``limit``."""
    with tx.reading(bind, "reading the live old projection work") as conn:
        if range_column is None:
            range_column = has_column(conn, catalog.INPUT_START_ORDINAL)
        ids = conn.execute(live_old_work_ids_statement(namespace, range_column, limit + 1)).scalars().all()
    return None if len(ids) > limit else frozenset(int(i) for i in ids)


#: Most live processes listed per role (a namespace has a handful; the cap bounds a runaway registry).
PROCESS_LIST_LIMIT = 1000


def live_old_processes_by_role(
    conn: Connection, namespace: str, roles: tuple[str, ...], *, stale_heartbeat: dt.timedelta, now: dt.datetime
) -> dict[str, list[str]]:
    """Role -> ProcessIds (sorted, at most :data:`PROCESS_LIST_LIMIT` each) of the namespace's live old-protocol
    processes of ``roles``: one statement, unless it comes back full, when each role is read on its own (so a
    runaway count of one role can never hide another role's processes)."""
    t = ProcessRegistry

    def live(*where):
        return (
            select(t.c.Role, t.c.ProcessId)
            .where(t.c.Namespace == namespace, t.c.ProjectionProtocol == catalog.PROTOCOL_OLD, live_clause(now, stale_heartbeat),
                   *where)
            .order_by(t.c.Role, t.c.ProcessId)
        )

    cap = PROCESS_LIST_LIMIT * len(roles)
    rows = conn.execute(live(t.c.Role.in_(roles)).limit(cap)).all()
    if len(rows) == cap and len(roles) > 1:
        rows = [r for role in roles for r in conn.execute(live(t.c.Role == role).limit(PROCESS_LIST_LIMIT))]
    by_role: dict[str, list[str]] = {role: [] for role in roles}
    for role, process_id in rows:
        if len(by_role[role]) < PROCESS_LIST_LIMIT:
            by_role[role].append(process_id)
    return by_role


def live_old_processes(conn: Connection, namespace: str, role: str, *, stale_heartbeat: dt.timedelta, now: dt.datetime) -> list[str]:
    """ProcessIds of the namespace's live (:func:`~nexus_cutover.liveness.live_clause`) old-protocol ``role`` processes."""
    return live_old_processes_by_role(conn, namespace, (role,), stale_heartbeat=stale_heartbeat, now=now)[role]


def live_old_projection_workers(conn: Connection, namespace: str, *, stale_heartbeat: dt.timedelta, now: dt.datetime) -> list[str]:
    """ProcessIds of live old-protocol projection_workers of the namespace."""
    return live_old_processes(conn, namespace, catalog.ROLE_PROJECTION_WORKER, stale_heartbeat=stale_heartbeat, now=now)


def live_old_dependency_resolvers(conn: Connection, namespace: str, *, stale_heartbeat: dt.timedelta, now: dt.datetime) -> list[str]:
    """ProcessIds of live old-protocol dependency_resolvers of the namespace."""
    return live_old_processes(conn, namespace, catalog.ROLE_DEPENDENCY_RESOLVER, stale_heartbeat=stale_heartbeat, now=now)


def _item(row) -> dict[str, Any]:
    m = row._mapping
    out = {"work_id": m["WorkId"], "pack_install_id": m["PackInstallId"], "source_lane": m["SourceLane"]}
    for key, col in (
        ("status", "Status"),
        ("blocked_on", "BlockedOn"),
        ("next_attempt_at", "NextAttemptAt"),
        ("lease_owner", "LeaseOwner"),
        ("lease_expires_at", "LeaseExpiresAt"),
    ):
        value = m.get(col)
        if value is not None:
            out[key] = value.isoformat() if isinstance(value, dt.datetime) else value
    return out


_ITEM_COLUMNS = [
    WorkItem.c.WorkId,
    WorkItem.c.PackInstallId,
    WorkItem.c.SourceLane,
    WorkItem.c.Status,
    WorkItem.c.BlockedOn,
    WorkItem.c.NextAttemptAt,
    WorkItem.c.LeaseOwner,
    WorkItem.c.LeaseExpiresAt,
]


def _count_and_sample(conn: Connection, where, limit: int) -> tuple[int, list[dict[str, Any]]]:
    """The exact total of ``where`` and its first ``limit`` items; a cause with none costs one small COUNT.

    (One statement with a window ``COUNT(*) OVER ()`` was measured: it saves a round trip only when the cause
    has items, and its compiled form, cached by each waiting tenant's engine, costs ~8 KB more per cause.)
    """
    total = conn.execute(select(func.count()).select_from(WorkItem).where(where)).scalar_one()
    if not total:
        return 0, []
    rows = conn.execute(select(*_ITEM_COLUMNS).where(where).order_by(WorkItem.c.WorkId).limit(limit)).all()
    return int(total), [_item(r) for r in rows]


def drain_report(
    bind: Engine | Connection,
    namespace: str,
    *,
    deadline: dt.datetime,
    stale_heartbeat: dt.timedelta,
    now: dt.datetime | None = None,
    sample_limit: int = 200,
    range_column: bool | None = None,
) -> DrainReport:
    """Count the namespace's old projection work by live status and classify what cannot finish.

    ``deadline`` and ``now`` are naive UTC. ``range_column`` says whether
    ``InputStartOrdinal`` exists (detected when None). Read only.
    """
    now = now or utcnow()
    with tx.reading(bind, "reading the drain status") as conn:
        return _look(conn, namespace, deadline, stale_heartbeat, now, sample_limit, range_column)


def _look(
    conn: Connection, namespace: str, deadline: dt.datetime, stale_heartbeat: dt.timedelta, now: dt.datetime,
    sample_limit: int, range_column: bool | None,
) -> DrainReport:
    """One look (:func:`drain_report`): the counts, the live old processes, then the blockers cause by cause."""
    if range_column is None:
        range_column = has_column(conn, catalog.INPUT_START_ORDINAL)
    counts = _live_counts(conn, namespace, range_column)
    roles = (catalog.ROLE_PROJECTION_WORKER, catalog.ROLE_DEPENDENCY_RESOLVER)
    live = live_old_processes_by_role(conn, namespace, roles, stale_heartbeat=stale_heartbeat, now=now)
    workers, resolvers = live[roles[0]], live[roles[1]]
    report = DrainReport(namespace, now, deadline, counts, workers, resolvers)
    report.ordinary_live = int(conn.execute(ordinary_live_statement(namespace)).scalar_one())
    report.timed_out = now >= deadline and not report.drained
    blockers = _Blockers(conn, report, range_column, sample_limit)
    blockers.cannot_finish()
    if not workers and (counts["pending"] or counts["retry"]):
        blockers.no_live_old_worker()
    if report.timed_out:
        blockers.still_live()
    return report


def _live_counts(conn: Connection, namespace: str, range_column: bool) -> dict[str, int]:
    """Old projection work of the namespace by live status (every live status present, 0 when none)."""
    counts = dict.fromkeys(catalog.WORK_LIVE_STATUSES, 0)
    for status, total in conn.execute(live_counts_statement(namespace, range_column)):
        counts[status] = int(total)
    return counts


class _Blockers:
    """Fills ``report.blocker_totals`` / ``report.blockers`` of one look, a cause at a time (listings capped at ``sample_limit``)."""

    def __init__(self, conn: Connection, report: DrainReport, range_column: bool, sample_limit: int):
        self.conn = conn
        self.report = report
        self.range_column = range_column
        self.sample_limit = sample_limit

    def old_work(self, status: str):
        return _old_work(self.report.namespace, status, self.range_column)

    def record(self, cause: str, total: int, items: list[dict[str, Any]]) -> None:
        self.report.blocker_totals[cause] = total
        self.report.blockers[cause] = items

    def classify(self, cause: str, where) -> None:
        """``cause``: the old work matching ``where``, its exact total and the first ``sample_limit`` items."""
        self.record(cause, *_count_and_sample(self.conn, where, self.sample_limit))

    def cannot_finish(self) -> None:
        """``retry_not_due``, ``blocked_external`` (only while no live resolver) and ``expired_lease``."""
        report, counts = self.report, self.report.counts
        if counts["retry"]:
            self.classify(CAUSE_RETRY_NOT_DUE, and_(self.old_work("retry"), WorkItem.c.NextAttemptAt > report.deadline))
        if counts["blocked"] and not report.live_old_resolvers:  # with a live resolver, blocked items are progressing
            self.classify(CAUSE_BLOCKED_EXTERNAL, and_(self.old_work("blocked"), WorkItem.c.BlockedOn.isnot(None)))
        if counts["processing"]:
            expired = and_(WorkItem.c.LeaseExpiresAt.isnot(None), WorkItem.c.LeaseExpiresAt < report.checked_at)
            self.classify(CAUSE_EXPIRED_LEASE, and_(self.old_work("processing"), expired))

    def no_live_old_worker(self) -> None:
        """``no_live_old_worker``: the pending items, then the retry items due before the deadline."""
        total_p, items_p = _count_and_sample(self.conn, self.old_work("pending"), self.sample_limit)
        due = or_(WorkItem.c.NextAttemptAt.is_(None), WorkItem.c.NextAttemptAt <= self.report.deadline)
        total_r, items_r = _count_and_sample(
            self.conn, and_(self.old_work("retry"), due), max(0, self.sample_limit - len(items_p))
        )
        self.record(CAUSE_NO_LIVE_OLD_WORKER, total_p + total_r, items_p + items_r)

    def still_live(self) -> None:
        """``still_live_at_timeout``: everything still live, status by status, up to ``sample_limit`` items."""
        remaining_items: list[dict[str, Any]] = []
        for status in catalog.WORK_LIVE_STATUSES:
            if self.report.counts[status] and len(remaining_items) < self.sample_limit:
                _, items = _count_and_sample(self.conn, self.old_work(status), self.sample_limit - len(remaining_items))
                remaining_items.extend(items)
        self.record(CAUSE_TIMED_OUT, self.report.remaining, remaining_items)

"""The old-protocol runtime (``ProjectionProtocol = 0``), simulated for demos and tests.

``python -m nexus_sim.old_runtime --namespace <ns> [--process-id <id>] [--exit-when-drained]``
reads ``NEXUS_TENANT_DSN``.

What it does, each :meth:`OldRuntimeSimulator.step`:

* **ingress_writer**: admits old-style inputs - unmaterialized ``_System_IngressReceipt``
  rows of active packs and, if configured, synthetic inputs - but only for
  sources no admission fence in force covers (overrides let their scopes
  through; see :mod:`nexus_cutover.runtime.fenced_sources`). Admission holds the pack lock, allocates
  ordinals from ``_System_EnqueueOrdinal``, inserts the Event and coalesces by
  identity the old way: the latest old WorkItem of the identity, if still
  pending and attempt zero, moves its ``SelectedEventId``/``LaneOrdinal`` to the
  new Event; otherwise a new WorkItem is created. Old WorkItems never carry
  ``InputStartOrdinal`` (the simulator also runs on the Part A schema).
* **dependency_resolver** (in-process): a ``blocked`` item is released to
  ``retry`` after ``block_steps`` steps, unless ``resolve_dependencies`` is off.
* **projection_worker**: claims old projection items (``InputStartOrdinal IS
  NULL``: pending, due retry, or processing with an expired lease) and works
  them to completion: the first ``fail_attempts`` executions of an item fail
  into ``retry`` (``Attempt`` + 1, due after ``retry_delay_s``); every
  ``block_every``-th WorkId first blocks on an external dependency.

It heartbeats as ``ingress_writer`` and ``projection_worker`` (ProcessIds
``<id>/ingress_writer`` and ``<id>/projection_worker``) and sets ``StoppedAt`` on
both when :meth:`run` ends. Changing the status of the WorkItems it works is
its job, as it is the old runtime's; it never touches range work.

What it holds: the simulator (:class:`OldRuntimeSimulator`, its :class:`SimulatorConfig` and :class:`StepReport`)
and its command line (:func:`main`). The statements it runs (which WorkItems are old work, which it may claim and
in what order, old-style admission and coalescing) are :mod:`nexus_sim.old_runtime_sql`'s; :func:`allocate_table_id`
is re-exported here (importers may keep ``from nexus_sim.old_runtime import allocate_table_id``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import logging
import threading
import uuid
from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, func, select, update

from nexus_cutover import catalog
from nexus_cutover import tx as policy
from nexus_cutover.catalog import Event, IngressReceipt, WorkItem
from nexus_cutover.cli.common import configure_logging, flag, run_command, stop_on_signals
from nexus_cutover.clock import utcnow
from nexus_cutover.db import DSN_ENV_TENANT, Deadline, dsn_from_env, make_engine, translate_errors
from nexus_cutover.errors import CutoverError
from nexus_cutover.runtime.activation import active_packs
from nexus_cutover.runtime.fenced_sources import FenceView, fences_in_force
from nexus_cutover.runtime.model import Input, Routing
from nexus_cutover.runtime.registry import default_process_id, heartbeat, mark_stopped, register
from nexus_cutover.runtime.tx import run_in_pack_transaction
from nexus_cutover.schema import has_column

from .old_runtime_sql import (  # noqa: F401 - re-exported: importers know allocate_table_id as old_runtime's
    allocate_table_id,
    claimable,
    old_admit,
    old_work,
    reclaim_first,
)

log = logging.getLogger(__name__)

OLD_BINARY_VERSION = "4.11.0"


@dataclass
class StepReport:
    admitted: int = 0
    claimed: int = 0
    completed: int = 0
    retried: int = 0
    blocked: int = 0
    unblocked: int = 0
    fenced_sources: int = 0

    @property
    def busy(self) -> bool:
        return bool(self.admitted or self.claimed or self.unblocked)


@dataclass
class SimulatorConfig:
    synthetic_inputs_per_step: int = 0
    synthetic_lanes: int = 3
    receipts_per_step: int = 200
    work_per_step: int = 50
    fail_attempts: int = 0
    retry_delay_s: float = 0.2
    block_every: int = 0
    block_steps: int = 3
    resolve_dependencies: bool = True
    lease_s: float = 30.0
    heartbeat_s: float = 2.0
    routing: Routing = field(default_factory=Routing)


class OldRuntimeSimulator:
    def __init__(
        self,
        engine: Engine,
        namespace: str,
        *,
        process_id: str | None = None,
        writer_id: str | None = None,
        worker_id: str | None = None,
        config: SimulatorConfig | None = None,
        **overrides,
    ):
        """``writer_id`` / ``worker_id`` override the two ProcessIds (e.g. to stand in for an
        old process already registered); the worker resumes ``processing`` items leased to its own id."""
        self.engine = engine
        self.namespace = namespace
        self.process_id = process_id or default_process_id("old-runtime")
        self.config = config or SimulatorConfig()
        for key, value in overrides.items():
            if not hasattr(self.config, key):
                raise TypeError(f"unknown simulator setting {key!r}")
            setattr(self.config, key, value)
        self.writer_id = (writer_id or f"{self.process_id}/{catalog.ROLE_INGRESS_WRITER}")[:128]
        self.worker_id = (worker_id or f"{self.process_id}/{catalog.ROLE_PROJECTION_WORKER}")[:128]
        self.resolver_id = f"{self.process_id}/{catalog.ROLE_DEPENDENCY_RESOLVER}"[:128]
        self._run_tag = uuid.uuid4().hex[:8]
        self._synthetic = 0
        self._blocked_since: dict[int, int] = {}
        self._blocked_once: set[int] = set()
        self._steps = 0
        self._last_beat: dt.datetime | None = None
        self._registered = False

    # -- registry ---------------------------------------------------------

    def _processes(self) -> list[tuple[str, str]]:
        """(ProcessId, role) of every old process this simulator stands for (a resolver when it resolves)."""
        procs = [(self.writer_id, catalog.ROLE_INGRESS_WRITER), (self.worker_id, catalog.ROLE_PROJECTION_WORKER)]
        if self.config.resolve_dependencies:
            procs.append((self.resolver_id, catalog.ROLE_DEPENDENCY_RESOLVER))
        return procs

    def register(self) -> None:
        for pid, role in self._processes():
            register(self.engine, pid, self.namespace, role, catalog.PROTOCOL_OLD, binary_version=OLD_BINARY_VERSION)
        self._registered = True
        self._last_beat = utcnow()

    def _heartbeat_if_due(self) -> None:
        now = utcnow()
        if self._last_beat is None or (now - self._last_beat).total_seconds() >= self.config.heartbeat_s:
            for pid, _ in self._processes():
                heartbeat(self.engine, pid)
            self._last_beat = now

    def stop(self) -> None:
        if self._registered:
            for pid, _ in self._processes():
                mark_stopped(self.engine, pid)

    # -- one step ---------------------------------------------------------

    def step(self) -> StepReport:
        if not self._registered:
            self.register()
        self._heartbeat_if_due()
        self._steps += 1
        report = StepReport()
        with translate_errors("reading the old runtime's view"), self.engine.connect() as conn:
            packs = active_packs(conn, self.namespace)
            fences = fences_in_force(conn, self.namespace, utcnow())
            ranged = has_column(conn, catalog.INPUT_START_ORDINAL)
        for pack in packs:
            report.admitted += self._admit_pack(pack, fences, report)
        if self.config.resolve_dependencies:
            report.unblocked += self._resolve_dependencies(ranged)
        self._work(ranged, report)
        return report

    def _inputs_for(self, conn: Connection, pack: str, fences: FenceView, report: StepReport) -> tuple[list[Input], list]:
        t = IngressReceipt
        receipts = conn.execute(
            select(t.c.SourceLane, t.c.ReceiptId, t.c.EventKind, t.c.Payload, t.c.ReceivedAt)
            .where(t.c.PackInstallId == pack, t.c.MaterializedAt.is_(None))
            .order_by(t.c.SourceLane, t.c.ReceiptId)
            .limit(self.config.receipts_per_step)
        ).all()
        routing = self.config.routing
        inputs, keys = [], []
        for r in receipts:
            if fences.fenced(pack, r.SourceLane):
                report.fenced_sources += 1
                continue
            inputs.append(Input.routed(r.SourceLane, r.ReceiptId, r.Payload, r.EventKind, routing, received_at=r.ReceivedAt))
            keys.append((r.SourceLane, r.ReceiptId))
        for _ in range(self.config.synthetic_inputs_per_step):
            lane = f"sim-{self._synthetic % max(1, self.config.synthetic_lanes):03d}"
            if fences.fenced(pack, lane):
                report.fenced_sources += 1
                continue
            self._synthetic += 1
            rid = f"sim-{self._run_tag}-{self._synthetic}"
            inputs.append(Input.routed(lane, rid, f'{{"synthetic": "{rid}"}}', "contact.changed", routing))
        return inputs, keys

    def _admit_pack(self, pack: str, fences: FenceView, report: StepReport) -> int:
        with translate_errors(f"reading receipts of pack {pack!r}"), self.engine.connect() as conn:
            inputs, receipt_keys = self._inputs_for(conn, pack, fences, report)
        if not inputs:
            return 0

        def body(conn: Connection) -> int:
            return old_admit(conn, self.namespace, pack, inputs, receipt_keys)

        return run_in_pack_transaction(self.engine, pack, body, what=f"old-style admission into {pack!r}", deadline=Deadline(30))

    def _resolve_dependencies(self, ranged: bool) -> int:
        with translate_errors("reading blocked work"), self.engine.connect() as conn:
            blocked = [
                r.WorkId
                for r in conn.execute(select(WorkItem.c.WorkId).where(old_work(self.namespace, ranged), WorkItem.c.Status == "blocked"))
            ]
        released = 0
        for work_id in blocked:
            since = self._blocked_since.setdefault(work_id, self._steps)
            if self._steps - since < self.config.block_steps:
                continue
            now = utcnow()
            released += policy.run(
                self.engine,
                lambda conn, work_id=work_id, now=now: conn.execute(
                    update(WorkItem)
                    .where(WorkItem.c.WorkId == work_id, WorkItem.c.Status == "blocked")
                    .values(Status="retry", BlockedOn=None, NextAttemptAt=now, UpdatedAt=now)
                ).rowcount,
                what=f"resolving the dependency of WorkItem {work_id}",
            )
            self._blocked_since.pop(work_id, None)
        return released

    def _work(self, ranged: bool, report: StepReport) -> None:
        now = utcnow()
        with translate_errors("listing old projection work"), self.engine.connect() as conn:
            candidates = [
                r.WorkId
                for r in conn.execute(
                    select(WorkItem.c.WorkId)
                    .where(old_work(self.namespace, ranged), claimable(now, self.worker_id))
                    .order_by(reclaim_first(), WorkItem.c.WorkId)
                    .limit(self.config.work_per_step)
                )
            ]
        for work_id in candidates:
            outcome = self._work_one(work_id, ranged)
            if outcome is None:
                continue
            report.claimed += 1
            setattr(report, outcome, getattr(report, outcome) + 1)

    def _work_one(self, work_id: int, ranged: bool) -> str | None:
        cfg = self.config
        def body(conn: Connection) -> str | None:
            now = utcnow()
            claimed = conn.execute(
                update(WorkItem)
                .where(WorkItem.c.WorkId == work_id, old_work(self.namespace, ranged), claimable(now, self.worker_id))
                .values(
                    Status="processing", LeaseOwner=self.worker_id, LeaseExpiresAt=now + dt.timedelta(seconds=cfg.lease_s), UpdatedAt=now
                )
            ).rowcount
            if claimed != 1:
                return None
            row = conn.execute(
                select(WorkItem.c.Attempt, WorkItem.c.SelectedEventId, WorkItem.c.SourceLane).where(WorkItem.c.WorkId == work_id)
            ).one()
            if cfg.block_every and work_id % cfg.block_every == 0 and work_id not in self._blocked_once:
                self._blocked_once.add(work_id)
                self._blocked_since[work_id] = self._steps
                conn.execute(
                    update(WorkItem)
                    .where(WorkItem.c.WorkId == work_id)
                    .values(Status="blocked", BlockedOn=f"dependency/{row.SourceLane}", LeaseOwner=None, LeaseExpiresAt=None, UpdatedAt=now)
                )
                return "blocked"
            if row.Attempt < cfg.fail_attempts:
                conn.execute(
                    update(WorkItem)
                    .where(WorkItem.c.WorkId == work_id)
                    .values(
                        Status="retry",
                        Attempt=WorkItem.c.Attempt + 1,
                        NextAttemptAt=now + dt.timedelta(seconds=cfg.retry_delay_s),
                        LeaseOwner=None,
                        LeaseExpiresAt=None,
                        UpdatedAt=now,
                    )
                )
                return "retried"
            conn.execute(
                update(WorkItem)
                .where(WorkItem.c.WorkId == work_id)
                .values(Status="completed", LeaseOwner=None, LeaseExpiresAt=None, UpdatedAt=now)
            )
            if row.SelectedEventId is not None:
                conn.execute(update(Event).where(Event.c.EventId == row.SelectedEventId).values(Status="processed"))
            return "completed"

        return policy.run(self.engine, body, what=f"working old WorkItem {work_id}")

    # -- drain and run ----------------------------------------------------

    def live_old_work(self) -> int:
        with translate_errors("counting old projection work"), self.engine.connect() as conn:
            ranged = has_column(conn, catalog.INPUT_START_ORDINAL)
            return conn.execute(
                select(func.count())
                .select_from(WorkItem)
                .where(old_work(self.namespace, ranged), WorkItem.c.Status.in_(catalog.WORK_LIVE_STATUSES))
            ).scalar_one()

    def drained(self) -> bool:
        """No live old projection work, and nothing left it may admit (fenced sources do not count)."""
        if self.live_old_work():
            return False
        with translate_errors("checking admissible inputs"), self.engine.connect() as conn:
            fences = fences_in_force(conn, self.namespace, utcnow())
            for pack in active_packs(conn, self.namespace):
                t = IngressReceipt
                lanes = conn.execute(
                    select(t.c.SourceLane).distinct().where(t.c.PackInstallId == pack, t.c.MaterializedAt.is_(None))
                ).scalars()
                if any(not fences.fenced(pack, lane) for lane in lanes):
                    return False
                if self.config.synthetic_inputs_per_step and not all(
                    fences.fenced(pack, f"sim-{i:03d}") for i in range(max(1, self.config.synthetic_lanes))
                ):
                    return False
        return True

    def run(self, stop_event: threading.Event | None = None, *, poll_s: float = 0.1, exit_when_drained: bool = False) -> int:
        """Step until ``stop_event`` is set (or, with ``exit_when_drained``, until drained); marks itself stopped."""
        stop_event = stop_event or threading.Event()
        self.register()
        try:
            while not stop_event.is_set():
                try:
                    report = self.step()
                except CutoverError as exc:  # a real old runtime outlives one failed step (e.g. a concurrent DDL)
                    log.warning("old runtime %s: step failed, retrying: %s", self.worker_id, exc)
                    stop_event.wait(poll_s)
                    continue
                if exit_when_drained and not report.busy and self.drained():
                    break
                if not report.busy:
                    stop_event.wait(poll_s)
        finally:
            self.stop()
        return 0




# -- command line -------------------------------------------------------------


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="old-runtime-simulator", description=__doc__.splitlines()[0])
    flag(parser, "namespace", required=True)
    flag(parser, "process-id", default=None)
    flag(parser, "writer-id", default=None, help="ProcessId of the ingress_writer row (default <process-id>/ingress_writer)")
    flag(parser, "worker-id", default=None, help="ProcessId of the projection_worker row; its own leases are resumed")
    flag(parser, "exit-when-drained", action="store_true", help="exit 0 once no old work and nothing admissible is left")
    flag(parser, "synthetic-inputs", type=int, default=0, help="synthetic inputs per step and pack (default 0)")
    flag(parser, "fail-attempts", type=int, default=0, help="executions of each item that fail into retry first")
    flag(parser, "retry-delay", type=float, default=0.2, help="seconds before a retry is due")
    flag(parser, "block-every", type=int, default=0, help="every n-th WorkId first blocks on a dependency")
    flag(parser, "no-resolve", action="store_true", help="never resolve blocked dependencies")
    flag(parser, "poll", type=float, default=0.1, help="idle poll interval in seconds")
    args = parser.parse_args(argv)
    configure_logging()
    stop = threading.Event()
    stop_on_signals(stop)

    def body() -> int:
        engine = make_engine(dsn_from_env(DSN_ENV_TENANT))
        try:
            sim = OldRuntimeSimulator(
                engine,
                args.namespace,
                process_id=args.process_id,
                writer_id=args.writer_id,
                worker_id=args.worker_id,
                synthetic_inputs_per_step=args.synthetic_inputs,
                fail_attempts=args.fail_attempts,
                retry_delay_s=args.retry_delay,
                block_every=args.block_every,
                resolve_dependencies=not args.no_resolve,
            )
            return sim.run(stop, poll_s=args.poll, exit_when_drained=args.exit_when_drained)
        finally:
            engine.dispose()

    return run_command(body, program="old-runtime-simulator")


if __name__ == "__main__":
    raise SystemExit(main())

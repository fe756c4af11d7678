"""Live traffic after the release: a reference producer that keeps writing while a test or the demo runs.

:class:`LiveTraffic` stands for the tenant's sources and its ordinary-work
runtime. Each :meth:`~LiveTraffic.tick` (or each ``interval_s`` once
:meth:`~LiveTraffic.start`-ed, until :meth:`~LiveTraffic.stop`):

* **receipts** (new range work): ``receipts_per_tick`` new
  ``_System_IngressReceipt`` rows per receipt pack, unmaterialized, on the
  planted lanes (hostile spellings included), with fresh 15-character CRM ids
  (key prefix ``a1L``, which the builder never uses) and non-ASCII payloads --
  what the reference host (``nexus-host``) materializes through range
  admission. Then up to ``future_per_tick`` of the tenant's planned future
  receipts (:class:`~nexus_sim.scenario.production.FutureReceipt`, in plan
  order): the collision candidates among them are the receipts the runtime
  must treat as collisions. A receipt whose key the server equates with an
  existing receipt row is refused by the table's primary key: it is reported
  as rejected at ingress, as a source would see it.
* **ordinary work**: ``ordinary_per_tick`` new ordinary Events per ordinary
  pack, each with its one ``WorkClass = 'ordinary'`` WorkItem (``pending``).
  The reference runtime (``nexus_cutover.runtime``) has no ordinary-work path,
  so the rows are written as a simple ordinary-work producer of the new
  runtime would: in one transaction under the pack lock, the ordinal from
  the pack's ``_System_EnqueueOrdinal`` row (above the pack's
  ``LegacyMaxOrdinal`` once it has a protocol row), EventId and WorkId from the
  pack's id shard (:func:`nexus_cutover.runtime.tx.allocate_event_and_work_ids`).
* **ordinary worker**: completes up to ``complete_ordinary_per_tick`` pending
  ordinary WorkItems of the namespace (lowest WorkId first, planted ones
  included) and marks their Events processed: ordinary rows change after the
  release, as the contract says they may.

``receipts_after_release=True`` holds the receipts (new and future ones) until the
tenant's cutover released admission (:func:`released`: every receipt pack has its
checkpoint and no cutover fence is in force), so that they reach the new host and
not the old runtime, while ordinary work keeps arriving throughout the cutover, as
it does in production; ticks that held them are counted (``receipts_held``).

Invariants: every write goes through the project's transaction policy
(:func:`nexus_cutover.tx.run`); everything drawn is deterministic for
``seed`` (what lands depends on timing only in how many ticks ran); the report
(:class:`TrafficReport`) names every row written or refused; a failed tick is
recorded in ``errors`` and the next tick runs (a source retries).
"""

from __future__ import annotations

import copy
import logging
import random
import threading
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update
from sqlalchemy.exc import IntegrityError, SQLAlchemyError

from nexus_cutover import catalog, tx
from nexus_cutover.catalog import Event, IngressReceipt, WorkItem
from nexus_cutover.clock import utcnow
from nexus_cutover.db import is_duplicate_key
from nexus_cutover.errors import CutoverError
from nexus_cutover.projection.cutover_fence import cutover_fence_in_force
from nexus_cutover.protocol_row import read_protocol_row
from nexus_cutover.runtime.tx import allocate_event_and_work_ids, allocate_ordinals, run_in_pack_transaction
from nexus_cutover.schema import has_table

from .scenario.hostile import crm_id, payload
from .scenario.production import ORDINARY_WORK_TYPES, FutureReceipt, Planted

log = logging.getLogger(__name__)

#: Key prefix of the ids this producer draws (the builder never uses it, so no planted id equals one).
TRAFFIC_ID_PREFIX = "a1L"

Key = tuple[str, str, str]  # (pack, lane, receipt id)


@dataclass
class TrafficReport:
    """What :class:`LiveTraffic` wrote (or had refused), in the order it happened."""

    ticks: int = 0
    #: New receipts stored in ``_System_IngressReceipt``.
    receipts: list[Key] = field(default_factory=list)
    #: Planned future receipts sent: (the receipt, ``stored`` or ``rejected_at_ingress``).
    future_sent: list[tuple[FutureReceipt, str]] = field(default_factory=list)
    #: Receipts the table's primary key refused (the server equates them with an existing row).
    rejected_at_ingress: list[Key] = field(default_factory=list)
    #: Ordinary work created: (pack, EventId, WorkId, EnqueueOrdinal).
    ordinary: list[tuple[str, int, int, int]] = field(default_factory=list)
    #: Ordinary WorkIds completed by the ordinary worker.
    ordinary_completed: list[int] = field(default_factory=list)
    errors: list[str] = field(default_factory=list)
    #: Steps the server refused because the tables they read were being altered (the cutover's apply_schema):
    #: a producer retries them, so the step is tried again at the next tick (not an error).
    retried_under_ddl: int = 0
    #: Ticks that held their receipts (``receipts_after_release`` and admission not released yet).
    receipts_held: int = 0
    #: Ticks that sent receipts after the release (``receipts_after_release``), and ordinary work created then.
    ticks_after_release: int = 0

    @property
    def collisions_stored(self) -> list[FutureReceipt]:
        """Collision candidates that reached ``_System_IngressReceipt`` (the runtime must refuse them)."""
        return [f for f, outcome in self.future_sent if f.kind == "collision" and outcome == "stored"]


class LiveTraffic:
    """A stoppable producer of receipts and ordinary work for one tenant (module docstring)."""

    def __init__(
        self,
        engine: Engine,
        planted: Planted,
        *,
        seed: int = 25,
        receipts_per_tick: int = 2,
        future_per_tick: int = 1,
        ordinary_per_tick: int = 1,
        complete_ordinary_per_tick: int = 1,
        interval_s: float = 0.5,
        receipt_packs: list[str] | None = None,
        ordinary_packs: list[str] | None = None,
        receipts_after_release: bool = False,
    ):
        self.engine = engine
        self.namespace = planted.namespace
        self.rng = random.Random(seed)
        self.receipts_per_tick = receipts_per_tick
        self.future_per_tick = future_per_tick
        self.ordinary_per_tick = ordinary_per_tick
        self.complete_ordinary_per_tick = complete_ordinary_per_tick
        self.interval_s = interval_s
        history_packs = [p for p in planted.active_packs if p not in planted.greenfield_packs]
        self.receipt_packs = list(receipt_packs if receipt_packs is not None else planted.active_packs)
        self.ordinary_packs = list(ordinary_packs if ordinary_packs is not None else history_packs)
        self.lanes = list(dict.fromkeys(s for lp in planted.lanes for s in lp.spellings))
        self.event_kinds = list(dict.fromkeys(lp.event_kind for lp in planted.lanes))
        self.alphabet = planted.held_non_ascii
        self.future = list(planted.future_receipts)
        self.receipts_after_release = receipts_after_release
        self._released = False
        self._ids: set[str] = set()
        self._report = TrafficReport()
        self._lock = threading.Lock()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    # -- lifecycle ---------------------------------------------------------------------------------------------

    def start(self) -> LiveTraffic:
        """Tick every ``interval_s`` seconds in a background thread until :meth:`stop`."""
        if self._thread is not None:
            raise RuntimeError("live traffic already started")
        self._thread = threading.Thread(target=self._run, name="nexus-live-traffic", daemon=True)
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.is_set():
            self.tick()
            self._stop.wait(self.interval_s)

    def stop(self, timeout_s: float = 30.0) -> TrafficReport:
        """Stop ticking (the current tick finishes) and return what was written."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(timeout_s)
            if self._thread.is_alive():
                raise RuntimeError(f"live traffic did not stop within {timeout_s:g}s")
        return self.report

    @property
    def report(self) -> TrafficReport:
        """A copy of the report so far."""
        with self._lock:
            return copy.deepcopy(self._report)

    def __enter__(self) -> LiveTraffic:
        return self.start()

    def __exit__(self, *exc: Any) -> None:
        self.stop()

    # -- one tick ----------------------------------------------------------------------------------------------

    def tick(self) -> None:
        """One round of receipts, future receipts, ordinary work and the ordinary worker; errors are recorded."""
        for what, step in (("receipts", self._gated_receipts), ("ordinary work", self._ordinary),
                           ("ordinary worker", self._work)):
            try:
                step()
            except (CutoverError, SQLAlchemyError) as exc:
                if _under_concurrent_ddl(exc):
                    log.info("live traffic: %s met a table being altered; retried at the next tick", what)
                    with self._lock:
                        self._report.retried_under_ddl += 1
                    continue
                log.warning("live traffic: %s failed: %s", what, exc)
                with self._lock:
                    self._report.errors.append(f"{what}: {exc}")
        with self._lock:
            self._report.ticks += 1

    def _new_id(self) -> str:
        while True:
            rid = crm_id(self.rng, TRAFFIC_ID_PREFIX)
            if rid.upper() not in self._ids:
                self._ids.add(rid.upper())
                return rid

    def _gated_receipts(self) -> None:
        if self.receipts_after_release and not self._released:
            self._released = released(self.engine, self.namespace, self.receipt_packs)
            if not self._released:
                with self._lock:
                    self._report.receipts_held += 1
                return
        if self.receipts_after_release:
            with self._lock:
                self._report.ticks_after_release += 1
        self._receipts()

    def _receipts(self) -> None:
        batch: list[tuple[Key, str, FutureReceipt | None]] = []
        for pack in self.receipt_packs:
            for _ in range(self.receipts_per_tick):
                rid = self._new_id()
                batch.append(((pack, self.rng.choice(self.lanes), rid), self.rng.choice(self.event_kinds), None))
        for _ in range(self.future_per_tick):
            if self.future:
                f = self.future.pop(0)
                batch.append(((f.pack_install_id, f.source_lane, f.receipt_id), f.event_kind, f))
        payloads = [payload(self.rng, self.alphabet, tag=key[2]) for key, _, _ in batch]

        def body(conn: Connection) -> list[bool]:
            now = utcnow()
            stored = []
            for ((pack, lane, rid), kind, _), body_text in zip(batch, payloads, strict=True):
                stored.append(_insert_receipt(conn, pack, lane, rid, kind, body_text, now))
            return stored

        stored = tx.run(self.engine, body, what="live traffic: storing ingress receipts")
        with self._lock:
            for (key, _, future), ok in zip(batch, stored, strict=True):
                if ok and future is None:
                    self._report.receipts.append(key)
                elif not ok:
                    self._report.rejected_at_ingress.append(key)
                if future is not None:
                    self._report.future_sent.append((future, "stored" if ok else "rejected_at_ingress"))

    def _ordinary(self) -> None:
        for pack in self.ordinary_packs:
            for _ in range(self.ordinary_per_tick):
                lane, rid = self.rng.choice(self.lanes), self._new_id()
                work_type = self.rng.choice(ORDINARY_WORK_TYPES)
                body_text = payload(self.rng, self.alphabet, tag=rid)
                created = run_in_pack_transaction(
                    self.engine, pack,
                    lambda conn, pack=pack, lane=lane, rid=rid, work_type=work_type, body_text=body_text:
                        _create_ordinary(conn, self.namespace, pack, lane, rid, work_type, body_text),
                    what=f"live traffic: ordinary work of pack {pack!r}",
                )
                with self._lock:
                    self._report.ordinary.append((pack, *created))

    def _work(self) -> None:
        if not self.complete_ordinary_per_tick:
            return
        with self.engine.connect() as conn:
            pending = conn.execute(
                select(WorkItem.c.WorkId, WorkItem.c.SelectedEventId)
                .where(WorkItem.c.Namespace == self.namespace, WorkItem.c.WorkClass == catalog.WORK_CLASS_ORDINARY,
                       WorkItem.c.Status == "pending")
                .order_by(WorkItem.c.WorkId)
                .limit(self.complete_ordinary_per_tick)
            ).all()
        for work_id, event_id in pending:
            if tx.run(self.engine, lambda conn, w=work_id, e=event_id: _complete_ordinary(conn, w, e),
                      what=f"live traffic: completing ordinary WorkItem {work_id}"):
                with self._lock:
                    self._report.ordinary_completed.append(int(work_id))


#: MariaDB/MySQL errors of a statement that met a table another session is altering: 1412 "table definition has
#: changed, please retry", 1684 "skipped since its definition is being modified by concurrent DDL".
_CONCURRENT_DDL_ERRORS = (1412, 1684)


def _under_concurrent_ddl(exc: BaseException | None) -> bool:
    """Whether ``exc`` (or what it wraps) is a statement refused because a table was being altered meanwhile."""
    while exc is not None:
        orig = getattr(exc, "orig", None)
        if orig is not None and getattr(orig, "args", None) and orig.args[0] in _CONCURRENT_DDL_ERRORS:
            return True
        exc = exc.__cause__ or exc.__context__
    return False


def released(engine: Engine, namespace: str, packs: list[str]) -> bool:
    """Whether the cutover of ``namespace`` released admission for ``packs``: each has its checkpoint (protocol
    row) and no cutover fence is in force (it was released, not just never armed)."""
    with engine.connect() as conn:
        if not has_table(conn, catalog.ConnectorProjectionProtocol.name):
            return False
        if any(read_protocol_row(conn, pack) is None for pack in packs):
            return False
    return cutover_fence_in_force(engine, namespace) is None


def _insert_receipt(conn: Connection, pack: str, lane: str, rid: str, kind: str, body_text: str, now) -> bool:
    """Insert one unmaterialized receipt; False when the primary key refuses it (an equal key exists)."""
    try:
        with conn.begin_nested():
            conn.execute(insert(IngressReceipt).values(
                PackInstallId=pack, SourceLane=lane, ReceiptId=rid, EventKind=kind, Payload=body_text, ReceivedAt=now))
    except IntegrityError as exc:
        if not is_duplicate_key(exc):
            raise
        return False
    return True


def _create_ordinary(conn: Connection, namespace: str, pack: str, lane: str, rid: str, work_type: str,
                     body_text: str) -> tuple[int, int, int]:
    """One ordinary Event and its pending ordinary WorkItem, under the pack lock; (EventId, WorkId, ordinal)."""
    floor = 0
    if has_table(conn, catalog.ConnectorProjectionProtocol.name):
        row = read_protocol_row(conn, pack, for_update=True)
        floor = row.legacy_max_ordinal if row is not None else 0
    ordinal = allocate_ordinals(conn, pack, floor, 1)
    event_id, work_id = allocate_event_and_work_ids(conn, pack, 1, 1)
    now = utcnow()
    conn.execute(insert(Event).values(
        EventId=event_id, Namespace=namespace, PackInstallId=pack, EventKind="email.requested", RouteVersion=1,
        FlowVersion="1.0.0", WorkType=work_type, SourceLane=lane, EnqueueOrdinal=ordinal, ReceiptId=rid,
        ReplayOfWorkId=None, Status="pending", Payload=body_text, ReceivedAt=now))
    conn.execute(insert(WorkItem).values(
        WorkId=work_id, Namespace=namespace, WorkClass=catalog.WORK_CLASS_ORDINARY, WorkType=work_type,
        SelectedEventId=event_id, Attempt=0, Status="pending", CreatedAt=now, UpdatedAt=now))
    return event_id, work_id, ordinal


def _complete_ordinary(conn: Connection, work_id: int, event_id: int | None) -> bool:
    now = utcnow()
    done = conn.execute(
        update(WorkItem)
        .where(WorkItem.c.WorkId == work_id, WorkItem.c.WorkClass == catalog.WORK_CLASS_ORDINARY, WorkItem.c.Status == "pending")
        .values(Status="completed", Attempt=WorkItem.c.Attempt + 1, UpdatedAt=now)
    ).rowcount
    if done and event_id is not None:
        conn.execute(update(Event).where(Event.c.EventId == event_id).values(Status="processed"))
    return bool(done)

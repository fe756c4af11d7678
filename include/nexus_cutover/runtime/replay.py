"""Explicit replay: :func:`replay` (seed 000, "A replay starts with its new replay Event").

Invariants:

* Runs in the pack transaction, so it is serialized with fresh ingress.
* Creates one new Event (a new ordinal above everything admitted, its own
  receipt key ``replay:<WorkId>:<ordinal>``, ``ReplayOfWorkId`` set) and one new
  generation ``[r, r]`` starting at it with ``ReplayOfWorkId`` set. Being the
  latest generation, pending and attempt zero, it absorbs later fresh inputs
  of its identity until it is claimed.
* The made-up receipt key shares ``ux_Event_Receipt`` with source receipts: a
  source may already have sent that very key (as the collation compares it). The
  replay then takes ``replay:<WorkId>:<ordinal>:<EventId>`` (the new Event's own,
  unique id), and refuses, writing nothing, if a source holds that too; a
  source's receipt is never displaced and never read as the replay's.
* Only a terminal projection WorkItem of a version-1 pack can be replayed
  (:class:`~.errors.ReplayRefused` otherwise); the replayed WorkItem and its
  Events are not touched.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, insert, select

from .. import catalog, tx
from ..catalog import Event, WorkItem
from ..clock import utcnow
from ..db import Deadline
from ..errors import BadInput
from ..identity import columns, of_row, value_keys
from .duplicates import existing_events
from .errors import ReplayRefused
from .generations import create_generations, generation_row
from .packs import pack_context
from .tx import allocate_ids, allocate_ordinals, run_in_pack_transaction


@dataclass(frozen=True)
class ReplayResult:
    replayed_work_id: int
    work_id: int
    event_id: int
    ordinal: int


def _work_row(conn: Connection, work_id: int):
    return conn.execute(
        select(WorkItem.c.WorkClass, WorkItem.c.Status, WorkItem.c.Namespace, *columns(WorkItem)).where(WorkItem.c.WorkId == work_id)
    ).first()


def replay(engine: Engine, work_id: int, *, payload: str | None = None, deadline: Deadline | None = None) -> ReplayResult:
    """Replay the terminal projection WorkItem ``work_id`` as a new generation."""
    with tx.reading(engine, f"reading WorkItem {work_id}") as conn:
        row = _work_row(conn, work_id)
    if row is None:
        raise BadInput(f"unknown WorkItem {work_id}")
    if row.WorkClass != catalog.WORK_CLASS_PROJECTION or row.PackInstallId is None:
        raise ReplayRefused(f"WorkItem {work_id} is {row.WorkClass!r} work, not a projection generation: nothing replayed")
    pack_install_id = row.PackInstallId

    def body(conn: Connection) -> ReplayResult:
        current = _work_row(conn, work_id)
        if current.Status not in catalog.WORK_TERMINAL_STATUSES:
            raise ReplayRefused(f"WorkItem {work_id} is {current.Status!r}: only terminal work can be replayed; wait for it to finish")
        ctx = pack_context(conn, pack_install_id)
        identity = of_row(current)
        ordinal = allocate_ordinals(conn, ctx.pack_install_id, ctx.protocol.legacy_max_ordinal, 1)
        event_id = allocate_ids(conn, Event.c.EventId, ctx.pack_install_id)
        now = utcnow()
        receipt_id = _free_replay_receipt(conn, ctx.pack_install_id, identity.source_lane, work_id, ordinal, event_id)
        conn.execute(
            insert(Event).values(
                EventId=event_id,
                Namespace=ctx.namespace,
                **identity.as_values(),
                EnqueueOrdinal=ordinal,
                ReceiptId=receipt_id,
                ReplayOfWorkId=work_id,
                Status="pending",
                Payload=payload if payload is not None else json.dumps({"replay_of_work_id": work_id}),
                ReceivedAt=now,
            )
        )
        new_work_id = allocate_ids(conn, WorkItem.c.WorkId, ctx.pack_install_id)
        create_generations(conn, [generation_row(
            work_id=new_work_id,
            namespace=ctx.namespace,
            identity=identity,
            input_start_ordinal=ordinal,
            lane_ordinal=ordinal,
            selected_event_id=event_id,
            now=now,
            replay_of_work_id=work_id,
        )])
        return ReplayResult(work_id, new_work_id, event_id, ordinal)

    return run_in_pack_transaction(engine, pack_install_id, body, what=f"replaying WorkItem {work_id}", deadline=deadline)


def _free_replay_receipt(conn: Connection, pack_install_id: str, source_lane: str, work_id: int, ordinal: int,
                         event_id: int) -> str:
    """The replay Event's receipt key: ``replay:<WorkId>:<ordinal>``, or with ``:<EventId>`` when a source receipt
    holds that key (module invariants); :class:`~.errors.ReplayRefused` when a source holds both."""
    candidates = [f"replay:{work_id}:{ordinal}", f"replay:{work_id}:{ordinal}:{event_id}"]
    taken = existing_events(conn, pack_install_id, ((source_lane, c) for c in candidates))
    held = value_keys(conn, Event.c.ReceiptId, [r.ReceiptId for r in taken] + candidates, cache=False)
    used = {held[r.ReceiptId] for r in taken}
    for candidate in candidates:
        if held[candidate] not in used:
            return candidate
    raise ReplayRefused(
        f"WorkItem {work_id} cannot be replayed: source receipts of lane {source_lane!r} hold the replay's receipt keys "
        f"{candidates!r} (EventIds {sorted(r.EventId for r in taken)}); nothing was written. Next: review those receipts "
        "(a source sent the runtime's own replay key), then replay again"
    )

"""Explicit replay: :func:`replay` (seed 000, "A replay starts with its new replay Event").

Invariants:

* Runs in the pack transaction, so it is serialized with fresh ingress.
* Creates one new Event (a new ordinal above everything admitted, its own
  receipt key ``replay:<WorkId>:<ordinal>``, ``ReplayOfWorkId`` set) and one new
  generation ``[r, r]`` starting at it with ``ReplayOfWorkId`` set. Being the
  latest generation, pending and attempt zero, it absorbs later fresh inputs
  of its identity until it is claimed.
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
from ..identity import columns, of_row
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
        conn.execute(
            insert(Event).values(
                EventId=event_id,
                Namespace=ctx.namespace,
                **identity.as_values(),
                EnqueueOrdinal=ordinal,
                ReceiptId=f"replay:{work_id}:{ordinal}",
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

"""Duplicate receipts: detection and verification (seed 000, "Recovery contract").

Invariants:

* A receipt is a duplicate when a *source* Event (``ReplayOfWorkId IS NULL``)
  with its key (PackInstallId, SourceLane, ReceiptId; ``ux_Event_Receipt``)
  exists **byte for byte**. A duplicate changes no membership and creates no
  work. A replay Event's made-up ReceiptId (``replay:<WorkId>:<ordinal>``,
  :mod:`.replay`) shares that key space: a receipt equal to it, even byte for
  byte, is a collision (it holds none of the receipt's payload), never a
  duplicate.
* A receipt whose key the tenant's collation equates with an admitted Event's
  key (``ux_Event_Receipt`` would refuse it), or with an earlier receipt's of
  the same batch, while the bytes differ, is a *collision*
  (:class:`~.errors.Collision`): a different source record. It is never
  acknowledged (that would lose it) and never retried; equality is the server's
  (:func:`~nexus_cutover.identity.value_keys`), the byte comparison Python's.
* Verification uses the protocol row read once per batch (a bounded primary-key
  read), then: an ordinal at or below ``LegacyMaxOrdinal`` is acknowledged
  without interpreting history; above it, the one generation that can contain
  the ordinal (:func:`~.generations.covering_generation`, one index row) must
  contain it, whatever the Event's own status. Otherwise
  :class:`~.errors.MissingCoverage` is raised: never an acknowledgement, never
  an automatic replay.
"""

from __future__ import annotations

from collections import defaultdict
from collections.abc import Iterable, Sequence
from typing import Any

from sqlalchemy import Connection, Select, and_, or_, select

from ..catalog import Event
from ..identity import columns, of_row, value_keys
from ..protocol_row import ProtocolRow
from .errors import Collision, MissingCoverage
from .generations import covering_generation
from .model import Duplicate, Input

AT_OR_BELOW_CUTOFF = "at_or_below_cutoff"
COVERED = "covered"


def existing_events_query(pack_install_id: str, keys_by_lane: dict[str, set[str]]) -> Select:
    """Events with the given receipt ids per source lane (ranges on ``ux_Event_Receipt``)."""
    by_lane = [and_(Event.c.SourceLane == lane, Event.c.ReceiptId.in_(sorted(receipts))) for lane, receipts in sorted(keys_by_lane.items())]
    return select(Event.c.EventId, Event.c.EnqueueOrdinal, Event.c.ReceiptId, Event.c.ReplayOfWorkId, *columns(Event)).where(
        Event.c.PackInstallId == pack_install_id, or_(*by_lane)
    )


def existing_events(conn: Connection, pack_install_id: str, keys: Iterable[tuple[str, str]]) -> list[Any]:
    """Events whose receipt key the server equates with one of ``(source_lane, receipt_id)`` (one statement)."""
    by_lane: dict[str, set[str]] = defaultdict(set)
    for lane, receipt in keys:
        by_lane[lane].add(receipt)
    if not by_lane:
        return []
    return conn.execute(existing_events_query(pack_install_id, by_lane)).all()


def sort_receipts(conn: Connection, pack_install_id: str, inputs: Sequence[Input]) -> tuple[list[Any], list[Collision]]:
    """``(duplicates, collisions)`` of a batch: the admitted source Events holding an input's exact key, and the inputs
    whose key the collation equates with an admitted Event's or an earlier input's while the bytes differ, or that
    hold a replay Event's key (each once).

    ``pack_install_id`` is the pack's stored spelling: an Event of another spelling holds a colliding key.
    """
    rows = existing_events(conn, pack_install_id, ((i.source_lane, i.receipt_id) for i in inputs))
    lanes = value_keys(conn, Event.c.SourceLane, [i.source_lane for i in inputs] + [r.SourceLane for r in rows])
    receipts = value_keys(conn, Event.c.ReceiptId, [i.receipt_id for i in inputs] + [r.ReceiptId for r in rows], cache=False)

    def key(lane: str, receipt: str) -> tuple:
        return lanes[lane], receipts[receipt]

    admitted = {key(r.SourceLane, r.ReceiptId): r for r in rows}  # unique: ux_Event_Receipt
    duplicates: dict[int, Any] = {}
    collisions: dict[tuple[str, str], Collision] = {}
    first: dict[tuple, Input] = {}
    for item in inputs:
        k = key(item.source_lane, item.receipt_id)
        row = admitted.get(k)
        if row is not None:
            same_bytes = (row.PackInstallId, row.SourceLane, row.ReceiptId) == (pack_install_id, item.source_lane, item.receipt_id)
            if same_bytes and row.ReplayOfWorkId is None:
                duplicates[row.EventId] = row
            else:
                collisions.setdefault(
                    (item.source_lane, item.receipt_id),
                    Collision(item.source_lane, item.receipt_id, row.SourceLane, row.ReceiptId, row.EventId,
                              row.ReplayOfWorkId),
                )
            continue
        earlier = first.setdefault(k, item)
        if (earlier.source_lane, earlier.receipt_id) != (item.source_lane, item.receipt_id):
            collisions.setdefault(
                (item.source_lane, item.receipt_id),
                Collision(item.source_lane, item.receipt_id, earlier.source_lane, earlier.receipt_id, None),
            )
    return list(duplicates.values()), list(collisions.values())


def verify_duplicates(conn: Connection, protocol: ProtocolRow, events: Iterable[Any]) -> list[Duplicate]:
    """Acknowledge or prove coverage for each already admitted Event; :class:`MissingCoverage` otherwise."""
    acknowledged: list[Duplicate] = []
    uncovered: list[tuple[str, str, int]] = []
    for ev in events:
        identity = of_row(ev)
        ordinal = ev.EnqueueOrdinal
        if ordinal <= protocol.legacy_max_ordinal:
            acknowledged.append(Duplicate(identity.source_lane, ev.ReceiptId, ev.EventId, ordinal, AT_OR_BELOW_CUTOFF))
            continue
        gen = covering_generation(conn, identity, ordinal)
        if gen is None:
            uncovered.append((identity.source_lane, ev.ReceiptId, ordinal))
        else:
            acknowledged.append(Duplicate(identity.source_lane, ev.ReceiptId, ev.EventId, ordinal, COVERED, gen.work_id))
    if uncovered:
        raise MissingCoverage(protocol.pack_install_id, uncovered)
    return acknowledged

"""Duplicate receipts: detection and verification (seed 000, "Recovery contract").

Invariants:

* A receipt is a duplicate when an Event with its key (PackInstallId,
  SourceLane, ReceiptId; ``ux_Event_Receipt``) exists. A duplicate changes no
  membership and creates no work.
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
from collections.abc import Iterable
from typing import Any

from sqlalchemy import Connection, Select, and_, or_, select

from ..catalog import Event
from ..identity import columns, of_row
from ..protocol_row import ProtocolRow
from .errors import MissingCoverage
from .generations import covering_generation
from .model import Duplicate

AT_OR_BELOW_CUTOFF = "at_or_below_cutoff"
COVERED = "covered"


def existing_events_query(pack_install_id: str, keys_by_lane: dict[str, set[str]]) -> Select:
    """Events with the given receipt ids per source lane (ranges on ``ux_Event_Receipt``)."""
    by_lane = [and_(Event.c.SourceLane == lane, Event.c.ReceiptId.in_(sorted(receipts))) for lane, receipts in sorted(keys_by_lane.items())]
    return select(Event.c.EventId, Event.c.EnqueueOrdinal, Event.c.ReceiptId, *columns(Event)).where(
        Event.c.PackInstallId == pack_install_id, or_(*by_lane)
    )


def existing_events(conn: Connection, pack_install_id: str, keys: Iterable[tuple[str, str]]) -> dict[tuple[str, str], Any]:
    """Events already admitted for ``(source_lane, receipt_id)`` keys, by key (one statement)."""
    by_lane: dict[str, set[str]] = defaultdict(set)
    for lane, receipt in keys:
        by_lane[lane].add(receipt)
    if not by_lane:
        return {}
    return {(row.SourceLane, row.ReceiptId): row for row in conn.execute(existing_events_query(pack_install_id, by_lane))}


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

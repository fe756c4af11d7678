"""Greenfield pack activation: cutoff zero in its own transaction (seed 000, "Existing-data cutover").

:func:`activate_pack` is the whole step; the ``nexus-cutover activate-pack
-pack-install-id <id>`` command calls it. A pack installed with no history
(no ``_System_Event`` and no ``_System_WorkItem`` row) has nothing to drain
and nothing to audit, so it needs neither the fence nor the full cutover: its
one-time protocol row is written with ``LegacyMaxOrdinal = 0``.

What it reads, in one transaction of the policy (:func:`nexus_cutover.tx.run`)
holding the namespace lock then the pack lock, at READ COMMITTED (so a row a
previous lock holder committed is seen, on TiDB too):

* the pack (:func:`~.checkpoint.read_pack`: unknown or not active is
  :class:`~nexus_cutover.errors.BadInput`, exit 2), re-read under the locks;
* its ``_System_ConnectorProjectionProtocol`` row (a locking primary-key read);
* whether it has any Event or WorkItem (:func:`~.checkpoint.is_greenfield`:
  two index probes), and only when it has: bounded counts and a few ids;
* the namespace's old runtime (contract, "Greenfield activation"): activation
  goes on only while no old-protocol ingress_writer, receipt_materializer or
  projection_worker of the namespace is live (the liveness rule of the writer
  evidence, in SQL on ``ix_ProcessRegistry_Role``) or the namespace's cutover
  fence is in force (its rows read ``FOR UPDATE``). Otherwise an old runtime
  would admit old-protocol work above cutoff 0 that no audit ever reads: the
  refusal ``old_runtime_live`` names the live processes.

Every condition is checked again after the write, in the same transaction:
what committed in between (an old process registering or heartbeating, an
Event written without the pack lock) is seen, the write rolled back and the
call refused. ``between_check_and_act`` is a test seam only.

What it writes: at most the one version-1 protocol row with
``LegacyMaxOrdinal = 0`` (and the lock rows, created beforehand as every
locked transaction does). It never touches an Event, a WorkItem or a receipt:
durable ``_System_IngressReceipt`` rows are not history, the host admits them
after activation with ordinals above zero.

Outcomes (the JSON shape of :class:`~.checkpoint.CheckpointResult`):

* ``already_written``: a protocol row exists; it is returned unchanged, whatever
  its cutoff (a row with another ProtocolVersion is an error, exit 1);
* ``written``: the pack had no Event and no WorkItem; cutoff 0 written;
* ``refused`` (nothing raised, nothing written): the pack has history. The one
  finding ``not_greenfield`` gives the Event and WorkItem counts (counted up to
  :data:`COUNT_LIMIT`) and the first few EventIds / WorkIds in index order.
  Such a pack goes through the cutover (drain, then the audited checkpoint);
  there is no option that activates it here. Or an old runtime is live
  (``old_runtime_live``, its ProcessIds): stop it, or arm the cutover fence.

The Part B schema must be complete (:class:`~nexus_cutover.errors.MissingSchema`,
exit 2); every wait, lock waits included, is bounded by ``timeout_s``
(:class:`~nexus_cutover.errors.LockTimeout`, exit 4). Concurrent or repeated
calls write one row: the second finds it under the locks.
"""

from __future__ import annotations

import datetime as dt
import logging
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine, func, select

from .. import tx
from ..catalog import Event, WorkItem
from ..db import Deadline
from ..liveness import DEFAULT_STALE_HEARTBEAT_S
from ..locks import lifecycle_lock_names
from ..protocol_row import insert_protocol_row, read_protocol_row
from .audit import NOT_GREENFIELD, Finding
from .checkpoint import (
    REFUSED,
    CheckpointResult,
    Withdrawn,
    is_greenfield,
    old_runtime_finding,
    prerequisite_namespace,
    reread_pack,
    result_already_written,
    result_written,
)
from .cutover_fence import Seam

log = logging.getLogger(__name__)

#: Counts of a refusal stop here (``event_count`` / ``work_item_count`` of at least this many).
COUNT_LIMIT = 10_000
#: How many EventIds and WorkIds a refusal names.
SHOWN_IDS = 5


@dataclass
class NotGreenfield(Finding):
    """The ``not_greenfield`` finding: what history the pack has (counts capped at :data:`COUNT_LIMIT`)."""

    event_count: int = 0
    work_item_count: int = 0

    def as_json(self) -> dict[str, Any]:
        return {**super().as_json(), "event_count": self.event_count, "work_item_count": self.work_item_count,
                "count_limit": COUNT_LIMIT}

    def describe(self) -> str:
        def n(count: int) -> str:
            return f"at least {count}" if count >= COUNT_LIMIT else str(count)

        return f"{n(self.event_count)} Event(s), {n(self.work_item_count)} WorkItem(s); " + super().describe()


def _history(conn: Connection, pack_install_id: str) -> NotGreenfield:
    """Counts and the first few ids of the pack's Events (``ux_Event_Receipt``) and WorkItems (``ix_WorkItem_ProjectionOrder``)."""
    events = select(Event.c.EventId).where(Event.c.PackInstallId == pack_install_id)
    work = select(WorkItem.c.WorkId).where(WorkItem.c.PackInstallId == pack_install_id)

    def count(stmt) -> int:
        return conn.execute(select(func.count()).select_from(stmt.limit(COUNT_LIMIT).subquery())).scalar_one()

    event_ids = conn.execute(events.order_by(Event.c.SourceLane, Event.c.ReceiptId).limit(SHOWN_IDS)).scalars().all()
    work_ids = conn.execute(
        work.order_by(WorkItem.c.EventKind, WorkItem.c.RouteVersion, WorkItem.c.FlowVersion, WorkItem.c.WorkType,
                      WorkItem.c.SourceLane, WorkItem.c.LaneOrdinal).limit(SHOWN_IDS)
    ).scalars().all()
    return NotGreenfield(NOT_GREENFIELD, None, event_ids=sorted(event_ids), work_ids=sorted(work_ids),
                         event_count=count(events), work_item_count=count(work))


def activate_pack(
    engine: Engine, pack_install_id: str, *, timeout_s: float, written_by: str,
    stale_heartbeat: dt.timedelta = dt.timedelta(seconds=DEFAULT_STALE_HEARTBEAT_S),
    between_check_and_act: Seam | None = None,
) -> CheckpointResult:
    """Write the greenfield pack's protocol row with cutoff 0, or return the existing one, or refuse (module docstring).

    Raises :class:`~nexus_cutover.errors.BadInput` (no id, unknown or inactive
    pack; :class:`~nexus_cutover.errors.MissingSchema` without the Part B
    schema), :class:`~nexus_cutover.errors.LockTimeout`, or another
    :class:`~nexus_cutover.errors.CutoverError`; nothing is written then.
    """
    deadline = Deadline(timeout_s)
    namespace = prerequisite_namespace(engine, pack_install_id, deadline)

    def refusal(conn: Connection) -> CheckpointResult | None:
        """Every condition of the activation, None when it may be written (read again after the write)."""
        if not is_greenfield(conn, pack_install_id):
            finding = _history(conn, pack_install_id)
        else:
            finding = old_runtime_finding(conn, namespace, stale_heartbeat)
        if finding is None:
            return None
        log.info("pack %s: not activated: %s", pack_install_id, finding.describe())
        return CheckpointResult(pack_install_id, namespace, REFUSED, None, [finding])

    def decide_and_write(conn: Connection) -> CheckpointResult:
        reread_pack(conn, pack_install_id, namespace)  # under the locks
        existing = read_protocol_row(conn, pack_install_id, for_update=True)
        if existing is not None:
            return result_already_written(existing, namespace)
        refused = refusal(conn)
        if refused is not None:
            return refused
        deadline.check("writing the greenfield activation")
        if between_check_and_act is not None:
            between_check_and_act(conn)
        row = insert_protocol_row(conn, pack_install_id, 0, written_by)
        refused = refusal(conn)  # after the write: what committed since the check is seen, and rolls it back
        if refused is not None:
            raise Withdrawn(refused)
        log.info("pack %s: greenfield pack activated (LegacyMaxOrdinal=0)", pack_install_id)
        return result_written(row, namespace)

    try:
        return tx.run(
            engine, decide_and_write, what=f"activating greenfield pack {pack_install_id!r}", deadline=deadline,
            locks=lifecycle_lock_names(namespace, [pack_install_id]), bound_statements=True,
        )
    except Withdrawn as withdrawn:  # rolled back: nothing written
        return withdrawn.result

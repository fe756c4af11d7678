"""One definition of a *live* process in ``_System_ProcessRegistry`` (contract, "Drain").

"Live" means one thing, used by the drain (:mod:`.projection.drain`), the writer
evidence (:mod:`.projection.writers`) and the Field History inventory
(:mod:`.field_history.inventory`) alike:

* **live**: ``StoppedAt IS NULL`` and ``LastHeartbeatAt >= now - window``;
* **silent**: ``StoppedAt IS NULL`` and an older heartbeat (it may come back);
* **stopped**: ``StoppedAt`` is set, whatever the heartbeat.

The boundary is inclusive: a heartbeat exactly ``window`` old (``LastHeartbeatAt
= now - window``) is still live; one microsecond older is silent. A heartbeat
after ``now`` (clock skew between the process and the reader) is live. The SQL
clause (:func:`live_clause`) and the Python rule (:func:`process_state`) say the
same thing, so a listing read with the clause and a state computed from the
row never disagree.

``window`` is the stale-heartbeat window, a :class:`datetime.timedelta` or
seconds; :data:`DEFAULT_STALE_HEARTBEAT_S` is its default. Times are naive UTC
(:func:`nexus_cutover.clock.utcnow`).
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import ColumnElement, Table, and_

from .catalog import ProcessRegistry

DEFAULT_STALE_HEARTBEAT_S = 120.0

LIVE = "live"
SILENT = "silent"
STOPPED = "stopped"
STATES = (LIVE, SILENT, STOPPED)


def window_of(window: dt.timedelta | float | int) -> dt.timedelta:
    """The stale-heartbeat window as a timedelta (seconds accepted); never negative."""
    if not isinstance(window, dt.timedelta):
        window = dt.timedelta(seconds=float(window))
    if window < dt.timedelta(0):
        raise ValueError(f"the stale-heartbeat window must not be negative: {window}")
    return window


def heartbeat_cutoff(now: dt.datetime, window: dt.timedelta | float | int) -> dt.datetime:
    """The oldest heartbeat that is still live at ``now``: ``now - window`` (inclusive)."""
    return now - window_of(window)


def live_clause(now: dt.datetime, window: dt.timedelta | float | int, table: Table = ProcessRegistry) -> ColumnElement[bool]:
    """``StoppedAt IS NULL AND LastHeartbeatAt >= now - window`` over ``table`` (``_System_ProcessRegistry``)."""
    return and_(table.c.StoppedAt.is_(None), table.c.LastHeartbeatAt >= heartbeat_cutoff(now, window))


def process_state(
    stopped_at: dt.datetime | None,
    last_heartbeat_at: dt.datetime,
    now: dt.datetime,
    window: dt.timedelta | float | int,
) -> str:
    """``'live'``, ``'silent'`` or ``'stopped'`` for a registry row's (StoppedAt, LastHeartbeatAt) at ``now``."""
    if stopped_at is not None:
        return STOPPED
    return LIVE if last_heartbeat_at >= heartbeat_cutoff(now, window) else SILENT


def is_live(
    stopped_at: dt.datetime | None,
    last_heartbeat_at: dt.datetime,
    now: dt.datetime,
    window: dt.timedelta | float | int,
) -> bool:
    """Whether the process is live at ``now`` (:func:`process_state` is ``'live'``)."""
    return process_state(stopped_at, last_heartbeat_at, now, window) == LIVE

"""``_System_ProcessRegistry``: register, heartbeat, activate, stop (contract, ``ProcessRegistry``).

Invariants:

* One row per ProcessId. Registering an existing ProcessId (a restart) resets
  it: new ``StartedAt``, ``ActivatedAt`` and ``StoppedAt`` cleared, so a restarted
  process is not "activated" before its gate passes again.
* ``ActivatedAt`` is set only by :func:`mark_activated`, after the gate passed.
* :class:`Heartbeater` updates ``LastHeartbeatAt`` from its own thread and
  connection every ``period_s``, so a long execution does not look dead.
"""

from __future__ import annotations

import logging
import os
import socket
import threading
import uuid

from sqlalchemy import Connection, Engine, insert, select, update

from .. import tx
from ..catalog import ProcessRegistry
from ..clock import utcnow
from ..errors import BadInput

log = logging.getLogger(__name__)

#: The BinaryVersion a reference-runtime process registers with.
RUNTIME_BINARY_VERSION = "5.0.0"


def default_process_id(prefix: str) -> str:
    """``<prefix>-<host>-<pid>-<random>``, at most the column's width: a long host name is cut, never the tail that
    makes the id unique."""
    tail = f"-{os.getpid()}-{uuid.uuid4().hex[:6]}"
    return f"{prefix}-{socket.gethostname()}"[: _ID_WIDTH - len(tail)] + tail


_ID_WIDTH = ProcessRegistry.c.ProcessId.type.length


def register(
    engine: Engine,
    process_id: str,
    namespace: str,
    role: str,
    protocol: int,
    *,
    binary_version: str = RUNTIME_BINARY_VERSION,
) -> None:
    """Register (or re-register, after a restart) ``process_id``: its row, live from now.

    A process id longer than the column is bad input (never cut: two processes would share one row); one the
    column's collation equates with another process's id while the bytes differ is refused too (the upsert would
    take over that process's row)."""
    if not process_id or len(process_id) > _ID_WIDTH:
        raise BadInput(f"process id {process_id!r} must be 1 to {_ID_WIDTH} characters (it is {len(process_id)}): "
                       "choose a shorter --process-id")
    t = ProcessRegistry
    now = utcnow()
    values = {
        "Namespace": namespace,
        "Role": role,
        "BinaryVersion": binary_version,
        "ProjectionProtocol": protocol,
        "StartedAt": now,
        "LastHeartbeatAt": now,
        "ActivatedAt": None,
        "StoppedAt": None,
    }

    def upsert(conn: Connection) -> None:
        exists = conn.execute(select(t.c.ProcessId).where(t.c.ProcessId == process_id).with_for_update()).first()
        if exists is not None and exists.ProcessId != process_id:
            raise BadInput(f"process id {process_id!r} is the registry's {exists.ProcessId!r} as the tenant's collation "
                           "compares them (they differ in case or trailing spaces): choose another --process-id")
        if exists is None:
            conn.execute(insert(t).values(ProcessId=process_id, **values))
        else:
            conn.execute(update(t).where(t.c.ProcessId == process_id).values(**values))

    tx.run(engine, upsert, what=f"registering process {process_id!r}", retry=tx.Retry.DEADLOCK | tx.Retry.DUPLICATE_KEY)


def _set(engine: Engine, process_id: str, what: str, **values) -> None:
    tx.run(
        engine,
        lambda conn: conn.execute(update(ProcessRegistry).where(ProcessRegistry.c.ProcessId == process_id).values(**values)),
        what=f"{what} for process {process_id!r}",
    )


def heartbeat(engine: Engine, process_id: str) -> None:
    _set(engine, process_id, "heartbeating", LastHeartbeatAt=utcnow())


def mark_activated(engine: Engine, process_id: str) -> None:
    now = utcnow()
    _set(engine, process_id, "recording activation", ActivatedAt=now, LastHeartbeatAt=now)


def mark_stopped(engine: Engine, process_id: str) -> None:
    now = utcnow()
    _set(engine, process_id, "recording the stop", StoppedAt=now, LastHeartbeatAt=now)


class Heartbeater:
    """Heartbeats ``process_ids`` every ``period_s`` seconds until :meth:`stop`."""

    def __init__(self, engine: Engine, process_ids: list[str], period_s: float):
        self.engine = engine
        self.process_ids = list(process_ids)
        self.period_s = period_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="nexus-heartbeat", daemon=True)

    def start(self) -> Heartbeater:
        self._thread.start()
        return self

    def _run(self) -> None:
        while not self._stop.wait(self.period_s):
            for pid in self.process_ids:
                try:
                    heartbeat(self.engine, pid)
                except Exception as exc:  # noqa: BLE001 - a missed beat is logged and retried next period
                    log.warning("heartbeat of %s failed: %s", pid, exc)

    def stop(self) -> None:
        self._stop.set()
        if self._thread.is_alive():
            self._thread.join(timeout=max(5.0, self.period_s))

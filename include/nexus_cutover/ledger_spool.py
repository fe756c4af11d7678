"""Delivering events to the delivery ledger without ever losing one: the machine's spool, and the one write call.

:func:`record` is what every path's ledger sink calls (an Airflow task's, the command line's): the ledger's DSN
comes from the caller (an Airflow connection, ``NEXUS_LEDGER_DSN``), everything else is here.

Invariants:

* Recording never blocks, fails or skips a step: every error is caught and logged here. Each attempt to reach the
  ledger is bounded by a few seconds (:data:`TIMEOUT_S`).
* Never a silent loss: an event that cannot be written (the ledger down, none configured) is written to this
  machine's spool (:func:`spool_dir`, one JSON-lines file per call, fsynced) and counted
  (``nexus.ledger.spooled``); every later record call on the machine, any run's or command's, first writes the
  spool to the ledger (:func:`catch_up`; counted as ``nexus.ledger.caught_up``, what is left as
  ``nexus.ledger.pending``). Writing is idempotent (each event's key), so a spool file caught up twice is one set
  of rows.
"""

from __future__ import annotations

import datetime as dt
import json
import logging
import os
import pathlib
import socket
import time
import uuid
from collections.abc import Callable, Iterable
from typing import Any

from . import settings
from .db import hide_dsn_secrets
from .ledger import LedgerEvent, append, ledger_engine
from .metrics import LEDGER_CAUGHT_UP, LEDGER_PENDING, LEDGER_SPOOLED, Metric

log = logging.getLogger(__name__)

#: The spool's directory (default ``$AIRFLOW_HOME/nexus-ledger-spool``, ``~/airflow/nexus-ledger-spool`` without one).
SPOOL_DIR_ENV = settings.BY_NAME["ledger_spool_dir"].alias
#: The bound of one attempt to reach the ledger (connect, and each statement on PostgreSQL): ``ledger_timeout_s``.
TIMEOUT_S = float(settings.value("ledger_timeout_s"))
#: The machine whose spool this is: the ``host`` tag of ``nexus.ledger.pending`` (each worker's gauge its own series,
#: not one gauge the workers overwrite in turn).
HOST = socket.gethostname() or "unknown"
#: A spool file claimed by a flush that died is taken again after this long.
STALE_CLAIM_S = 600.0
_CLAIMED = ".claimed-"

#: How figures are sent: ``send(metric, value, **tags)`` (the caller's metrics client; nothing by default).
Send = Callable[..., None]


def _no_figures(_metric: Metric, _value: Any, **_tags: Any) -> None:
    return None


# -- the spool ---------------------------------------------------------------------------------------------------

def spool_dir() -> pathlib.Path:
    home = os.environ.get("AIRFLOW_HOME") or os.path.expanduser("~/airflow")
    base = settings.value("ledger_spool_dir") or os.path.join(home, "nexus-ledger-spool")
    return pathlib.Path(base)


def spool(events: list) -> pathlib.Path:
    """Write ``events`` to a new spool file (written whole, fsynced, then renamed into place: a flush never reads
    half a file)."""
    folder = spool_dir()
    folder.mkdir(parents=True, exist_ok=True)
    name = f"{dt.datetime.now(dt.UTC):%Y%m%dT%H%M%S%f}-{socket.gethostname()}-{os.getpid()}-{uuid.uuid4().hex[:8]}.jsonl"
    tmp = folder / f".{name}.tmp"
    with open(tmp, "w", encoding="utf-8") as out:
        for event in events:
            out.write(json.dumps(event.as_json(), sort_keys=True, default=str) + "\n")
        out.flush()
        os.fsync(out.fileno())
    final = folder / name
    os.replace(tmp, final)
    return final


def pending() -> int:
    """Events waiting in this machine's spool (claimed files included)."""
    folder = spool_dir()
    if not folder.is_dir():
        return 0
    total = 0
    for path in folder.iterdir():
        if ".jsonl" in path.name and not path.name.startswith("."):
            try:
                total += sum(1 for line in path.read_text(encoding="utf-8").splitlines() if line.strip())
            except OSError:
                continue
    return total


def _claimable(folder: pathlib.Path) -> list[pathlib.Path]:
    """The spool files to flush, oldest first: unclaimed ones, and claims older than :data:`STALE_CLAIM_S` (their
    flush died)."""
    found = []
    for path in sorted(folder.iterdir()):
        if path.name.startswith("."):
            continue
        if path.name.endswith(".jsonl"):
            found.append(path)
        elif _CLAIMED in path.name:
            try:
                if time.time() - path.stat().st_mtime > STALE_CLAIM_S:
                    found.append(path)
            except OSError:
                continue
    return found


def catch_up(engine, send: Send = _no_figures) -> int:
    """Write this machine's spool to the ledger ``engine``, file by file (each claimed by an atomic rename, so two
    flushes never take the same file); returns the events written. A file is removed once its events are in the
    ledger; one that fails is put back and the error raised (the caller spools its own events then)."""
    folder = spool_dir()
    if not folder.is_dir():
        return 0
    written = 0
    for path in _claimable(folder):
        original = path.name.split(_CLAIMED)[0]
        claimed = folder / f"{original}{_CLAIMED}{os.getpid()}"
        try:
            os.replace(path, claimed)
            os.utime(claimed)
        except FileNotFoundError:  # another flush took it
            continue
        try:
            lines = [line for line in claimed.read_text(encoding="utf-8").splitlines() if line.strip()]
            events = []
            for line in lines:
                try:
                    events.append(LedgerEvent.from_json(json.loads(line)))
                except Exception as exc:  # noqa: BLE001 - an unreadable line is kept aside, never dropped
                    _keep_aside(folder, original, line, exc)
            append(engine, events)
        except BaseException:
            os.replace(claimed, folder / original)
            raise
        written += len(events)
        for tenant, count in _per_tenant(events).items():
            send(LEDGER_CAUGHT_UP, count, tenant=tenant)
        claimed.unlink(missing_ok=True)
    return written


def _keep_aside(folder: pathlib.Path, original: str, line: str, exc: Exception) -> None:
    """A spool line that is not an event (a damaged file): kept in ``unreadable/`` for a person, logged."""
    aside = folder / "unreadable"
    aside.mkdir(exist_ok=True)
    with open(aside / original, "a", encoding="utf-8") as out:
        out.write(line + "\n")
    log.error("delivery ledger: a spool line of %s is not an event (%s): kept in %s", original, exc, aside)


# -- recording ---------------------------------------------------------------------------------------------------

def record(events: list[LedgerEvent], dsn: Callable[[], str | None], *, where: str, send: Send = _no_figures) -> str:
    """Write ``events`` to the ledger at ``dsn()`` (None: none configured, ``where`` says which setting), this
    machine's spool first; on any failure they are spooled and counted. Never raises. Returns ``written``,
    ``spooled``, ``nothing`` or (not even the spool) ``lost``."""
    try:
        url = dsn()
    except Exception as exc:  # noqa: BLE001 - a bad setting is reported, the events kept
        return _spooled(events, f"{where}: {str(exc).splitlines()[0][:200]}", send)
    if url is None:
        return _spooled(events, f"no {where} (runbook, \"Delivery ledger\")", send) if events else "nothing"
    engine = None
    try:
        engine = ledger_engine(url, timeout_s=TIMEOUT_S)
        caught = catch_up(engine, send)
        if caught:
            log.info("delivery ledger: caught up %d spooled event(s)", caught)
        if events:
            append(engine, events)
        send(LEDGER_PENDING, pending(), host=HOST)
        return "written" if events else "nothing"
    except Exception as exc:  # noqa: BLE001 - a ledger outage never fails a step
        return _spooled(events, hide_dsn_secrets(f"{type(exc).__name__}: {str(exc).splitlines()[0][:300] if str(exc) else ''}",
                                                 url), send)
    finally:
        if engine is not None:
            engine.dispose()


def _spooled(events: list[LedgerEvent], why: str, send: Send) -> str:
    if not events:
        log.warning("delivery ledger not reachable (%s); %d event(s) wait in %s", why, pending(), spool_dir())
        send(LEDGER_PENDING, pending(), host=HOST)
        return "nothing"
    try:
        path = spool(events)
    except Exception as exc:  # noqa: BLE001 - not even the spool: said loudly, the step still goes on
        log.error("delivery ledger: %d event(s) could not be written (%s) nor spooled (%s): %s", len(events), why,
                  exc, [e.as_json() for e in events])
        return "lost"
    log.warning("delivery ledger not written (%s): %d event(s) spooled in %s, written at the next record call on "
                "this machine", why, len(events), path)
    for tenant, count in _per_tenant(events).items():
        send(LEDGER_SPOOLED, count, tenant=tenant)
    send(LEDGER_PENDING, pending(), host=HOST)
    return "spooled"


def _per_tenant(events: Iterable[LedgerEvent]) -> dict[str, int]:
    counts: dict[str, int] = {}
    for e in events:
        counts[e.tenant] = counts.get(e.tenant, 0) + 1
    return counts

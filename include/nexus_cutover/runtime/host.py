"""The reference host (the new runtime): :func:`run_host`, behind ``nexus-host``.

Sequence (contract, "Command-line contract of the reference host"):

1. register in ``_System_ProcessRegistry`` (``Role = 'integration_host'``,
   ``ProjectionProtocol = 1``) and heartbeat from a background thread;
2. run the activation gate; while it refuses, log why and keep waiting
   (``--drain-and-exit``: return 3 at once, having admitted nothing);
3. set ``ActivatedAt``; confirm receipts materialized before a crash;
4. loop: materialize unmaterialized receipts of every served pack through range
   admission, then claim / execute / complete ready range generations;
   ``drain_and_exit`` returns 0 once no receipt of a served pack and no live
   range work of a pack with a protocol row is left;
5. on ``stop_event`` (SIGTERM in the CLI): finish the current item, set
   ``StoppedAt``, return 0.

Served packs (:class:`~.activation.ServedPacks`): the active packs of the
namespace with a version-1 protocol row, re-read once per heartbeat period (one
statement). The gate of step 2 needs every active pack to have its row; after
it, a pack installed later is handled without a restart: while it has no row it
is skipped (logged once; the other packs keep being served; its receipts stay
unmaterialized and it has no work to claim, the claim testing the row in SQL);
within one heartbeat period of its row being written (``nexus-cutover
activate-pack`` or the cutover) its materialized-but-unconfirmed receipts are
confirmed and it is served. ``--drain-and-exit`` drains what it serves: it does
not wait for a pack without its row (it logs what it left).

Ordinary and old-protocol WorkItems are never touched. Heartbeat period:
``heartbeat_s`` or env ``NEXUS_HOST_HEARTBEAT_S`` (default 5 s); idle poll
``poll_s`` or env ``NEXUS_HOST_POLL_S`` (default 0.5 s).
"""

from __future__ import annotations

import logging
import os
import threading

from sqlalchemy import Engine

from .. import catalog
from ..catalog import WorkItem
from ..db import translate_errors
from ..errors import BadInput
from .activation import ServedPacks, protocol_in_force
from .claim import live_range_work
from .errors import MissingCoverage, NotActivated
from .materializer import Key, materialize, recover_unconfirmed, unmaterialized_count
from .model import Routing
from .registry import Heartbeater, default_process_id, mark_activated, mark_stopped, register
from .worker import Execute, ProjectionWorker

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_REFUSED = 3


def _env_float(name: str, default: float) -> float:
    raw = os.environ.get(name, "").strip()
    try:
        return float(raw) if raw else default
    except ValueError:
        log.warning("ignoring %s=%r: not a number; using %s", name, raw, default)
        return default


def run_host(
    engine: Engine,
    namespace: str,
    *,
    process_id: str | None = None,
    drain_and_exit: bool = False,
    stop_event: threading.Event | None = None,
    routing: Routing | None = None,
    execute: Execute | None = None,
    heartbeat_s: float | None = None,
    poll_s: float | None = None,
) -> int:
    """Run the host until stopped (or drained); returns the exit code (0, or 3 when the gate refuses)."""
    process_id = process_id or default_process_id("nexus-host")
    stop_event = stop_event or threading.Event()
    routing = routing or Routing()
    heartbeat_s = heartbeat_s if heartbeat_s is not None else _env_float("NEXUS_HOST_HEARTBEAT_S", 5.0)
    poll_s = poll_s if poll_s is not None else _env_float("NEXUS_HOST_POLL_S", 0.5)

    register(engine, process_id, namespace, catalog.ROLE_INTEGRATION_HOST, catalog.PROTOCOL_RANGES)
    beater = Heartbeater(engine, [process_id], heartbeat_s).start()
    log.info("host %s registered for namespace %r (protocol %s)", process_id, namespace, catalog.PROTOCOL_RANGES)
    try:
        return _serve(engine, namespace, process_id, drain_and_exit, stop_event, routing, execute, poll_s, heartbeat_s)
    finally:
        beater.stop()
        try:
            mark_stopped(engine, process_id)
            log.info("host %s stopped", process_id)
        except Exception as exc:  # noqa: BLE001 - never mask the error that ended the host
            log.error("host %s could not record its stop: %s", process_id, exc)


def _serve(engine, namespace, process_id, drain_and_exit, stop_event, routing, execute, poll_s, heartbeat_s) -> int:
    worker = ProjectionWorker(engine, namespace, process_id, execute=execute)
    last_reasons = None
    while True:
        try:
            verdict = worker.start()  # the gate, in the worker itself: no window between check and start
            break
        except NotActivated as exc:
            if exc.reasons != last_reasons:
                log.error("activation gate refused for namespace %r: %s", namespace, "; ".join(exc.reasons))
                last_reasons = exc.reasons
        if drain_and_exit:
            return EXIT_REFUSED
        if stop_event.wait(poll_s):
            return EXIT_OK
    mark_activated(engine, process_id)
    log.info("host %s activated: packs %s", process_id, ", ".join(verdict.packs) or "(none)")
    served = ServedPacks(engine, namespace, heartbeat_s, initial=verdict.packs)
    for pack in verdict.packs:
        _recover(engine, pack, routing)

    uncovered: dict[str, dict[Key, int]] = {}
    refused: set[str] = set()  # packs whose admission refused once: the served packs are re-read before a second try
    while not stop_event.is_set():
        busy = False
        for pack in served.refresh():
            _recover(engine, pack, routing)
        for pack in served.packs:
            stuck = uncovered.setdefault(pack, {})
            try:
                report = materialize(engine, pack, routing, skip=set(stuck))
            except (NotActivated, BadInput) as exc:
                if pack in refused:  # still served after a re-read: not a pack uninstalled since the last refresh
                    raise
                log.warning("pack %s refused admission (%s); re-reading the served packs", pack, exc)
                refused.add(pack)
                served.invalidate()
                continue
            refused.discard(pack)
            stuck.update({(lane, rid): ordinal for lane, rid, ordinal in report.uncovered})
            busy = busy or report.admitted > 0 or report.duplicates > 0 or report.confirmed > 0
        while not stop_event.is_set() and worker.work_one() is not None:
            busy = True
        if busy:
            continue
        if drain_and_exit and _drained(engine, namespace, [p for p in served.packs if p not in refused], uncovered):
            if served.skipped:
                log.warning("drained the served packs; not served (left as they are): %s", "; ".join(served.skipped.values()))
            return EXIT_OK
        stop_event.wait(poll_s)
    return EXIT_OK


def _recover(engine: Engine, pack: str, routing: Routing) -> None:
    report = recover_unconfirmed(engine, pack, routing)
    if report.confirmed:
        log.info("pack %s: confirmed %d receipt(s) materialized before a restart", pack, report.confirmed)


def _live_served_work(conn, namespace: str) -> int:
    """Live range generations of ``namespace`` the worker may claim (their pack has a version-1 protocol row)."""
    return live_range_work(conn, namespace, protocol_in_force(WorkItem.c.PackInstallId))


def _drained(engine: Engine, namespace: str, packs: list[str], uncovered: dict[str, dict[Key, int]]) -> bool:
    """No live range work and no receipt left; receipts without coverage end the drain with ``MissingCoverage``."""
    with translate_errors("checking whether work is left"), engine.connect() as conn:
        if _live_served_work(conn, namespace):
            return False
        for pack in packs:
            stuck = uncovered.get(pack, {})
            if unmaterialized_count(conn, pack, limit=len(stuck) + 1) > len(stuck):
                return False
    for pack, stuck in sorted(uncovered.items()):
        if stuck:
            raise MissingCoverage(pack, sorted((lane, rid, o) for (lane, rid), o in stuck.items()))
    return True

"""The reference host (the new runtime): :func:`run_host`, behind ``nexus-host``.

Sequence (contract, "Command-line contract of the reference host"):

1. register in ``_System_ProcessRegistry`` (``Role = 'integration_host'``,
   ``ProjectionProtocol = 1``) and heartbeat from a background thread;
2. run the activation gate; while it refuses, log why and keep waiting
   (``--drain-and-exit``: return 3 at once, having admitted nothing);
3. set ``ActivatedAt``; confirm receipts materialized before a crash;
4. loop: materialize unmaterialized receipts of every active pack through range
   admission, then claim / execute / complete ready range generations;
   ``drain_and_exit`` returns 0 once no receipt and no live range work is left;
5. on ``stop_event`` (SIGTERM in the CLI): finish the current item, set
   ``StoppedAt``, return 0.

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
from ..db import translate_errors
from .activation import active_packs, check_activation
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
        return _serve(engine, namespace, process_id, drain_and_exit, stop_event, routing, execute, poll_s)
    finally:
        beater.stop()
        try:
            mark_stopped(engine, process_id)
            log.info("host %s stopped", process_id)
        except Exception as exc:  # noqa: BLE001 - never mask the error that ended the host
            log.error("host %s could not record its stop: %s", process_id, exc)


def _serve(engine, namespace, process_id, drain_and_exit, stop_event, routing, execute, poll_s) -> int:
    worker = ProjectionWorker(engine, namespace, process_id, execute=execute)
    last_reasons = None
    while True:
        verdict = check_activation(engine, namespace)
        if verdict.ok:
            break
        if verdict.reasons != last_reasons:
            log.error("activation gate refused for namespace %r: %s", namespace, "; ".join(verdict.reasons))
            last_reasons = verdict.reasons
        if drain_and_exit:
            return EXIT_REFUSED
        if stop_event.wait(poll_s):
            return EXIT_OK
    worker.start()
    mark_activated(engine, process_id)
    log.info("host %s activated: packs %s", process_id, ", ".join(verdict.packs) or "(none)")

    for pack in verdict.packs:
        report = recover_unconfirmed(engine, pack, routing)
        if report.confirmed:
            log.info("pack %s: confirmed %d receipt(s) materialized before a restart", pack, report.confirmed)

    uncovered: dict[str, dict[Key, int]] = {}
    refused: set[str] = set()
    while not stop_event.is_set():
        busy = False
        with translate_errors("listing active packs"), engine.connect() as conn:
            packs = active_packs(conn, namespace)
        for pack in packs:
            stuck = uncovered.setdefault(pack, {})
            try:
                report = materialize(engine, pack, routing, skip=set(stuck))
            except NotActivated as exc:  # a pack installed after activation, not yet cut over
                if pack not in refused:
                    log.error("not materializing receipts of pack %s: %s", pack, exc)
                refused.add(pack)
                continue
            refused.discard(pack)
            stuck.update({(lane, rid): ordinal for lane, rid, ordinal in report.uncovered})
            busy = busy or report.admitted > 0 or report.duplicates > 0 or report.confirmed > 0
        while not stop_event.is_set() and worker.work_one() is not None:
            busy = True
        if busy:
            continue
        if drain_and_exit and _drained(engine, namespace, [p for p in packs if p not in refused], uncovered):
            return EXIT_OK
        stop_event.wait(poll_s)
    return EXIT_OK


def _drained(engine: Engine, namespace: str, packs: list[str], uncovered: dict[str, dict[Key, int]]) -> bool:
    """No live range work and no receipt left; receipts without coverage end the drain with ``MissingCoverage``."""
    with translate_errors("checking whether work is left"), engine.connect() as conn:
        if live_range_work(conn, namespace):
            return False
        for pack in packs:
            stuck = uncovered.get(pack, {})
            if unmaterialized_count(conn, pack, limit=len(stuck) + 1) > len(stuck):
                return False
    for pack, stuck in sorted(uncovered.items()):
        if stuck:
            raise MissingCoverage(pack, sorted((lane, rid, o) for (lane, rid), o in stuck.items()))
    return True

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
``heartbeat_s`` or the setting ``host_heartbeat_s`` (``NEXUS_HOST_HEARTBEAT_S``, default 5 s); idle poll
``poll_s`` or ``host_poll_s`` (``NEXUS_HOST_POLL_S``, default 0.5 s).
"""

from __future__ import annotations

import logging
import threading
from dataclasses import dataclass

from sqlalchemy import Engine

from .. import catalog, settings, tx
from ..catalog import WorkItem
from ..errors import BadInput
from .activation import ActivationVerdict, ServedPacks, protocol_in_force
from .claim import live_range_work
from .errors import InadmissibleReceipts, NotActivated, Rejection
from .materializer import Key, materialize, recover_unconfirmed, unmaterialized_count
from .model import Routing
from .registry import Heartbeater, default_process_id, mark_activated, mark_stopped, register
from .worker import Execute, ProjectionWorker

log = logging.getLogger(__name__)

EXIT_OK = 0
EXIT_REFUSED = 3


def _setting_s(name: str) -> float:
    """The setting ``name`` (seconds); its default, with a warning, when it is not a number: a host keeps running."""
    try:
        return settings.value(name)
    except settings.BadSetting as exc:
        log.warning("ignoring %s; using %s", exc, settings.BY_NAME[name].default)
        return settings.BY_NAME[name].default


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
    host = _Host(
        engine=engine,
        namespace=namespace,
        process_id=process_id or default_process_id("nexus-host"),
        drain_and_exit=drain_and_exit,
        stop_event=stop_event or threading.Event(),
        routing=routing or Routing(),
        execute=execute,
        heartbeat_s=heartbeat_s if heartbeat_s is not None else _setting_s("host_heartbeat_s"),
        poll_s=poll_s if poll_s is not None else _setting_s("host_poll_s"),
    )
    register(engine, host.process_id, namespace, catalog.ROLE_INTEGRATION_HOST, catalog.PROTOCOL_RANGES)
    beater = Heartbeater(engine, [host.process_id], host.heartbeat_s).start()
    log.info("host %s registered for namespace %r (protocol %s)", host.process_id, namespace, catalog.PROTOCOL_RANGES)
    try:
        return _serve(host)
    finally:
        beater.stop()
        try:
            mark_stopped(engine, host.process_id)
            log.info("host %s stopped", host.process_id)
        except Exception as exc:  # noqa: BLE001 - never mask the error that ended the host
            log.error("host %s could not record its stop: %s", host.process_id, exc)


@dataclass(frozen=True)
class _Host:
    """One run of the host, as :func:`run_host` resolved its arguments (defaults and environment applied)."""

    engine: Engine
    namespace: str
    process_id: str
    drain_and_exit: bool
    stop_event: threading.Event
    routing: Routing
    execute: Execute | None
    heartbeat_s: float
    poll_s: float


def _serve(host: _Host) -> int:
    """Steps 2 to 5 of the module docstring, once registered."""
    worker = ProjectionWorker(host.engine, host.namespace, host.process_id, execute=host.execute)
    verdict = _await_gate(host, worker)
    if verdict is None:  # refused under --drain-and-exit (3), or stopped while waiting (0)
        return EXIT_REFUSED if host.drain_and_exit else EXIT_OK
    mark_activated(host.engine, host.process_id)
    log.info("host %s activated: packs %s", host.process_id, ", ".join(verdict.packs) or "(none)")
    served = ServedPacks(host.engine, host.namespace, host.heartbeat_s, initial=verdict.packs)
    for pack in verdict.packs:
        _recover(host.engine, pack, host.routing)
    receipts = _Receipts(host, served)
    while not host.stop_event.is_set():
        for pack in served.refresh():
            _recover(host.engine, pack, host.routing)
        busy = receipts.materialize_served()
        while not host.stop_event.is_set() and worker.work_one() is not None:
            busy = True
        if busy:
            continue
        if host.drain_and_exit and receipts.drained():
            if served.skipped:
                log.warning("drained the served packs; not served (left as they are): %s", "; ".join(served.skipped.values()))
            return EXIT_OK
        host.stop_event.wait(host.poll_s)
    return EXIT_OK


def _await_gate(host: _Host, worker: ProjectionWorker) -> ActivationVerdict | None:
    """Run the activation gate until it passes, logging each new refusal; None when the host is to return instead.

    That is at the first refusal with ``drain_and_exit``, or when ``stop_event``
    is set while waiting. The gate runs in the worker itself: no window between
    check and start.
    """
    last_reasons = None
    while True:
        try:
            return worker.start()
        except NotActivated as exc:
            if exc.reasons != last_reasons:
                log.error("activation gate refused for namespace %r: %s", host.namespace, "; ".join(exc.reasons))
                last_reasons = exc.reasons
        if host.drain_and_exit or host.stop_event.wait(host.poll_s):
            return None


class _Receipts:
    """The receipts of the served packs: materialized pass by pass, those that cannot be admitted remembered per pack.

    A receipt that cannot be admitted (without coverage, colliding with another
    receipt's key, invalid) was logged once with its reason; it is skipped from
    then on, stays durable and unconfirmed for review while the pack's other
    receipts keep being admitted, and ends a drain with the error naming every
    such receipt (:func:`_drained`).
    """

    def __init__(self, host: _Host, served: ServedPacks):
        self.host = host
        self.served = served
        self.rejected: dict[str, dict[Key, Rejection]] = {}
        self.refused: set[str] = set()  # packs whose admission refused once: the served packs are re-read before a second try

    def materialize_served(self) -> bool:
        """One pass over the served packs; True when it admitted, found duplicates or confirmed anything."""
        busy = False
        for pack in self.served.packs:
            stuck = self.rejected.setdefault(pack, {})
            try:
                report = materialize(self.host.engine, pack, self.host.routing, skip=set(stuck))
            except (NotActivated, BadInput) as exc:
                if pack in self.refused:  # still served after a re-read: not a pack uninstalled since the last refresh
                    raise
                log.warning("pack %s refused admission (%s); re-reading the served packs", pack, exc)
                self.refused.add(pack)
                self.served.invalidate()
                continue
            self.refused.discard(pack)
            stuck.update({r.key: r for r in report.rejected})
            busy = busy or report.admitted > 0 or report.duplicates > 0 or report.confirmed > 0
        return busy

    def drained(self) -> bool:
        """:func:`_drained` over the served packs whose admission did not just refuse."""
        packs = [p for p in self.served.packs if p not in self.refused]
        return _drained(self.host.engine, self.host.namespace, packs, self.rejected)


def _recover(engine: Engine, pack: str, routing: Routing) -> None:
    report = recover_unconfirmed(engine, pack, routing)
    if report.confirmed:
        log.info("pack %s: confirmed %d receipt(s) materialized before a restart", pack, report.confirmed)


def _live_served_work(conn, namespace: str) -> int:
    """Live range generations of ``namespace`` the worker may claim (their pack has a version-1 protocol row)."""
    return live_range_work(conn, namespace, protocol_in_force(WorkItem.c.PackInstallId))


def _drained(engine: Engine, namespace: str, packs: list[str], rejected: dict[str, dict[Key, Rejection]]) -> bool:
    """No live range work and no receipt left; receipts that cannot be admitted end the drain with the error naming
    them (``MissingCoverage`` when all lack coverage, ``ReceiptCollision`` when all collide)."""
    with tx.reading(engine, "checking whether work is left") as conn:
        if _live_served_work(conn, namespace):
            return False
        for pack in packs:
            stuck = rejected.get(pack, {})
            if unmaterialized_count(conn, pack, limit=len(stuck) + 1) > len(stuck):
                return False
    for pack, stuck in sorted(rejected.items()):
        if stuck:
            raise InadmissibleReceipts.combined(pack, [stuck[k] for k in sorted(stuck)])
    return True

"""The one hook every path records through: a :class:`Recorder` emits a run's events to its sinks.

Like gh-ost's hooks (one hook fires whichever path reached the event), a step's end is recorded the same way
whether an Airflow task ran it, ``nexus-cutover run`` or a single-step command did, the lifecycle entrypoint or a
Field History stage: the caller makes a :class:`Recorder` for its :class:`Origin` (who records: the DAG and its run,
try and map index, or the command, its run id and actor) and its sinks, and hands it each step's result
(:meth:`Recorder.step_passed`), stop (:meth:`Recorder.step_stopped`) and the questions a person answers. What a
result means as events is the step's own (:attr:`~nexus_cutover.transition.Step.records`, next to its body);
what a sink does with an event is the sink's:

* :class:`LedgerSink` writes the kinds the delivery ledger keeps (:data:`nexus_cutover.events.LEDGER_KINDS`),
  through the machine's spool (:mod:`nexus_cutover.ledger_spool`);
* :class:`MetricsSink` sends the figures each event carries (:func:`nexus_cutover.metrics.figures_of`) through
  the caller's metrics client (Airflow's in a task; :class:`~nexus_cutover.metrics.StatsdSender` from the command
  line).

Adding a sink is one class with ``receive(origin, events)`` and one line where each path builds its sinks
(``nexus_airflow.ledger.recorder_for``, :func:`nexus_cutover.cli.recording.command_recorder`).

Invariants:

* Recording never fails, blocks or skips a step: a sink's error is logged and dropped here (the ledger's own
  outage is spooled, never lost: :mod:`nexus_cutover.ledger_spool`).
* A dry run records nothing (:data:`NOT_RECORDING`): it is not a cutover, and its figures would mix with theirs.
* An event's place in its run (the ledger's ``seq``) is its step's place in the declared transition, then its
  kind's: never a random id, never the time a row landed.
"""

from __future__ import annotations

import contextlib
import datetime as dt
import logging
import time
from collections.abc import Callable, Iterable, Iterator, Sequence
from dataclasses import dataclass, replace
from typing import Any, Protocol

from . import events as E
from . import ledger_spool
from .events import Event
from .field_history.transition import FIELD_HISTORY
from .ledger import LedgerEvent
from .locks import metering
from .metrics import figures_of
from .projection.transition import CUTOVER
from .transition import Transition

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Origin:
    """Who records: the tenant, the DAG (or the command) and its run, the task's map index and try, the person
    acting (a command's ``-actor``; an answer names its own), and the declared transition its steps are in."""

    tenant: str
    dag_id: str
    run_id: str
    transition: Transition | None = None
    map_index: int = -1
    try_number: int = 1
    actor: str | None = None

    def seq(self, step: str, kind: str) -> int:
        """The event's declared place in its run: its step's place in the transition (a wave's number for a
        rollout's question), then its kind's (:data:`nexus_cutover.events.LEDGER_KINDS`)."""
        names = self.transition.names if self.transition is not None else []
        if step in names:
            rank = names.index(step) + 1
        else:
            digits = "".join(ch for ch in step if ch.isdigit())
            rank = int(digits) if digits else 0
        return rank * 100 + (E.LEDGER_KINDS.index(kind) if kind in E.LEDGER_KINDS else 99)


class Sink(Protocol):
    def receive(self, origin: Origin, events: Sequence[Event]) -> None: ...


def records_of(transition: Transition | None, step: str, value: Any) -> list[Event]:
    """The events the declared step ``step``'s result ``value`` (its JSON form: the XCom value, the ``-json``
    field) means, by the step's own :attr:`~nexus_cutover.transition.Step.records`; none for a step that
    declares none or is not in ``transition``."""
    declared = transition.get(step) if transition is not None else None
    if declared is None or declared.records is None or not isinstance(value, dict):
        return []
    return [e for e in declared.records_function()(step, value) if e is not None]


class Recorder:
    """Emits one origin's events to its sinks (see the module's invariants)."""

    def __init__(self, origin: Origin | None, sinks: Sequence[Sink] = (), *,
                 mask: Callable[[str], str] = lambda text: text) -> None:
        self.origin = origin
        self.sinks = tuple(sinks) if origin is not None else ()
        #: What a stop's reason shows (the command line hides every secret of its DSN variables, as its errors do).
        self.mask = mask

    @property
    def recording(self) -> bool:
        return bool(self.sinks)

    def emit(self, events: Iterable[Event] | Callable[[], Iterable[Event]]) -> None:
        """Hand ``events`` (or what building them gives) to every sink; nothing here ever fails the step."""
        if not self.sinks:
            return
        try:
            built = list(events() if callable(events) else events)
        except Exception as exc:  # noqa: BLE001 - a record's bug never fails a cutover step; said in the log
            log.error("the events of a step could not be built: %s", exc)
            return
        for sink in self.sinks:
            try:
                sink.receive(self.origin, built)
            except Exception as exc:  # noqa: BLE001 - one sink's failure is neither the step's nor another sink's
                log.error("%s could not take %d event(s): %s", type(sink).__name__, len(built), exc)

    def step_passed(self, step: str, value: Any, *, seconds: float | None = None,
                    lock_wait_s: float | None = None) -> None:
        """Step ``step`` ended with ``value``: the events it means, then that it passed (its figures)."""
        transition = self.origin.transition if self.origin else None
        self.emit(lambda: [*records_of(transition, step, value),
                           E.passed(step, seconds=seconds, lock_wait_s=lock_wait_s)])

    def step_stopped(self, step: str, reason: str, *, error: str | None = None, failure: str = "error",
                     seconds: float | None = None, lock_wait_s: float | None = None) -> None:
        """Step ``step`` stopped (a refusal, bad input, a person's answer, a timeout, a crash): ``stopped`` with
        its reason, on every path."""
        self.emit([E.stopped(step, self.mask(reason), error=error, failure=failure, seconds=seconds, lock_wait_s=lock_wait_s)])

    def asked(self, step: str, subject: str, shown: Any) -> None:
        self.emit([E.evidence_shown(step, subject, shown)])

    def answered(self, step: str, outcome: str, *, who: str | None, at: Any = None, shown: Any = None,
                 reason: str | None = None, **detail: Any) -> None:
        self.emit([E.answer(step, outcome, who=who, at=at, shown=shown, reason=reason, **detail)])


#: The recorder of a dry run, and of a caller that records nothing.
NOT_RECORDING = Recorder(None)


class StepClock:
    """One step being run under a recorder: its duration and lock waits (:func:`nexus_cutover.locks.metering`),
    and how it ended, recorded once (:attr:`settled`)."""

    def __init__(self, recorder: Recorder, step: str) -> None:
        self.recorder, self.step = recorder, step
        self.meter = metering()
        self.started = time.monotonic()
        self.settled = False

    def _waited(self) -> float | None:
        return self.meter.seconds if self.meter.acquisitions else None

    def passed(self, value: Any) -> None:
        self.settled = True
        self.recorder.step_passed(self.step, value, seconds=time.monotonic() - self.started, lock_wait_s=self._waited())

    def stopped(self, reason: str, *, failure: str, error: str | None = None) -> None:
        self.settled = True
        self.recorder.step_stopped(self.step, reason, error=error, failure=failure,
                                   seconds=time.monotonic() - self.started, lock_wait_s=self._waited())


@contextlib.contextmanager
def timed(recorder: Recorder, step: str, *, failure_of: Callable[[BaseException], str]) -> Iterator[StepClock]:
    """Run one step under ``recorder``: the body calls ``clock.passed(value)`` when it passed (or settles it
    otherwise); an exception it did not settle records ``stopped`` (with ``failure_of(exc)``) and goes on up."""
    clock = StepClock(recorder, step)
    try:
        yield clock
    except BaseException as exc:
        if not clock.settled:
            clock.stopped(str(exc) or type(exc).__name__, failure=failure_of(exc), error=type(exc).__name__)
        raise


# -- the sinks ----------------------------------------------------------------------------------------------------

class LedgerSink:
    """The delivery ledger: the kinds it keeps, as rows of the origin's run (:mod:`nexus_cutover.ledger`), written
    through this machine's spool. ``dsn()`` gives the ledger's URL (None: none configured, ``where`` names the
    setting a person gives it in); ``send`` counts what was spooled and caught up."""

    def __init__(self, dsn: Callable[[], str | None], *, where: str, send: Callable[..., None] | None = None) -> None:
        self.dsn, self.where, self.send = dsn, where, send

    def receive(self, origin: Origin, events: Sequence[Event]) -> None:
        rows = [ledger_event(origin, e) for e in events if e.recorded]
        if rows:
            ledger_spool.record(rows, self.dsn, where=self.where,
                                **({"send": self.send} if self.send is not None else {}))


def ledger_event(origin: Origin, event: Event):
    """``event`` as a :class:`~nexus_cutover.ledger.LedgerEvent` of ``origin``'s run."""

    when = event.at or dt.datetime.now(dt.UTC)
    return LedgerEvent(
        tenant=str(event.tenant or origin.tenant), dag_id=origin.dag_id, run_id=origin.run_id, step=event.step,
        kind=event.kind, recorded_at=when if when.tzinfo else when.replace(tzinfo=dt.UTC),
        seq=origin.seq(event.step, event.kind), map_index=origin.map_index, try_number=origin.try_number,
        outcome=event.outcome, actor=event.actor or origin.actor, holder=event.holder, digest=event.digest,
        pack=event.pack, cutoff=event.cutoff, reason=event.reason, detail=dict(event.detail))


class MetricsSink:
    """The figures each event carries, through ``send(metric, value, **tags)``: tagged with its tenant when the
    metric is a per-tenant one (:data:`~nexus_cutover.metrics.TENANT_METRICS`), fleet-wide otherwise."""

    def __init__(self, send: Callable[..., None]) -> None:
        self.send = send

    def receive(self, origin: Origin, events: Sequence[Event]) -> None:
        for event in events:
            for metric, value, tags in figures_of(event):
                tenant = {"tenant": event.tenant or origin.tenant} if "tenant" in metric.tags else {}
                self.send(metric, value, **tenant, **tags)


def step_figures(step: str, result: Any, transition: Transition | None = None) -> list[tuple[Any, float]]:
    """The figures a declared step's result carries (its records' events' figures; the cutover's or Field History's
    step when ``transition`` is not given): what a metrics sink sends for it besides its duration."""
    if transition is None:

        transition = CUTOVER if CUTOVER.get(step) is not None else FIELD_HISTORY
    return [(metric, value) for event in records_of(transition, step, result) for metric, value, _ in figures_of(event)]


def with_tenant(event: Event, tenant: str) -> Event:
    """``event`` naming ``tenant`` (a wave's question records one event per tenant it shows)."""
    return replace(event, tenant=tenant)

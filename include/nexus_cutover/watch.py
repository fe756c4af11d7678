"""A wait's look, the same on every path: one :class:`Watch` per waiting step, declared beside its body.

A waiting step (a declared :class:`~nexus_cutover.transition.Wait`) is looked at again and again until its verdict
is no longer ``wait``. Who repeats the look differs (the command line's :func:`nexus_cutover.polling.wait_until`, the
Airflow trigger on a triggerer, a ``poke`` sensor), what one look *is* does not: the step module's ``Watch`` runs the
step's body once per :meth:`Watch.poll` and says what it saw as a JSON-serializable dict:

* ``state``: ``waiting``, the watch's ``done`` state when the verdict proceeds, ``stuck`` when it stops, or
  ``timed_out`` once the deadline passed while still waiting;
* ``verdict`` (the body's, :func:`verdict_json`), ``message`` (one progress line: counts, trend, rate and ETA),
  ``report`` (the body's value) and, where the watch has one, ``report_text`` (the human report).

Invariants: a look is read only (nothing is written to the tenant database); deadlines are naive UTC (an ISO-8601
string is accepted, so a trigger restarted on another triggerer keeps the same bound); figures a look measures
(a drain's remaining work, rate and ETA) are events handed to ``record`` (the caller's sinks), never sent here.
"""

from __future__ import annotations

import datetime as dt
import math
from collections.abc import Callable
from typing import Any

from .clock import utcnow
from .events import Event

#: The state of a look that has not ended the wait.
WAITING = "waiting"


def naive_utc(deadline: str | dt.datetime) -> dt.datetime:
    """A deadline as naive UTC, from an ISO-8601 string or a datetime (aware values are converted)."""
    value = dt.datetime.fromisoformat(deadline) if isinstance(deadline, str) else deadline
    return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value


def eta_minutes(remaining: int | None, rate: float | None) -> int | None:
    """Whole minutes until ``remaining`` reaches 0 at ``rate`` items/min (0 when drained; None if not draining)."""
    if remaining is not None and remaining <= 0:
        return 0
    if remaining is None or rate is None or rate <= 0:
        return None
    return math.ceil(remaining / rate)


def eta_text(remaining: int | None, rate: float | None) -> str:
    """The ETA as the log line and the page say it: ``"12.0 items/min, ETA ~3 min"``, or why there is none."""
    eta = eta_minutes(remaining, rate)
    if eta == 0:
        return "drained"
    if rate is None:
        return "ETA unknown (one sample so far)"
    if eta is None:
        return f"ETA unknown (no progress measured: {rate:+.1f} items/min)"
    return f"{rate:.1f} items/min, ETA ~{eta} min"


def wait_state(verdict, done: str, *, expired: bool = False) -> str:
    """A look's ``state`` from the waiting step's verdict on it: ``done`` when it proceeds, ``stuck`` when it stops,
    ``timed_out`` past the deadline, else waiting."""
    if verdict.proceeds:
        return done
    if verdict.outcome == "stop":
        return "stuck"
    return "timed_out" if expired else WAITING


def verdict_json(verdict) -> dict[str, Any]:
    """A look's verdict as a trigger's event carries it."""
    return {"outcome": str(verdict.outcome), "reason": verdict.reason, "timed_out": verdict.timed_out}


class Watch:
    """The looks at one waiting step of a tenant, until its wait ends. Subclasses (one per waiting step, in the
    step's module) implement :meth:`poll`; the adapter reads the class attributes below."""

    #: The ``state`` a passing look reports.
    done = ""
    #: The key the DAG's task keeps the look's human report (``report_text``) under; None: it keeps none.
    text_key: str | None = None
    #: More of the watch's keyword arguments, from the run's parameters: (keyword, parameter name) pairs.
    params: tuple[tuple[str, str], ...] = ()

    def __init__(self, engine, namespace: str, step: str, deadline: str | dt.datetime, *,
                 record: Callable[[list[Event]], None] | None = None) -> None:
        self.engine, self.namespace, self.step = engine, namespace, step
        self.deadline = naive_utc(deadline)
        #: Where the figures a look measures go (the caller's recorder); None: nowhere.
        self.record = record
        #: The last look's step result (its verdict and value), for callers that judge it themselves.
        self.last = None

    def expired(self) -> bool:
        return utcnow() >= self.deadline

    def poll(self) -> dict[str, Any]:  # pragma: no cover - every watch implements its own look
        raise NotImplementedError

    def looked(self, result, message: str, *, expires: bool = True, **more: Any) -> dict[str, Any]:
        """The dict of one look whose step result is ``result``: its state, verdict, message, report and ``more``
        (``expires``: whether the watch's deadline makes a look that still waits ``timed_out``)."""
        self.last = result
        state = wait_state(result.verdict, self.done, expired=expires and self.expired())
        return {"state": state, "verdict": verdict_json(result.verdict), "message": message, "report": result.value,
                **more}

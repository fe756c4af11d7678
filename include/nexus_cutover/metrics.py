"""Every ``nexus.*`` metric, declared once (name, type, tags, meaning), and what the events of a run say as figures.

Invariants:

* The figures come from a run's events (:mod:`nexus_cutover.events`), never from a step's name: the metrics sink
  (:class:`nexus_cutover.recording.MetricsSink`) turns each event into the figures it carries
  (:func:`figures_of`), so every path that records a step -- an Airflow task, ``nexus-cutover run``, a single-step
  command, the lifecycle entrypoint, a Field History stage -- sends the same names with the same tags.
* Where they are sent is the caller's: Airflow's own metrics client in a task (``nexus_airflow.metrics``), a plain
  StatsD listener (:class:`StatsdSender`, ``NEXUS_STATSD=host:port``) from the command line. Both send each figure
  twice, as Airflow sends its own metrics: the bare name (its tags where the client keeps tags) and, the form plain
  StatsD keeps per tenant, the name with the tag values appended in the declared order
  (``nexus.step.duration.<tenant>.<step>.<outcome>``; :func:`named`). Tag values are made name-safe as Airflow does
  (a ``.`` becomes ``__``, any other character outside ``[A-Za-z0-9_-]`` a ``_``).
* A metric never fails or slows a step: a sender's error is logged and dropped (UDP is fire-and-forget).
* What ``deploy/`` loads (the StatsD exporter's mapping, the Prometheus alert rules, the Grafana dashboard) reads
  these names only: ``tests/deploy`` fails when a rule or a panel queries a series the mapping does not make of
  what is declared here.
"""

from __future__ import annotations

import datetime as dt
import logging
import re
import socket
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from . import events as E
from .errors import BadInput

log = logging.getLogger(__name__)

__all__ = ["ADMISSION_PAUSE", "ALL", "TENANT_METRICS", "COUNTER", "DIGEST_ROWS_PER_S", "DRAIN_ETA", "DRAIN_RATE", "DRAIN_REMAINING",
           "FAILURE_REASONS", "FENCE_ARMED_AT", "FENCE_HELD_OUTCOMES", "GAUGE", "LEDGER_CAUGHT_UP",
           "LEDGER_PENDING", "LEDGER_SPOOLED", "LOCK_WAIT", "Metric", "ROLLOUT_HALTED", "ROLLOUT_TENANTS",
           "STEP_DURATION", "STEP_FAILED", "StatsdSender", "TIMER", "WAVE_ETA", "epoch_seconds", "failure_reason",
           "figures_of", "name_safe", "named", "pause_summary", "rollout_progress", "statsd_lines"]

TIMER, GAUGE, COUNTER = "timer", "gauge", "counter"


@dataclass(frozen=True)
class Metric:
    """One metric: ``name`` (``nexus.*``), ``kind`` (timer in ms, gauge or counter), ``tags`` in name order,
    ``unit``."""

    name: str
    kind: str
    tags: tuple[str, ...]
    unit: str
    meaning: str


# Fleet-wide, not per tenant (issue 49, item 5): a histogram per tenant and step (and per locked step) made about 290
# of the ~310 series a tenant's cutover run left (19 now), and what a person reads from it is the fleet's p95 by
# step; a tenant's own steps are in its ledger and the status view. The figures a tenant's pause and its alerts need
# keep the tenant (the pause, the fence, the drain, the digest, a failure): TENANT_METRICS.
STEP_DURATION = Metric(
    "nexus.step.duration", TIMER, ("step", "outcome"), "ms",
    "a step (task) of a cutover or Field History run, from its first start (a deferred or rescheduled wait "
    "included) to its end; outcome success or failed. Fleet-wide: no tenant tag")
ADMISSION_PAUSE = Metric(
    "nexus.admission.pause", TIMER, ("tenant",), "ms",
    "the tenant's admission pause: its cutover fence's ReleasedAt - ArmedAt as the fence row records them, "
    "sent once, by the run that released it")
LOCK_WAIT = Metric(
    "nexus.lock.wait", TIMER, ("step",), "ms",
    "time a locked step spent taking its _System_Lock rows (every transaction and retry of the step together). "
    "Fleet-wide: no tenant tag")
DRAIN_REMAINING = Metric(
    "nexus.drain.remaining", GAUGE, ("tenant",), "WorkItems",
    "old projection WorkItems still pending, blocked, retry or processing, at each poll of wait_for_drain")
STEP_FAILED = Metric(
    "nexus.step.failed", COUNTER, ("tenant", "step", "reason"), "steps",
    "a step that failed, by reason (:func:`failure_reason`): refused (a stop: a refusal, a person's Reject, a wait "
    "that cannot pass), bad_input, timeout (a deadline or lock timeout), error (anything else: a crash, a lost "
    "database)")
FENCE_ARMED_AT = Metric(
    "nexus.fence.armed_at", GAUGE, ("tenant",), "s since the epoch",
    "the ArmedAt of the tenant's cutover fence (when its admission pause began), sent by the step that armed, "
    "adopted or kept it; 0 by the step that released it. Now minus it is how long admission has been paused so far")
DRAIN_RATE = Metric(
    "nexus.drain.rate", GAUGE, ("tenant",), "WorkItems/min",
    "drain rate over the last polls (negative when old work grew); not sent until two polls lie apart")
DRAIN_ETA = Metric(
    "nexus.drain.eta", GAUGE, ("tenant",), "s",
    "seconds until the old projection work is drained at the measured rate (0 once drained), at each poll of "
    "wait_for_drain; not sent while the drain is not shrinking or not measured yet")
DIGEST_ROWS_PER_S = Metric(
    "nexus.digest.rows_per_second", GAUGE, ("tenant",), "rows/s",
    "history rows digested per second by history_digest (the tenant's projection history rows)")
ROLLOUT_TENANTS = Metric(
    "nexus.rollout.tenants", GAUGE, ("rollout", "state"), "tenants",
    "tenants of a tenant_rollout run by state (done, failed, waiting: not yet ended), at each wave's close")
WAVE_ETA = Metric(
    "nexus.rollout.wave.eta", GAUGE, ("rollout",), "s",
    "seconds until the rollout's last wave ends, at the pace measured so far (elapsed / tenants ended x "
    "tenants waiting); 0 when none waits")
ROLLOUT_HALTED = Metric(
    "nexus.rollout.halted", GAUGE, ("rollout",), "0 or 1",
    "1 from the wave close that halted the rollout (more tenants failed than max_failed), 0 from every other "
    "wave close")

LEDGER_SPOOLED = Metric(
    "nexus.ledger.spooled", COUNTER, ("tenant",), "events",
    "delivery-ledger events that could not be written (the ledger down or not configured) and went to the "
    "machine's spool instead (nexus_airflow.ledger)")
LEDGER_CAUGHT_UP = Metric(
    "nexus.ledger.caught_up", COUNTER, ("tenant",), "events",
    "spooled delivery-ledger events written to the ledger at a later record call on the same machine")
LEDGER_PENDING = Metric(
    "nexus.ledger.pending", GAUGE, ("host",), "events",
    "delivery-ledger events waiting in this machine's spool, after each record call; tagged with the machine's "
    "name (each worker has its own spool, so its own series: their sum is the fleet's)")

#: Every metric of the project, in the runbook's order.
ALL = (STEP_DURATION, STEP_FAILED, ADMISSION_PAUSE, FENCE_ARMED_AT, LOCK_WAIT, DRAIN_REMAINING, DRAIN_RATE, DRAIN_ETA,
       DIGEST_ROWS_PER_S, ROLLOUT_TENANTS, WAVE_ETA, ROLLOUT_HALTED, LEDGER_SPOOLED, LEDGER_CAUGHT_UP, LEDGER_PENDING)

#: The metrics a tenant has series of (tagged with it); every other one is fleet-wide, by step, rollout or host.
TENANT_METRICS = tuple(m for m in ALL if "tenant" in m.tags)

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def name_safe(value: Any) -> str:
    """A tag value as one segment of a metric name (Airflow's rule for its legacy names, then its character set)."""
    return _UNSAFE.sub("_", str(value).replace(".", "__"))[:100] or "_"


def named(metric: Metric, tags: dict[str, Any]) -> str:
    """The name with the tag values appended in the declared order (the form plain StatsD keeps per tenant)."""
    return ".".join([metric.name, *(name_safe(tags[t]) for t in metric.tags)])


# --- what an event says ------------------------------------------------------------------------------------------

#: A fence event's outcomes after which the run holds the fence (``nexus.fence.armed_at`` is its ArmedAt).
FENCE_HELD_OUTCOMES = ("armed", "adopted", "reused")


def epoch_seconds(value: Any) -> float:
    """A stored time (naive UTC, as the tenant's columns hold it; a datetime or its ISO text) as seconds since the
    epoch."""
    when = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


def figures_of(event) -> list[tuple[Metric, float, dict[str, Any]]]:
    """The figures one event (:class:`nexus_cutover.events.Event`) carries, with their tags but the tenant's:
    a step's duration and lock wait when it passed or stopped (and its failure by reason), the fence's arming time
    while the run holds it (0 from every release, whichever path released it), the admission pause of a release,
    the digest's rows per second, the drain's remaining work, rate and ETA at each look."""

    kind, step, detail = event.kind, event.step, event.detail or {}
    out: list[tuple[Metric, float, dict[str, Any]]] = []
    if kind in (E.STEP_PASSED, E.STOPPED):
        outcome = "success" if kind == E.STEP_PASSED else "failed"
        if event.seconds is not None:
            out.append((STEP_DURATION, event.seconds, {"step": step, "outcome": outcome}))
        if kind == E.STOPPED:
            out.append((STEP_FAILED, 1, {"step": step, "reason": event.failure or "error"}))
        if event.lock_wait_s is not None:
            out.append((LOCK_WAIT, event.lock_wait_s, {"step": step}))
    elif kind in (E.FENCE_ARMED, E.FENCE_ADOPTED, E.FENCE_REUSED) and detail.get("armed_at") is not None:
        out.append((FENCE_ARMED_AT, epoch_seconds(detail["armed_at"]), {}))
    elif kind == E.FENCE_RELEASED:
        if event.outcome == "released" and detail.get("admission_pause_s") is not None:
            out.append((ADMISSION_PAUSE, float(detail["admission_pause_s"]), {}))
        out.append((FENCE_ARMED_AT, 0.0, {}))
    elif kind == E.BACKED_OUT:  # released without a cutover: the gauge says released; no cutover's pause figure
        out.append((FENCE_ARMED_AT, 0.0, {}))
    elif kind == E.DIGEST_TAKEN:
        rows, seconds = detail.get("rows"), detail.get("seconds")
        if isinstance(rows, dict) and seconds:
            out.append((DIGEST_ROWS_PER_S, sum(int(r) for r in rows.values()) / float(seconds), {}))
    elif kind == E.DRAIN_LOOKED:
        out.append((DRAIN_REMAINING, detail["remaining"], {}))
        if detail.get("rate_per_min") is not None:
            out.append((DRAIN_RATE, detail["rate_per_min"], {}))
        if detail.get("eta_s") is not None:
            out.append((DRAIN_ETA, detail["eta_s"], {}))
    return out


#: A stop's exit code (the command line's, and an Airflow task's that stopped) -> its reason.
_STOP_REASONS = {2: "bad_input", 3: "refused", 4: "timeout"}
FAILURE_REASONS = ("refused", "bad_input", "timeout", "error")


def failure_reason(exc: BaseException | None) -> str:
    """Why a step failed, in :data:`FAILURE_REASONS`: a stop by its exit code (2 bad input, 3 refused, 4 timeout:
    a ``SystemExit``'s code, or a domain error's ``exit_code``), a timeout (any ``*Timeout*`` exception: a sensor's,
    a task's ``execution_timeout``) as ``timeout``, anything else ``error``."""
    code = exc.code if isinstance(exc, SystemExit) else getattr(exc, "exit_code", None)
    if isinstance(code, int) and code in _STOP_REASONS:
        return _STOP_REASONS[code]
    if exc is not None and "Timeout" in type(exc).__name__:
        return "timeout"
    return "error"


# --- rollout (pure figures; nexus_airflow sends them) ---------------------------------------------------------

def rollout_progress(total: int, done: int, failed: int, elapsed_s: float | None) -> dict[str, float | int | None]:
    """Tenants by state and the ETA of the rollout's end at the measured pace (None before a tenant ended, or
    with no elapsed time known)."""
    ended = done + failed
    waiting = max(0, total - ended)
    eta = 0.0 if waiting == 0 else (elapsed_s / ended * waiting if ended and elapsed_s is not None else None)
    return {"done": done, "failed": failed, "waiting": waiting, "eta_s": eta}


def pause_summary(pauses: Iterable[float]) -> dict[str, float | int] | None:
    """Median, p95 (nearest rank) and max of admission pauses in seconds; None without any."""
    values = sorted(pauses)
    if not values:
        return None
    p95 = values[max(0, -(-95 * len(values) // 100) - 1)]
    return {"tenants": len(values), "median_s": round(statistics.median(values), 3), "p95_s": round(p95, 3),
            "max_s": round(values[-1], 3)}


# --- plain StatsD, for the command line ------------------------------------------------------------------------

def statsd_lines(metric: Metric, value: float, tags: dict[str, Any], prefix: str = "airflow") -> list[str]:
    """The StatsD lines of one figure, as Airflow's StatsD client sends them with ``[metrics] legacy_names_on``:
    the bare name (plain StatsD has no tags) and the name with the tag values appended; timers in ms."""
    kind = {TIMER: "ms", COUNTER: "c"}.get(metric.kind, "g")
    shown = float(value) * 1000.0 if metric.kind == TIMER else (int(value) if metric.kind == COUNTER else float(value))
    names = [metric.name] + ([named(metric, tags)] if metric.tags else [])
    return [f"{prefix + '.' if prefix else ''}{name}:{shown}|{kind}" for name in names]


class StatsdSender:
    """Sends figures to a StatsD listener over UDP (``NEXUS_STATSD=host:port``): the names and the prefix
    (``NEXUS_STATSD_PREFIX``, default ``airflow``, Airflow's ``[metrics] statsd_prefix``) a DAG's task sends, so the
    same exporter mapping, alerts and dashboard read the command line's figures too. Never raises."""

    def __init__(self, address: str, prefix: str = "airflow") -> None:
        host, _, port = address.rpartition(":")
        if not host or not port.isdigit():

            raise BadInput(f"NEXUS_STATSD={address!r}: give host:port, e.g. localhost:8125")
        self.target = (host, int(port))
        self.prefix = prefix
        self._socket = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET, socket.SOCK_DGRAM)

    def __call__(self, metric: Metric, value: float | None, **tags: Any) -> None:
        if value is None:
            return
        try:
            for line in statsd_lines(metric, value, tags, self.prefix):
                self._socket.sendto(line.encode("utf-8"), self.target)
        except OSError as exc:  # a metric never fails a step
            log.warning("metric %s not sent to %s: %s", metric.name, self.target, exc)

"""Every ``nexus.*`` metric, declared once (name, type, tags, meaning), and the one way they are emitted.

Invariants:

* Emitted only through Airflow's own metrics client (``airflow.sdk.observability.stats``, the Task SDK's
  ``Stats``), so StatsD, Datadog or OpenTelemetry, as ``[metrics]`` configures them, all receive them and
  ``[metrics]`` allow/block lists apply. A process where Airflow never initialized that client (a bare
  script) initializes it once from ``[metrics]``, as the task runner does.
* Each figure is sent twice, as Airflow sends its own metrics: the bare name with its tags (per tenant in
  OpenTelemetry, Datadog and StatsD with ``statsd_influxdb_enabled``; fleet-wide in plain StatsD, which drops
  tags) and, while ``[metrics] legacy_names_on`` (Airflow's default), the name with the tag values appended
  in the declared order (``nexus.step.duration.<tenant>.<step>.<outcome>``): per tenant in plain StatsD.
  Tag values are made name-safe as Airflow does (a ``.`` becomes ``__``, any other character outside
  ``[A-Za-z0-9_-]`` a ``_``).
* A metric never fails or slows a step: an emission error is logged and dropped (UDP is fire-and-forget).
* Emitted from few places: the cutover and Field History DAGs' step hooks (:mod:`nexus_airflow.base`:
  step duration, lock wait, admission pause, the fence's arming time, digest rate, from each step's own result and
  lock meter; a failed step's reason), the drain poller (remaining, rate, ETA), the rollout's wave close (tenants
  done/failed/waiting, ETA, halted) and the delivery ledger's record calls (events spooled, caught up, pending:
  :mod:`nexus_airflow.ledger`).
* What ``deploy/`` loads (the StatsD exporter's mapping, the Prometheus alert rules, the Grafana dashboard) reads
  these names only: ``tests/deploy`` fails when a rule or a panel queries a series the mapping does not make of
  what is declared here.
"""

from __future__ import annotations

import datetime as dt
import logging
import os
import re
import statistics
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

log = logging.getLogger(__name__)

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


STEP_DURATION = Metric(
    "nexus.step.duration", TIMER, ("tenant", "step", "outcome"), "ms",
    "a step (task) of a tenant's cutover or Field History run, from its first start (a deferred or rescheduled "
    "wait included) to its end; outcome success or failed")
ADMISSION_PAUSE = Metric(
    "nexus.admission.pause", TIMER, ("tenant",), "ms",
    "the tenant's admission pause: its cutover fence's ReleasedAt - ArmedAt as the fence row records them, "
    "sent once, by the run that released it")
LOCK_WAIT = Metric(
    "nexus.lock.wait", TIMER, ("tenant", "step"), "ms",
    "time a locked step spent taking its _System_Lock rows (every transaction and retry of the step together)")
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
    "nexus.ledger.pending", GAUGE, (), "events",
    "delivery-ledger events waiting in this machine's spool, after each record call")

#: Every metric of the project, in the runbook's order.
ALL = (STEP_DURATION, STEP_FAILED, ADMISSION_PAUSE, FENCE_ARMED_AT, LOCK_WAIT, DRAIN_REMAINING, DRAIN_RATE, DRAIN_ETA,
       DIGEST_ROWS_PER_S, ROLLOUT_TENANTS, WAVE_ETA, ROLLOUT_HALTED, LEDGER_SPOOLED, LEDGER_CAUGHT_UP, LEDGER_PENDING)

_UNSAFE = re.compile(r"[^A-Za-z0-9_-]")


def name_safe(value: Any) -> str:
    """A tag value as one segment of a metric name (Airflow's rule for its legacy names, then its character set)."""
    return _UNSAFE.sub("_", str(value).replace(".", "__"))[:100] or "_"


def named(metric: Metric, tags: dict[str, Any]) -> str:
    """The name with the tag values appended in the declared order (the form plain StatsD keeps per tenant)."""
    return ".".join([metric.name, *(name_safe(tags[t]) for t in metric.tags)])


_initialized_in: int | None = None  # the pid whose metrics client this module initialized


def _stats():
    """Airflow 3.3's metrics client (``airflow.sdk.observability.stats``, its public module; ``airflow.stats`` is a
    deprecated shim of it), initialized from ``[metrics]`` once per process by this module: a task process Airflow
    already initialized gets the same factory again (harmless: the client is built on first use), a bare script
    gets one at all. Nothing private of Airflow's is read."""
    global _initialized_in
    from airflow.sdk.observability import stats

    if _initialized_in != os.getpid():
        from airflow.sdk.configuration import conf
        from airflow.sdk.observability.metrics import stats_utils

        stats.initialize(factory=stats_utils.get_stats_factory(),
                         export_legacy_names=conf.getboolean("metrics", "legacy_names_on", fallback=True))
        _initialized_in = os.getpid()
    return stats


def _legacy_names_on() -> bool:
    from airflow.sdk.configuration import conf

    return conf.getboolean("metrics", "legacy_names_on", fallback=True)


def emit(metric: Metric, value: float | None, **tags: Any) -> None:
    """Send ``value`` (seconds for a timer, sent in ms; the unit for a gauge; a count for a counter) with exactly the
    declared tags.

    Nothing is sent for ``None``. Never raises: a metric must not fail a step.
    """
    if value is None:
        return
    try:
        if set(tags) != set(metric.tags):
            raise ValueError(f"{metric.name} takes tags {metric.tags}, given {sorted(tags)}")
        stats = _stats()
        clean = {k: str(v) for k, v in tags.items()}
        names = [metric.name] + ([named(metric, tags)] if _legacy_names_on() and metric.tags else [])
        for i, name in enumerate(names):
            kw = {"tags": clean} if i == 0 else {}
            if metric.kind == TIMER:
                stats.timing(name, float(value) * 1000.0, **kw)
            elif metric.kind == COUNTER:
                stats.incr(name, int(value), **kw)
            else:
                stats.gauge(name, float(value), **kw)
    except Exception as exc:  # noqa: BLE001 - a metric never fails a step
        log.warning("metric %s not sent: %s", metric.name, exc)


# --- what a step's result says ----------------------------------------------------------------------------------

#: A fence step's outcomes after which the run holds the fence (``nexus.fence.armed_at`` is its ArmedAt).
FENCE_HELD_OUTCOMES = ("armed", "adopted", "reused")


def step_figures(step: str, result: Any) -> list[tuple[Metric, float]]:
    """The figures a step's own result carries: the admission pause of a release (and the fence's arming time set
    back to 0), the arming time of a fence the run armed, adopted or kept, the digest's rows per second."""
    if not isinstance(result, dict):
        return []
    out: list[tuple[Metric, float]] = []
    outcome = result.get("outcome")
    if outcome == "released" and result.get("admission_pause_s") is not None:
        out.append((ADMISSION_PAUSE, float(result["admission_pause_s"])))
        out.append((FENCE_ARMED_AT, 0.0))
    if outcome in FENCE_HELD_OUTCOMES and result.get("armed_at") is not None:
        out.append((FENCE_ARMED_AT, epoch_seconds(result["armed_at"])))
    rows, seconds = result.get("rows"), result.get("seconds")
    if step == "history_digest" and isinstance(rows, dict) and seconds:
        out.append((DIGEST_ROWS_PER_S, sum(int(r) for r in rows.values()) / float(seconds)))
    return out


def epoch_seconds(value: Any) -> float:
    """A stored time (naive UTC, as the tenant's columns hold it; a datetime or its ISO text) as seconds since the
    epoch."""
    when = value if isinstance(value, dt.datetime) else dt.datetime.fromisoformat(str(value))
    return (when if when.tzinfo else when.replace(tzinfo=dt.UTC)).timestamp()


#: A stop's exit code (:class:`nexus_airflow.base.TaskStopped`, the command line's) -> its reason.
_STOP_REASONS = {2: "bad_input", 3: "refused", 4: "timeout"}
FAILURE_REASONS = ("refused", "bad_input", "timeout", "error")


def failure_reason(exc: BaseException | None) -> str:
    """Why a step failed, in :data:`FAILURE_REASONS`: a stop by its exit code (2 bad input, 3 refused, 4 timeout),
    an Airflow timeout (a sensor's or the task's ``execution_timeout``) as ``timeout``, anything else ``error``."""
    if isinstance(exc, SystemExit) and isinstance(exc.code, int) and exc.code in _STOP_REASONS:
        return _STOP_REASONS[exc.code]
    if exc is not None and "Timeout" in type(exc).__name__:
        return "timeout"
    return "error"


def emit_step(tenant: str, step: str, outcome: str, seconds: float | None, result: Any = None,
              lock_wait_s: float | None = None, reason: str | None = None) -> None:
    """Every figure of one ended step (the one call of the DAGs' step hooks); a failed step's ``reason`` counted."""
    emit(STEP_DURATION, seconds, tenant=tenant, step=step, outcome=outcome)
    if outcome == "failed":
        emit(STEP_FAILED, 1, tenant=tenant, step=step, reason=reason or "error")
    emit(LOCK_WAIT, lock_wait_s, tenant=tenant, step=step)
    for metric, value in step_figures(step, result):
        emit(metric, value, tenant=tenant)


# --- rollout ----------------------------------------------------------------------------------------------------

def rollout_progress(total: int, done: int, failed: int, elapsed_s: float | None) -> dict[str, float | int | None]:
    """Tenants by state and the ETA of the rollout's end at the measured pace (None before a tenant ended, or
    with no elapsed time known)."""
    ended = done + failed
    waiting = max(0, total - ended)
    eta = 0.0 if waiting == 0 else (elapsed_s / ended * waiting if ended and elapsed_s is not None else None)
    return {"done": done, "failed": failed, "waiting": waiting, "eta_s": eta}


def emit_rollout(rollout: str, progress: dict[str, Any], *, halted: bool = False) -> None:
    """A wave close's figures: tenants by state, the ETA, whether this close halted the rollout."""
    for state in ("done", "failed", "waiting"):
        emit(ROLLOUT_TENANTS, progress[state], rollout=rollout, state=state)
    emit(WAVE_ETA, progress["eta_s"], rollout=rollout)
    emit(ROLLOUT_HALTED, 1 if halted else 0, rollout=rollout)


def pause_summary(pauses: Iterable[float]) -> dict[str, float | int] | None:
    """Median, p95 (nearest rank) and max of admission pauses in seconds; None without any."""
    values = sorted(pauses)
    if not values:
        return None
    p95 = values[max(0, -(-95 * len(values) // 100) - 1)]
    return {"tenants": len(values), "median_s": round(statistics.median(values), 3), "p95_s": round(p95, 3),
            "max_s": round(values[-1], 3)}

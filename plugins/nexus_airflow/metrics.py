"""The ``nexus.*`` metrics through Airflow's own metrics client: the one way a task sends them.

The metrics are declared, and what each event of a run says as figures is decided, in the domain
(:mod:`nexus_cutover.metrics`: re-exported here); this module only sends them.

Invariants:

* Emitted only through Airflow's own metrics client (``airflow.sdk.observability.stats``, the Task SDK's
  ``Stats``), so StatsD, Datadog or OpenTelemetry, as ``[metrics]`` configures them, all receive them and
  ``[metrics]`` allow/block lists apply. A process where Airflow never initialized that client (a bare
  script) initializes it once from ``[metrics]``, as the task runner does.
* Each figure is sent twice, as Airflow sends its own metrics: the bare name with its tags and, while
  ``[metrics] legacy_names_on`` (Airflow's default), the name with the tag values appended in the declared order
  (:func:`~nexus_cutover.metrics.named`).
* A metric never fails or slows a step: an emission error is logged and dropped (UDP is fire-and-forget).
* Sent from few places: every step's events through its recorder (:func:`nexus_airflow.ledger.recorder_for`: the
  sink :class:`~nexus_cutover.recording.MetricsSink` calls :func:`emit`), a wait's trigger that ended its step
  (:mod:`nexus_airflow.triggers`), the rollout's wave close (:func:`emit_rollout`) and the delivery ledger's spool.
"""

from __future__ import annotations

import logging
import os
from typing import Any

from nexus_cutover.metrics import *  # noqa: F403 - the declarations, re-exported for the adapter and its tests
from nexus_cutover.metrics import COUNTER, ROLLOUT_HALTED, ROLLOUT_TENANTS, TIMER, WAVE_ETA, Metric, named

log = logging.getLogger(__name__)

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


# --- rollout ----------------------------------------------------------------------------------------------------

def emit_rollout(rollout: str, progress: dict[str, Any], *, halted: bool = False) -> None:
    """A wave close's figures: tenants by state, the ETA, whether this close halted the rollout."""
    for state in ("done", "failed", "waiting"):
        emit(ROLLOUT_TENANTS, progress[state], rollout=rollout, state=state)
    emit(WAVE_ETA, progress["eta_s"], rollout=rollout)
    emit(ROLLOUT_HALTED, 1 if halted else 0, rollout=rollout)

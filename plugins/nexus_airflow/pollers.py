"""Pollers for :class:`~nexus_airflow.triggers.StatusPollTrigger`: drain, old writers, new-host readiness.

Each poller opens an engine from an Airflow connection id (never a DSN), reads
one domain status per ``poll()`` and returns a JSON-serializable dict:
``state`` (``waiting`` or a final state), ``message`` (one progress line) and
``report`` (the domain object's ``as_json()``). Deadlines are ISO-8601 naive
UTC strings, so a trigger restarted on another triggerer keeps the same bound.
Read only: nothing here writes to the tenant database.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from nexus_airflow.triggers import WAITING


def _utcnow() -> dt.datetime:
    from nexus_cutover.clock import utcnow  # the one clock; imported at run time (DAG files import this module)

    return utcnow()


def _parse(deadline: str) -> dt.datetime:
    value = dt.datetime.fromisoformat(deadline)
    return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo else value


def deadline_in(seconds: float) -> str:
    return (_utcnow() + dt.timedelta(seconds=seconds)).isoformat()


class _EnginePoller:
    def __init__(self, conn_id: str, namespace: str, deadline: str, stale_heartbeat_s: float):
        from nexus_airflow.hooks import NexusTenantHook

        self.namespace = namespace
        self.deadline = _parse(deadline)
        self.stale = dt.timedelta(seconds=float(stale_heartbeat_s))
        # no idle connection between polls: a triggerer may hold thousands of waiting tenants
        self.engine = NexusTenantHook(conn_id).get_engine(pooled=False)

    def close(self) -> None:
        self.engine.dispose()

    def expired(self) -> bool:
        return _utcnow() >= self.deadline


class DrainPoller(_EnginePoller):
    """Old projection work of the namespace: ``drained``, ``stuck`` (with blockers) or ``waiting``."""

    def __init__(self, conn_id: str, namespace: str, deadline: str, stale_heartbeat_s: float,
                 initial_remaining: int | None = None, sample_limit: int = 200):
        super().__init__(conn_id, namespace, deadline, stale_heartbeat_s)
        self.initial = initial_remaining
        self.previous: int | None = initial_remaining
        self.sample_limit = sample_limit
        self.range_column: bool | None = None  # probed once: the column never disappears

    def poll(self) -> dict[str, Any]:
        from nexus_cutover import catalog
        from nexus_cutover.projection import steps
        from nexus_cutover.schema import has_column

        if not self.range_column:
            self.range_column = has_column(self.engine, catalog.INPUT_START_ORDINAL)
        report = steps.drain(
            self.engine, self.namespace, deadline=self.deadline, stale_heartbeat=self.stale,
            sample_limit=self.sample_limit, range_column=self.range_column,
        )
        remaining = report.remaining
        trend = []
        if self.previous is not None:
            trend.append(f"{remaining - self.previous:+d} since last poll")
        if self.initial is not None:
            trend.append(f"{remaining - self.initial:+d} since start")
        if self.initial is None:
            self.initial = remaining
        self.previous = remaining
        state = {"drained": "drained", "stuck": "stuck", "draining": WAITING}[report.state]
        message = report.counts_text() + (f"; {', '.join(trend)}" if trend else "")
        if report.live_old_workers:
            message += f"; live old projection_workers: {len(report.live_old_workers)}"
        return {"state": state, "message": message, "remaining": remaining,
                "report": report.as_json(), "report_text": report.report_text()}


class OldWritersPoller(_EnginePoller):
    """Old-protocol writers: ``stopped`` when all are stopped or silent, ``timed_out`` at the deadline."""

    def poll(self) -> dict[str, Any]:
        from nexus_cutover.projection import steps

        ev = steps.writer_evidence(self.engine, self.namespace, stale_heartbeat=self.stale)
        live = [p["process_id"] for p in ev.live]
        if not live:
            state, message = "stopped", f"every old-protocol writer of {self.namespace!r} is stopped or silent"
        else:
            state = "timed_out" if self.expired() else WAITING
            message = f"{len(live)} old-protocol writer(s) still live: {', '.join(live[:20])}; stop them (keep the fence)"
        return {"state": state, "message": message, "report": ev.as_json(), "report_text": ev.as_markdown()}


class ReadinessPoller(_EnginePoller):
    """New host readiness: ``ready``, ``timed_out`` at the deadline, else ``waiting``."""

    def poll(self) -> dict[str, Any]:
        from nexus_cutover.projection import steps

        r = steps.readiness(self.engine, self.namespace, stale_heartbeat=self.stale)
        if r.ready:
            state, message = "ready", f"ready: activated integration_host(s) {', '.join(h['process_id'] for h in r.ready_hosts)}"
        else:
            state = "timed_out" if self.expired() else WAITING
            message = "not ready: " + "; ".join(r.reasons)
        return {"state": state, "message": message, "report": r.as_json(), "report_text": message}

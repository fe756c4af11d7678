"""Recent samples per tenant, for the drain chart and its ETA: kept in this API-server process only.

Each read of a tenant (``tenants.StateCache``) adds at most one sample per tenant
every ``MIN_SPACING_S`` seconds; at most ``MAX_SAMPLES`` are kept (a ring). The
drain rate and ETA (:func:`drain_eta`) are measured over the samples of the
last ``RATE_WINDOW_S`` seconds, with the drain poller's formula
(``nexus_airflow.pollers.measured_rate``: one rule for the log line and the page). Nothing
is persisted: a restarted API server starts a new chart (the tenant database
stays the record of truth; the chart only shows the trend while someone looks).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from typing import Any

MIN_SPACING_S = 4.0
MAX_SAMPLES = 360
RATE_WINDOW_S = 600.0

_lock = threading.Lock()
_samples: dict[str, deque] = {}


def record(tenant: str, state: dict[str, Any], now: float | None = None) -> list[dict[str, Any]]:
    """Add a sample of ``state`` (if due) and return the tenant's samples, oldest first."""
    now = time.time() if now is None else now
    drain = state.get("drain", {})
    fh = state.get("field_history", {})
    receipts = state.get("receipts", {})
    sample = {
        "t": round(now, 1),
        "remaining": drain.get("remaining"),
        "receipts_materialized": receipts.get("materialized"),
        "fh_decided": fh.get("decided_rows"),
    }
    with _lock:
        ring = _samples.setdefault(tenant, deque(maxlen=MAX_SAMPLES))
        if not ring or now - ring[-1]["t"] >= MIN_SPACING_S:
            ring.append(sample)
        return list(ring)


def samples(tenant: str) -> list[dict[str, Any]]:
    """The tenant's samples, oldest first (none if it was never read by this process)."""
    with _lock:
        return list(_samples.get(tenant, ()))


def drain_eta(points: list[dict[str, Any]]) -> dict[str, Any]:
    """``{"remaining", "rate_per_min", "eta_min", "text"}`` from samples (the last ``RATE_WINDOW_S`` of them)."""
    from nexus_airflow.pollers import eta_minutes, eta_text, measured_rate

    pts = [(p["t"], p["remaining"]) for p in points if p.get("remaining") is not None]
    if not pts:
        return {"remaining": None, "rate_per_min": None, "eta_min": None, "text": "no drain sample yet"}
    recent = [p for p in pts if p[0] >= pts[-1][0] - RATE_WINDOW_S]
    rate = measured_rate(recent)
    remaining = pts[-1][1]
    return {"remaining": remaining, "rate_per_min": None if rate is None else round(rate, 2),
            "eta_min": eta_minutes(remaining, rate), "text": eta_text(remaining, rate)}


def reset() -> None:
    with _lock:
        _samples.clear()

"""Recent samples per tenant, for the drain chart: kept in this API-server process only.

Each read of the status JSON adds at most one sample per tenant every
``MIN_SPACING_S`` seconds; at most ``MAX_SAMPLES`` are kept (a ring). Nothing
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


def reset() -> None:
    with _lock:
        _samples.clear()

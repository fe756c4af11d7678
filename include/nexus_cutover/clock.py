"""The project's one clock: naive UTC, as the tenant's ``DATETIME(6)`` columns store it.

Timestamps are for display and diagnosis, and for the few rules the contract
states in wall-clock terms (heartbeat freshness, lease expiry, fence expiry,
a retry's due time); they never decide membership, ownership or eligibility.
"""

from __future__ import annotations

import datetime as dt


def utcnow() -> dt.datetime:
    """Now, in UTC, without tzinfo (the form stored in and compared with the tenant's columns)."""
    return dt.datetime.now(dt.UTC).replace(tzinfo=None)

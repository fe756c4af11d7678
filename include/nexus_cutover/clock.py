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


def utc_text(value: dt.datetime | str | None) -> str:
    """A stored (naive UTC) time as a person reads it, with its zone: ``2026-12-04 01:28:03 UTC`` (seconds; None as
    ``-``). A string is an ISO time as this project serializes them."""
    if value is None:
        return "-"
    when = dt.datetime.fromisoformat(value) if isinstance(value, str) else value
    if when.tzinfo is not None:
        when = when.astimezone(dt.UTC).replace(tzinfo=None)
    return when.strftime("%Y-%m-%d %H:%M:%S UTC")

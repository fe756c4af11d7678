"""When an admission fence, or an override of one, is in force (contract, ``_System_AdmissionFence``).

The one definition both the cutover (which arms and releases the fence) and
the runtimes (which refuse admission behind it) use:

* a fence is in force while ``ReleasedAt IS NULL`` and (``ExpiresAt IS NULL`` or in the future);
* an override is active while ``RevokedAt IS NULL`` and (``ExpiresAt IS NULL`` or in the future);
* the cutover's own fence is a namespace-wide (``*``), non-expiring one (:func:`is_cutover_fence`).

``now`` is the caller's clock: the contract defines "in force" by it; it decides no membership.
"""

from __future__ import annotations

import datetime as dt

from sqlalchemy import ColumnElement, and_, or_

from .catalog import FENCE_SCOPE_ALL, AdmissionFence, AdmissionFenceOverride


def fence_in_force(now: dt.datetime) -> ColumnElement[bool]:
    f = AdmissionFence.c
    return and_(f.ReleasedAt.is_(None), or_(f.ExpiresAt.is_(None), f.ExpiresAt > now))


def override_active(now: dt.datetime) -> ColumnElement[bool]:
    o = AdmissionFenceOverride.c
    return and_(o.RevokedAt.is_(None), or_(o.ExpiresAt.is_(None), o.ExpiresAt > now))


def is_cutover_fence(scope: str, expires_at: dt.datetime | None) -> bool:
    """The cutover's fence: namespace-wide (``Scope = '*'``) and non-expiring (``ExpiresAt IS NULL``)."""
    return scope == FENCE_SCOPE_ALL and expires_at is None

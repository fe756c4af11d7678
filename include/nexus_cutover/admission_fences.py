"""When an admission fence, or an override of one, is in force (contract, ``_System_AdmissionFence``).

The one definition both the cutover (which arms and releases the fence) and
the runtimes (which refuse admission behind it) use:

* a fence is in force while ``ReleasedAt IS NULL`` and (``ExpiresAt IS NULL`` or in the future);
* an override is active while ``RevokedAt IS NULL`` and (``ExpiresAt IS NULL`` or in the future);
* the cutover's own fence is a namespace-wide (``*``), non-expiring one (:func:`is_cutover_fence`).

The fences of a namespace in force (:func:`fences_in_force`, on ix_AdmissionFence_Namespace) and the cutover
fences among them (:func:`cutover_fences`) are read here too, once, for the fence's arming and releasing
(:mod:`nexus_cutover.projection.cutover_fence`), the checkpoint's precondition, the standing
(:mod:`nexus_cutover.standing`) and the status view; they write nothing.

``now`` is the caller's clock: the contract defines "in force" by it; it decides no membership.
"""

from __future__ import annotations

import datetime as dt
from typing import Any

from sqlalchemy import ColumnElement, Connection, Row, and_, or_, select

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


def row_as_json(row: Row[Any]) -> dict[str, Any]:
    """A fence (or override) row as a dict, its datetimes as ISO text: what results, refusals and XComs carry."""
    return {k: v.isoformat() if isinstance(v, dt.datetime) else v for k, v in row._mapping.items()}


def fences_in_force(conn: Connection, namespace: str, now: dt.datetime, *, for_update: bool = False) -> list[dict[str, Any]]:
    """Every fence of the namespace in force at ``now`` (on ix_AdmissionFence_Namespace); ``for_update``: locked."""
    stmt = (
        select(AdmissionFence)
        .where(AdmissionFence.c.Namespace == namespace, fence_in_force(now))
        .order_by(AdmissionFence.c.FenceId)
    )
    return [row_as_json(r) for r in conn.execute(stmt.with_for_update() if for_update else stmt).all()]


def cutover_fences(fences: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The cutover fences (non-expiring ``*``) among ``fences`` (rows as :func:`fences_in_force` reads them)."""
    return [f for f in fences if is_cutover_fence(f["Scope"], f["ExpiresAt"])]

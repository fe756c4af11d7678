"""The namespace-wide admission fence of the cutover (steps 1 and 5).

Invariants (seed 000, "Existing-data cutover"; contract, ``_System_AdmissionFence``):

* The cutover fence is one non-expiring (``ExpiresAt IS NULL``) fence with
  ``Scope = '*'`` on the namespace. Arming reuses an identical fence already in
  force (lowest FenceId), so reruns converge on one fence.
* A rerun after the cutover completed does not fence the tenant again: when
  every pack of the run already has its protocol row and no cutover fence is in
  force, arming reports ``not_needed`` with the last released cutover fence.
* Arming refuses while any override of a fence in force in the namespace is
  active (``RevokedAt IS NULL`` and not expired); it lists them and revokes
  nothing. A refusal writes nothing.
* Releasing sets ``ReleasedAt``/``ReleasedBy`` on the cutover fence only; a fence
  that is already released is a no-op success. Nothing here deletes a row.
* Every write happens under the namespace lifecycle lock, inside a bounded
  :class:`~nexus_cutover.db.Deadline`. A dry run only reads: it takes no lock
  and creates no lock row.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update

from .. import catalog
from ..catalog import AdmissionFence, AdmissionFenceOverride, ConnectorProjectionProtocol
from ..clock import utcnow
from ..db import Deadline, translate_errors
from ..errors import BadInput, Refused
from ..fencing import fence_in_force, override_active
from ..locks import lifecycle_lock_names, locked_transaction
from ..protocol_row import read_protocol_row
from ..schema import has_table

FENCE_REASON = "connector projection range cutover"


def _iso(value: Any) -> Any:
    return value.isoformat() if isinstance(value, dt.datetime) else value


def fences_in_force(conn: Connection, namespace: str, now: dt.datetime) -> list[dict[str, Any]]:
    """Every fence of the namespace in force at ``now`` (on ix_AdmissionFence_Namespace)."""
    rows = conn.execute(
        select(AdmissionFence)
        .where(AdmissionFence.c.Namespace == namespace, fence_in_force(now))
        .order_by(AdmissionFence.c.FenceId)
    ).all()
    return [{k: _iso(v) for k, v in r._mapping.items()} for r in rows]


def active_overrides(conn: Connection, namespace: str, now: dt.datetime) -> list[dict[str, Any]]:
    """Active overrides of fences in force in the namespace (read only; nothing is revoked)."""
    fence_ids = [f["FenceId"] for f in fences_in_force(conn, namespace, now)]
    if not fence_ids:
        return []
    o = AdmissionFenceOverride
    rows = conn.execute(
        select(o)
        .where(
            o.c.FenceId.in_(fence_ids),
            override_active(now),
        )
        .order_by(o.c.OverrideId)
    ).all()
    return [{k: _iso(v) for k, v in r._mapping.items()} for r in rows]


def _is_cutover_fence(fence: dict[str, Any]) -> bool:
    return fence["Scope"] == catalog.FENCE_SCOPE_ALL and fence["ExpiresAt"] is None


class ActiveOverrides(Refused):
    """Arming refused: overrides would let sources through the fence."""

    def __init__(self, namespace: str, overrides: list[dict[str, Any]]):
        self.overrides = overrides
        listed = "; ".join(
            f"OverrideId={o['OverrideId']} FenceId={o['FenceId']} Scope={o['Scope']!r} CreatedBy={o['CreatedBy']!r}"
            for o in overrides
        )
        super().__init__(
            f"namespace {namespace!r} has {len(overrides)} active admission fence override(s): {listed}. "
            "The cutover needs a namespace-wide fence with no active overrides; it revokes nothing. "
            "Have the L2 delivery owner revoke or let them expire, then rerun arm_fence."
        )


@dataclass
class FenceResult:
    """What arming/releasing did (``outcome``) and on which fence."""

    namespace: str
    outcome: str  # armed | reused | not_needed | would_arm | would_reuse | released | already_released | would_release
    fence_id: int | None
    other_fences_in_force: list[dict[str, Any]] = field(default_factory=list)

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "outcome": self.outcome,
            "fence_id": self.fence_id,
            "other_fences_in_force": self.other_fences_in_force,
        }


def arm_fence(
    engine: Engine,
    namespace: str,
    *,
    armed_by: str,
    timeout_s: float,
    dry_run: bool = False,
    reason: str = FENCE_REASON,
    packs: Iterable[str] = (),
) -> FenceResult:
    """Arm (or reuse) the namespace's non-expiring ``*`` fence; :class:`ActiveOverrides` if any override is active.

    ``packs``: the run's packs; when all are already checkpointed and no cutover
    fence is in force, nothing is armed (``not_needed``).
    """
    packs = sorted(set(packs))
    if dry_run:  # read only: not even the lock rows are created
        with translate_errors("checking the admission fence"), engine.connect() as conn:
            return _arm(conn, namespace, armed_by, reason, packs, dry_run=True)
    with (
        translate_errors("arming the admission fence"),
        locked_transaction(engine, lifecycle_lock_names(namespace), Deadline(timeout_s)) as conn,
    ):
        return _arm(conn, namespace, armed_by, reason, packs, dry_run=False)


def _all_checkpointed(conn: Connection, packs: list[str]) -> bool:
    if not packs or not has_table(conn, ConnectorProjectionProtocol.name):
        return False
    return all(read_protocol_row(conn, p) is not None for p in packs)


def last_released_cutover_fence(conn: Connection, namespace: str) -> dict[str, Any] | None:
    row = conn.execute(
        select(AdmissionFence)
        .where(
            AdmissionFence.c.Namespace == namespace,
            AdmissionFence.c.ReleasedAt.isnot(None),
            AdmissionFence.c.Scope == catalog.FENCE_SCOPE_ALL,
            AdmissionFence.c.ExpiresAt.is_(None),
        )
        .order_by(AdmissionFence.c.FenceId.desc())
        .limit(1)
    ).first()
    return None if row is None else {k: _iso(v) for k, v in row._mapping.items()}


def _arm(conn: Connection, namespace: str, armed_by: str, reason: str, packs: list[str], *, dry_run: bool) -> FenceResult:
    now = utcnow()
    overrides = active_overrides(conn, namespace, now)
    if overrides:
        raise ActiveOverrides(namespace, overrides)
    fences = fences_in_force(conn, namespace, now)
    existing = next((f for f in fences if _is_cutover_fence(f)), None)
    others = [f for f in fences if existing is None or f["FenceId"] != existing["FenceId"]]
    if existing is not None:
        return FenceResult(namespace, "would_reuse" if dry_run else "reused", existing["FenceId"], others)
    if _all_checkpointed(conn, packs):
        last = last_released_cutover_fence(conn, namespace)
        return FenceResult(namespace, "not_needed", last["FenceId"] if last else None, others)
    if dry_run:
        return FenceResult(namespace, "would_arm", None, others)
    result = conn.execute(
        insert(AdmissionFence).values(
            Namespace=namespace,
            Scope=catalog.FENCE_SCOPE_ALL,
            Reason=reason[:255],
            ArmedBy=armed_by[:128],
            ArmedAt=now,
            ExpiresAt=None,
            ReleasedAt=None,
            ReleasedBy=None,
        )
    )
    return FenceResult(namespace, "armed", int(result.inserted_primary_key[0]), others)


def fence_row(conn: Connection, fence_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(AdmissionFence).where(AdmissionFence.c.FenceId == fence_id)).first()
    return None if row is None else {k: _iso(v) for k, v in row._mapping.items()}


def release_fence(
    engine: Engine,
    namespace: str,
    fence_id: int,
    *,
    released_by: str,
    timeout_s: float,
    dry_run: bool = False,
) -> FenceResult:
    """Release the cutover fence ``fence_id`` (set ReleasedAt); already released is a no-op success."""
    if dry_run:
        with translate_errors("checking the admission fence"), engine.connect() as conn:
            return _release(conn, namespace, fence_id, released_by, dry_run=True)
    with (
        translate_errors("releasing the admission fence"),
        locked_transaction(engine, lifecycle_lock_names(namespace), Deadline(timeout_s)) as conn,
    ):
        return _release(conn, namespace, fence_id, released_by, dry_run=False)


def _release(conn: Connection, namespace: str, fence_id: int, released_by: str, *, dry_run: bool) -> FenceResult:
    now = utcnow()
    fence = fence_row(conn, fence_id)
    if fence is None or fence["Namespace"] != namespace:
        raise BadInput(f"admission fence {fence_id} does not exist in namespace {namespace!r}")
    if not _is_cutover_fence(fence):
        raise BadInput(f"admission fence {fence_id} is not a non-expiring '*' cutover fence; it is left as is")
    others = [f for f in fences_in_force(conn, namespace, now) if f["FenceId"] != fence_id]
    if fence["ReleasedAt"] is not None:
        return FenceResult(namespace, "already_released", fence_id, others)
    if dry_run:
        return FenceResult(namespace, "would_release", fence_id, others)
    conn.execute(
        update(AdmissionFence)
        .where(AdmissionFence.c.FenceId == fence_id, AdmissionFence.c.ReleasedAt.is_(None))
        .values(ReleasedAt=now, ReleasedBy=released_by[:128])
    )
    return FenceResult(namespace, "released", fence_id, others)


def cutover_fence_in_force(bind: Engine | Connection, namespace: str) -> dict[str, Any] | None:
    """The namespace's non-expiring ``*`` fence in force (lowest FenceId), if any."""
    if isinstance(bind, Engine):
        with bind.connect() as conn:
            return cutover_fence_in_force(conn, namespace)
    return next((f for f in fences_in_force(bind, namespace, utcnow()) if _is_cutover_fence(f)), None)

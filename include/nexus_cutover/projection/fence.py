"""The namespace-wide admission fence of the cutover (steps 1 and 5).

Invariants (seed 000, "Existing-data cutover"; contract, ``_System_AdmissionFence``):

* The cutover fence is one non-expiring (``ExpiresAt IS NULL``) fence with
  ``Scope = '*'`` on the namespace (:func:`~nexus_cutover.fencing.is_cutover_fence`).
  Arming reuses the one already in force, so reruns converge on one fence.
* One cutover per tenant (contract, "One cutover per tenant at a time"): the
  fence records its holder in ``ArmedBy``. Arming again as the same holder
  reuses it; a fence whose holder is still at work (``holder_active``) is
  refused with :class:`FenceHeld`, naming the holder, and nothing is written;
  a fence left by a finished or failed holder is adopted (``ArmedBy`` set to the
  new holder). Releasing is allowed only to the fence's holder.
* A rerun after the cutover completed does not fence the tenant again: when
  every pack of the run already has its protocol row and no cutover fence is in
  force, arming reports ``not_needed`` with the last released cutover fence.
* Arming refuses while any override of a fence in force in the namespace is
  active (``RevokedAt IS NULL`` and not expired); it lists them and revokes
  nothing. A refusal writes nothing.
* Releasing sets ``ReleasedAt``/``ReleasedBy`` on the cutover fence only; a fence
  that is already released is a no-op success. Nothing here deletes a row.
* Every decision is re-read and every write made in one transaction of the
  policy (:func:`nexus_cutover.tx.run`: READ COMMITTED) holding the namespace
  lifecycle lock, inside a bounded :class:`~nexus_cutover.db.Deadline`. A dry
  run only reads: it takes no lock and creates no lock row.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update

from .. import catalog, tx
from ..catalog import AdmissionFence, AdmissionFenceOverride, ConnectorProjectionProtocol
from ..clock import utcnow
from ..db import Deadline, connection_of
from ..errors import BadInput, Refused
from ..fencing import fence_in_force, is_cutover_fence, override_active
from ..locks import lifecycle_lock_names
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
    return is_cutover_fence(fence["Scope"], fence["ExpiresAt"])


#: Whether the holder named in a fence's ``ArmedBy`` is still at work (e.g. an unfinished Airflow run).
HolderActive = Callable[[str], bool]


def _always_active(_holder: str) -> bool:
    return True


class FenceHeld(Refused):
    """Another holder, still at work, holds the namespace's cutover fence: this caller writes nothing."""

    def __init__(self, namespace: str, fence: dict[str, Any], caller: str):
        self.fence = fence
        self.holder = fence["ArmedBy"]
        super().__init__(
            f"namespace {namespace!r} is held by {self.holder!r} (cutover fence {fence['FenceId']} armed "
            f"{fence['ArmedAt']}), which has not finished: one cutover per tenant at a time. Nothing was written "
            f"by {caller!r}. Let that run finish (or fail), then run again; a finished run's fence is adopted."
        )


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
    #: armed | reused | adopted | not_needed | would_arm | would_reuse | would_adopt
    #: | released | already_released | would_release
    outcome: str
    fence_id: int | None
    other_fences_in_force: list[dict[str, Any]] = field(default_factory=list)
    previous_holder: str | None = None

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "outcome": self.outcome,
            "fence_id": self.fence_id,
            "previous_holder": self.previous_holder,
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
    holder_active: HolderActive = _always_active,
) -> FenceResult:
    """Arm, reuse or adopt the namespace's non-expiring ``*`` fence as holder ``armed_by``.

    Refuses with :class:`ActiveOverrides` if any override is active, and with
    :class:`FenceHeld` if another holder for which ``holder_active`` is true
    holds the fence (by default every other holder counts as active: only a
    caller that can tell, like the DAG, lets a finished holder's fence be adopted).
    ``packs``: the run's packs; when all are already checkpointed and no cutover
    fence is in force, nothing is armed (``not_needed``).
    """
    packs = sorted(set(packs))
    deadline = Deadline(timeout_s)
    if dry_run:  # read only: not even the lock rows are created
        return tx.read(
            engine, lambda conn: _arm(conn, namespace, armed_by, reason, packs, holder_active, dry_run=True),
            what="checking the admission fence", deadline=deadline,
        )
    return tx.run(
        engine, lambda conn: _arm(conn, namespace, armed_by, reason, packs, holder_active, dry_run=False),
        what="arming the admission fence", deadline=deadline, locks=lifecycle_lock_names(namespace),
    )


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
        # the latest release by time; the id only breaks ties (ids are not ordered across TiDB servers)
        .order_by(AdmissionFence.c.ReleasedAt.desc(), AdmissionFence.c.FenceId.desc())
        .limit(1)
    ).first()
    return None if row is None else {k: _iso(v) for k, v in row._mapping.items()}


def _cutover_fence_of(fences: list[dict[str, Any]], holder: str) -> dict[str, Any] | None:
    """The cutover fence among ``fences`` in force: the one ``holder`` holds, else any (there is normally one)."""
    cutover = [f for f in fences if _is_cutover_fence(f)]
    return next((f for f in cutover if f["ArmedBy"] == holder), cutover[0] if cutover else None)


def _arm(
    conn: Connection, namespace: str, armed_by: str, reason: str, packs: list[str], holder_active: HolderActive,
    *, dry_run: bool,
) -> FenceResult:
    now = utcnow()
    armed_by = armed_by[:128]
    overrides = active_overrides(conn, namespace, now)
    if overrides:
        raise ActiveOverrides(namespace, overrides)
    fences = fences_in_force(conn, namespace, now)
    existing = _cutover_fence_of(fences, armed_by)
    others = [f for f in fences if existing is None or f["FenceId"] != existing["FenceId"]]
    if existing is not None:
        fence_id = existing["FenceId"]
        if existing["ArmedBy"] == armed_by:
            return FenceResult(namespace, "would_reuse" if dry_run else "reused", fence_id, others)
        if holder_active(existing["ArmedBy"]):
            raise FenceHeld(namespace, existing, armed_by)
        if dry_run:
            return FenceResult(namespace, "would_adopt", fence_id, others, previous_holder=existing["ArmedBy"])
        conn.execute(
            update(AdmissionFence)
            .where(AdmissionFence.c.FenceId == fence_id, AdmissionFence.c.ArmedBy == existing["ArmedBy"])
            .values(ArmedBy=armed_by)
        )
        return FenceResult(namespace, "adopted", fence_id, others, previous_holder=existing["ArmedBy"])
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
            ArmedBy=armed_by,
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
    precondition: Callable[[Connection], None] | None = None,
) -> FenceResult:
    """Release the cutover fence ``fence_id`` (set ReleasedAt) as its holder ``released_by``.

    Already released is a no-op success; a fence held by another holder is
    refused with :class:`FenceHeld` (a run releases only the fence it armed or adopted).
    ``precondition(conn)`` runs inside the same locked transaction just before
    the release and refuses by raising (the caller's switch condition, e.g. readiness).
    """
    deadline = Deadline(timeout_s)
    if dry_run:
        return tx.read(
            engine, lambda conn: _release(conn, namespace, fence_id, released_by, None, dry_run=True),
            what="checking the admission fence", deadline=deadline,
        )
    return tx.run(
        engine, lambda conn: _release(conn, namespace, fence_id, released_by, precondition, dry_run=False),
        what="releasing the admission fence", deadline=deadline, locks=lifecycle_lock_names(namespace),
    )


def _release(
    conn: Connection, namespace: str, fence_id: int, released_by: str, precondition: Callable[[Connection], None] | None,
    *, dry_run: bool,
) -> FenceResult:
    now = utcnow()
    fence = fence_row(conn, fence_id)
    if fence is None or fence["Namespace"] != namespace:
        raise BadInput(f"admission fence {fence_id} does not exist in namespace {namespace!r}")
    if not _is_cutover_fence(fence):
        raise BadInput(f"admission fence {fence_id} is not a non-expiring '*' cutover fence; it is left as is")
    others = [f for f in fences_in_force(conn, namespace, now) if f["FenceId"] != fence_id]
    if fence["ReleasedAt"] is not None:
        return FenceResult(namespace, "already_released", fence_id, others)
    if fence["ArmedBy"] != released_by[:128]:
        raise FenceHeld(namespace, fence, released_by)
    if dry_run:
        return FenceResult(namespace, "would_release", fence_id, others)
    if precondition is not None:
        precondition(conn)
    conn.execute(
        update(AdmissionFence)
        .where(AdmissionFence.c.FenceId == fence_id, AdmissionFence.c.ReleasedAt.is_(None))
        .values(ReleasedAt=now, ReleasedBy=released_by[:128])
    )
    return FenceResult(namespace, "released", fence_id, others)


def cutover_fence_in_force(bind: Engine | Connection, namespace: str) -> dict[str, Any] | None:
    """The namespace's non-expiring ``*`` fence in force, if any (there is normally one)."""
    with connection_of(bind) as conn:
        return next((f for f in fences_in_force(conn, namespace, utcnow()) if _is_cutover_fence(f)), None)

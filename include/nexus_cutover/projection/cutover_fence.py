"""The namespace-wide admission fence of the cutover (steps 1 and 5), and who holds it.

Invariants (seed 000, "Existing-data cutover"; contract, ``_System_AdmissionFence`` and "One cutover per tenant
at a time"):

* The cutover fence is one non-expiring (``ExpiresAt IS NULL``) fence with
  ``Scope = '*'`` on the namespace (:func:`~nexus_cutover.admission_fences.is_cutover_fence`).
  Arming reuses the one already in force, so reruns converge on one fence.
  More than one cutover fence in force is a refusal naming every one of them
  (:class:`SeveralCutoverFences`), for arming, releasing and the checkpoint's
  precondition alike: which one holds the tenant is then not clear.
* The fence records its holder in ``ArmedBy``; holders are unique (every run
  and every command-line invocation its own) at any length: ``ArmedBy`` and
  ``ReleasedBy`` hold :func:`~nexus_cutover.holders.stored_holder`'s spelling,
  never a cut name, and holders are compared byte for byte in Python, never by
  the column's collation. Arming again as the same holder reuses it. Another holder's fence is adopted only when that holder is
  provably finished (``holder_state`` says :data:`HOLDER_FINISHED`: an Airflow
  run in a final state) or the person names it (``adopt``): a fence armed by
  hand or by a CLI invocation, whose state nobody here can read
  (:data:`HOLDER_UNKNOWN`), is never adopted silently. A holder still at work
  (:data:`HOLDER_ACTIVE`) is never adopted, named or not. Otherwise
  :class:`FenceHeld`, naming the holder and how to take over, and nothing is
  written. An adoption rewrites ``ArmedBy`` and records in ``Reason`` from whom
  and how.
* ``Reason`` records the product version of the code that armed the fence, or adopted it
  (:func:`~nexus_cutover.code_version.fence_reason`): a run on another version takes the tenant over only by
  adopting the fence, and the fence then says so; the same holder on another version does not reuse it
  (:func:`~nexus_cutover.code_version.check_reuse`, under the lock: nothing written).
* A rerun after the cutover completed does not fence the tenant again: when the
  tenant is cut over (:mod:`nexus_cutover.standing`: every pack of the run has
  its protocol row, no cutover fence is in force, no old work above a cutoff),
  arming reports ``not_needed`` with the last released cutover fence; when only
  old work above a cutoff stands in the way it refuses (:class:`OldWorkAboveCutoff`):
  that needs a separately reviewed recovery decision, not another fence.
* Arming refuses while any override of a fence in force in the namespace is
  active (``RevokedAt IS NULL`` and not expired); it lists them and revokes
  nothing. A refusal writes nothing.
* Releasing sets ``ReleasedAt``/``ReleasedBy`` on the cutover fence its caller
  holds, only: a fence another holder holds is :class:`FenceHeld`; a fence
  already released by this holder is a no-op success, one released by another
  holder is :class:`ReleasedByAnother` (not a success). Nothing here deletes a row.
* The admission pause of a released cutover fence is ``ReleasedAt - ArmedAt`` of its own row
  (:func:`admission_pause_s`), read back in the releasing transaction; never derived from ids.
* No call out of the process under the lock: what is known of the holder of
  the fence in force (``holder_state``: for the DAG, a call into Airflow) is
  asked after a read-only look and before the locked transaction, and passed
  into it as a value (:class:`HolderLook`). The locked transaction re-reads the
  fence; if it is not the one looked at (another fence, another holder: a run
  that armed or adopted it meanwhile), it rolls back, writing nothing, and the
  decision looks again (at most :data:`LOOKS` times, then :class:`FenceChanged`).
* Check where it is relied on: every decision is re-read and every write made
  in one transaction of the policy (:func:`nexus_cutover.tx.run`: READ
  COMMITTED) holding the namespace lifecycle lock, inside a bounded
  :class:`~nexus_cutover.db.Deadline`. The fence rows it decides on are read
  with ``SELECT ... FOR UPDATE`` (a session changing them by hand waits for the
  commit), every write is conditional on what was read (a row count other than
  one refuses, rolling back), and a release re-checks its precondition
  (readiness) after its write. ``between_check_and_act`` is a test seam only.
  A dry run only reads: it takes no lock and creates no lock row.

What it holds: arming (:func:`arm_fence`), releasing (:func:`release_fence`) and the reads of the fence rows. Beside
it, each re-exported here so importers keep ``from .cutover_fence import ...``: who holds the fence and who may take
it (:mod:`.cutover_fence_holders`), the refusals (:mod:`.cutover_fence_refusals`), and what arming and releasing did
(:mod:`.cutover_fence_result`).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update

from .. import catalog, tx
from ..above_cutoff import namespace_above_cutoff
from ..admission_fences import fences_in_force, is_cutover_fence, override_active, row_as_json
from ..catalog import AdmissionFence, AdmissionFenceOverride, ConnectorProjectionProtocol
from ..clock import utcnow
from ..code_version import check_reuse, fence_reason
from ..db import Deadline
from ..errors import BadInput
from ..holders import stored_holder
from ..locks import lifecycle_lock_names
from ..protocol_row import active_protocol_rows
from ..schema import has_table
from ..standing import is_cut_over
from .cutover_fence_holders import (  # noqa: F401 - re-exported: importers know these as cutover_fence's
    LOOKS,
    FenceMovedSinceTheLook,
    HolderLook,
    Holders,
    held_by_another,
    look_at_holder,
    the_cutover_fence,
)
from .cutover_fence_refusals import (  # noqa: F401 - re-exported: importers know these as cutover_fence's
    HOLDER_ACTIVE,
    HOLDER_FINISHED,
    HOLDER_UNKNOWN,
    TAKE_OVER,
    ActiveOverrides,
    FenceChanged,
    FenceHeld,
    HolderState,
    OldWorkAboveCutoff,
    ReleasedByAnother,
    SeveralCutoverFences,
    unknown_holders,
)
from .cutover_fence_result import FenceResult, admission_pause_s  # noqa: F401 - re-exported, as the others

FENCE_REASON = "connector projection range cutover"


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
    return [row_as_json(r) for r in rows]


#: A test seam called inside the locked transaction after every check and before the write (no product caller).
Seam = Callable[[Connection], None]


def arm_fence(
    engine: Engine,
    namespace: str,
    *,
    armed_by: str,
    timeout_s: float,
    dry_run: bool = False,
    reason: str | None = None,
    packs: Iterable[str] = (),
    holder_state: HolderState = unknown_holders,
    adopt: str | None = None,
    take_over: str = TAKE_OVER,
    between_check_and_act: Seam | None = None,
) -> FenceResult:
    """Arm, reuse or adopt the namespace's non-expiring ``*`` fence as holder ``armed_by`` (module invariants).

    Refuses with :class:`ActiveOverrides` if any override is active, :class:`SeveralCutoverFences` if more than
    one cutover fence is in force, and :class:`FenceHeld` if another holder holds the fence and may not be adopted
    (``holder_state`` / ``adopt``; ``take_over`` says how, ``{holder}`` filled in). ``packs``: the run's packs;
    when all are already checkpointed and no cutover fence is in force, nothing is armed (``not_needed``).
    ``reason``: the fence's ``Reason``, armed or adopted (default: :data:`FENCE_REASON` and the version of the code
    running, :func:`~nexus_cutover.code_version.fence_reason`).
    """
    packs = sorted(set(packs))
    reason = fence_reason(FENCE_REASON) if reason is None else reason
    deadline = Deadline(timeout_s)
    me = stored_holder(armed_by)
    for look in range(1, LOOKS + 1):
        decide = Holders(me, look_at_holder(engine, namespace, me, holder_state, deadline), adopt, take_over)
        try:
            if dry_run:  # read only: not even the lock rows are created
                return tx.read(
                    engine, lambda conn, decide=decide: _arm(conn, namespace, decide, reason, packs, dry_run=True, seam=None),
                    what="checking the admission fence", deadline=deadline,
                )
            return tx.run(
                engine,
                lambda conn, decide=decide: _arm(conn, namespace, decide, reason, packs, dry_run=False,
                                                 seam=between_check_and_act),
                what="arming the admission fence", deadline=deadline, locks=lifecycle_lock_names(namespace),
            )
        except FenceMovedSinceTheLook as moved:  # rolled back, nothing written: look again, with no lock held
            if look == LOOKS:
                raise moved.refusal from None
    raise AssertionError("unreachable")


def _all_checkpointed(conn: Connection, namespace: str, packs: list[str]) -> bool:
    """Whether every pack of the run has its protocol row: one statement for the namespace's active packs (never a
    statement per pack inside the locked transaction: a namespace may hold thousands)."""
    if not packs or not has_table(conn, ConnectorProjectionProtocol.name):
        return False
    have = active_protocol_rows(conn, namespace)
    return all(p in have for p in packs)


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
    return None if row is None else row_as_json(row)


def _one_row(conn: Connection, stmt, namespace: str, fence_id: int, what: str) -> None:
    """Run the conditional write ``stmt``; :class:`FenceChanged` (rolling back) unless it changed exactly one row."""
    if conn.execute(stmt).rowcount != 1:
        raise FenceChanged(namespace, fence_id, what)


def _arm(
    conn: Connection, namespace: str, decide: Holders, reason: str, packs: list[str], *, dry_run: bool,
    seam: Seam | None,
) -> FenceResult:
    now = utcnow()
    overrides = active_overrides(conn, namespace, now)
    if overrides:
        raise ActiveOverrides(namespace, overrides)
    fences = fences_in_force(conn, namespace, now, for_update=not dry_run)
    existing = the_cutover_fence(namespace, fences)
    others = [f for f in fences if existing is None or f["FenceId"] != existing["FenceId"]]
    if existing is not None:
        fence_id = existing["FenceId"]
        how = decide(namespace, existing)
        if how is None:
            check_reuse("arm_fence", existing, reason, go_on=f"go on as a new holder: {decide.take_over.format(holder=decide.me)}")
            return FenceResult(namespace, "would_reuse" if dry_run else "reused", fence_id, others, holder=decide.me,
                               armed_at=existing["ArmedAt"])
        previous = existing["ArmedBy"]
        if dry_run:
            return FenceResult(namespace, "would_adopt", fence_id, others, previous_holder=previous, holder=decide.me)
        if seam is not None:
            seam(conn)
        record = f"{reason}; adopted from {previous} ({how})"[:255]
        _one_row(conn, update(AdmissionFence)
                 .where(AdmissionFence.c.FenceId == fence_id, AdmissionFence.c.ArmedBy == previous,
                        AdmissionFence.c.ReleasedAt.is_(None))
                 .values(ArmedBy=decide.me, Reason=record), namespace, fence_id, "adopted")
        _still_one_cutover_fence(conn, namespace, now)
        return FenceResult(namespace, "adopted", fence_id, others, previous_holder=previous, holder=decide.me,
                           armed_at=existing["ArmedAt"])
    if _all_checkpointed(conn, namespace, packs):  # and no cutover fence in force: cut over, unless old work is above a cutoff
        above = [a for a in namespace_above_cutoff(conn, namespace) if a.pack_install_id in packs]
        if not is_cut_over(packs=len(packs), checkpointed=len(packs), cutover_fences=0, above_cutoff=len(above)):
            raise OldWorkAboveCutoff(namespace, above)
        last = last_released_cutover_fence(conn, namespace)
        if last is None:
            return FenceResult(namespace, "not_needed", None, others)
        # who cut the tenant over and when (the last released cutover fence): what a rerun says instead of cutting over
        return FenceResult(namespace, "not_needed", last["FenceId"], others, previous_holder=last.get("ArmedBy"),
                           armed_at=last.get("ArmedAt"), released_at=last.get("ReleasedAt"))
    if dry_run:
        return FenceResult(namespace, "would_arm", None, others, holder=decide.me)
    if seam is not None:
        seam(conn)
    result = conn.execute(
        insert(AdmissionFence).values(
            Namespace=namespace,
            Scope=catalog.FENCE_SCOPE_ALL,
            Reason=reason[:255],
            ArmedBy=decide.me,
            ArmedAt=now,
            ExpiresAt=None,
            ReleasedAt=None,
            ReleasedBy=None,
        )
    )
    fence_id = int(result.inserted_primary_key[0])
    _still_one_cutover_fence(conn, namespace, now)
    return FenceResult(namespace, "armed", fence_id, others, holder=decide.me, armed_at=now.isoformat())


def _still_one_cutover_fence(conn: Connection, namespace: str, now: dt.datetime) -> None:
    """After a write: another session may have armed a cutover fence by hand (no lock of ours stops an INSERT)
    since the read; then :class:`SeveralCutoverFences`, rolling this transaction back."""
    the_cutover_fence(namespace, fences_in_force(conn, namespace, now))


def fence_row(conn: Connection, fence_id: int, *, for_update: bool = False) -> dict[str, Any] | None:
    stmt = select(AdmissionFence).where(AdmissionFence.c.FenceId == fence_id)
    row = conn.execute(stmt.with_for_update() if for_update else stmt).first()
    return None if row is None else row_as_json(row)


def release_fence(
    engine: Engine,
    namespace: str,
    fence_id: int,
    *,
    released_by: str,
    timeout_s: float,
    dry_run: bool = False,
    precondition: Callable[[Connection], None] | None = None,
    between_check_and_act: Seam | None = None,
) -> FenceResult:
    """Release the cutover fence ``fence_id`` (set ReleasedAt) as its holder ``released_by``.

    Already released by this holder is a no-op success; released by another holder is :class:`ReleasedByAnother`;
    a fence another holder holds is :class:`FenceHeld` (a run releases only the fence it armed or adopted); more
    than one cutover fence in force is :class:`SeveralCutoverFences`. ``precondition(conn)`` runs inside the same
    locked transaction just before the release and again just after its write, refusing by raising (the
    caller's switch condition, e.g. readiness): what committed in between is seen, and the release rolled back.
    """
    deadline = Deadline(timeout_s)
    if dry_run:
        return tx.read(
            engine, lambda conn: _release(conn, namespace, fence_id, released_by, None, dry_run=True, seam=None),
            what="checking the admission fence", deadline=deadline,
        )
    return tx.run(
        engine,
        lambda conn: _release(conn, namespace, fence_id, released_by, precondition, dry_run=False, seam=between_check_and_act),
        what="releasing the admission fence", deadline=deadline, locks=lifecycle_lock_names(namespace),
    )


def _release(
    conn: Connection, namespace: str, fence_id: int, released_by: str, precondition: Callable[[Connection], None] | None,
    *, dry_run: bool, seam: Seam | None,
) -> FenceResult:
    now = utcnow()
    me = stored_holder(released_by)
    fence = fence_row(conn, fence_id, for_update=not dry_run)
    if fence is None or fence["Namespace"] != namespace:
        raise BadInput(f"admission fence {fence_id} does not exist in namespace {namespace!r}")
    if not is_cutover_fence(fence["Scope"], fence["ExpiresAt"]):
        raise BadInput(f"admission fence {fence_id} is not a non-expiring '*' cutover fence; it is left as is")
    in_force = fences_in_force(conn, namespace, now, for_update=not dry_run)
    others = [f for f in in_force if f["FenceId"] != fence_id]
    if fence["ReleasedAt"] is not None:
        if fence["ReleasedBy"] != me:
            raise ReleasedByAnother(namespace, fence, me)
        return FenceResult(namespace, "already_released", fence_id, others, holder=me, armed_at=fence["ArmedAt"],
                           released_at=fence["ReleasedAt"])
    the_cutover_fence(namespace, in_force)
    if fence["ArmedBy"] != me:
        raise FenceHeld(namespace, fence, me, state=HOLDER_UNKNOWN, releasing=True)
    if dry_run:
        return FenceResult(namespace, "would_release", fence_id, others, holder=me)
    if precondition is not None:
        precondition(conn)
    if seam is not None:
        seam(conn)
    _one_row(conn, update(AdmissionFence)
             .where(AdmissionFence.c.FenceId == fence_id, AdmissionFence.c.ArmedBy == me,
                    AdmissionFence.c.ReleasedAt.is_(None))
             .values(ReleasedAt=now, ReleasedBy=me), namespace, fence_id, "released")
    if precondition is not None:
        precondition(conn)  # after the write: what committed since the first check is seen, and rolls it back
    written = fence_row(conn, fence_id)  # the pause as the row records it, read back in the releasing transaction
    return FenceResult(namespace, "released", fence_id, others, holder=me, armed_at=written["ArmedAt"],
                       released_at=written["ReleasedAt"])


def cutover_fence_in_force(bind: Engine | Connection, namespace: str) -> dict[str, Any] | None:
    """The namespace's non-expiring ``*`` fence in force, if any; :class:`SeveralCutoverFences` when there are more."""
    with tx.reading(bind, f"reading the fences of namespace {namespace!r}") as conn:
        return the_cutover_fence(namespace, fences_in_force(conn, namespace, utcnow()))

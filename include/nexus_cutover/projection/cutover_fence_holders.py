"""Who holds the namespace's cutover fence, and who may take it: the decision :mod:`.cutover_fence` acts on.

Split out of :mod:`.cutover_fence`, which re-exports every name here (importers may keep
``from .cutover_fence import ...``).

Invariants (seed 000; contract, ``_System_AdmissionFence`` and "One cutover per tenant at a time"):

* The cutover fence in force is the one non-expiring ``*`` fence of the namespace (:func:`the_cutover_fence`);
  more than one is :class:`~.cutover_fence_refusals.SeveralCutoverFences`: which one holds the tenant is not clear.
* Holders are compared byte for byte in Python (stored spellings,
  :func:`~nexus_cutover.holders.stored_holder`), never by the column's collation. The same holder reuses its fence;
  another holder's fence is adopted only when that holder is provably finished (:data:`HOLDER_FINISHED`) or is
  named (``adopt``) while nobody here can read its state (:data:`HOLDER_UNKNOWN`); a holder at work
  (:data:`HOLDER_ACTIVE`) never is. Otherwise :class:`~.cutover_fence_refusals.FenceHeld` (:class:`Holders`).
* No call out of the process under the lock: ``holder_state`` is asked after a read-only look and before the
  locked transaction (:func:`look_at_holder`), and its answer passed in as a value (:class:`HolderLook`). When the
  locked transaction finds another fence or another holder than the one looked at, it rolls back
  (:class:`FenceMovedSinceTheLook`) and the caller looks again, at most :data:`LOOKS` times, then
  :class:`~.cutover_fence_refusals.FenceChanged`.
* :func:`held_by_another` only reads and takes no lock: the early refusal a run makes before its first write.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from sqlalchemy import Connection, Engine

from .. import tx
from ..admission_fences import cutover_fences, fences_in_force
from ..clock import utcnow
from ..db import Deadline
from ..holders import same_holder, stored_holder
from .cutover_fence_refusals import (
    HOLDER_FINISHED,
    HOLDER_UNKNOWN,
    TAKE_OVER,
    FenceChanged,
    FenceHeld,
    HolderState,
    SeveralCutoverFences,
    unknown_holders,
)


def the_cutover_fence(namespace: str, fences: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The one cutover fence among ``fences`` in force, None when there is none; :class:`SeveralCutoverFences` else."""
    found = cutover_fences(fences)
    if len(found) > 1:
        raise SeveralCutoverFences(namespace, found)
    return found[0] if found else None


#: How often a fence decision looks at the holder again when the fence moved between its look and its lock (another
#: run armed or adopted it meanwhile: the next look names that run, usually FenceHeld); then FenceChanged.
LOOKS = 3


class FenceMovedSinceTheLook(Exception):
    """Raised inside the locked transaction (rolling it back) when the fence in force is not the one whose holder was
    looked at; :func:`~.cutover_fence.arm_fence` looks again, at most :data:`LOOKS` times, then raises ``refusal``."""

    def __init__(self, refusal: FenceChanged):
        super().__init__(str(refusal))
        self.refusal = refusal


def held_by_another(
    bind: Engine | Connection, namespace: str, *, holder: str, holder_state: HolderState = unknown_holders,
    adopt: str | None = None, take_over: str = TAKE_OVER,
) -> None:
    """Read only, no lock: refuse at once (:class:`FenceHeld`, :class:`SeveralCutoverFences`) what :func:`~.cutover_fence.arm_fence`
    would refuse for holder ``holder`` because of another holder; return when this holder may go on.

    What a run calls before its first write (the additive schema), so a held tenant is refused before anything is
    written; :func:`~.cutover_fence.arm_fence` decides again under the lock, where it acts.
    """
    me = stored_holder(holder)
    look = look_at_holder(bind, namespace, me, holder_state)
    if look.fence is not None:
        Holders(me, look, adopt, take_over)(namespace, look.fence)


@dataclass(frozen=True)
class HolderLook:
    """The cutover fence in force at a read-only look before any lock (None: none), and what ``holder_state`` said
    of its holder (None when there is no fence or it is the caller's own): the value a locked decision uses instead
    of calling out of the process under the lock (module invariants)."""

    fence: dict[str, Any] | None
    state: str | None

    def is_of(self, fence: dict[str, Any]) -> bool:
        """Whether ``fence`` (read under the lock) is the one looked at, with the same holder."""
        return self.fence is not None and (fence["FenceId"], fence["ArmedBy"]) == (self.fence["FenceId"], self.fence["ArmedBy"])


def look_at_holder(bind: Engine | Connection, namespace: str, me: str, holder_state: HolderState,
                   deadline: Deadline | None = None) -> HolderLook:
    """Read the cutover fence in force (one read transaction, no lock), then, with no transaction open, ask
    ``holder_state`` about its holder unless it is ``me`` (a stored spelling). :class:`SeveralCutoverFences` at once."""
    with tx.reading(bind, f"reading the fences of namespace {namespace!r}", deadline=deadline) as conn:
        existing = the_cutover_fence(namespace, fences_in_force(conn, namespace, utcnow()))
    if existing is None or existing["ArmedBy"] == me:
        return HolderLook(existing, None)
    return HolderLook(existing, holder_state(existing["ArmedBy"]))


class Holders:
    """Who may take which fence: reuse by the same holder, adoption of a finished or named one, else FenceHeld.

    ``me`` is a stored spelling (:func:`~nexus_cutover.holders.stored_holder`); ``look`` what was learnt of the
    fence's holder before the lock. Every comparison is Python's, byte for byte."""

    def __init__(self, me: str, look: HolderLook, adopt: str | None, take_over: str):
        self.me, self.look, self.adopt, self.take_over = me, look, adopt, take_over

    def __call__(self, namespace: str, fence: dict[str, Any]) -> str | None:
        """None: the fence is this holder's (reuse); else how it may be adopted. Raises FenceHeld otherwise, and
        :class:`FenceMovedSinceTheLook` (the caller looks again) when the fence is not the one whose holder was
        looked at."""
        holder = fence["ArmedBy"]
        if holder == self.me:
            return None
        if not self.look.is_of(fence):
            raise FenceMovedSinceTheLook(FenceChanged(namespace, fence["FenceId"], "taken", why=(
                f"it is held by {holder!r}, which kept changing between this run's look at its holder and the "
                f"namespace lock ({LOOKS} looks)")))
        state = self.look.state
        if state == HOLDER_FINISHED:
            return "its run finished"
        if state == HOLDER_UNKNOWN and same_holder(holder, self.adopt):
            return f"named by {self.me}"
        raise FenceHeld(namespace, fence, self.me, state=state, take_over=self.take_over)

"""Backing a tenant out of its cutover: the cutover fence released without a cutover, before any checkpoint.

The runbook's back-out ("Rollback stance"): after a rejected (or unanswered) writer-stop question, or any stop
before the checkpoint, the tenant may go back to its old runtime: restart the old writers and release the fence.
Until this module that release was done by hand, outside the product; :func:`back_out` is it, with its safety
condition checked where it acts (issue 51, item 7).

Invariants:

* Only before the checkpoint. Once any pack of the namespace has its ``_System_ConnectorProjectionProtocol`` row
  (a one-time ``LegacyMaxOrdinal``), backing out would let the old writers admit above a cutoff that no audit reads
  and the new runtime never works: refused (:class:`CheckpointWritten`), naming the packs, nothing written.
* Check where it is relied on: one transaction of the policy (:func:`nexus_cutover.tx.run`, READ COMMITTED) holding
  the namespace lifecycle lock (the checkpoint takes the same lock first, and verifies the fence in force under it:
  a checkpoint after a back-out refuses). The fence row and the fences in force are read ``FOR UPDATE``; the
  checkpoints are read before the write and again after it (a row committed in between, by a session that took no
  lock, rolls the release back); the write is conditional on the row as read (one row or :class:`FenceChanged`).
* Only the fence the person saw: the caller names ``fence_id`` (the one its look showed, the DAG's question or
  ``back-out -check``); a fence that is not in force, or not the namespace's one cutover fence, is refused.
* Whose fence: the holder of a failed or finished Airflow run is taken over by itself; a holder nobody here can
  read (a command-line invocation, a fence armed by hand) only when the person names it (``adopt``: the DAG's
  question names it and the approval is the naming); a holder still at work never
  (:class:`~.cutover_fence.FenceHeld`). ``ArmedBy`` is left as it was: ``ReleasedBy`` names who backed out.
* Rerun-safe: a fence this holder already backed out is a no-op success (``already_backed_out``); one released by
  another holder is :class:`~.cutover_fence.ReleasedByAnother`. Nothing here deletes a row or touches an Event or
  a WorkItem.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, select, update

from .. import tx
from ..catalog import AdmissionFence, ConnectorProjectionProtocol, PackInstall
from ..clock import utc_text, utcnow
from ..db import Deadline
from ..errors import BadInput, Refused
from ..holders import stored_holder
from ..locks import lifecycle_lock_names
from ..schema import has_table
from .cutover_fence import (
    TAKE_OVER,
    FenceChanged,
    FenceMovedSinceTheLook,
    FenceResult,
    Holders,
    HolderState,
    ReleasedByAnother,
    fence_row,
    fences_in_force,
    is_cutover_fence,
    last_released_cutover_fence,
    look_at_holder,
    the_cutover_fence,
    unknown_holders,
)
from .writers import WriterEvidence, old_writer_evidence

#: What a back-out's result says it did.
BACKED_OUT, ALREADY_BACKED_OUT = "backed_out", "already_backed_out"
Seam = Any


class CheckpointWritten(Refused):
    """A pack of the namespace has its one-time checkpoint: the fence is not released, nothing written."""

    def __init__(self, namespace: str, packs: list[str]):
        self.report = {"checkpointed": packs}
        super().__init__(
            f"not backing out namespace {namespace!r}: pack(s) {', '.join(packs)} already have their one-time "
            "checkpoint (LegacyMaxOrdinal). Releasing the fence to the old writers now would let them admit above a "
            "cutoff that no audit reads: nothing was written. Next: keep the fence armed and the old writers "
            "stopped, and finish the cutover with a rerun (runbook, \"Rollback stance\")."
        )


class NothingToBackOut(Refused):
    """No cutover fence is in force in the namespace (and this holder backed none out): nothing to release."""

    def __init__(self, namespace: str, last: dict[str, Any] | None):
        self.report = {"last_released_cutover_fence": last}
        was = (f" (the last one, fence {last['FenceId']}, was released by {last['ReleasedBy']!r} at "
               f"{utc_text(last['ReleasedAt'])})" if last else "")
        super().__init__(f"nothing to back out: namespace {namespace!r} has no cutover fence in force{was}; "
                         "admission is not paused by a cutover. Nothing was written.")


def checkpointed_packs(conn: Connection, namespace: str) -> list[str]:
    """The packs of ``namespace`` (any status) that have a protocol row, by id: one statement, a range on
    ``ix_PackInstall_Namespace`` then a primary-key probe per pack. Empty while the table does not exist."""
    if not has_table(conn, ConnectorProjectionProtocol.name):
        return []
    t, p = PackInstall, ConnectorProjectionProtocol
    return list(conn.execute(
        select(t.c.PackInstallId).join(p, p.c.PackInstallId == t.c.PackInstallId)
        .where(t.c.Namespace == namespace).order_by(t.c.PackInstallId)).scalars())


@dataclass
class BackOutLook:
    """What a person is shown before backing out (read only, no lock): the fence in force and what is known of its
    holder, the packs already checkpointed, the old writers, and whether this holder already backed it out."""

    namespace: str
    checked_at: dt.datetime
    fence: dict[str, Any] | None
    holder_state: str | None
    checkpointed: list[str]
    evidence: dict[str, Any]
    already: dict[str, Any] | None = None
    refusal: str | None = None
    report: dict[str, Any] = field(default_factory=dict)

    def as_json(self) -> dict[str, Any]:
        fence = None if self.fence is None else {k: self.fence.get(k) for k in ("FenceId", "ArmedBy", "ArmedAt", "Reason")}
        return {"namespace": self.namespace, "checked_at": self.checked_at.isoformat(), "fence": fence,
                "fence_id": fence and fence["FenceId"], "holder_state": self.holder_state,
                "checkpointed": self.checkpointed, "evidence": self.evidence,
                "outcome": ALREADY_BACKED_OUT if self.already else ("refused" if self.refusal else "can_back_out"),
                "already": self.already, "refused": self.refusal, "report": self.report}

    def writers(self) -> WriterEvidence:
        e = self.evidence
        return WriterEvidence(e["namespace"], dt.datetime.fromisoformat(e["checked_at"]), e["stale_heartbeat_s"],
                              list(e["processes"]), dict(e.get("stopped_by_role") or {}))

    def fence_line(self) -> str:
        """The fence a back-out releases, and its holder as this look knows it."""
        f = self.fence or {}
        known = {None: "this holder", "finished": "its run finished", "active": "still at work",
                 "unknown": "a command-line invocation or a fence armed by hand: back out only if you know it ended"}
        return (f"cutover fence {f.get('FenceId')} of tenant {self.namespace}, armed {utc_text(f.get('ArmedAt'))} by "
                f"{f.get('ArmedBy')} ({known.get(self.holder_state, self.holder_state)}); no pack is checkpointed")

    def as_text(self) -> str:
        """What a terminal or a task log shows before a back-out."""
        if self.already:
            return (f"fence {self.already['fence_id']} of tenant {self.namespace} was already backed out by you at "
                    f"{utc_text(self.already['released_at'])}: nothing to do")
        if self.refusal:
            return self.refusal
        return self.fence_line() + "\n" + self.writers().as_text()

    def as_markdown(self) -> str:
        """The question's body: which fence, held by whom, and the old writers as the registry shows them."""
        line = self.fence_line()
        return f"{line[:1].upper()}{line[1:]}.\n\n" + self.writers().as_markdown()


def look(engine: Engine, namespace: str, *, holder: str, holder_state: HolderState = unknown_holders,
         stale_heartbeat: dt.timedelta) -> BackOutLook:
    """Read only: what backing ``namespace`` out would release, and why it would refuse (``refusal``)."""
    me = stored_holder(holder)
    seen = look_at_holder(engine, namespace, me, holder_state)
    with tx.reading(engine, f"reading what backing namespace {namespace!r} out would release") as conn:
        checkpointed = checkpointed_packs(conn, namespace)
        last = last_released_cutover_fence(conn, namespace) if seen.fence is None else None
    evidence = old_writer_evidence(engine, namespace, stale_heartbeat=stale_heartbeat)
    result = BackOutLook(namespace, evidence.checked_at, seen.fence, seen.state, checkpointed, evidence.as_json())
    if seen.fence is None and last is not None and last.get("ReleasedBy") == me:
        result.already = {"fence_id": last["FenceId"], "released_at": last["ReleasedAt"]}
    elif seen.fence is None:
        _refuse(result, NothingToBackOut(namespace, last))
    elif checkpointed:
        _refuse(result, CheckpointWritten(namespace, checkpointed))
    return result


def _refuse(result: BackOutLook, refusal: Refused) -> None:
    result.refusal, result.report = str(refusal), dict(refusal.report or {})


def back_out(engine: Engine, namespace: str, fence_id: int, *, holder: str, timeout_s: float,
             holder_state: HolderState = unknown_holders, adopt: str | None = None, take_over: str = TAKE_OVER,
             between_check_and_act: Seam | None = None) -> FenceResult:
    """Release the cutover fence ``fence_id`` of ``namespace`` without a cutover, as ``holder`` (module invariants):
    ``backed_out``, or ``already_backed_out`` when ``holder`` did it before. ``between_check_and_act``: a test seam."""
    me = stored_holder(holder)
    deadline = Deadline(timeout_s)
    seen = look_at_holder(engine, namespace, me, holder_state, deadline)

    def act(conn: Connection) -> FenceResult:
        now = utcnow()
        fence = fence_row(conn, fence_id, for_update=True)
        if fence is None or fence["Namespace"] != namespace:
            raise BadInput(f"admission fence {fence_id} does not exist in namespace {namespace!r}")
        if not is_cutover_fence(fence["Scope"], fence["ExpiresAt"]):
            raise BadInput(f"admission fence {fence_id} is not a non-expiring '*' cutover fence; it is left as is")
        if fence["ReleasedAt"] is not None:
            if fence["ReleasedBy"] != me:
                raise ReleasedByAnother(namespace, fence, me)
            return FenceResult(namespace, ALREADY_BACKED_OUT, fence_id, holder=me, previous_holder=fence["ArmedBy"],
                               armed_at=fence["ArmedAt"], released_at=fence["ReleasedAt"])
        in_force = fences_in_force(conn, namespace, now, for_update=True)
        the_cutover_fence(namespace, in_force)  # several cutover fences: which one holds the tenant is not clear
        if fence["ArmedBy"] != me:
            try:
                Holders(me, seen, adopt, take_over)(namespace, fence)
            except FenceMovedSinceTheLook as moved:
                raise moved.refusal from None
        _refuse_checkpointed(conn, namespace)
        if between_check_and_act is not None:
            between_check_and_act(conn)
        written = conn.execute(
            update(AdmissionFence)
            .where(AdmissionFence.c.FenceId == fence_id, AdmissionFence.c.ArmedBy == fence["ArmedBy"],
                   AdmissionFence.c.ReleasedAt.is_(None))
            .values(ReleasedAt=now, ReleasedBy=me))
        if written.rowcount != 1:
            raise FenceChanged(namespace, fence_id, "backed out")
        _refuse_checkpointed(conn, namespace)  # after the write: a checkpoint committed since the check rolls it back
        row = fence_row(conn, fence_id)
        return FenceResult(namespace, BACKED_OUT, fence_id, [f for f in in_force if f["FenceId"] != fence_id],
                           previous_holder=fence["ArmedBy"], holder=me, armed_at=row["ArmedAt"],
                           released_at=row["ReleasedAt"])

    return tx.run(engine, act, what="backing out: releasing the admission fence without a cutover", deadline=deadline,
                  locks=lifecycle_lock_names(namespace))


def _refuse_checkpointed(conn: Connection, namespace: str) -> None:
    if packs := checkpointed_packs(conn, namespace):
        raise CheckpointWritten(namespace, packs)

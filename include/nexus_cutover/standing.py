"""What "cut over" means, once: the one definition the status view, ``status``, ``plan``, the fence and the rollout use.

A tenant is **cut over** when every active pack has its checkpoint (its
``_System_ConnectorProjectionProtocol`` row), no cutover fence is in force
(admission resumed through the new host) and no pack holds old-protocol work
above its cutoff (:mod:`nexus_cutover.above_cutoff`: that is a stop, needing a
separately reviewed recovery decision, never "cut over"). The new host's health
afterwards is not part of it: a host that stopped heartbeating after the
release is a host problem of a cut-over tenant (the status view's host section
says so), not a tenant to cut over again.

Who relies on it: :func:`read_standing` (the rollout's skip, ``plan``),
:func:`nexus_cutover.tenant_status.phase` (the status view, ``nexus-cutover status``)
and :func:`nexus_cutover.projection.cutover_fence.arm_fence`'s ``not_needed`` (a run that
finds the tenant cut over arms nothing; one that finds old work above a cutoff stops).
Read only.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine

from . import schema, tx
from .above_cutoff import namespace_above_cutoff
from .admission_fences import cutover_fences, fences_in_force
from .catalog import ConnectorProjectionProtocol
from .clock import utcnow
from .protocol_row import active_protocol_rows
from .runtime.activation import active_packs


def is_cut_over(*, packs: int, checkpointed: int, cutover_fences: int, above_cutoff: int) -> bool:
    """The definition (module docstring), from counts: ``packs`` active, ``checkpointed`` of them with their
    checkpoint, ``cutover_fences`` in force, ``above_cutoff`` packs holding old work above their cutoff."""
    return packs > 0 and checkpointed == packs and cutover_fences == 0 and above_cutoff == 0


@dataclass
class Standing:
    """Where a tenant stands, read in one read-only transaction."""

    packs: int
    checkpointed: int
    fence_holders: list[str] = field(default_factory=list)  # the ArmedBy of every cutover fence in force
    above_cutoff: list[dict[str, Any]] = field(default_factory=list)  # AboveCutoff.as_json() per pack holding some

    @property
    def cut_over(self) -> bool:
        return is_cut_over(packs=self.packs, checkpointed=self.checkpointed, cutover_fences=len(self.fence_holders),
                           above_cutoff=len(self.above_cutoff))

    def as_json(self) -> dict[str, Any]:
        """``fence_held_by``: the one holder, every holder when several cutover fences are in force, else None."""
        held = self.fence_holders
        return {"packs": self.packs, "checkpointed": self.checkpointed,
                "fence_held_by": held[0] if len(held) == 1 else (held or None),
                "old_work_above_cutoff": self.above_cutoff, "cut_over": self.cut_over}


def read_standing(bind: Engine | Connection, namespace: str) -> Standing:
    """The tenant's :class:`Standing` (read only, through the read path: driver errors leave as contract errors)."""

    with tx.reading(bind, f"reading where namespace {namespace!r} stands") as conn:
        packs = active_packs(conn, namespace)
        table = schema.has_table(conn, ConnectorProjectionProtocol.name)
        rows = active_protocol_rows(conn, namespace) if table else {}  # one statement, not one per pack
        done = [p for p in packs if p in rows]
        held = [f["ArmedBy"] for f in cutover_fences(fences_in_force(conn, namespace, utcnow()))]
        above = [a.as_json() for a in namespace_above_cutoff(conn, namespace)] if table else []
    return Standing(len(packs), len(done), held, above)

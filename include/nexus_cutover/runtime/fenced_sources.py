"""Admission fences (contract, ``_System_AdmissionFence``): is one in force for a source?

Scopes: ``*`` (every source of the namespace), ``<PackInstallId>`` (a pack), or
``<PackInstallId>/<SourceLane>`` (one source). "In force" and "active" are
defined once, in :mod:`nexus_cutover.admission_fences`. An active override of a fence lets the sources its
own scope names through that fence. A source is fenced when any fence in force
covers it and none of that fence's active overrides covers it.

The expiry comparison uses the database rows' timestamps against the current
clock: that is the contract's own definition of "in force", not a membership decision.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Connection, select

from ..admission_fences import fence_in_force, override_active
from ..catalog import FENCE_SCOPE_ALL, AdmissionFence, AdmissionFenceOverride


@dataclass(frozen=True)
class FenceView:
    """The fences of a namespace in force at one instant, with their active override scopes."""

    fences: dict[int, str]
    overrides: dict[int, frozenset[str]]

    def fenced(self, pack_install_id: str, source_lane: str) -> bool:
        scopes = source_scopes(pack_install_id, source_lane)
        return any(scope in scopes and not (self.overrides.get(fence_id, frozenset()) & scopes) for fence_id, scope in self.fences.items())

    @property
    def any(self) -> bool:
        return bool(self.fences)


def source_scopes(pack_install_id: str, source_lane: str) -> frozenset[str]:
    return frozenset({FENCE_SCOPE_ALL, pack_install_id, f"{pack_install_id}/{source_lane}"})


def fences_in_force(conn: Connection, namespace: str, now: dt.datetime) -> FenceView:
    f = AdmissionFence
    fences = {
        r.FenceId: r.Scope
        for r in conn.execute(
            select(f.c.FenceId, f.c.Scope).where(
                f.c.Namespace == namespace,
                fence_in_force(now),
            )
        )
    }
    overrides: dict[int, set[str]] = {}
    if fences:
        o = AdmissionFenceOverride
        for r in conn.execute(
            select(o.c.FenceId, o.c.Scope).where(
                o.c.FenceId.in_(sorted(fences)),
                override_active(now),
            )
        ):
            overrides.setdefault(r.FenceId, set()).add(r.Scope)
    return FenceView(fences, {k: frozenset(v) for k, v in overrides.items()})

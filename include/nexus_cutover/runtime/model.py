"""Plain values of the runtime API (no database access here).

Identity values are always :class:`~nexus_cutover.identity.ProjectionIdentity`;
an :class:`Input` names five of its six parts and gets the pack from the batch.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass, field

from ..catalog import PROJECTION_WORK_TYPE
from ..identity import ProjectionIdentity


@dataclass(frozen=True)
class Routing:
    """How the host routes a receipt: route version, companion Flow version, work type.

    ``by_event_kind`` overrides the defaults for named Event kinds:
    ``{"deal.changed": (2, "1.1.0", "connector.projection")}``. The default work type is the catalog's
    projection work type: what a receipt admits is projection input.
    """

    route_version: int = 1
    flow_version: str = "1.0.0"
    work_type: str = PROJECTION_WORK_TYPE
    by_event_kind: dict[str, tuple[int, str, str]] = field(default_factory=dict)

    def route(self, event_kind: str) -> tuple[int, str, str]:
        return self.by_event_kind.get(event_kind, (self.route_version, self.flow_version, self.work_type))


@dataclass(frozen=True)
class Input:
    """One source input offered for admission (a receipt of ``source_lane``)."""

    source_lane: str
    receipt_id: str
    payload: str
    event_kind: str = "contact.changed"
    route_version: int = 1
    flow_version: str = "1.0.0"
    work_type: str = PROJECTION_WORK_TYPE
    received_at: dt.datetime | None = None

    def identity(self, pack_install_id: str) -> ProjectionIdentity:
        return ProjectionIdentity(pack_install_id, self.event_kind, self.route_version, self.flow_version, self.work_type, self.source_lane)

    @classmethod
    def routed(cls, source_lane: str, receipt_id: str, payload: str, event_kind: str, routing: Routing, **kw) -> Input:
        route_version, flow_version, work_type = routing.route(event_kind)
        return cls(source_lane, receipt_id, payload, event_kind, route_version, flow_version, work_type, **kw)


@dataclass(frozen=True)
class Admitted:
    source_lane: str
    receipt_id: str
    event_id: int
    ordinal: int
    work_id: int


@dataclass(frozen=True)
class Duplicate:
    """An already admitted receipt. ``reason``: ``at_or_below_cutoff`` or ``covered`` (then ``work_id``)."""

    source_lane: str
    receipt_id: str
    event_id: int
    ordinal: int
    reason: str
    work_id: int | None = None


@dataclass
class AdmissionResult:
    pack_install_id: str
    admitted: list[Admitted] = field(default_factory=list)
    duplicates: list[Duplicate] = field(default_factory=list)
    #: WorkIds created (new generations) and extended by this batch.
    created_work_ids: list[int] = field(default_factory=list)
    extended_work_ids: list[int] = field(default_factory=list)


@dataclass(frozen=True)
class ClaimedWork:
    """What a claim remembers: the WorkId and the interval persisted at claim time."""

    work_id: int
    identity: ProjectionIdentity
    input_start_ordinal: int
    lane_ordinal: int
    selected_event_id: int
    attempt: int
    lease_owner: str
    replay_of_work_id: int | None


@dataclass(frozen=True)
class Payload:
    event_id: int
    ordinal: int
    receipt_id: str
    payload: str
    replay_of_work_id: int | None

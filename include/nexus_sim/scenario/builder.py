"""Deterministic construction of tenant histories (tests, demo and benchmarks).

A :class:`TenantScenario` collects rows in memory and :meth:`TenantScenario.write`
inserts them in bounded multi-row batches. Nothing here is random unless a
caller passes a seeded :class:`random.Random`; the same calls produce the
same rows, ids and timestamps.

Ordinals follow the contract: per pack, positive and strictly increasing,
never reused; legacy Events (admitted before ordinals existed) carry 0.
"""

from __future__ import annotations

import datetime as dt
import itertools
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Engine, Table, insert

from nexus_cutover import catalog, tx
from nexus_cutover.clock import utcnow
from nexus_cutover.identity import ProjectionIdentity

BASE_TIME = dt.datetime(2026, 1, 1, 0, 0, 0)
BATCH_ROWS = 1000


@dataclass
class Lane:
    """One projection identity of a pack: adds its Events and WorkItems."""

    pack: PackBuilder
    identity: ProjectionIdentity

    @property
    def scenario(self) -> TenantScenario:
        return self.pack.scenario

    def event(
        self,
        *,
        status: str = "processed",
        ordinal: int | None = None,
        legacy: bool = False,
        receipt_id: str | None = None,
        replay_of_work_id: int | None = None,
        received_at: dt.datetime | None = None,
        payload: str | None = None,
    ) -> dict[str, Any]:
        """Add an Event. ``legacy=True`` gives ordinal 0; else the pack's next ordinal."""
        if ordinal is None:
            ordinal = 0 if legacy else self.pack.next_ordinal()
        else:
            self.pack.last_ordinal = max(self.pack.last_ordinal, ordinal)
        sc = self.scenario
        event_id = next(sc.event_ids)
        row = {
            "EventId": event_id,
            "Namespace": sc.namespace,
            **self.identity.as_values(),
            "EnqueueOrdinal": ordinal,
            "ReceiptId": receipt_id or f"r-{event_id}",
            "ReplayOfWorkId": replay_of_work_id,
            "Status": status,
            "Payload": payload if payload is not None else f'{{"event": {event_id}}}',
            "ReceivedAt": received_at or sc.tick(),
        }
        sc.events.append(row)
        return row

    def work_item(
        self,
        selected: dict[str, Any] | None,
        *,
        status: str = "completed",
        lane_ordinal: int | None = None,
        input_start_ordinal: int | None = None,
        attempt: int = 0,
        blocked_on: str | None = None,
        next_attempt_at: dt.datetime | None = None,
        lease_owner: str | None = None,
        lease_expires_at: dt.datetime | None = None,
        replay_of_work_id: int | None = None,
    ) -> dict[str, Any]:
        """Add a projection WorkItem of this identity selecting ``selected``."""
        sc = self.scenario
        if lane_ordinal is None and selected is not None:
            lane_ordinal = selected["EnqueueOrdinal"]
        now = sc.tick()
        row = {
            "WorkId": next(sc.work_ids),
            "Namespace": sc.namespace,
            "WorkClass": catalog.WORK_CLASS_PROJECTION,
            **self.identity.as_values(),
            "SelectedEventId": selected["EventId"] if selected is not None else None,
            "LaneOrdinal": lane_ordinal,
            "ReplayOfWorkId": replay_of_work_id,
            "Attempt": attempt,
            "Status": status,
            "BlockedOn": blocked_on,
            "NextAttemptAt": next_attempt_at,
            "LeaseOwner": lease_owner,
            "LeaseExpiresAt": lease_expires_at,
            "CreatedAt": now,
            "UpdatedAt": now,
        }
        if input_start_ordinal is not None:
            row["InputStartOrdinal"] = input_start_ordinal
        sc.work_items.append(row)
        return row

    def generation(
        self,
        inputs: int = 1,
        *,
        status: str = "completed",
        legacy: bool = False,
        coalesced_event_status: str = "processed",
        **work_item_kwargs: Any,
    ) -> tuple[list[dict[str, Any]], dict[str, Any]]:
        """``inputs`` Events coalesced into one old-protocol WorkItem selecting the last."""
        selected_status = "processed" if status == "completed" else "pending"
        events = [self.event(status=coalesced_event_status, legacy=legacy) for _ in range(inputs - 1)]
        events.append(self.event(status=selected_status, legacy=legacy))
        work = self.work_item(events[-1], status=status, **work_item_kwargs)
        return events, work


@dataclass
class PackBuilder:
    scenario: TenantScenario
    pack_install_id: str
    last_ordinal: int = 0

    def next_ordinal(self) -> int:
        self.last_ordinal += 1
        return self.last_ordinal

    def lane(
        self,
        source_lane: str,
        *,
        event_kind: str = "contact.changed",
        route_version: int = 1,
        flow_version: str = "1.0.0",
        work_type: str = catalog.PROJECTION_WORK_TYPE,
    ) -> Lane:
        return Lane(
            self,
            ProjectionIdentity(self.pack_install_id, event_kind, route_version, flow_version, work_type, source_lane),
        )


@dataclass
class TenantScenario:
    """Rows of one tenant (one namespace), built in memory, written by :meth:`write`."""

    namespace: str = "acme"
    now: dt.datetime = field(default_factory=utcnow)
    packs: list[PackBuilder] = field(default_factory=list)
    pack_rows: list[dict[str, Any]] = field(default_factory=list)
    events: list[dict[str, Any]] = field(default_factory=list)
    work_items: list[dict[str, Any]] = field(default_factory=list)
    processes: list[dict[str, Any]] = field(default_factory=list)
    fences: list[dict[str, Any]] = field(default_factory=list)
    overrides: list[dict[str, Any]] = field(default_factory=list)
    receipts: list[dict[str, Any]] = field(default_factory=list)
    fields: list[dict[str, Any]] = field(default_factory=list)
    sequences: list[dict[str, Any]] = field(default_factory=list)
    intervals: list[dict[str, Any]] = field(default_factory=list)
    audit_changes: list[dict[str, Any]] = field(default_factory=list)
    outbox: list[dict[str, Any]] = field(default_factory=list)
    settings: list[dict[str, Any]] = field(default_factory=list)
    protocol_rows: list[dict[str, Any]] = field(default_factory=list)
    event_id_start: int = 1
    work_id_start: int = 1

    def __post_init__(self) -> None:
        self.event_ids = itertools.count(self.event_id_start)
        self.work_ids = itertools.count(self.work_id_start)
        self.change_ids = itertools.count(1)
        self.outbox_ids = itertools.count(1)
        self._clock = itertools.count()

    def tick(self) -> dt.datetime:
        """Deterministic, increasing display timestamps (never used for decisions)."""
        return BASE_TIME + dt.timedelta(milliseconds=next(self._clock))

    # -- packs and projection history -------------------------------------

    def pack(self, pack_install_id: str, *, name: str = "crm-sync", status: str = catalog.PACK_ACTIVE) -> PackBuilder:
        builder = PackBuilder(self, pack_install_id)
        self.packs.append(builder)
        self.pack_rows.append(
            {
                "PackInstallId": pack_install_id,
                "Namespace": self.namespace,
                "PackName": name,
                "Status": status,
                "InstalledAt": BASE_TIME,
            }
        )
        return builder

    def ordinary_work(
        self,
        selected_event: dict[str, Any] | None,
        *,
        status: str = "completed",
        work_type: str | None = None,
        attempt: int = 0,
        blocked_on: str | None = None,
        next_attempt_at: dt.datetime | None = None,
        lease_owner: str | None = None,
        lease_expires_at: dt.datetime | None = None,
    ) -> dict[str, Any]:
        """An ordinary one-Event/one-WorkItem row (no projection identity).

        ``work_type`` defaults to the selected Event's WorkType (``"ordinary"`` without one).
        """
        now = self.tick()
        if work_type is None:
            work_type = selected_event["WorkType"] if selected_event else "ordinary"
        row = {
            "WorkId": next(self.work_ids),
            "Namespace": self.namespace,
            "WorkClass": catalog.WORK_CLASS_ORDINARY,
            "WorkType": work_type,
            "SelectedEventId": selected_event["EventId"] if selected_event else None,
            "Attempt": attempt,
            "Status": status,
            "CreatedAt": now,
            "UpdatedAt": now,
        }
        optional = {"BlockedOn": blocked_on, "NextAttemptAt": next_attempt_at, "LeaseOwner": lease_owner,
                    "LeaseExpiresAt": lease_expires_at}
        row.update({k: v for k, v in optional.items() if v is not None})
        self.work_items.append(row)
        return row

    def protocol_row(self, pack_install_id: str, legacy_max_ordinal: int, *, version: int = 1) -> None:
        self.protocol_rows.append(
            {
                "PackInstallId": pack_install_id,
                "ProtocolVersion": version,
                "LegacyMaxOrdinal": legacy_max_ordinal,
                "WrittenAt": BASE_TIME,
                "WrittenBy": "scenario",
            }
        )

    # -- processes, fences, receipts --------------------------------------

    def process(
        self,
        role: str,
        *,
        protocol: int = catalog.PROTOCOL_OLD,
        version: str = "4.11.0",
        heartbeat_age_s: float = 0.0,
        stopped: bool = False,
        activated: bool = False,
        process_id: str | None = None,
        heartbeat_at: dt.datetime | None = None,
        started_at: dt.datetime | None = None,
    ) -> dict[str, Any]:
        """A registry row. Its last heartbeat is ``heartbeat_at``, else ``heartbeat_age_s`` before ``now``;
        a stopped process stopped at its last heartbeat."""
        heartbeat = heartbeat_at if heartbeat_at is not None else self.now - dt.timedelta(seconds=heartbeat_age_s)
        row = {
            "ProcessId": process_id or f"{role}-{len(self.processes) + 1}",
            "Namespace": self.namespace,
            "Role": role,
            "BinaryVersion": version,
            "ProjectionProtocol": protocol,
            "StartedAt": started_at if started_at is not None else heartbeat - dt.timedelta(hours=1),
            "LastHeartbeatAt": heartbeat,
            "ActivatedAt": heartbeat if activated else None,
            "StoppedAt": heartbeat if stopped else None,
        }
        self.processes.append(row)
        return row

    def fence(
        self, *, scope: str = catalog.FENCE_SCOPE_ALL, expires_at: dt.datetime | None = None, released: bool = False
    ) -> dict[str, Any]:
        row = {
            "FenceId": len(self.fences) + 1,
            "Namespace": self.namespace,
            "Scope": scope,
            "Reason": "scenario",
            "ArmedBy": "scenario",
            "ArmedAt": BASE_TIME,
            "ExpiresAt": expires_at,
            "ReleasedAt": BASE_TIME if released else None,
            "ReleasedBy": "scenario" if released else None,
        }
        self.fences.append(row)
        return row

    def fence_override(self, fence: dict[str, Any], scope: str, *, revoked: bool = False) -> dict[str, Any]:
        row = {
            "OverrideId": len(self.overrides) + 1,
            "FenceId": fence["FenceId"],
            "Scope": scope,
            "CreatedBy": "scenario",
            "CreatedAt": BASE_TIME,
            "ExpiresAt": None,
            "RevokedAt": BASE_TIME if revoked else None,
        }
        self.overrides.append(row)
        return row

    def receipt(
        self, pack_install_id: str, source_lane: str, receipt_id: str, *, event_kind: str = "contact.changed"
    ) -> dict[str, Any]:
        row = {
            "PackInstallId": pack_install_id,
            "SourceLane": source_lane,
            "ReceiptId": receipt_id,
            "EventKind": event_kind,
            "Payload": f'{{"receipt": "{receipt_id}"}}',
            "ReceivedAt": self.tick(),
            "MaterializedAt": None,
            "ConfirmedAt": None,
        }
        self.receipts.append(row)
        return row

    # -- field history ----------------------------------------------------

    def field(
        self,
        field_id: int,
        *,
        track_history: bool = True,
        intervals: list[tuple[int, int | None]] = (),
        last_sequence: int | None = None,
        object_name: str = "Contact",
    ) -> dict[str, Any]:
        row = {
            "FieldId": field_id,
            "ObjectName": object_name,
            "FieldName": f"field_{field_id}",
            "TrackHistory": track_history,
            "Revision": 1,
        }
        self.fields.append(row)
        for started, ended in intervals:
            self.intervals.append({"FieldId": field_id, "StartedSequence": started, "EndedSequence": ended})
        ends = [e for _, e in intervals if e is not None] + [s for s, _ in intervals]
        self.sequences.append({"FieldId": field_id, "LastSequence": last_sequence or (max(ends) if ends else 0)})
        return row

    def audit_change(
        self,
        field_id: int | None,
        *,
        history_sequence: int | None,
        eligible: bool | None = None,
        producer_version: str = "4.11.0",
        record_id: str = "rec-1",
    ) -> dict[str, Any]:
        change_id = next(self.change_ids)
        row = {
            "ChangeId": change_id,
            "AuditId": change_id,
            "ObjectName": "Contact",
            "RecordId": record_id,
            "FieldId": field_id,
            "OldValue": "a",
            "NewValue": "b",
            "HistorySequence": history_sequence,
            "ProducerVersion": producer_version,
            "CreatedAt": self.tick(),
        }
        if eligible is not None:
            row["FieldHistoryEligible"] = eligible
        self.audit_changes.append(row)
        return row

    def outbox_row(self, *, producer_version: str = "4.11.0", status: str = "pending") -> dict[str, Any]:
        row = {
            "OutboxId": next(self.outbox_ids),
            "ProducerVersion": producer_version,
            "Status": status,
            "Attempts": 0,
            "Payload": "{}",
            "CreatedAt": self.tick(),
        }
        self.outbox.append(row)
        return row

    def setting(self, name: str, value: str) -> None:
        self.settings.append({"Name": name, "Value": value, "UpdatedBy": "scenario", "UpdatedAt": BASE_TIME})

    # -- writing ----------------------------------------------------------

    def ordinal_rows(self) -> list[dict[str, Any]]:
        return [{"PackInstallId": p.pack_install_id, "LastOrdinal": p.last_ordinal} for p in self.packs]

    def write(self, engine: Engine) -> None:
        """Insert every row, in bounded multi-row batches (one transaction per table batch)."""
        plan: list[tuple[Table, list[dict[str, Any]]]] = [
            (catalog.PackInstall, self.pack_rows),
            (catalog.EnqueueOrdinal, self.ordinal_rows()),
            (catalog.Event, self.events),
            (catalog.WorkItem, self.work_items),
            (catalog.AdmissionFence, self.fences),
            (catalog.AdmissionFenceOverride, self.overrides),
            (catalog.IngressReceipt, self.receipts),
            (catalog.ProcessRegistry, self.processes),
            (catalog.Field, self.fields),
            (catalog.FieldHistorySequence, self.sequences),
            (catalog.FieldHistoryTrackingInterval, self.intervals),
            (catalog.AuditFieldChange, self.audit_changes),
            (catalog.AuditOutbox, self.outbox),
            (catalog.RuntimeSetting, self.settings),
            (catalog.ConnectorProjectionProtocol, self.protocol_rows),
        ]
        for table, rows in plan:
            insert_rows(engine, table, rows)


def insert_rows(engine: Engine, table: Table, rows: list[dict[str, Any]], batch: int = BATCH_ROWS) -> None:
    """Insert ``rows`` grouped by key set (so optional Part B keys stay optional)."""
    groups: dict[frozenset[str], list[dict[str, Any]]] = {}
    for row in rows:
        groups.setdefault(frozenset(row), []).append(row)
    for group in groups.values():
        for start in range(0, len(group), batch):
            chunk = group[start : start + batch]
            tx.run(engine, lambda conn, chunk=chunk: conn.execute(insert(table), chunk), what=f"writing {table.name} rows")

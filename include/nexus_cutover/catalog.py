"""The tenant catalog: every table and column name of ``shared/contract/tenant_catalog.sql``.

This is the only module that spells table and column names. Every query of the
project reaches the database through the :class:`sqlalchemy.Table` objects
defined here, so SQL is always built from the catalog and never from input.

The contract has two parts:

* Part A, the legacy schema as it stands before any cutover
  (:data:`legacy_metadata`), used to build tenants in tests, demo and benchmarks;
* Part B, the additive objects of the two cutovers (:data:`INPUT_START_ORDINAL`,
  :data:`FIELD_HISTORY_ELIGIBLE` and :data:`ConnectorProjectionProtocol`), applied as separate idempotent steps by
  :mod:`nexus_cutover.schema`.

The module-level tables (``Event``, ``WorkItem``...) are the *full* tables,
Part A plus Part B, in :data:`metadata`: queries use them.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import (
    BigInteger,
    Boolean,
    Column,
    DateTime,
    Index,
    Integer,
    MetaData,
    PrimaryKeyConstraint,
    String,
    Table,
    Text,
)
from sqlalchemy.dialects import mysql

# DATETIME(6) on MySQL/MariaDB/TiDB, plain DATETIME elsewhere.
Timestamp = DateTime().with_variant(mysql.DATETIME(fsp=6), "mysql", "mariadb")
# BIGINT AUTO_INCREMENT on MySQL; SQLite only auto-increments INTEGER PRIMARY KEY.
AutoBigInt = BigInteger().with_variant(Integer(), "sqlite")

# --------------------------------------------------------------------------
# Vocabulary of the contract (lower-case status strings, roles, settings).
# --------------------------------------------------------------------------

WORK_CLASS_PROJECTION = "projection"
WORK_CLASS_ORDINARY = "ordinary"

#: The Event work types that are projection inputs (contract, "Ordinary work"): named here and nowhere else.
#: Every other Event is an ordinary input, owned by the one ordinary WorkItem created with it.
PROJECTION_WORK_TYPE = "connector.projection"
PROJECTION_WORK_TYPES = (PROJECTION_WORK_TYPE,)

WORK_LIVE_STATUSES = ("pending", "blocked", "retry", "processing")
WORK_COMPLETED = "completed"
WORK_TERMINAL_STATUSES = (WORK_COMPLETED, "failed", "cancelled")

PACK_ACTIVE = "active"
PACK_UNINSTALLED = "uninstalled"

ROLE_INGRESS_WRITER = "ingress_writer"
ROLE_RECEIPT_MATERIALIZER = "receipt_materializer"
ROLE_PROJECTION_WORKER = "projection_worker"
ROLE_DEPENDENCY_RESOLVER = "dependency_resolver"
ROLE_INTEGRATION_HOST = "integration_host"
ROLE_RUNTIME_API = "runtime_api"
ROLE_SERVICE_MANAGER = "service_manager"
ROLE_AUDIT_OUTBOX_WORKER = "audit_outbox_worker"

# Old-protocol processes that must be stopped before the cutover audit (step 3).
OLD_WRITER_ROLES = (
    ROLE_INGRESS_WRITER,
    ROLE_RECEIPT_MATERIALIZER,
    ROLE_PROJECTION_WORKER,
    ROLE_DEPENDENCY_RESOLVER,
)

PROTOCOL_OLD = 0  # coverage-inference runtime
PROTOCOL_RANGES = 1  # durable-input-range runtime; also the protocol row's version

FENCE_SCOPE_ALL = "*"

SETTING_READ_MODE = "FieldHistoryReadMode"
SETTING_SEQUENCE_RESERVATION = "FieldHistorySequenceReservationEnabled"
READ_MODE_COMPAT = "compat"
READ_MODE_BOOLEAN_ONLY = "boolean_only"


def namespace_lock_name(namespace: str) -> str:
    return f"namespace/{namespace}"


def pack_lock_name(pack_install_id: str) -> str:
    return f"pack/{pack_install_id}"


# --------------------------------------------------------------------------
# Table definitions. ``_define`` builds Part A, plus Part B when asked, into a
# MetaData so that the legacy schema and the full schema share one spelling.
# --------------------------------------------------------------------------


def _define(md: MetaData, *, with_part_b: bool) -> None:
    Table(
        "_System_PackInstall",
        md,
        Column("PackInstallId", String(64), nullable=False),
        Column("Namespace", String(64), nullable=False),
        Column("PackName", String(128), nullable=False),
        Column("Status", String(16), nullable=False),
        Column("InstalledAt", Timestamp, nullable=False),
        PrimaryKeyConstraint("PackInstallId"),
        Index("ix_PackInstall_Namespace", "Namespace", "Status"),
    )
    Table(
        "_System_EnqueueOrdinal",
        md,
        Column("PackInstallId", String(64), nullable=False),
        Column("LastOrdinal", BigInteger, nullable=False),
        PrimaryKeyConstraint("PackInstallId"),
    )
    Table(
        "_System_Event",
        md,
        Column("EventId", BigInteger, nullable=False, autoincrement=False),
        Column("Namespace", String(64), nullable=False),
        Column("PackInstallId", String(64), nullable=False),
        Column("EventKind", String(128), nullable=False),
        Column("RouteVersion", Integer, nullable=False),
        Column("FlowVersion", String(64), nullable=False),
        Column("WorkType", String(64), nullable=False),
        Column("SourceLane", String(128), nullable=False),
        Column("EnqueueOrdinal", BigInteger, nullable=False),
        Column("ReceiptId", String(128), nullable=False),
        Column("ReplayOfWorkId", BigInteger, nullable=True),
        Column("Status", String(16), nullable=False),
        Column("Payload", Text, nullable=False),
        Column("ReceivedAt", Timestamp, nullable=False),
        PrimaryKeyConstraint("EventId"),
        Index("ux_Event_Receipt", "PackInstallId", "SourceLane", "ReceiptId", unique=True),
        Index(
            "ix_Event_SourceLane",
            "PackInstallId",
            "EventKind",
            "RouteVersion",
            "FlowVersion",
            "WorkType",
            "SourceLane",
            "EnqueueOrdinal",
        ),
    )
    work_item_columns = [
        Column("WorkId", BigInteger, nullable=False, autoincrement=False),
        Column("Namespace", String(64), nullable=False),
        Column("WorkClass", String(16), nullable=False),
        Column("PackInstallId", String(64), nullable=True),
        Column("EventKind", String(128), nullable=True),
        Column("RouteVersion", Integer, nullable=True),
        Column("FlowVersion", String(64), nullable=True),
        Column("WorkType", String(64), nullable=False),
        Column("SourceLane", String(128), nullable=True),
        Column("SelectedEventId", BigInteger, nullable=True),
        Column("LaneOrdinal", BigInteger, nullable=True),
        Column("ReplayOfWorkId", BigInteger, nullable=True),
        Column("Attempt", Integer, nullable=False, server_default="0"),
        Column("Status", String(16), nullable=False),
        Column("BlockedOn", String(255), nullable=True),
        Column("NextAttemptAt", Timestamp, nullable=True),
        Column("LeaseOwner", String(128), nullable=True),
        Column("LeaseExpiresAt", Timestamp, nullable=True),
        Column("CreatedAt", Timestamp, nullable=False),
        Column("UpdatedAt", Timestamp, nullable=False),
    ]
    if with_part_b:
        work_item_columns.append(Column("InputStartOrdinal", BigInteger, nullable=True))
    Table(
        "_System_WorkItem",
        md,
        *work_item_columns,
        PrimaryKeyConstraint("WorkId"),
        Index(
            "ix_WorkItem_ProjectionOrder",
            "PackInstallId",
            "EventKind",
            "RouteVersion",
            "FlowVersion",
            "WorkType",
            "SourceLane",
            "LaneOrdinal",
        ),
        Index("ix_WorkItem_State", "Namespace", "WorkClass", "Status"),
        Index("ix_WorkItem_Selected", "SelectedEventId"),
    )
    Table(
        "_System_AdmissionFence",
        md,
        Column("FenceId", AutoBigInt, nullable=False, autoincrement=True),
        Column("Namespace", String(64), nullable=False),
        Column("Scope", String(128), nullable=False),
        Column("Reason", String(255), nullable=False),
        Column("ArmedBy", String(128), nullable=False),
        Column("ArmedAt", Timestamp, nullable=False),
        Column("ExpiresAt", Timestamp, nullable=True),
        Column("ReleasedAt", Timestamp, nullable=True),
        Column("ReleasedBy", String(128), nullable=True),
        PrimaryKeyConstraint("FenceId"),
        Index("ix_AdmissionFence_Namespace", "Namespace", "ReleasedAt"),
    )
    Table(
        "_System_AdmissionFenceOverride",
        md,
        Column("OverrideId", AutoBigInt, nullable=False, autoincrement=True),
        Column("FenceId", BigInteger, nullable=False),
        Column("Scope", String(128), nullable=False),
        Column("CreatedBy", String(128), nullable=False),
        Column("CreatedAt", Timestamp, nullable=False),
        Column("ExpiresAt", Timestamp, nullable=True),
        Column("RevokedAt", Timestamp, nullable=True),
        PrimaryKeyConstraint("OverrideId"),
        Index("ix_FenceOverride_Fence", "FenceId"),
    )
    Table(
        "_System_IngressReceipt",
        md,
        Column("PackInstallId", String(64), nullable=False),
        Column("SourceLane", String(128), nullable=False),
        Column("ReceiptId", String(128), nullable=False),
        Column("EventKind", String(128), nullable=False),
        Column("Payload", Text, nullable=False),
        Column("ReceivedAt", Timestamp, nullable=False),
        Column("MaterializedAt", Timestamp, nullable=True),
        Column("ConfirmedAt", Timestamp, nullable=True),
        PrimaryKeyConstraint("PackInstallId", "SourceLane", "ReceiptId"),
        Index("ix_IngressReceipt_Pending", "PackInstallId", "MaterializedAt"),
    )
    Table(
        "_System_ProcessRegistry",
        md,
        Column("ProcessId", String(128), nullable=False),
        Column("Namespace", String(64), nullable=False),
        Column("Role", String(32), nullable=False),
        Column("BinaryVersion", String(64), nullable=False),
        Column("ProjectionProtocol", Integer, nullable=False),
        Column("StartedAt", Timestamp, nullable=False),
        Column("LastHeartbeatAt", Timestamp, nullable=False),
        Column("ActivatedAt", Timestamp, nullable=True),
        Column("StoppedAt", Timestamp, nullable=True),
        PrimaryKeyConstraint("ProcessId"),
        Index("ix_ProcessRegistry_Role", "Namespace", "Role", "StoppedAt"),
    )
    Table(
        "_System_Lock",
        md,
        Column("LockName", String(191), nullable=False),
        PrimaryKeyConstraint("LockName"),
    )
    Table(
        "_System_Field",
        md,
        Column("FieldId", BigInteger, nullable=False, autoincrement=False),
        Column("ObjectName", String(128), nullable=False),
        Column("FieldName", String(128), nullable=False),
        Column("TrackHistory", Boolean, nullable=False),
        Column("Revision", BigInteger, nullable=False),
        PrimaryKeyConstraint("FieldId"),
    )
    Table(
        "_System_FieldHistorySequence",
        md,
        Column("FieldId", BigInteger, nullable=False, autoincrement=False),
        Column("LastSequence", BigInteger, nullable=False),
        PrimaryKeyConstraint("FieldId"),
    )
    Table(
        "_System_FieldHistoryTrackingInterval",
        md,
        Column("IntervalId", AutoBigInt, nullable=False, autoincrement=True),
        Column("FieldId", BigInteger, nullable=False),
        Column("StartedSequence", BigInteger, nullable=False),
        Column("EndedSequence", BigInteger, nullable=True),
        PrimaryKeyConstraint("IntervalId"),
        Index("ix_TrackingInterval_Field", "FieldId", "StartedSequence"),
    )
    audit_columns = [
        Column("ChangeId", BigInteger, nullable=False, autoincrement=False),
        Column("AuditId", BigInteger, nullable=False),
        Column("ObjectName", String(128), nullable=False),
        Column("RecordId", String(64), nullable=False),
        Column("FieldId", BigInteger, nullable=True),
        Column("OldValue", Text, nullable=True),
        Column("NewValue", Text, nullable=True),
        Column("HistorySequence", BigInteger, nullable=True),
        Column("ProducerVersion", String(64), nullable=False),
        Column("CreatedAt", Timestamp, nullable=False),
    ]
    if with_part_b:
        audit_columns.append(Column("FieldHistoryEligible", Boolean, nullable=True))
    Table(
        "_System_AuditFieldChange",
        md,
        *audit_columns,
        PrimaryKeyConstraint("ChangeId"),
        Index("ix_AuditFieldChange_Field", "FieldId", "HistorySequence"),
    )
    Table(
        "_System_AuditOutbox",
        md,
        Column("OutboxId", BigInteger, nullable=False, autoincrement=False),
        Column("ProducerVersion", String(64), nullable=False),
        Column("Status", String(16), nullable=False),
        Column("Attempts", Integer, nullable=False, server_default="0"),
        Column("Payload", Text, nullable=False),
        Column("CreatedAt", Timestamp, nullable=False),
        PrimaryKeyConstraint("OutboxId"),
        Index("ix_AuditOutbox_Status", "Status", "ProducerVersion"),
    )
    Table(
        "_System_RuntimeSetting",
        md,
        Column("Name", String(128), nullable=False),
        Column("Value", String(255), nullable=False),
        Column("UpdatedBy", String(128), nullable=False),
        Column("UpdatedAt", Timestamp, nullable=False),
        PrimaryKeyConstraint("Name"),
    )
    if with_part_b:
        Table(
            "_System_ConnectorProjectionProtocol",
            md,
            Column("PackInstallId", String(64), nullable=False),
            Column("ProtocolVersion", Integer, nullable=False),
            Column("LegacyMaxOrdinal", BigInteger, nullable=False),
            Column("WrittenAt", Timestamp, nullable=False),
            Column("WrittenBy", String(128), nullable=False),
            PrimaryKeyConstraint("PackInstallId"),
        )


#: Part A only: the schema of a tenant before any cutover.
legacy_metadata = MetaData()
_define(legacy_metadata, with_part_b=False)

#: Part A + Part B: what queries are built from.
metadata = MetaData()
_define(metadata, with_part_b=True)

PackInstall = metadata.tables["_System_PackInstall"]
EnqueueOrdinal = metadata.tables["_System_EnqueueOrdinal"]
Event = metadata.tables["_System_Event"]
WorkItem = metadata.tables["_System_WorkItem"]
AdmissionFence = metadata.tables["_System_AdmissionFence"]
AdmissionFenceOverride = metadata.tables["_System_AdmissionFenceOverride"]
IngressReceipt = metadata.tables["_System_IngressReceipt"]
ProcessRegistry = metadata.tables["_System_ProcessRegistry"]
Lock = metadata.tables["_System_Lock"]
Field = metadata.tables["_System_Field"]
FieldHistorySequence = metadata.tables["_System_FieldHistorySequence"]
FieldHistoryTrackingInterval = metadata.tables["_System_FieldHistoryTrackingInterval"]
AuditFieldChange = metadata.tables["_System_AuditFieldChange"]
AuditOutbox = metadata.tables["_System_AuditOutbox"]
RuntimeSetting = metadata.tables["_System_RuntimeSetting"]
ConnectorProjectionProtocol = metadata.tables["_System_ConnectorProjectionProtocol"]


@dataclass(frozen=True)
class AddedColumn:
    """A Part B column added to an existing Part A table."""

    table: Table
    column_name: str

    @property
    def column(self) -> Column:
        return self.table.c[self.column_name]

    @property
    def label(self) -> str:
        return f"{self.table.name}.{self.column_name}"


#: Part B, connector projection range cutover step 1.
INPUT_START_ORDINAL = AddedColumn(WorkItem, "InputStartOrdinal")
#: Part B, Field History eligibility stage 1.
FIELD_HISTORY_ELIGIBLE = AddedColumn(AuditFieldChange, "FieldHistoryEligible")
#: The earlier WorkItem-only v2 handoff: a prerequisite, never created by this project.
V2_REPLAY_OF_WORK_ID = AddedColumn(WorkItem, "ReplayOfWorkId")

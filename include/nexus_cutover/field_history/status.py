"""``status``: where a tenant stands on Field History eligibility (read-only).

Counts come from one scan of ``_System_AuditFieldChange`` with the predicates of
:mod:`.readers` (no second copy of the rule); switches from
:mod:`.settings`; producers from :mod:`.inventory`.
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, case, func, select

from .. import catalog, tx
from ..db import translate_errors
from . import readers
from .inventory import OutboxCount, ProducerProcess, outbox_counts, producer_processes
from .prerequisites import require_eligibility_column
from .settings import FieldHistorySettings, read_settings

Audit = catalog.AuditFieldChange


@dataclass(frozen=True)
class RowCounts:
    total: int
    null_rows: int
    eligible_null_rows: int
    materializable_rows: int
    null_without_sequence: int
    null_without_field_id: int
    true_rows: int
    false_rows: int

    def as_dict(self) -> dict:
        return {
            "total_rows": self.total,
            "null_rows": self.null_rows,
            "eligible_null_rows": self.eligible_null_rows,
            "materializable_rows": self.materializable_rows,
            "null_rows_without_sequence": self.null_without_sequence,
            "null_rows_without_field_id": self.null_without_field_id,
            "rows_by_value": {"true": self.true_rows, "false": self.false_rows, "null": self.null_rows},
        }


def _count_if(condition):
    return func.coalesce(func.sum(case((condition, 1), else_=0)), 0)


def row_counts(conn: Connection) -> RowCounts:
    """Every count in one pass over the audit table."""
    stmt = select(
        func.count(),
        _count_if(readers.is_null()),
        _count_if(readers.eligible_null()),
        _count_if(readers.materializable()),
        _count_if(readers.is_null() & Audit.c.HistorySequence.is_(None)),
        _count_if(readers.is_null() & Audit.c.FieldId.is_(None)),
        _count_if(readers.stamped_true()),
        _count_if(readers.stamped_false()),
    ).select_from(Audit)
    return RowCounts(*(int(v) for v in conn.execute(stmt).one()))


def eligible_null_count(conn: Connection) -> int:
    return conn.scalar(select(func.count()).select_from(Audit).where(readers.eligible_null())) or 0


@dataclass
class FieldHistoryStatus:
    rows: RowCounts
    settings: FieldHistorySettings
    processes: list[ProducerProcess] = field(default_factory=list)
    outbox: list[OutboxCount] = field(default_factory=list)

    @property
    def eligible_null_rows(self) -> int:
        return self.rows.eligible_null_rows

    def as_dict(self) -> dict:
        return {
            **self.rows.as_dict(),
            **self.settings.as_dict(),
            "producers": {
                "processes": [p.as_dict() for p in self.processes],
                "outbox": [c.as_dict() for c in self.outbox],
            },
        }


def read_status(engine: Engine, namespace: str | None = None) -> FieldHistoryStatus:
    """Counts, switches and producer inventory, read in one snapshot where the backend gives one."""
    with translate_errors("reading the Field History status"):
        require_eligibility_column(engine)
    return tx.read(
        engine,
        lambda conn: FieldHistoryStatus(row_counts(conn), read_settings(conn), producer_processes(conn, namespace), outbox_counts(conn)),
        what="reading the Field History status",
    )

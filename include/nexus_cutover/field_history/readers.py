"""The two Field History readers, as SQLAlchemy expressions: the only copy of the predicate.

Every count, check and the materializer build on these functions; nothing else
spells the interval predicate or the eligibility rule.

Invariants (seed 003 "Cutover", contract "Field History eligibility"):

* Boolean-only reader: ``FieldHistoryEligible = TRUE``.
* Compatibility reader: ``FieldHistoryEligible = TRUE OR (FieldHistoryEligible IS
  NULL AND HistorySequence IS NOT NULL AND <an interval of the row's FieldId has
  StartedSequence < HistorySequence AND (EndedSequence IS NULL OR HistorySequence
  < EndedSequence)>)``.
* A stamped FALSE never falls back to an interval (the fallback is guarded by
  ``IS NULL``); a row without a HistorySequence is fail-closed; a row without a
  FieldId matches no interval. Timestamps appear nowhere.
* The interval test is a correlated EXISTS on ``ix_TrackingInterval_Field``
  (FieldId, StartedSequence), so it is a point/range probe per row.
"""

from __future__ import annotations

from sqlalchemy import ColumnElement, and_, exists, false, not_, or_, select, true
from sqlalchemy.sql import FromClause

from .. import catalog

Audit = catalog.AuditFieldChange
Interval = catalog.FieldHistoryTrackingInterval


def eligible_column(audit: FromClause = Audit):
    return audit.c[catalog.FIELD_HISTORY_ELIGIBLE.column_name]


def interval_contains(field_id: ColumnElement, sequence: ColumnElement) -> ColumnElement[bool]:
    """The strict legacy predicate for a (field, sequence) pair: some interval of the field contains the sequence."""
    return exists(
        select(Interval.c.IntervalId).where(
            Interval.c.FieldId == field_id,
            Interval.c.StartedSequence < sequence,
            or_(Interval.c.EndedSequence.is_(None), sequence < Interval.c.EndedSequence),
        )
    )


def interval_proves(audit: FromClause = Audit) -> ColumnElement[bool]:
    """The strict legacy predicate: some interval of the row's field contains its sequence."""
    return interval_contains(audit.c.FieldId, audit.c.HistorySequence)


def is_null(audit: FromClause = Audit) -> ColumnElement[bool]:
    return eligible_column(audit).is_(None)


def stamped_true(audit: FromClause = Audit) -> ColumnElement[bool]:
    return eligible_column(audit).is_(true())


def stamped_false(audit: FromClause = Audit) -> ColumnElement[bool]:
    return eligible_column(audit).is_(false())


def eligible_null(audit: FromClause = Audit) -> ColumnElement[bool]:
    """A NULL row that the compatibility reader accepts (the legacy fallback branch)."""
    return and_(is_null(audit), audit.c.HistorySequence.isnot(None), interval_proves(audit))


def compat_reader(audit: FromClause = Audit) -> ColumnElement[bool]:
    """The compatibility read path of stages 1 and 2."""
    return or_(stamped_true(audit), eligible_null(audit))


def boolean_only_reader(audit: FromClause = Audit) -> ColumnElement[bool]:
    """The final read path of stage 3."""
    return stamped_true(audit)


def materializable(audit: FromClause = Audit) -> ColumnElement[bool]:
    """NULL rows whose existing facts decide the value: a FieldId and a HistorySequence."""
    return and_(is_null(audit), audit.c.FieldId.isnot(None), audit.c.HistorySequence.isnot(None))


def proves_true(audit: FromClause = Audit) -> ColumnElement[bool]:
    """Materializable rows that become TRUE (they are exactly the eligible NULL rows with a FieldId)."""
    return and_(materializable(audit), interval_proves(audit))


def proves_false(audit: FromClause = Audit) -> ColumnElement[bool]:
    """Materializable rows that become FALSE: no interval proves eligibility."""
    return and_(materializable(audit), not_(interval_proves(audit)))

"""The one rule of Field History provenance: what a producer stamps, and which NULL is legitimate (seed 003, "Authority").

Used by the reference producer (:mod:`nexus_sim.producers`), the stage-2 gate
(:mod:`.gates`) and the tests, so that the three can never disagree.

* A *history-addressable* diff is a real Update diff with a stable FieldId.
  Generic-audit-only diffs (no FieldId) and Create/Delete pseudo rows are not:
  they are written NULL without a sequence and never force the sequence path.
* A history-addressable diff whose field is in the admitted Mutation view gets
  that view's ``TrackHistory`` (TRUE / FALSE): :func:`eligibility`.
* One whose field is absent from the view -- an *unresolved field* -- supplies
  no provenance: NULL. Its mutation then falls back to sequence reservation for
  all its stable diffs, exactly as before (:func:`reserves_sequences`), so while
  reservation is enabled the NULL row carries a HistorySequence and is
  materialized like a legacy row. With the emergency breaker off it carries none
  and stays fail-closed (neither reader accepts it).
* So a NULL row with a FieldId written by a producer at or above the release is
  *unstamped* -- a producer that failed to stamp a resolved field, which fails
  stage 2 -- exactly when it has no HistorySequence although its field exists
  in ``_System_Field`` (:func:`unstamped_row`). A field missing from
  ``_System_Field`` is unresolved, whatever the row carries. (A field created
  after the mutation was admitted errs on the side of refusing.)
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import ColumnElement, Connection, and_, exists, select

from .. import catalog
from . import readers
from .settings import read_settings

#: The HistorySequence of a field's first reservation (its ``_System_FieldHistorySequence`` row is created with it).
FIRST_SEQUENCE = 1

Audit = catalog.AuditFieldChange


def eligibility(history_addressable: bool, decision: bool | None) -> bool | None:
    """The ``FieldHistoryEligible`` a producer writes: the admitted decision of an addressable diff, else NULL."""
    return decision if history_addressable else None


def reserves_sequences(addressable_decisions: Iterable[bool | None], *, reservation_enabled: bool) -> bool:
    """Whether a mutation falls back to sequence reservation: some addressable diff has no decision."""
    return reservation_enabled and any(decision is None for decision in addressable_decisions)


def unstamped_row() -> ColumnElement[bool]:
    """A NULL row with a FieldId that a stamping producer should have decided (see the module rule)."""
    field = catalog.Field
    return and_(
        readers.is_null(),
        Audit.c.FieldId.isnot(None),
        Audit.c.HistorySequence.is_(None),
        exists(select(field.c.FieldId).where(field.c.FieldId == Audit.c.FieldId)),
    )


def may_reserve(conn: Connection, field_ids: Iterable[int]) -> bool:
    """Inside a mutation's transaction: lock its fields' sequence rows (ascending FieldId), then read the switch.

    True when the mutation may reserve (the switch is on). See the module rule: the
    order is what lets stage 3 wait for every mutation that saw the switch on.
    """
    seq = catalog.FieldHistorySequence
    ids = sorted(set(field_ids))
    if ids:
        conn.execute(select(seq.c.FieldId).where(seq.c.FieldId.in_(ids)).order_by(seq.c.FieldId).with_for_update()).all()
    return read_settings(conn).sequence_reservation_enabled

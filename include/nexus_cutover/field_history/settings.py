"""The two runtime switches of Field History in ``_System_RuntimeSetting``.

Invariants (contract, ``_System_RuntimeSetting``):

* ``FieldHistoryReadMode``: ``compat`` | ``boolean_only``; absent means ``compat``.
* ``FieldHistorySequenceReservationEnabled``: ``true`` | ``false``; absent means ``true``.
* This module writes only those two names (insert-or-update, by primary key) and
  only stage 3 calls :func:`set_setting_in` (:mod:`.switch`, each switch under its own checks: reservation off
  first, the read mode only on an equal comparison under the locks); there is no writer of both at once. An unrecognised stored value is
  reported as it is and read conservatively (compat reads, reservation on).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, insert, select, update

from .. import catalog
from ..clock import utcnow
from ..holders import stored_holder

Setting = catalog.RuntimeSetting
NAMES = (catalog.SETTING_READ_MODE, catalog.SETTING_SEQUENCE_RESERVATION)
FINAL_VALUES = {catalog.SETTING_READ_MODE: catalog.READ_MODE_BOOLEAN_ONLY, catalog.SETTING_SEQUENCE_RESERVATION: "false"}


@dataclass(frozen=True)
class FieldHistorySettings:
    read_mode_raw: str | None
    reservation_raw: str | None

    @property
    def read_mode(self) -> str:
        if self.read_mode_raw == catalog.READ_MODE_BOOLEAN_ONLY:
            return catalog.READ_MODE_BOOLEAN_ONLY
        return catalog.READ_MODE_COMPAT

    @property
    def sequence_reservation_enabled(self) -> bool:
        return (self.reservation_raw or "true").strip().lower() != "false"

    @property
    def final(self) -> bool:
        """Both switches already at their stage-3 values."""
        return self.read_mode == catalog.READ_MODE_BOOLEAN_ONLY and not self.sequence_reservation_enabled

    def as_json(self) -> dict:
        return {
            "read_mode": self.read_mode,
            "sequence_reservation_enabled": self.sequence_reservation_enabled,
            "stored": {catalog.SETTING_READ_MODE: self.read_mode_raw, catalog.SETTING_SEQUENCE_RESERVATION: self.reservation_raw},
        }


def read_settings(conn: Connection) -> FieldHistorySettings:
    rows = dict(conn.execute(select(Setting.c.Name, Setting.c.Value).where(Setting.c.Name.in_(NAMES))).all())
    return FieldHistorySettings(rows.get(catalog.SETTING_READ_MODE), rows.get(catalog.SETTING_SEQUENCE_RESERVATION))


def read_settings_for_update(conn: Connection) -> FieldHistorySettings:
    """:func:`read_settings` as a locking (current) read: the existing switch rows stay locked until the caller's
    transaction ends (a missing row locks nothing: there are no gap locks on TiDB)."""
    rows = dict(conn.execute(select(Setting.c.Name, Setting.c.Value).where(Setting.c.Name.in_(NAMES)).with_for_update()).all())
    return FieldHistorySettings(rows.get(catalog.SETTING_READ_MODE), rows.get(catalog.SETTING_SEQUENCE_RESERVATION))


def set_setting_in(conn: Connection, name: str, value: str, updated_by: str) -> bool:
    """Inside the caller's transaction: set switch ``name`` (one of :data:`NAMES`) to ``value``; True when it changed.

    The row is read FOR UPDATE first (a current read, whatever the snapshot); a
    concurrent writer's insert of a missing row surfaces as a duplicate key,
    which the caller's transaction policy retries from the start.
    """
    if name not in NAMES:
        raise ValueError(f"not a Field History switch: {name!r}")
    current = conn.execute(select(Setting.c.Value).where(Setting.c.Name == name).with_for_update()).first()
    if current is not None and current[0] == value:
        return False
    values = {"Value": value, "UpdatedBy": stored_holder(updated_by), "UpdatedAt": utcnow()}
    if current is None:
        conn.execute(insert(Setting).values(Name=name, **values))
    else:
        conn.execute(update(Setting).where(Setting.c.Name == name).values(**values))
    return True

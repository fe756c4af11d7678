"""The two runtime switches of Field History in ``_System_RuntimeSetting``.

Invariants (contract, ``_System_RuntimeSetting``):

* ``FieldHistoryReadMode``: ``compat`` | ``boolean_only``; absent means ``compat``.
* ``FieldHistorySequenceReservationEnabled``: ``true`` | ``false``; absent means ``true``.
* This module writes only those two names (insert-or-update, by primary key) and
  only stage 3 calls the writer. An unrecognised stored value is reported as it
  is and read conservatively (compat reads, reservation on).
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Connection, Engine, insert, select, update
from sqlalchemy import exc as sa_exc

from .. import catalog
from ..db import Deadline, bounded_session, classify, is_sqlite

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

    def as_dict(self) -> dict:
        return {
            "read_mode": self.read_mode,
            "sequence_reservation_enabled": self.sequence_reservation_enabled,
            "stored": {catalog.SETTING_READ_MODE: self.read_mode_raw, catalog.SETTING_SEQUENCE_RESERVATION: self.reservation_raw},
        }


def read_settings(conn: Connection) -> FieldHistorySettings:
    rows = dict(conn.execute(select(Setting.c.Name, Setting.c.Value).where(Setting.c.Name.in_(NAMES))).all())
    return FieldHistorySettings(rows.get(catalog.SETTING_READ_MODE), rows.get(catalog.SETTING_SEQUENCE_RESERVATION))


def write_final_settings(engine: Engine, updated_by: str, deadline: Deadline) -> list[str]:
    """Set both switches to their stage-3 values in one transaction; returns the names changed."""
    now = dt.datetime.now(dt.UTC).replace(tzinfo=None)
    for attempt in range(3):
        try:
            with engine.connect() as conn:
                if is_sqlite(conn):
                    conn = conn.execution_options(sqlite_begin="IMMEDIATE")
                with bounded_session(conn, deadline), conn.begin():
                    changed = []
                    for name, value in FINAL_VALUES.items():
                        current = conn.execute(select(Setting.c.Value).where(Setting.c.Name == name).with_for_update()).first()
                        if current is not None and current[0] == value:
                            continue
                        values = {"Value": value, "UpdatedBy": updated_by[:128], "UpdatedAt": now}
                        if current is None:
                            conn.execute(insert(Setting).values(Name=name, **values))
                        else:
                            conn.execute(update(Setting).where(Setting.c.Name == name).values(**values))
                        changed.append(name)
                    return changed
        except sa_exc.IntegrityError:
            if attempt == 2:
                raise
            continue  # a concurrent writer inserted the row first: read it again
        except sa_exc.DBAPIError as exc:
            raise classify(exc, "writing the Field History runtime settings") from exc
    raise AssertionError("unreachable")

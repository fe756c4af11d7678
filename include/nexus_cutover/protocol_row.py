"""The per-pack ``_System_ConnectorProjectionProtocol`` row: read, check, insert.

Invariants (seed 000, "Release boundary"; contract, "Audit"):

* One immutable row per pack incarnation, ``ProtocolVersion = 1``, written
  exactly once and never advanced; this module has no UPDATE or DELETE.
* A row with another ProtocolVersion is an error, never reinterpreted.
* ``LegacyMaxOrdinal`` is the old-protocol boundary, not proof of business success.

Both the cutover (which writes the row) and the range runtime (which reads it
once per admission batch and in its activation gate) use this module.
"""

from __future__ import annotations

import datetime as dt
from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, insert, select

from .catalog import PACK_ACTIVE, PROTOCOL_RANGES, ConnectorProjectionProtocol, PackInstall
from .clock import utcnow
from .errors import CutoverError
from .holders import stored_holder


class WrongProtocolVersion(CutoverError):
    """A protocol row exists with a version this tool does not implement."""


@dataclass(frozen=True)
class ProtocolRow:
    pack_install_id: str
    protocol_version: int
    legacy_max_ordinal: int
    written_at: dt.datetime
    written_by: str


_t = ConnectorProjectionProtocol
#: Built once (read once per admission batch: constructing the statement would cost more than running it).
_ROW = select(_t.c.PackInstallId, _t.c.ProtocolVersion, _t.c.LegacyMaxOrdinal, _t.c.WrittenAt, _t.c.WrittenBy).where(
    _t.c.PackInstallId == bindparam("pack", type_=_t.c.PackInstallId.type)
)
_ROW_FOR_UPDATE = _ROW.with_for_update()


def read_protocol_row(conn: Connection, pack_install_id: str, *, for_update: bool = False) -> ProtocolRow | None:
    """The pack's protocol row (a bounded primary-key read), or None.

    ``for_update``: a locking read, which sees the latest committed row even where
    the transaction's snapshot is older (TiDB takes it at the first statement).
    """
    row = conn.execute(_ROW_FOR_UPDATE if for_update else _ROW, {"pack": pack_install_id}).first()
    if row is None:
        return None
    return ProtocolRow(*row)


def active_protocol_rows(conn: Connection, namespace: str) -> dict[str, ProtocolRow]:
    """The protocol row of every active pack of ``namespace`` that has one (PackInstallId as ``_System_PackInstall``
    spells it -> row), in one statement: a range on ``ix_PackInstall_Namespace``, then a primary-key probe per pack
    (never a statement per pack: a namespace may hold thousands)."""
    p = PackInstall
    stmt = (
        select(p.c.PackInstallId.label("pack"), *_ROW.selected_columns)
        .join_from(p, _t, _t.c.PackInstallId == p.c.PackInstallId)
        .where(p.c.Namespace == namespace, p.c.Status == PACK_ACTIVE)
    )
    return {row[0]: ProtocolRow(*row[1:]) for row in conn.execute(stmt)}


def require_version_1(row: ProtocolRow) -> ProtocolRow:
    if row.protocol_version != PROTOCOL_RANGES:
        raise WrongProtocolVersion(
            f"pack {row.pack_install_id!r} has a connector projection protocol row with ProtocolVersion "
            f"{row.protocol_version} (this tool implements {PROTOCOL_RANGES}); it is left unchanged"
        )
    return row


def insert_protocol_row(conn: Connection, pack_install_id: str, legacy_max_ordinal: int, written_by: str) -> ProtocolRow:
    """Insert the version-1 row inside the caller's locked transaction."""
    now = utcnow()
    row = ProtocolRow(pack_install_id, PROTOCOL_RANGES, legacy_max_ordinal, now, stored_holder(written_by))
    conn.execute(
        insert(ConnectorProjectionProtocol).values(
            PackInstallId=row.pack_install_id,
            ProtocolVersion=row.protocol_version,
            LegacyMaxOrdinal=row.legacy_max_ordinal,
            WrittenAt=row.written_at,
            WrittenBy=row.written_by,
        )
    )
    return row

"""Per-batch pack context: the pack's namespace and its version-1 protocol row.

Read once per admission / replay transaction, after the pack lock: a pack that
is unknown, uninstalled, or has no version-1 ``_System_ConnectorProjectionProtocol``
row admits nothing (the activation gate's rule). The pack is named by its stored
PackInstallId from then on (the caller's spelling may differ as the collation allows).
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, bindparam, select

from .. import catalog
from ..errors import BadInput
from ..protocol_row import ProtocolRow, read_protocol_row, require_version_1
from .errors import NotActivated


@dataclass(frozen=True)
class PackContext:
    pack_install_id: str
    namespace: str
    protocol: ProtocolRow


def no_protocol_row_reason(pack_install_id: str) -> str:
    return (
        f"pack {pack_install_id!r} has no connector projection protocol row: a pack installed with no history is "
        f"activated with `nexus-cutover activate-pack -pack-install-id {pack_install_id}`; one with history goes "
        f"through the cutover (`connector-projection-cutover -pack-install-id {pack_install_id}` after the drain)"
    )


#: Built once: it runs once per admission batch.
_PACK = select(catalog.PackInstall.c.PackInstallId, catalog.PackInstall.c.Namespace, catalog.PackInstall.c.Status).where(
    catalog.PackInstall.c.PackInstallId == bindparam("pack", type_=catalog.PackInstall.c.PackInstallId.type)
)


def pack_context(conn: Connection, pack_install_id: str) -> PackContext:
    """The pack's context; ``pack_install_id`` of the result is the stored spelling (the server found the row by its
    collation, so ``PK-1`` may name ``pk-1``): what admission writes into Events and WorkItems."""
    row = conn.execute(_PACK, {"pack": pack_install_id}).first()
    if row is None:
        raise BadInput(f"unknown pack install {pack_install_id!r}: no _System_PackInstall row")
    if row.Status != catalog.PACK_ACTIVE:
        raise BadInput(f"pack install {pack_install_id!r} is {row.Status!r}, not active: nothing is admitted for it")
    stored = row.PackInstallId
    protocol = read_protocol_row(conn, stored)
    if protocol is None:
        raise NotActivated([no_protocol_row_reason(stored)])
    return PackContext(stored, row.Namespace, require_version_1(protocol))

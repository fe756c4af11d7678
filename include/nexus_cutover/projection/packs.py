"""Which packs a cutover run covers, and the dry-run plan of the schema step.

Invariants:

* The packs of a run are active ``_System_PackInstall`` rows of the namespace
  (on ``ix_PackInstall_Namespace``). A requested pack that is unknown, belongs
  to another namespace or is not active is :class:`~nexus_cutover.errors.BadInput`,
  never silently dropped. No pack at all is BadInput too: there is nothing to cut over.
* Read only.
"""

from __future__ import annotations

from collections.abc import Iterable

from sqlalchemy import Connection, Engine, select

from .. import catalog, tx
from ..catalog import PackInstall
from ..errors import BadInput
from ..namespaces import SHOWN, some_namespaces
from ..schema import DdlStep


def resolve_packs(bind: Engine | Connection, namespace: str, requested: Iterable[str] = ()) -> list[str]:
    """The PackInstallIds of the run, ascending (the lock order)."""
    requested = sorted(set(requested))
    with tx.reading(bind, "reading the namespace's packs") as conn:
        active = {
            r[0]
            for r in conn.execute(
                select(PackInstall.c.PackInstallId).where(
                    PackInstall.c.Namespace == namespace, PackInstall.c.Status == catalog.PACK_ACTIVE
                )
            )
        }
        if not requested:
            if not active:
                have = [n for n in some_namespaces(conn) if n != namespace]
                listed = ", ".join(repr(n) for n in have[:SHOWN]) + (", ..." if len(have) > SHOWN else "")
                raise BadInput(
                    f"namespace {namespace!r} has no active pack in this database: nothing to cut over. "
                    + (f"This database has the namespaces {listed}. " if have else "")
                    + "Does the connection point at another tenant's database? Next: check the tenant name, and "
                    "the connection (conn_id / the DSN's schema) if it is another tenant's database; trigger again"
                )
            return sorted(active)
        wrong = [p for p in requested if p not in active]
        if wrong:
            raise BadInput(
                f"pack(s) {', '.join(wrong)} are not active packs of namespace {namespace!r} "
                f"(active: {', '.join(sorted(active)) or 'none'}); fix pack_install_ids"
            )
        return requested


def schema_plan(steps: list[DdlStep]) -> list[str]:
    """One line per additive object: the DDL that would run, or why it is skipped."""
    return [f"{s.label}: present, skipped" if s.present else f"{s.label}: {s.ddl}" for s in steps]

"""Which namespaces a tenant database holds: a mistyped namespace is bad input, never "not started".

Invariants:

* A namespace is known to the database when a ``_System_PackInstall`` row (any status) or an admission fence
  names it, as the server compares names (the tenant's collation, like every other identity here). Each probe is
  one ``LIMIT 1`` read on ``ix_PackInstall_Namespace`` / ``ix_AdmissionFence_Namespace``.
* :func:`require_known_namespace` refuses an unknown one with :class:`~nexus_cutover.errors.BadInput` (exit 2),
  naming the namespaces the database does have (at most :data:`SHOWN` of them, read on the pack index).
"""

from __future__ import annotations

from sqlalchemy import Connection, select

from .catalog import AdmissionFence, PackInstall
from .errors import BadInput

#: How many of the database's namespaces a refusal names.
SHOWN = 20


def is_known_namespace(conn: Connection, namespace: str) -> bool:
    """Whether a pack (any status) or an admission fence of ``namespace`` exists."""
    for table in (PackInstall, AdmissionFence):
        if conn.execute(select(table.c.Namespace).where(table.c.Namespace == namespace).limit(1)).first() is not None:
            return True
    return False


def some_namespaces(conn: Connection, limit: int = SHOWN) -> list[str]:
    """Up to ``limit`` namespaces of the database's packs, in the index's order (a distinct read on the pack index)."""
    stmt = select(PackInstall.c.Namespace).distinct().order_by(PackInstall.c.Namespace).limit(limit + 1)
    return list(conn.execute(stmt).scalars())


def require_known_namespace(conn: Connection, namespace: str) -> None:
    """Return when ``namespace`` is known here; else :class:`BadInput` naming what the database has."""
    if is_known_namespace(conn, namespace):
        return
    have = some_namespaces(conn)
    listed = ", ".join(repr(n) for n in have[:SHOWN]) + (", ..." if len(have) > SHOWN else "")
    raise BadInput(
        f"namespace {namespace!r} has no pack and no admission fence in this database: is it mistyped? "
        + (f"This database has the namespaces {listed}." if have else "This database has no pack at all.")
        + " Next: give -namespace one of them, or point NEXUS_TENANT_DSN at the tenant's own database."
    )

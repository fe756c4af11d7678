"""The activation gate (seed 000, "Native projection activation requires ..."; contract, reference host).

A host or a standalone worker of ``namespace`` may serve range work only when:

* the WorkItem schema is complete for the range protocol: ``ReplayOfWorkId``
  (the v2 handoff) and ``InputStartOrdinal``, plus the protocol table - there is
  no optional-column rolling compatibility for projection work;
* every *active* pack of the namespace has a ``ProtocolVersion = 1``
  ``_System_ConnectorProjectionProtocol`` row.

:func:`check_activation` only reads; it never creates schema or rows. The
verdict lists every reason, each naming what to fix. A namespace with no active
pack passes (there is nothing to serve yet).
"""

from __future__ import annotations

from dataclasses import dataclass, field

from sqlalchemy import Connection, Engine, select

from .. import catalog
from ..catalog import PROTOCOL_RANGES
from ..db import translate_errors
from ..protocol_row import read_protocol_row
from ..schema import missing_projection_schema
from .errors import NotActivated
from .packs import no_protocol_row_reason


@dataclass(frozen=True)
class ActivationVerdict:
    ok: bool
    reasons: list[str] = field(default_factory=list)
    packs: list[str] = field(default_factory=list)


def active_packs(conn: Connection, namespace: str) -> list[str]:
    t = catalog.PackInstall
    rows = conn.execute(
        select(t.c.PackInstallId).where(t.c.Namespace == namespace, t.c.Status == catalog.PACK_ACTIVE).order_by(t.c.PackInstallId)
    )
    return [r.PackInstallId for r in rows]


def _check(conn: Connection, namespace: str) -> ActivationVerdict:
    missing = missing_projection_schema(conn)
    if missing:
        return ActivationVerdict(
            False,
            [
                "range projection schema incomplete: missing "
                + ", ".join(missing)
                + " (apply the additive schema, cutover step 1; ReplayOfWorkId comes from the v2 handoff)"
            ],
        )
    packs = active_packs(conn, namespace)
    reasons = []
    for pack in packs:
        row = read_protocol_row(conn, pack)
        if row is None:
            reasons.append(no_protocol_row_reason(pack))
        elif row.protocol_version != PROTOCOL_RANGES:
            reasons.append(f"pack {pack!r} has protocol row version {row.protocol_version}, this runtime implements {PROTOCOL_RANGES}")
    return ActivationVerdict(not reasons, reasons, packs)


def check_activation(conn_or_engine: Connection | Engine, namespace: str) -> ActivationVerdict:
    """Whether range workers of ``namespace`` may serve, and if not, why (reads only)."""
    with translate_errors(f"checking the activation gate of namespace {namespace!r}"):
        if isinstance(conn_or_engine, Engine):
            with conn_or_engine.connect() as conn:
                return _check(conn, namespace)
        return _check(conn_or_engine, namespace)


def require_activation(conn_or_engine: Connection | Engine, namespace: str) -> ActivationVerdict:
    """:func:`check_activation`, raising :class:`~.errors.NotActivated` (exit 3) when it refuses."""
    verdict = check_activation(conn_or_engine, namespace)
    if not verdict.ok:
        raise NotActivated(verdict.reasons)
    return verdict

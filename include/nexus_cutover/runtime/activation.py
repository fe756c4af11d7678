"""The activation gate (seed 000, "Native projection activation requires ..."; contract, reference host).

A host or a standalone worker of ``namespace`` may serve range work only when:

* the WorkItem schema is complete for the range protocol: ``ReplayOfWorkId``
  (the v2 handoff) and ``InputStartOrdinal``, plus the protocol table - there is
  no optional-column rolling compatibility for projection work;
* every *active* pack of the namespace has a ``ProtocolVersion = 1``
  ``_System_ConnectorProjectionProtocol`` row;
* no active pack holds old-protocol work above its cutoff
  (:mod:`nexus_cutover.above_cutoff`: what an old runtime admitted after the
  checkpoint, through a rollback or an activation over a live old runtime): the
  refusal names the pack, the WorkIds and the Events; it needs a separately
  reviewed recovery decision, and nothing is admitted.

:func:`check_activation` only reads; it never creates schema or rows. The
verdict lists every reason, each naming what to fix. A namespace with no active
pack passes (there is nothing to serve yet).

After the gate, a running host keeps its packs current with
:class:`ServedPacks`: the set it serves is re-read at most once per period (one
statement: :func:`pack_protocols`), so a pack activated later (its protocol row
written by the cutover or by greenfield activation) is served within one
period, without a restart. A pack installed after activation without its row
does not stop the host: the other packs keep being served, the new one is
skipped (logged once) until its row exists; so is a pack whose row appears
while it holds old-protocol work above its cutoff (skipped, named, until a
reviewed recovery). :func:`protocol_in_force` is the same
rule in SQL, for reads that must never pick up such a pack's work (the claim).
"""

from __future__ import annotations

import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass, field

from sqlalchemy import ColumnElement, Connection, Engine, Select, select

from .. import catalog, tx
from ..above_cutoff import namespace_above_cutoff, packs_above_cutoff
from ..catalog import PROTOCOL_RANGES
from ..protocol_row import active_protocol_rows
from ..schema import missing_projection_schema
from .errors import NotActivated
from .packs import no_protocol_row_reason

log = logging.getLogger(__name__)


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


def pack_protocols(conn: Connection, namespace: str) -> list[tuple[str, int | None]]:
    """Every active pack of ``namespace`` with the ProtocolVersion of its protocol row (None: no row), by id.

    One statement: a range on ``ix_PackInstall_Namespace``, then a primary-key
    probe of ``_System_ConnectorProjectionProtocol`` per pack.
    """
    return [(r.PackInstallId, r.ProtocolVersion) for r in conn.execute(pack_protocols_query(namespace))]


def pack_protocols_query(namespace: str) -> Select:
    """The statement of :func:`pack_protocols`."""
    t, p = catalog.PackInstall, catalog.ConnectorProjectionProtocol
    return (
        select(t.c.PackInstallId, p.c.ProtocolVersion)
        .select_from(t.outerjoin(p, p.c.PackInstallId == t.c.PackInstallId))
        .where(t.c.Namespace == namespace, t.c.Status == catalog.PACK_ACTIVE)
        .order_by(t.c.PackInstallId)
    )


def protocol_in_force(pack_install_id: ColumnElement) -> ColumnElement[bool]:
    """SQL: the pack named by ``pack_install_id`` has a version-1 protocol row (a correlated primary-key probe).

    A scalar subquery, not ``EXISTS``: MariaDB turns an ``EXISTS`` into a
    semi-join driven by the protocol table, re-reading the outer range once per
    protocol row; a dependent scalar subquery stays one ``eq_ref`` probe per
    outer row (memoized per pack). Protocol rows are never deleted or changed,
    so a row this finds stays in force.
    """
    p = catalog.ConnectorProjectionProtocol
    version = select(p.c.ProtocolVersion).where(p.c.PackInstallId == pack_install_id).scalar_subquery()
    return version == PROTOCOL_RANGES


def _not_served_reason(pack: str, version: int | None) -> str:
    if version is None:
        return no_protocol_row_reason(pack)
    return f"pack {pack!r} has protocol row version {version}, this runtime implements {PROTOCOL_RANGES}"


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
    rows = active_protocol_rows(conn, namespace)  # one statement, whatever the number of packs
    reasons = []
    for pack in packs:
        row = rows.get(pack)
        if row is None or row.protocol_version != PROTOCOL_RANGES:
            reasons.append(_not_served_reason(pack, row.protocol_version if row else None))
    reasons += [found.describe() for found in namespace_above_cutoff(conn, namespace)]
    return ActivationVerdict(not reasons, reasons, packs)


def check_activation(conn_or_engine: Connection | Engine, namespace: str) -> ActivationVerdict:
    """Whether range workers of ``namespace`` may serve, and if not, why (reads only)."""
    with tx.reading(conn_or_engine, f"checking the activation gate of namespace {namespace!r}") as conn:
        return _check(conn, namespace)


def require_activation(conn_or_engine: Connection | Engine, namespace: str) -> ActivationVerdict:
    """:func:`check_activation`, raising :class:`~.errors.NotActivated` (exit 3) when it refuses."""
    verdict = check_activation(conn_or_engine, namespace)
    if not verdict.ok:
        raise NotActivated(verdict.reasons)
    return verdict


class ServedPacks:
    """The packs a running host serves: active packs of the namespace with a version-1 protocol row.

    :meth:`refresh` re-reads them (:func:`pack_protocols`, one statement) at most
    once per ``period_s`` (the heartbeat period), or at once after
    :meth:`invalidate`. It logs each change once, not every loop: a pack that
    becomes served, an active pack skipped for lack of a version-1 row (until
    that changes), a served pack that is no longer active. Protocol rows are
    immutable, so once served a pack stays served while it is active.
    """

    def __init__(self, engine: Engine, namespace: str, period_s: float, initial: Iterable[str] = ()):
        self.engine = engine
        self.namespace = namespace
        self.period_s = period_s
        self.packs: list[str] = sorted(set(initial))
        self.skipped: dict[str, str] = {}  # active pack not served -> why
        self._due = time.monotonic() + period_s

    def invalidate(self) -> None:
        """Re-read on the next :meth:`refresh` (e.g. a pack refused admission: it may have been uninstalled)."""
        self._due = 0.0

    def refresh(self) -> list[str]:
        """The packs newly served by this refresh (empty when none, or when the period has not passed)."""
        now = time.monotonic()
        if now < self._due:
            return []
        self._due = now + self.period_s
        with tx.reading(self.engine, f"listing the packs of namespace {self.namespace!r}") as conn:
            rows = pack_protocols(conn, self.namespace)
            skipped = {pack: _not_served_reason(pack, version) for pack, version in rows if version != PROTOCOL_RANGES}
            coming = [pack for pack, version in rows if version == PROTOCOL_RANGES and pack not in self.packs]
            if coming:  # a pack about to be served: not while it holds old work above its cutoff (read in chunks)
                cutoffs = active_protocol_rows(conn, self.namespace)
                for found in packs_above_cutoff(conn, [(p, cutoffs[p].legacy_max_ordinal) for p in coming if p in cutoffs]):
                    skipped[found.pack_install_id] = found.describe()
        served = [pack for pack, version in rows if version == PROTOCOL_RANGES and pack not in skipped]
        added = [pack for pack in served if pack not in self.packs]
        for pack in added:
            log.info("pack %s: version-1 protocol row present: now served (picked up without a restart)", pack)
        for pack in self.packs:
            if pack not in served and pack not in skipped:
                log.info("pack %s is no longer active: no longer served", pack)
        for pack, reason in skipped.items():
            if self.skipped.get(pack) != reason:
                then = ("until a reviewed recovery decision" if pack in dict(rows) and dict(rows)[pack] == PROTOCOL_RANGES
                        else f"and it is picked up within {self.period_s:g}s once its version-1 row exists")
                log.warning("%s -- not serving it; the other packs are served, %s", reason, then)
        self.packs, self.skipped = served, skipped
        return added

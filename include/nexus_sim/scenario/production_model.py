"""What the production-shaped tenant (:mod:`.production`) is made of: its names (packs, work types, statuses, roles,
versions, kinds of future receipt) and the data it is planned into and reported as.

Split out of :mod:`.production`, which re-exports every name here (importers may keep
``from nexus_sim.scenario.production import ...``).

Invariants:

* Names only and plain data: nothing here reads a server, draws a random number or plans a row
  (:mod:`.production_plan` plans, :mod:`.production` assembles and writes).
* :data:`PROJECTION_WORK_TYPE` is the reference host's default routing, so planted history and what the host admits
  after the release are one work type; :data:`ORDINARY_WORK_TYPES` never include it.
* Ids fit their columns: :data:`LONG_PACK` is at PackInstallId's column limit.
* :class:`Planted` is everything planted that tests assert on, as data (``as_json()`` for reports).
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from typing import Any

from nexus_cutover import catalog
from nexus_cutover.runtime.model import Routing

from ..collation import ServerCollation
from .builder import TenantScenario

#: The projection work type: what the reference host routes receipts to by default, so that planted history and
#: what the host admits after the release are one work type.
PROJECTION_WORK_TYPE = Routing().work_type
#: Work types of ordinary work (never a projection work type).
ORDINARY_WORK_TYPES = ("crm.email.send", "crm.webhook.deliver", "crm.rollup.recalculate")
ORDINARY_STATUSES = ("pending", "blocked", "retry", "processing", "completed", "failed", "cancelled")
#: The Status an ordinary Event has while its WorkItem has the given Status.
ORDINARY_EVENT_STATUS = {
    "pending": "pending",
    "blocked": "pending",
    "retry": "pending",
    "processing": "processing",
    "completed": "processed",
    "failed": "failed",
    "cancelled": "skipped",
}

OLD_BINARY_VERSIONS = ("4.8.2", "4.9.0", "4.10.1", "4.11.0")
#: Roles of the stopped registry rows: every old-protocol writer role and every pre-cutover producer role.
STOPPED_ROLES = catalog.OLD_WRITER_ROLES + (
    catalog.ROLE_RUNTIME_API,
    catalog.ROLE_SERVICE_MANAGER,
    catalog.ROLE_AUDIT_OUTBOX_WORKER,
)
#: ProcessIds of the live old writers planted with ``live_old_writers`` (an old runtime simulator stands in for them
#: with ``writer_id`` / ``worker_id``).
LIVE_OLD_WRITER_IDS = {catalog.ROLE_INGRESS_WRITER: "old-ingress-1", catalog.ROLE_PROJECTION_WORKER: "old-worker-1"}
LIVE_PRODUCER_IDS = {catalog.ROLE_RUNTIME_API: "runtime-api-1", catalog.ROLE_AUDIT_OUTBOX_WORKER: "outbox-worker-1"}
OLD_PRODUCER_VERSION = "4.11.0"
NEW_PRODUCER_VERSION = "4.13.0"

FIRST_PACK = "pk-crm-sync-v2"
UNINSTALLED_PACK = "pk-crm-sync-v1"
#: An active pack whose id is at PackInstallId's column limit (64 characters).
LONG_PACK = ("pk-billing-eu-west-" + "x" * 64)[: catalog.PackInstall.c.PackInstallId.type.length]
GREENFIELD_PACK = "pk-greenfield"

FUTURE_COLLISION = "collision"
FUTURE_FRESH = "fresh"
FUTURE_INGRESS_DUPLICATE = "ingress_duplicate"


@dataclass(frozen=True)
class FutureReceipt:
    """A receipt that live traffic sends after the build.

    ``kind``: ``collision`` -- the server equates its key with ``equals``, an
    admitted Event's key, but the bytes differ: the runtime must neither
    acknowledge it as a duplicate nor retry it forever; ``fresh`` -- the server
    keeps it apart from ``equals``: a new input, admitted as such;
    ``ingress_duplicate`` -- the server equates it with ``equals``, a receipt row
    that exists: ``_System_IngressReceipt``'s primary key refuses it.
    """

    pack_install_id: str
    source_lane: str
    receipt_id: str
    event_kind: str
    kind: str
    equals: tuple[str, str]


@dataclass
class LanePlan:
    """One server equality class of lane spellings of a pack: one projection identity."""

    pack_install_id: str
    spellings: list[str]
    group: int | None  # index into LANE_SPELLINGS; None for a plain lane
    legacy_zero: bool
    event_kind: str
    generations: int = 0
    mixed_spelling_work_id: int | None = None


@dataclass
class Planted:
    """What :func:`production_tenant` planted, as data (``as_json()`` for reports)."""

    namespace: str
    seed: int
    #: The server's answers (:meth:`ServerCollation.describe`): dialect, charset, collation, folds_case, pads_spaces.
    collation: dict[str, Any]
    #: Every active pack, the greenfield one included.
    active_packs: list[str]
    uninstalled_packs: list[str]
    greenfield_packs: list[str]
    #: Per pack (every incarnation): the allocator's LastOrdinal, and Event counts by kind.
    last_ordinal: dict[str, int]
    projection_events: dict[str, int]
    ordinary_events: dict[str, int]
    legacy_zero_events: dict[str, int]
    projection_work_by_status: dict[str, int]
    live_projection_work: int
    ordinary_work_by_status: dict[str, int]
    #: Ordinary Events without a WorkItem (retention deleted it), EventIds.
    ordinary_events_without_work_item: list[int]
    lanes: list[LanePlan]
    #: (pack, spellings) of every identity the server spells in two or more ways.
    case_variant_lanes: list[tuple[str, list[str]]]
    #: Spelling groups of LANE_SPELLINGS the server splits into several identities.
    split_spelling_groups: list[list[list[str]]]
    #: Hostile values the column's character set cannot hold (not planted).
    dropped_values: list[str]
    held_non_ascii: str
    long_payload_event_ids: list[int]
    long_values: dict[str, int]
    #: Unmaterialized receipts planted now: (pack, lane, receipt id).
    pending_receipts: list[tuple[str, str, str]]
    #: Unmaterialized receipts whose ids differ from another planted one's only in case or trailing spaces.
    receipt_variant_pairs: list[tuple[tuple[str, str, str], tuple[str, str, str]]]
    confirmed_receipts: int
    future_receipts: list[FutureReceipt]
    registry_stopped_rows: int
    registry_stopped_by_role: dict[str, int]
    live_processes: list[str]
    field_history_rows: int

    @property
    def collision_receipts(self) -> list[FutureReceipt]:
        return [f for f in self.future_receipts if f.kind == FUTURE_COLLISION]

    def as_json(self) -> dict[str, Any]:
        return asdict(self)


@dataclass
class ProductionTenant:
    scenario: TenantScenario
    planted: Planted
    collation: ServerCollation


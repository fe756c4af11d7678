"""The demo tenant on the embedded default: a SQLite tenant database, seeded once per demo run.

``python scripts/demo_seed.py <path.db> [--namespace demo] [--clean]`` (re)creates the file.

By default the demo tenant is the **production-shaped tenant** of :mod:`nexus_sim.scenario.production`
(issues 24, 25), with :data:`PRODUCTION_DEMO`'s knobs:

* two active packs (one id at PackInstallId's column limit) of drained old-protocol history on hostile lanes
  (case variants, trailing spaces, non-ASCII, values at the column limit), one lane entirely pre-ordinal, plus per
  pack a backlog of old projection work still in flight (pending, due retry, processing items whose old worker
  crashed) for the old runtime to drain;
* ordinary work in every status beside it (a retry due next week, blocked, processing under a lease...) and
  ordinary Events whose WorkItem retention deleted: the cutover must neither wait for it nor refuse it;
* unmaterialized receipts whose 15-character CRM ids differ only in case or trailing spaces, non-ASCII and long
  payloads, an uninstalled incarnation of the first pack, a greenfield pack, 10,000 stopped registry rows;
* Field History rows from old producers (NULL eligibility, with and without a sequence) and from new producers
  (stamped TRUE/FALSE), fields with intervals, two pre-cutover producer processes (Runtime API, outbox worker);
* no live old writer: the old runtime is started by the demo itself (``scripts/demo_old_runtime.py``) and
  registers as it starts; live traffic (:class:`nexus_sim.traffic.LiveTraffic`) is started by the demo too.

``--clean`` (``production=False``) seeds the small clean tenant of earlier versions instead (:func:`demo_scenario`:
two packs ``pk-crm-sync`` and ``pk-billing``, projection work only), which the status-view and browser tests use.
"""

from __future__ import annotations

import argparse
import datetime as dt
import os
import random

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.schema import apply_steps, create_legacy_schema, field_history_steps
from nexus_sim.scenario import TenantScenario, build_production_tenant, drained_pack_history
from nexus_sim.scenario.production import Planted

PACKS = (("pk-crm-sync", 4, 1), ("pk-billing", 3, 0))
OLD_PRODUCER_VERSION = "4.11.0"
STAGE1_RELEASE = "4.12.0"  # preserves FieldHistoryEligible (seed 003 stage 1)
NEW_PRODUCER_VERSION = "4.13.0"  # producers always stamp (seed 003 stage 2)


def demo_scenario(namespace: str = "demo", *, seed: int = 7, backlog: int = 12) -> TenantScenario:
    """The demo tenant's rows; ``backlog`` live old generations per pack (plus crashed-worker items)."""
    rng = random.Random(seed)
    sc = TenantScenario(namespace=namespace)
    crashed = sc.now - dt.timedelta(minutes=5)
    live: dict[str, list] = {}
    packs = {}
    for pack_id, _, _ in PACKS:  # first, so the crashed items have the lowest WorkIds of the namespace
        packs[pack_id] = pack = sc.pack(pack_id, name=pack_id.removeprefix("pk-"))
        live[pack_id] = [pack.lane(f"live-{i:02d}") for i in range(3)]
        for lane in live[pack_id]:
            lane.generation(2, status="completed")
            lane.generation(1, status="processing", lease_owner="old-worker-crashed", lease_expires_at=crashed)
    for pack_id, lanes, zero in PACKS:
        drained_pack_history(packs[pack_id], rng, lanes=lanes, generations=6, legacy_zero_lanes=zero)
        for i in range(backlog):
            lane = live[pack_id][i % 3]
            if i % 4 == 3:
                lane.generation(2, status="retry", attempt=1, next_attempt_at=sc.now)
            else:
                lane.generation(rng.randint(1, 3), status="pending")
        for i in range(6):
            sc.receipt(pack_id, f"live-{i % 3:02d}", f"rcpt-{pack_id}-{i}")
    sc.process(catalog.ROLE_RUNTIME_API, version=OLD_PRODUCER_VERSION, process_id="runtime-api-1")
    sc.process(catalog.ROLE_AUDIT_OUTBOX_WORKER, version=OLD_PRODUCER_VERSION, process_id="outbox-worker-1")
    for field_id, track, intervals in ((101, True, [(0, None)]), (102, True, [(0, 40), (60, None)]), (103, False, [])):
        sc.field(field_id, track_history=track, intervals=intervals, last_sequence=100)
    for seq in range(1, 100, 2):
        for field_id in (101, 102, 103):
            sc.audit_change(field_id, history_sequence=seq)
    for field_id, eligible in ((101, True), (102, True), (103, False)):
        for _ in range(5):
            sc.audit_change(field_id, history_sequence=None, eligible=eligible, producer_version=NEW_PRODUCER_VERSION)
    sc.audit_change(None, history_sequence=None)
    sc.audit_change(101, history_sequence=None)
    sc.outbox_row(producer_version=OLD_PRODUCER_VERSION, status="delivered")
    sc.setting(catalog.SETTING_READ_MODE, catalog.READ_MODE_COMPAT)
    sc.setting(catalog.SETTING_SEQUENCE_RESERVATION, "true")
    return sc


#: Sizes of the production-shaped demo tenant: old work in flight for the old runtime to drain, Field History rows.
PRODUCTION_DEMO = {"in_flight_generations": 6, "field_history": True}


def build_tenant(engine, namespace: str = "demo", *, production: bool = True) -> tuple[TenantScenario, Planted | None]:
    """Write the demo tenant (the production-shaped one unless ``production`` is False) into ``engine``'s empty
    database; returns its rows and, for the production-shaped one, what was planted (None for the clean one)."""
    create_legacy_schema(engine)
    apply_steps(engine, field_history_steps(engine))  # seed 003 stage 1 landed (#4654): the column exists
    if production:
        tenant = build_production_tenant(engine, namespace=namespace, **PRODUCTION_DEMO)
        return tenant.scenario, tenant.planted
    sc = demo_scenario(namespace)
    sc.write(engine)
    return sc, None


def seed(path: str, namespace: str = "demo", *, production: bool = True) -> dict:
    """Create the SQLite tenant at ``path`` (replacing any previous file); returns a short description (with
    ``planted``, the production tenant's report, for the demo's live traffic and checks)."""
    for suffix in ("", "-wal", "-shm", "-journal"):
        if os.path.exists(path + suffix):
            os.remove(path + suffix)
    open(path, "wb").close()
    engine = make_engine(f"sqlite:///{path}")
    try:
        sc, planted = build_tenant(engine, namespace, production=production)
    finally:
        engine.dispose()
    live = sum(1 for w in sc.work_items
               if w["WorkClass"] == catalog.WORK_CLASS_PROJECTION and w["Status"] in catalog.WORK_LIVE_STATUSES)
    return {
        "namespace": namespace,
        "packs": [p.pack_install_id for p in sc.packs],
        "events": len(sc.events),
        "work_items": len(sc.work_items),
        "live_old_work": live,
        "receipts": len(sc.receipts),
        "audit_rows": len(sc.audit_changes),
        "ordinary_work": sum(1 for w in sc.work_items if w["WorkClass"] == catalog.WORK_CLASS_ORDINARY),
        "registry_rows": len(sc.processes),
        "planted": planted,
        "work_item_rows": sc.work_items,
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("path")
    parser.add_argument("--namespace", default="demo")
    parser.add_argument("--clean", action="store_true",
                        help="the small clean tenant (projection work only) instead of the production-shaped one")
    args = parser.parse_args()
    info = seed(args.path, args.namespace, production=not args.clean)
    print({k: v for k, v in info.items() if k not in ("planted", "work_item_rows")})
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

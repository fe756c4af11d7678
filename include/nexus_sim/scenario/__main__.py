"""``NEXUS_TENANT_DSN=... python -m nexus_sim.scenario [--namespace prod] [sizes] [--json]``: seed the
production-shaped tenant (:mod:`.production`) into an empty tenant database and print what it planted."""

from __future__ import annotations

import argparse
import json
import os
from collections import Counter

from nexus_cutover.db import DSN_ENV_TENANT, dsn_from_env, make_engine

from .production import build_production_tenant

SUMMARY = ("namespace", "collation", "active_packs", "uninstalled_packs", "last_ordinal", "projection_work_by_status",
           "ordinary_work_by_status", "ordinary_events_without_work_item", "case_variant_lanes", "live_processes",
           "registry_stopped_rows")


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Seed the production-shaped tenant into NEXUS_TENANT_DSN.")
    parser.add_argument("--namespace", default="prod")
    parser.add_argument("--seed", type=int, default=24)
    for knob, default in (("active-packs", 2), ("plain-lanes", 3), ("generations", 3), ("ordinary-per-status", 2),
                          ("retention-trimmed-ordinary", 3), ("in-flight-generations", 0),
                          ("registry-stopped-rows", 10_000)):
        parser.add_argument(f"--{knob}", type=int, default=default)
    for knob in ("live-old-writers", "field-history"):
        parser.add_argument(f"--{knob}", action="store_true")
    parser.add_argument("--json", action="store_true", help="print everything planted (default: a summary)")
    args = parser.parse_args(argv)
    knobs = {k: v for k, v in vars(args).items() if k != "json"}
    dsn = dsn_from_env(DSN_ENV_TENANT)
    if dsn.startswith("sqlite:///") and not os.path.exists(dsn.removeprefix("sqlite:///")):
        open(dsn.removeprefix("sqlite:///"), "xb").close()  # seeding is what creates an embedded tenant
    engine = make_engine(dsn)
    try:
        planted = build_production_tenant(engine, **knobs).planted
    finally:
        engine.dispose()
    out = planted.as_json()
    if not args.json:
        out = {k: out[k] for k in SUMMARY} | {"future_receipts": dict(Counter(f.kind for f in planted.future_receipts))}
    print(json.dumps(out, ensure_ascii=False, default=str, indent=1))
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

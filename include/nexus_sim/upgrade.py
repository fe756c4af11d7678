"""The demo's stand-in for a deployment's producer upgrade (seed 003, "stopped upgrade"): a control a person runs.

``python -m nexus_sim.upgrade --namespace demo --release 4.13.0`` (tenant from ``NEXUS_TENANT_DSN``): every
pre-cutover producer process of the namespace (``runtime_api``, ``service_manager``, ``audit_outbox_worker``) still
running is marked stopped, and one process of each role registers at ``--release``. This is what a real
deployment's rollout of the new Runtime API does to ``_System_ProcessRegistry``; the pipeline itself never writes
the registry. Field History's stage 1 and 2 stops name this command in ``make airflow`` (its
``NEXUS_PRODUCER_UPGRADE_COMMAND``). Rerunning it is harmless: it stops what runs and registers the same ids again.
"""

from __future__ import annotations

import argparse
import sys

from sqlalchemy import Engine

from nexus_cutover import catalog
from nexus_cutover.db import DSN_ENV_TENANT, dsn_from_env, make_engine
from nexus_cutover.field_history.inventory import producer_processes
from nexus_cutover.runtime.registry import mark_stopped, register

PRODUCER_ROLES = (catalog.ROLE_RUNTIME_API, catalog.ROLE_SERVICE_MANAGER, catalog.ROLE_AUDIT_OUTBOX_WORKER)


def upgrade_producers(engine: Engine, namespace: str, release: str) -> list[str]:
    """Stop the namespace's running producers and start one of each role at ``release``; lines saying what was done."""
    with engine.connect() as conn:
        old = [p.process_id for p in producer_processes(conn, namespace) if not p.stopped]
    for pid in old:
        mark_stopped(engine, pid)
    new = []
    for role in PRODUCER_ROLES:
        pid = f"{role.replace('_', '-')}-{release}"
        register(engine, pid, namespace, role, catalog.PROTOCOL_RANGES, binary_version=release)
        new.append(pid)
    return [f"stopped {', '.join(old) or 'nothing (no producer was running)'}", f"started {', '.join(new)} at {release}"]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m nexus_sim.upgrade", description=__doc__.splitlines()[0])
    parser.add_argument("--namespace", required=True)
    parser.add_argument("--release", required=True, help="the producers' new BinaryVersion, e.g. 4.13.0")
    args = parser.parse_args(argv)
    engine = make_engine(dsn_from_env(DSN_ENV_TENANT))
    try:
        for line in upgrade_producers(engine, args.namespace, args.release):
            print(f"upgrade: {line}", flush=True)
    finally:
        engine.dispose()
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The MariaDB tenants of the rollout parts of ``make bench-stack`` (``rollout``, ``faults``): how each is built.

* :func:`drained_tenant`: one pack's drained history and no old writers: its cutover goes through;
* :func:`audit_refusing_tenant`: drained plus a lane the audit refuses (``mixed_history_indirect``): its run stops
  at ``audit_and_checkpoint`` and writes nothing;
* :func:`slow_drain_tenant`: drained plus one old WorkItem leased to :data:`SLOW_OLD_WORKER`, which a
  :class:`Heartbeat` keeps alive: its drain waits to its timeout;
* :func:`rollout_tenants` builds them, one database and one user each (``scripts.stack_services.mariadb_tenant``), 4 at a
  time, and gives the stack their connections; a DSN is returned, never printed.

Of the stack bench's modules it imports none; ``bench/stack_rollout.py`` imports it. Needs the repository and
``plugins/`` on ``sys.path`` (``bench/bench_stack.py`` puts them there).
"""

from __future__ import annotations

import datetime as dt
import random
import threading
from collections.abc import Callable
from concurrent.futures import ThreadPoolExecutor
from typing import Any

from scripts.stack_services import mariadb_tenant
from scripts.stack_topology import ProductionStack


def drained_tenant(namespace: str, extra: Callable[[Any, Any], None] | None = None):
    """One pack's drained history; ``extra(scenario, pack)`` adds to it before it is written."""
    def build(engine) -> None:
        from nexus_cutover.schema import create_legacy_schema
        from nexus_sim.scenario import TenantScenario, drained_pack_history

        create_legacy_schema(engine)
        sc = TenantScenario(namespace=namespace)
        pack = sc.pack("pk-one")
        drained_pack_history(pack, random.Random(11), lanes=3, generations=4)
        if extra is not None:
            extra(sc, pack)
        sc.write(engine)

    return build


#: The old worker of the tenant whose drain times out: its item stays leased to it while it heartbeats.
SLOW_OLD_WORKER = "old-worker-slow"


def audit_refusing_tenant(namespace: str):
    """Drained, plus a lane whose coalesced ordinal-0 inputs sit beside positive ordinals: the audit refuses
    (``mixed_history_indirect``) and the tenant's run stops at ``audit_and_checkpoint``, writing nothing."""
    def mixed(_sc, pack) -> None:
        lane = pack.lane("lane-mixed")
        lane.generation(2, legacy=True)
        lane.generation(1)
    return drained_tenant(namespace, mixed)


def slow_drain_tenant(namespace: str):
    """Drained, plus one old WorkItem ``processing`` under a live lease of :data:`SLOW_OLD_WORKER`, which
    heartbeats (the bench's :class:`Heartbeat`) and never completes it: the drain waits to its timeout."""
    def leased(sc, pack) -> None:
        from nexus_cutover import catalog
        from nexus_cutover.clock import utcnow

        pack.lane("lane-slow").generation(1, status="processing", lease_owner=SLOW_OLD_WORKER,
                                          lease_expires_at=utcnow() + dt.timedelta(hours=2))
        sc.process(catalog.ROLE_PROJECTION_WORKER, process_id=SLOW_OLD_WORKER)
    return drained_tenant(namespace, leased)


class Heartbeat(threading.Thread):
    """Keeps a registry row's heartbeat fresh every ``every_s`` until stopped (an old worker that is alive)."""

    def __init__(self, dsn: str, process_id: str, every_s: float = 5.0):
        super().__init__(daemon=True)
        self.dsn, self.process_id, self.every_s, self.halt = dsn, process_id, every_s, threading.Event()

    def run(self) -> None:
        from sqlalchemy import update

        from nexus_cutover import catalog
        from nexus_cutover.clock import utcnow
        from nexus_cutover.db import make_engine

        engine = make_engine(self.dsn)
        try:
            while not self.halt.wait(self.every_s):
                with engine.begin() as conn:
                    conn.execute(update(catalog.ProcessRegistry)
                                 .where(catalog.ProcessRegistry.c.ProcessId == self.process_id)
                                 .values(LastHeartbeatAt=utcnow()))
        finally:
            engine.dispose()


def rollout_tenants(stack: ProductionStack, server: str, names: list[str], *, connections: bool,
                    builders: dict[str, Any] | None = None, unreachable: tuple[str, ...] = ()) -> dict[str, str]:
    """One MariaDB database per tenant (built 4 at a time; ``builders`` per tenant, else drained); returns
    tenant -> DSN (never printed). An ``unreachable`` tenant's connection names a port nothing listens on."""

    def one(name: str) -> tuple[str, str]:
        made = mariadb_tenant(server, f"nx_bench_{name}", (builders or {}).get(name, drained_tenant)(name))
        if connections:
            conn = {**made["conn"], "port": 1} if name in unreachable else made["conn"]
            stack.put_connection(f"nexus_tenant_{name}", **conn)
        return name, made["dsn"]

    with ThreadPoolExecutor(4) as pool:
        return dict(pool.map(one, names))

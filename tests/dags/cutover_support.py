"""Tenants, state snapshots, an in-test deployer and an old-runtime driver for the cutover DAG tests."""

from __future__ import annotations

import contextlib
import http.server
import json
import random
import threading
import time
from typing import Any

from sqlalchemy import Engine, func, select

from nexus_cutover import catalog
from nexus_cutover.schema import existing_columns
from nexus_sim.scenario import TenantScenario, drained_pack_history
from tests.support import history_checksum, table_checksum

DAG_ID = "connector_projection_cutover"
NS = "acme"
PACKS = ("pk-a", "pk-b")


def base_conf(conn_id: str, **overrides: Any) -> dict[str, Any]:
    """Every param given explicitly: under ``dag.test()`` tasks run in-process and a run's conf can leak
    into the DAG object's param defaults, so no test relies on a default."""
    conf = {
        "dry_run": False,
        "pack_install_ids": [],
        "tenant": NS,
        "conn_id": conn_id,
        "poll_interval": 1,
        "stale_heartbeat": 30,
        "arm_when_drain_below": 0,  # arm at once, as before issue 36: the pre-arm wait's tests set it
        "pre_arm_timeout": 60,
        "drain_timeout": 120,
        "writers_stop_timeout": 60,
        "readiness_timeout": 60,
        "confirm_timeout": 300,
        "lock_timeout": 30,
        "digest_timeout": 60,
        "digest_connections": 2,
        "host_controller": "http",
        "host_http_conn_id": "nexus_deployer_test",
        "writers_stop_controller": "manual",
        "writers_stop_http_conn_id": "nexus_deployer_test",
        "writers_stop_controller_timeout": 60,
        "approval": "per_tenant",
        "approvers": [],
        "allow_self_approval": False,
        "rollout": {},
        "adopt": None,
    }
    conf.update(overrides)
    return conf


def drained_tenant(*, seed: int = 11, old_writers_stopped: bool = True) -> TenantScenario:
    """Two packs of drained old-protocol history; old writers registered as stopped."""
    rng = random.Random(seed)
    sc = TenantScenario(namespace=NS)
    for pack_id in PACKS:
        drained_pack_history(sc.pack(pack_id), rng, lanes=3, generations=4, legacy_zero_lanes=1 if pack_id == "pk-a" else 0)
    for role in catalog.OLD_WRITER_ROLES:
        sc.process(role, process_id=f"old-{role}", stopped=old_writers_stopped)
    return sc


def draining_tenant(lane: str = "lane-live") -> TenantScenario:
    """:func:`drained_tenant` plus one pending old projection WorkItem and a live old worker: the drain waits."""
    sc = drained_tenant()
    sc.packs[0].lane(lane).generation(1, status="pending")
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker-live")
    return sc


def snapshot(engine: Engine) -> dict[str, Any]:
    """What a cutover run leaves behind (ids and timestamps of its own writes excluded)."""
    with engine.connect() as conn:
        protocol = (
            [tuple(r) for r in conn.execute(
                select(catalog.ConnectorProjectionProtocol.c.PackInstallId,
                       catalog.ConnectorProjectionProtocol.c.ProtocolVersion,
                       catalog.ConnectorProjectionProtocol.c.LegacyMaxOrdinal).order_by("PackInstallId"))]
            if existing_columns(conn, catalog.ConnectorProjectionProtocol.name) is not None
            else None
        )
        f = catalog.AdmissionFence
        fences = [
            (r.Scope, r.ExpiresAt is None, r.ReleasedAt is not None)
            for r in conn.execute(select(f.c.Scope, f.c.ExpiresAt, f.c.ReleasedAt).where(f.c.Namespace == NS))
        ]
        work_cols = existing_columns(conn, catalog.WorkItem.name)
    return {
        "protocol_rows": protocol,
        "fences": sorted(fences),
        "input_start_ordinal": catalog.INPUT_START_ORDINAL.column_name in work_cols,
        "history": history_checksum(engine),
        "overrides": table_checksum(engine, catalog.AdmissionFenceOverride),
    }


def history_bytes(engine: Engine) -> tuple[str, str]:
    """Checksums of every Part A column of ``_System_WorkItem`` and ``_System_Event``.

    Part A columns only, so the check is the same before and after apply_schema
    adds ``InputStartOrdinal`` (which :func:`no_range_starts` checks separately).
    """
    return tuple(table_checksum(engine, catalog.legacy_metadata.tables[t.name]) for t in (catalog.WorkItem, catalog.Event))


def no_range_starts(engine: Engine) -> bool:
    """No WorkItem carries an InputStartOrdinal (or the column does not exist)."""
    with engine.connect() as conn:
        if catalog.INPUT_START_ORDINAL.column_name not in existing_columns(conn, catalog.WorkItem.name):
            return True
        return not conn.execute(
            select(func.count()).select_from(catalog.WorkItem).where(catalog.INPUT_START_ORDINAL.column.isnot(None))
        ).scalar_one()


def max_ordinal(engine: Engine, pack: str) -> int:
    with engine.connect() as conn:
        return conn.execute(
            select(func.coalesce(func.max(catalog.Event.c.EnqueueOrdinal), 0)).where(catalog.Event.c.PackInstallId == pack)
        ).scalar_one()


# ---------------------------------------------------------------------------
# A deployer endpoint for host_controller=http: starts the reference host in a thread.
# ---------------------------------------------------------------------------


class Deployer:
    """A real HTTP server; each POST starts ``run_host`` for the tenant (once) in a background thread."""

    def __init__(self, engine: Engine):
        self.engine = engine
        self.requests: list[dict[str, Any]] = []
        self.stop_event = threading.Event()
        self.hosts: list[threading.Thread] = []
        deployer = self

        class Handler(http.server.BaseHTTPRequestHandler):
            def do_POST(self):  # noqa: N802 - http.server API
                body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
                deployer.requests.append({"path": self.path, **body})
                deployer.start_host(body["tenant"])
                self.send_response(202)
                self.end_headers()
                self.wfile.write(b'{"accepted": true}')

            def log_message(self, *args):
                pass

        self.server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
        self.thread = threading.Thread(target=self.server.serve_forever, daemon=True)

    @property
    def connection_json(self) -> str:
        return json.dumps({"conn_type": "http", "host": "127.0.0.1", "port": self.server.server_address[1],
                           "schema": "http"})

    def start_host(self, tenant: str) -> None:
        from nexus_cutover.runtime.host import run_host

        t = threading.Thread(
            target=run_host, args=(self.engine, tenant),
            kwargs={"stop_event": self.stop_event, "heartbeat_s": 0.5, "poll_s": 0.2, "process_id": f"host-{len(self.hosts)}"},
            daemon=True,
        )
        t.start()
        self.hosts.append(t)

    def __enter__(self) -> Deployer:
        self.thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self.stop_event.set()
        for t in self.hosts:
            t.join(timeout=20)
        self.server.shutdown()
        self.server.server_close()


@contextlib.contextmanager
def old_runtime(engine: Engine, *, stop_when_drained_and_fenced: bool = True, **config):
    """The old-protocol runtime in a thread; stopped (StoppedAt set) once the fence is armed and its work drained."""
    from nexus_cutover.projection.cutover_fence import cutover_fence_in_force
    from nexus_sim.old_runtime import OldRuntimeSimulator

    sim = OldRuntimeSimulator(engine, NS, process_id="old-rt", **config)
    sim.register()  # live before the run's first look, however slowly the thread gets going
    stop = threading.Event()
    runner = threading.Thread(target=sim.run, args=(stop,), kwargs={"poll_s": 0.1}, daemon=True)
    runner.start()

    def controller():
        while not stop.is_set():
            if cutover_fence_in_force(engine, NS) and sim.live_old_work() == 0:
                stop.set()
                return
            time.sleep(0.2)

    ctl = threading.Thread(target=controller, daemon=True)
    if stop_when_drained_and_fenced:
        ctl.start()
    try:
        yield sim
    finally:
        stop.set()
        runner.join(timeout=30)

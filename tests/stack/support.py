"""Tenants, DAG-run watching and tenant reads for the stack tests (every wait bounded)."""

from __future__ import annotations

import random
import time
import uuid
from collections.abc import Callable
from typing import Any
from urllib.parse import quote

from sqlalchemy import text

from nexus_cutover.db import make_engine
from scripts.demo import Watcher
from scripts.stack import ProductionStack, build_demo_tenant, mariadb_tenant

CUTOVER_DAG = "connector_projection_cutover"
CONFIRM = "Confirm: all old writers stopped"


def cutover_conf(tenant: str) -> dict[str, Any]:
    """The demo's conf (poll 10 s: the runbook's floor; the reference host started by the run)."""
    return {"tenant": tenant, "host_controller": "command", "poll_interval": 10, "stale_heartbeat": 20,
            "drain_timeout": 300, "writers_stop_timeout": 120, "confirm_timeout": 600, "readiness_timeout": 120,
            "checkpoint_timeout": 60}


def drained_tenant(packs: list[str], namespace: str):
    """A tenant whose old projection work is drained and whose old writers are gone: the run goes straight
    to the writer-stop confirmation."""

    def build(engine) -> None:
        from nexus_cutover.schema import create_legacy_schema
        from nexus_sim.scenario import TenantScenario, drained_pack_history

        create_legacy_schema(engine)
        sc = TenantScenario(namespace=namespace)
        rng = random.Random(11)
        for pack in packs:
            drained_pack_history(sc.pack(pack), rng, lanes=3, generations=4)
        sc.write(engine)

    return build


def new_tenant(stack: ProductionStack, server_url: str, prefix: str, *, packs: list[str] | None = None,
               demo: bool = False) -> dict[str, Any]:
    """A tenant database on MariaDB and its Airflow connection ``nexus_tenant_<tenant>`` (created over REST)."""
    tenant = f"{prefix}{uuid.uuid4().hex[:6]}"
    build = build_demo_tenant(tenant) if demo else drained_tenant(packs or ["pk-one"], tenant)
    made = mariadb_tenant(server_url, f"nx_stack_{tenant}", build)
    stack.put_connection(f"nexus_tenant_{tenant}", **made["conn"])
    return {"tenant": tenant, **made}


def checkpoints(dsn: str) -> dict[str, list[int]]:
    """Every protocol row of the tenant: pack -> [LegacyMaxOrdinal, ...] (one per pack expected)."""
    engine = make_engine(dsn)
    try:
        with engine.connect() as conn:
            rows = conn.execute(text("SELECT PackInstallId, LegacyMaxOrdinal FROM _System_ConnectorProjectionProtocol"))
            out: dict[str, list[int]] = {}
            for pack, cutoff in rows:
                out.setdefault(pack, []).append(int(cutoff))
            return out
    finally:
        engine.dispose()


class Run:
    """One DAG run of the cutover on the stack, followed through the REST API."""

    def __init__(self, stack: ProductionStack, conf: dict[str, Any], *, confirm: bool = True):
        self.stack = stack
        self.confirm = confirm  # answer the writer-stop confirmation (through PATCH .../hitlDetails)
        self.run_id = stack.trigger(CUTOVER_DAG, conf)["dag_run_id"]
        self.watcher = Watcher(stack, CUTOVER_DAG, self.run_id, answer=self._answer)
        self.states_seen: dict[str, set[str]] = {}

    def _answer(self, task_id: str, options: list[str]) -> str | None:
        return CONFIRM if self.confirm and task_id == "confirm_writers_stopped" and CONFIRM in options else None

    def poll(self) -> tuple[str, dict[str, str]]:
        state, states = self.watcher.poll()
        for key, s in states.items():
            self.states_seen.setdefault(key, set()).add(s)
        return state, states

    def until(self, what: str, cond: Callable[[str, dict[str, str]], bool], timeout_s: float, every_s: float = 2.0) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            state, states = self.poll()
            if cond(state, states):
                return
            if time.monotonic() > deadline:
                raise AssertionError(f"run {self.run_id}: not {what} within {timeout_s:.0f}s (run {state}, tasks {states})")
            if state in ("success", "failed") and what not in ("finished", "failed"):
                raise AssertionError(f"run {self.run_id} ended {state} before {what} (tasks {states})")
            time.sleep(every_s)

    def finish(self, timeout_s: float) -> str:
        self.until("finished", lambda s, _: s in ("success", "failed"), timeout_s, every_s=3.0)
        return self.stack.dag_run(CUTOVER_DAG, self.run_id)["state"]

    def xcom(self, task_id: str, map_index: int = -1) -> Any:
        return self.stack.xcom(CUTOVER_DAG, self.run_id, task_id, map_index=map_index)

    def ti(self, task_id: str, map_index: int = -1) -> dict:
        return next(t for t in self.stack.task_instances(CUTOVER_DAG, self.run_id)
                    if t["task_id"] == task_id and t.get("map_index", -1) == map_index)

    def clear(self, task_id: str) -> None:
        """Clear ``task_id`` (every map index) and everything downstream, as the UI's Clear does."""
        self.stack.request("POST", f"/api/v2/dags/{CUTOVER_DAG}/clearTaskInstances", {
            "dry_run": False, "dag_run_id": self.run_id, "task_ids": [task_id], "include_downstream": True,
            "only_failed": False, "reset_dag_runs": True})

    def asset_events(self) -> list[dict]:
        return self.stack.request(
            "GET", f"/api/v2/assets/events?source_dag_id={CUTOVER_DAG}&source_run_id={quote(self.run_id, safe='')}"
        )["asset_events"]

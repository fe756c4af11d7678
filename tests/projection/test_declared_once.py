"""A step added to a copy of the declaration, in one place: ``plan`` and ``run`` run it in its declared place
(the DAG's tasks follow it too: tests/dags/test_cutover_dag_integrity.py). Real MariaDB and SQLite tenants."""

from __future__ import annotations

import contextlib
import os
import signal
import sys

from sqlalchemy import func, select

from nexus_cutover import catalog
from nexus_cutover.cli import cutover_steps as cli
from nexus_cutover.projection import dry_run
from tests.declared_copy import ADDED, with_added_step
from tests.projection.test_cutover_steps_cli import FAST, NS, tenant  # noqa: F401 - the fixture

COPY = with_added_step()


def _events(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(catalog.Event)).scalar_one()


def test_plan_runs_a_step_added_to_the_declaration_in_its_place(tenant):  # noqa: F811
    engine, _url = tenant
    lines: list[str] = []
    out = dry_run.plan(engine, dry_run.PlanOptions(namespace=NS, holder="planner"), lines.append, transition=COPY)
    assert out["steps"] == COPY.names and out["steps"].index(ADDED.name) == COPY.names.index("history_digest") + 1
    assert out["history_count"] == {"events": _events(engine), "plan": []} and out["verdict"] == "proceed"
    assert f"3. history: {_events(engine)} events" in lines
    assert "history_count" not in dry_run.plan(engine, dry_run.PlanOptions(namespace=NS, holder="planner"))


def test_run_runs_a_step_added_to_the_declaration_in_its_place(tenant, monkeypatch, capsys):  # noqa: F811
    engine, url = tenant
    monkeypatch.setenv("NEXUS_TENANT_DSN", url)
    monkeypatch.setenv("NEXUS_HOST_HEARTBEAT_S", "0.5")
    monkeypatch.setenv("NEXUS_HOST_POLL_S", "0.2")
    args = cli.build_parser().parse_args(["run", "-namespace", NS, *FAST, "--confirm-writers-stopped",
                                          "-host-command", f"{sys.executable} -m nexus_cutover.cli.host --namespace {NS}"])
    code, out = None, {}
    try:
        code, out = cli.cmd_run(cli.Command(args, engine), transition=COPY)
    finally:
        if out.get("host_pid"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(out["host_pid"], signal.SIGTERM)
    assert code == 0 and out["outcome"] == "cut_over"
    assert out["steps"] == COPY.names and out["history_count"] == {"events": _events(engine)}
    printed = capsys.readouterr().out.splitlines()
    digest_at = next(i for i, line in enumerate(printed) if line.startswith("  history digest "))
    assert printed[digest_at + 1] == f"  history: {_events(engine)} events"  # right after the digest, as declared

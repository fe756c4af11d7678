"""The fleet preflight (``nexus_cutover.projection.preflight``) on real MariaDB tenants, production-shaped.

Four tenants: one proceeds, one waits on its old work (and on its live old writers, one with a hostile id),
one stops on a finding (a fence another holder holds), one cannot be reached. Each row must be what
``nexus-cutover plan`` says for the same tenant (run as an engineer runs it, a real process), and the pool
must read exactly ``concurrency`` tenants at once, never more.
"""

from __future__ import annotations

import contextlib
import csv
import io
import json
import os
import subprocess
import sys
import threading

import pytest

from nexus_cutover import catalog
from nexus_cutover.cli.cutover_steps import CLI_TAKE_OVER
from nexus_cutover.db import make_engine
from nexus_cutover.errors import BadInput
from nexus_cutover.projection import preflight as pf
from nexus_cutover.projection.cutover_fence import arm_fence
from nexus_cutover.projection.dry_run import PlanOptions
from nexus_sim.scenario import TenantScenario
from nexus_sim.scenario.production import build_production_tenant
from tests.support import mysql_database

HOLDER = "preflight-test:holder"
STALE_S = 3600.0  # every heartbeat of the build stays live for the whole test (the CLI and the preflight agree)
#: One active pack, the full 10,000 stopped registry rows, hostile lanes and receipt ids (as tests/rollout).
SIZES = {"active_packs": 1, "plain_lanes": 2, "generations": 2, "greenfield_pack": False}
#: A live old writer's id a CSV must carry exactly: a quote, a comma, a newline, non-ASCII, a trailing space.
HOSTILE_WRITER = 'old "ingress", zwei\nüß '
UNREACHABLE = "mysql+pymysql://cutover:s3cret@127.0.0.1:1/tenant_gone"  # nothing listens on port 1


def _proceeds(engine, ns):
    build_production_tenant(engine, namespace=ns, seed=3, **SIZES)


def _waits(engine, ns):
    build_production_tenant(engine, namespace=ns, seed=4, in_flight_generations=1, live_old_writers=True, **SIZES)
    sc = TenantScenario(namespace=ns)
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id=HOSTILE_WRITER)
    sc.write(engine)


def _fence_held(engine, ns):
    build_production_tenant(engine, namespace=ns, seed=5, **SIZES)
    from nexus_cutover.projection import steps

    steps.actions.apply_schema(engine)  # a fence needs the additive schema: another engineer's run got this far
    arm_fence(engine, ns, armed_by="cli:someone-else", timeout_s=10)


def _cut_over(engine, ns):
    """Cut over already: every pack checkpointed under the fence, the fence released (issue 34, item 6)."""
    from sqlalchemy import update

    from nexus_cutover.clock import utcnow
    from nexus_cutover.projection import steps

    build_production_tenant(engine, namespace=ns, seed=6, **SIZES)
    steps.actions.apply_schema(engine)
    armed = arm_fence(engine, ns, armed_by=HOLDER, timeout_s=10)
    for pack in steps.actions.resolve_packs(engine, ns):
        assert steps.checkpoint(engine, pack, timeout_s=30, written_by=HOLDER).outcome == "written"
    with engine.begin() as conn:  # released as resume_admission would (readiness is not what this test is about)
        conn.execute(update(catalog.AdmissionFence).where(catalog.AdmissionFence.c.FenceId == armed.fence_id)
                     .values(ReleasedAt=utcnow(), ReleasedBy=HOLDER))


BUILDERS = {"pf-proceeds": _proceeds, "pf-waits": _waits, "pf-fenced": _fence_held, "pf-cut-over": _cut_over}


@pytest.fixture(scope="module")
def fleet(mysql_server_url):
    """tenant -> URL: three production-shaped MariaDB tenants and one unreachable one."""
    with contextlib.ExitStack() as stack:
        urls = {}
        for ns, build in BUILDERS.items():
            urls[ns] = stack.enter_context(mysql_database(mysql_server_url))
            engine = make_engine(urls[ns])
            build(engine, ns)
            engine.dispose()
        urls["pf-gone"] = UNREACHABLE
        yield urls


@pytest.fixture(autouse=True)
def _counted(request):
    """A test on the fleet ran on MariaDB (counted in the run's summary of MySQL-protocol tests)."""
    if "fleet" in request.fixturenames:
        request.node._nexus_uses_mysql = True


def options(tenant: str) -> PlanOptions:
    return PlanOptions(namespace=tenant, holder=HOLDER, stale_heartbeat_s=STALE_S, take_over=CLI_TAKE_OVER)


def opener(urls):
    return lambda tenant: pf.engine_of(urls[tenant], connect_timeout=3)


def cli_plan(url: str, ns: str) -> dict:
    env = {**os.environ, "NEXUS_TENANT_DSN": url}
    proc = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", "plan", "-namespace", ns, "-holder", HOLDER,
                           "-stale-heartbeat", f"{STALE_S:g}s", "-timeout", "30s", "-json"],
                          env=env, capture_output=True, text=True, timeout=300)
    return json.loads(proc.stdout.strip().splitlines()[-1])


def test_each_tenant_gets_its_own_verdict_and_one_bad_tenant_hides_none(fleet):
    rows = pf.preflight(list(fleet), opener(fleet), options, concurrency=4)
    by = {r["tenant"]: r for r in rows}
    assert [r["tenant"] for r in rows] == list(fleet)  # the order given, one row each
    assert by["pf-proceeds"]["verdict"] == "proceed" and by["pf-proceeds"]["old_work_remaining"] == 0
    assert by["pf-proceeds"]["drain_eta_min"] == 0 and by["pf-proceeds"]["live_old_writers"] == []
    waits = by["pf-waits"]
    assert waits["verdict"] == "wait" and waits["old_work_remaining"] > 0
    assert waits["reason"].startswith("the old projection backlog to drain within arm_when_drain_below")  # issue 36
    assert f"the drain ({waits['old_work_remaining']} old projection WorkItems remaining)" in waits["reason"]
    assert HOSTILE_WRITER in waits["live_old_writers"] and "old-worker-1" in waits["live_old_writers"]
    assert waits["drain_eta_min"] is None and "unknown" in waits["drain_eta"]
    fenced = by["pf-fenced"]
    assert fenced["verdict"] == "stop" and "cli:someone-else" in fenced["reason"]
    done = by["pf-cut-over"]  # one verdict for a cut-over tenant: never "proceed"
    assert done["verdict"] == "done" and done["reason"].startswith("already cut over"), done
    gone = by["pf-gone"]
    assert gone["verdict"] == "stop" and "cannot reach the tenant database" in gone["reason"]
    assert "s3cret" not in json.dumps(rows) and "OperationalError" not in gone["reason"]


def test_the_rows_are_what_nexus_cutover_plan_says_for_the_same_tenants(fleet):
    rows = {r["tenant"]: r for r in pf.preflight(list(fleet), opener(fleet), options, concurrency=2)}
    for tenant, url in fleet.items():
        cli = cli_plan(url, tenant)
        if "verdict" in cli:
            assert rows[tenant]["plan_verdict"] == cli["verdict"], tenant
            assert rows[tenant]["verdict"] == cli["verdict"].split(":")[0]
            assert rows[tenant]["old_work_remaining"] == cli["drain"]["remaining"]
            assert rows[tenant]["live_old_writers"] == cli["writers"]["live"]
        else:  # the plan itself could not run: the CLI's error is the row's reason
            assert cli["exit_code"] != 0 and rows[tenant]["reason"] == cli["error"], (tenant, cli)
    assert {r["verdict"] for r in rows.values()} == {"proceed", "wait", "stop", "done"}


def test_concurrency_is_reached_and_never_exceeded(fleet):
    """Six reads, ``concurrency`` 3: a barrier of 3 passes only if 3 read at once; a counter sees never 4."""
    bound, lock, state = 3, threading.Lock(), {"now": 0, "most": 0}
    barrier = threading.Barrier(bound, timeout=120)

    @contextlib.contextmanager
    def counting(tenant):
        with lock:
            state["now"] += 1
            state["most"] = max(state["most"], state["now"])
        try:
            barrier.wait()  # BrokenBarrierError (the row's reason) unless `bound` tenants are in here together
            with pf.engine_of(fleet["pf-proceeds"]) as engine:
                yield engine
        finally:
            with lock:
                state["now"] -= 1

    tenants = [f"pf-proceeds-{i}" for i in range(2 * bound)]
    rows = pf.preflight(tenants, counting, lambda t: options("pf-proceeds"), concurrency=bound)
    assert state["most"] == bound, state
    assert [r["verdict"] for r in rows] == ["proceed"] * len(tenants), [r["reason"] for r in rows]


def test_a_bad_concurrency_is_refused_before_any_read():
    def never(tenant):
        raise AssertionError("no tenant may be read")

    for bad in (0, -1, pf.MAX_CONCURRENCY + 1, "8"):
        with pytest.raises(BadInput, match="preflight concurrency"):
            pf.preflight(["acme"], never, options, concurrency=bad)


def test_the_csv_carries_hostile_ids_exactly_and_never_runs_as_a_formula(fleet):
    rows = pf.preflight(["pf-waits"], opener(fleet), options)
    rows.append({**rows[0], "tenant": "pf-formula", "reason": "=HYPERLINK(\"http://x\")", "live_old_writers": ["@x"]})
    parsed = list(csv.reader(io.StringIO(pf.to_csv(rows), newline="")))
    assert parsed[0] == list(pf.COLUMNS)
    got = dict(zip(parsed[0], parsed[1], strict=True))
    assert got["tenant"] == "pf-waits" and got["verdict"] == "wait"
    assert HOSTILE_WRITER in got["live_old_writers"]  # quote, comma, newline, non-ASCII and trailing space intact
    assert got["old_work_remaining"] == str(rows[0]["old_work_remaining"])
    formula = dict(zip(parsed[0], parsed[2], strict=True))
    assert formula["reason"] == "'" + rows[1]["reason"] and formula["live_old_writers"] == "'@x"
    table = pf.text_table(rows)
    assert "pf-waits" in table and "1 tenant(s)" not in table and "2 tenant(s): 0 proceed, 2 wait, 0 stop" in table


def test_an_unexpected_error_is_the_tenants_stop_row_in_words_and_never_quotes_a_dsn():
    @contextlib.contextmanager
    def broken(tenant):
        if tenant == "leaks":
            raise RuntimeError("could not use mysql+pymysql://cutover:s3cret@db:3306/t")
        raise KeyError(tenant)
        yield

    rows = pf.preflight(["leaks", "plain"], broken, options)
    assert [r["verdict"] for r in rows] == ["stop", "stop"]
    assert rows[0]["reason"] == "the plan could not be read (RuntimeError)" and "s3cret" not in json.dumps(rows)
    assert rows[1]["reason"] == "the plan could not be read (KeyError: 'plain')"

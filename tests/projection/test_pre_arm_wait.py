"""The wait before the fence (issue 36, item 1): ``run`` arms only once the old backlog would drain within
``-arm-when-drain-below`` at its measured rate, stops (nothing written, the fence not armed) when the backlog
cannot drain or does not shrink in time, and arms at once with 0. Real MariaDB and SQLite tenants, the old runtime
simulated draining at a slow, known rate."""

from __future__ import annotations

import contextlib
import os
import signal
import sys
import threading

from sqlalchemy import func, select

from nexus_cutover import catalog
from nexus_cutover.cli import cutover_steps as cli
from nexus_sim.old_runtime import OldRuntimeSimulator
from nexus_sim.scenario import TenantScenario
from tests.projection.test_cutover_steps_cli import FAST, NS, tenant  # noqa: F401 - the fixture
from tests.projection.test_cutover_steps_cli import cli as run_cli

BACKLOG = 60  # pending old projection WorkItems, one per lane


def _backlog(engine, *, live_worker: bool, items: int = BACKLOG) -> None:
    top = 100_000
    sc = TenantScenario(namespace=NS, event_id_start=top, work_id_start=top)
    pack = sc.pack("pk-c")
    for lane in range(items):
        pack.lane(f"backlog-{lane:03d}").generation(1, status="pending")
    if live_worker:  # heartbeating now, never working: the backlog does not shrink
        sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-idle-worker")
    sc.write(engine)


def _count(engine, table) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table)).scalar_one()


def _pending(engine) -> int:
    w = catalog.WorkItem
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(w).where(w.c.Status == "pending")).scalar_one()


def test_run_arms_the_fence_only_once_the_backlog_would_drain_within_the_bound(tenant, monkeypatch, capsys):  # noqa: F811
    engine, url = tenant
    _backlog(engine, live_worker=False)
    sim = OldRuntimeSimulator(engine, NS, process_id="old-rt", work_per_step=1, retry_delay_s=0.0)
    sim.register()
    done = threading.Event()

    def drain_slowly() -> None:  # one item per 0.25 s, ~4 items/s: the first rate measured says ~15 s, above 5 s
        while not done.is_set():
            sim.step()
            if sim.drained():
                sim.stop()  # drained: the old runtime stops, as an engineer stops it for the cutover
                return
            done.wait(0.25)

    old = threading.Thread(target=drain_slowly, daemon=True)
    old.start()
    monkeypatch.setenv("NEXUS_TENANT_DSN", url)
    monkeypatch.setenv("NEXUS_HOST_HEARTBEAT_S", "0.5")
    monkeypatch.setenv("NEXUS_HOST_POLL_S", "0.2")
    args = cli.build_parser().parse_args(["run", "-namespace", NS, *FAST, "-arm-when-drain-below", "5s",
                                          "--confirm-writers-stopped", "-host-command",
                                          f"{sys.executable} -m nexus_cutover.cli.host --namespace {NS}"])
    code, out = None, {}
    try:
        code, out = cli.cmd_run(cli.Command(args, engine))
    finally:
        if out.get("host_pid"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(out["host_pid"], signal.SIGTERM)
        done.set()
        old.join(timeout=60)
    assert code == 0 and out["outcome"] == "cut_over", out
    armed_at = out["pre_arm"]  # the look that let the run arm
    assert armed_at["remaining"] == 0 or armed_at["eta_s"] <= 5, armed_at
    printed = capsys.readouterr().out.splitlines()
    waited = [i for i, line in enumerate(printed) if "before the fence is armed" in line]
    fenced = next(i for i, line in enumerate(printed) if line.startswith("  fence ") and ": armed" in line)
    assert waited and waited[-1] < fenced, printed  # it waited, with the fence not armed, then armed
    assert any("items/min, ETA ~" in printed[i] for i in waited), printed  # a measured rate said: not yet


def test_a_backlog_that_does_not_shrink_stops_the_run_before_arming_and_nothing_is_written(tenant):  # noqa: F811
    engine, url = tenant
    _backlog(engine, live_worker=True)
    proc = run_cli(url, "run", "-namespace", NS, *FAST, "-arm-when-drain-below", "30s", "-pre-arm-timeout", "2s",
                   "--confirm-writers-stopped", "-json")
    assert proc.returncode == 4, proc.stderr  # timed out: the bound of the wait, not a finding
    assert "wait_for_short_drain" in proc.stderr and f"{BACKLOG} remaining" in proc.stderr, proc.stderr
    assert "not shrinking" in proc.stderr and "Next:" in proc.stderr
    assert _count(engine, catalog.AdmissionFence) == 0 and _count(engine, catalog.ConnectorProjectionProtocol) == 0
    assert _pending(engine) == BACKLOG  # no WorkItem changed


def test_a_backlog_that_cannot_drain_stops_the_run_before_arming(tenant):  # noqa: F811
    engine, url = tenant
    _backlog(engine, live_worker=False)  # pending, and no live old worker: it cannot drain
    proc = run_cli(url, "run", "-namespace", NS, *FAST, "--confirm-writers-stopped", "-json")
    assert proc.returncode == 3 and "wait_for_short_drain: the drain is stuck" in proc.stderr, proc.stderr
    assert "no live old-protocol projection_worker" in proc.stderr and "the fence is not armed" in proc.stderr
    assert _count(engine, catalog.AdmissionFence) == 0 and _pending(engine) == BACKLOG
    planned = run_cli(url, "plan", "-namespace", NS, *FAST)  # plan says the same, once, before anything is written
    verdict = planned.stdout.strip().splitlines()[-1]
    assert planned.returncode == 3 and verdict.count("the drain is stuck") == 1, planned.stdout


def test_zero_arms_at_once_as_before(tenant):  # noqa: F811
    engine, url = tenant
    _backlog(engine, live_worker=True)
    proc = run_cli(url, "run", "-namespace", NS, *FAST, "-arm-when-drain-below", "0", "-drain-timeout", "2s",
                   "--confirm-writers-stopped", "-json")
    assert proc.returncode == 4 and "wait_for_drain" in proc.stderr, proc.stderr  # fenced, then the drain's bound
    assert _count(engine, catalog.AdmissionFence) == 1 and _pending(engine) == BACKLOG


def test_new_old_work_arriving_as_fast_as_it_drains_does_not_keep_the_fence_from_arming(tenant, monkeypatch):  # noqa: F811
    """A production backlog before the fence: the old runtime admits new old work as fast as it finishes old work,
    so the count stays flat (300, give or take a step's worth); the rate it finishes items at (the WorkIds that
    left the backlog: ~24/s, ~13 s for 300) times the drain behind the fence, within the 40 s bound, and the run
    arms. Timed by the flat count alone (a few items/min of jitter: minutes) it would wait out pre_arm_timeout."""
    import pytest

    engine, url = tenant
    _backlog(engine, live_worker=False, items=300)
    sim = OldRuntimeSimulator(engine, NS, process_id="old-rt", work_per_step=6, synthetic_inputs_per_step=2,
                              synthetic_lanes=100_000, retry_delay_s=0.0)
    sim.register()
    done = threading.Event()

    def steady() -> None:  # three packs x two new inputs per step in, six items per step out, every 0.25 s
        while not done.is_set():
            sim.step()
            done.wait(0.25)

    old = threading.Thread(target=steady, daemon=True)
    old.start()
    monkeypatch.setenv("NEXUS_TENANT_DSN", url)
    args = cli.build_parser().parse_args(["run", "-namespace", NS, *FAST, "-arm-when-drain-below", "40s",
                                          "-pre-arm-timeout", "20s", "-writers-stop-timeout", "1s",
                                          "--confirm-writers-stopped"])
    try:
        with pytest.raises(cli.TimedOut) as stopped:  # armed and drained; the old runtime, never stopped, is live
            cli.cmd_run(cli.Command(args, engine))
    finally:
        done.set()
        old.join(timeout=60)
    report = stopped.value.report
    assert report["steps"][-1] == "check_old_writers" and report["fence"]["outcome"] == "armed", report
    looks = report["pre_arm"]
    assert looks["eta_s"] is not None and looks["eta_s"] <= 40 and looks["remaining"] > 200, looks
    assert _count(engine, catalog.AdmissionFence) == 1

"""The old-protocol simulator: protocol-0 heartbeats, fenced admission, old coalescing, retries and blocks."""

from __future__ import annotations

import datetime as dt
import threading

from sqlalchemy import func, select

from nexus_cutover import catalog
from nexus_cutover.catalog import Event, IngressReceipt, ProcessRegistry, WorkItem
from nexus_cutover.runtime.admission import admit_batch
from nexus_cutover.runtime.host import run_host
from nexus_sim.old_runtime import OldRuntimeSimulator
from nexus_sim.scenario import TenantScenario

from .support import NS, PACK, assert_membership, inp, range_generations, range_tenant


def _legacy_tenant(engine, build=None):
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK)
    if build:
        build(sc)
    sc.write(engine)
    return sc


def _rows(engine, table, *where, cols=None):
    with engine.connect() as conn:
        return conn.execute(select(*(cols or [table])).where(*where)).all()


def _count(engine, table, *where):
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar()


def test_runs_on_the_legacy_schema_and_coalesces_old_style(legacy_engine):
    _legacy_tenant(legacy_engine, lambda sc: [sc.receipt(PACK, "a", f"r{i}") for i in range(4)])
    sim = OldRuntimeSimulator(legacy_engine, NS, process_id="old", work_per_step=0)
    report = sim.step()
    assert report.admitted == 4 and report.claimed == 0
    work = _rows(legacy_engine, WorkItem, cols=[WorkItem.c.LaneOrdinal, WorkItem.c.Status])
    assert [tuple(w) for w in work] == [(4, "pending")]  # one old generation, coalesced to the last input
    assert _count(legacy_engine, IngressReceipt, IngressReceipt.c.ConfirmedAt.is_(None)) == 0
    sim.config.work_per_step = 10
    assert sim.step().completed == 1
    assert sim.drained()
    sim.stop()
    procs = _rows(
        legacy_engine, ProcessRegistry, cols=[ProcessRegistry.c.Role, ProcessRegistry.c.ProjectionProtocol, ProcessRegistry.c.StoppedAt]
    )
    assert sorted((r.Role, r.ProjectionProtocol) for r in procs) == [
        (catalog.ROLE_DEPENDENCY_RESOLVER, 0), (catalog.ROLE_INGRESS_WRITER, 0), (catalog.ROLE_PROJECTION_WORKER, 0)
    ]
    assert all(r.StoppedAt is not None for r in procs)


def test_fence_in_force_stops_admission_and_overrides_let_named_scopes_through(legacy_engine):
    future = dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(hours=1)

    def build(sc):
        sc.receipt(PACK, "a", "ra")
        sc.receipt(PACK, "b", "rb")
        sc.receipt(PACK, "c", "rc")
        fence = sc.fence(expires_at=future)
        sc.fence_override(fence, f"{PACK}/b")
        sc.fence_override(fence, f"{PACK}/c", revoked=True)
        sc.fence(released=True)
        sc.fence(expires_at=dt.datetime(2000, 1, 1))  # expired: not in force

    _legacy_tenant(legacy_engine, build)
    sim = OldRuntimeSimulator(legacy_engine, NS, process_id="old")
    report = sim.step()
    assert report.admitted == 1 and report.fenced_sources == 2
    assert [r.ReceiptId for r in _rows(legacy_engine, Event, cols=[Event.c.ReceiptId])] == ["rb"]
    assert sim.drained()  # what is left is fenced: nothing it may admit


def test_retries_and_dependency_blocks_finish_unless_resolution_is_off(legacy_engine):
    _legacy_tenant(legacy_engine, lambda sc: [sc.receipt(PACK, lane, "r") for lane in ("a", "b", "c")])
    sim = OldRuntimeSimulator(legacy_engine, NS, process_id="old", fail_attempts=2, retry_delay_s=0, block_every=2, block_steps=2)
    seen = set()
    for _ in range(20):
        r = sim.step()
        seen |= {k for k in ("retried", "blocked", "unblocked", "completed") if getattr(r, k)}
        if sim.drained():
            break
    assert sim.drained() and seen == {"retried", "blocked", "unblocked", "completed"}
    statuses = _rows(legacy_engine, WorkItem, cols=[WorkItem.c.Status, WorkItem.c.Attempt])
    assert {s.Status for s in statuses} == {"completed"} and max(s.Attempt for s in statuses) >= 2

    stuck = OldRuntimeSimulator(legacy_engine, NS, process_id="old2", block_every=1, resolve_dependencies=False)
    with legacy_engine.begin() as conn:
        conn.execute(
            IngressReceipt.insert().values(
                PackInstallId=PACK,
                SourceLane="d",
                ReceiptId="r",
                EventKind="contact.changed",
                Payload="{}",
                ReceivedAt=dt.datetime(2026, 1, 1),
            )
        )
    for _ in range(5):
        stuck.step()
    assert _rows(legacy_engine, WorkItem, WorkItem.c.SourceLane == "d", cols=[WorkItem.c.Status])[0].Status == "blocked"
    assert not stuck.drained()


def test_never_touches_range_work(range_engine):
    range_tenant(range_engine)
    admit_batch(range_engine, PACK, [inp("a", "1")])
    before = range_generations(range_engine)
    sim = OldRuntimeSimulator(range_engine, NS, process_id="old")
    sim.step()
    assert range_generations(range_engine) == before
    assert sim.live_old_work() == 0


def test_live_cutover_old_runtime_then_fence_drain_checkpoint_and_new_host(range_engine):
    """Old runtime under synthetic load -> fence -> drained -> stopped -> checkpoint -> new host serves receipts."""
    from nexus_cutover.projection.checkpoint import run_checkpoint

    _legacy_tenant(range_engine)
    sim = OldRuntimeSimulator(range_engine, NS, process_id="old", synthetic_inputs_per_step=3, fail_attempts=1, retry_delay_s=0)
    stop = threading.Event()
    for _ in range(5):
        sim.step()
    assert sim.live_old_work() > 0 or _count(range_engine, Event) > 0
    with range_engine.begin() as conn:  # step 1: arm the non-expiring '*' fence
        conn.execute(
            catalog.AdmissionFence.insert().values(Namespace=NS, Scope="*", Reason="cutover", ArmedBy="t", ArmedAt=dt.datetime(2026, 1, 1))
        )
    assert sim.run(stop, poll_s=0.01, exit_when_drained=True) == 0  # steps 2-3: drain, then stop
    events_before = _count(range_engine, Event)
    result = run_checkpoint(range_engine, PACK, timeout_s=30, written_by="test")
    assert result.outcome == "written" and result.legacy_max_ordinal == events_before
    with range_engine.begin() as conn:
        conn.execute(
            IngressReceipt.insert().values(
                PackInstallId=PACK,
                SourceLane="sim-000",
                ReceiptId="post",
                EventKind="contact.changed",
                Payload="{}",
                ReceivedAt=dt.datetime(2026, 1, 1),
            )
        )
    assert run_host(range_engine, NS, process_id="new", drain_and_exit=True, poll_s=0.01) == 0
    (gen,) = range_generations(range_engine)
    assert gen.InputStartOrdinal == events_before + 1 and gen.Status == "completed"
    assert_membership(range_engine, {PACK: events_before})


def test_simulator_command_exits_when_drained_and_marks_itself_stopped(sqlite_url):
    import os
    import subprocess
    import sys

    from nexus_cutover.db import make_engine
    from nexus_cutover.schema import create_legacy_schema

    engine = make_engine(sqlite_url)
    try:
        create_legacy_schema(engine)
        _legacy_tenant(engine, lambda sc: [sc.receipt(PACK, lane, "r") for lane in ("a", "b")])
        done = subprocess.run(
            [
                sys.executable,
                "-m",
                "nexus_sim.old_runtime",
                "--namespace",
                NS,
                "--process-id",
                "sim",
                "--exit-when-drained",
                "--fail-attempts",
                "1",
                "--retry-delay",
                "0",
            ],
            env=dict(os.environ, NEXUS_TENANT_DSN=sqlite_url),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert done.returncode == 0, done.stderr
        assert {r.Status for r in _rows(engine, WorkItem, cols=[WorkItem.c.Status])} == {"completed"}
        procs = _rows(engine, ProcessRegistry, cols=[ProcessRegistry.c.ProcessId, ProcessRegistry.c.StoppedAt])
        assert sorted(p.ProcessId for p in procs) == ["sim/dependency_resolver", "sim/ingress_writer", "sim/projection_worker"]
        assert all(p.StoppedAt is not None for p in procs)
    finally:
        engine.dispose()


def test_demo_tenant_old_work_drains_through_the_stand_in_worker_then_cuts_over(range_engine):
    """The demo's in-flight old work (one item leased to old-worker-1) finishes when the simulator stands in for it."""
    from nexus_cutover.projection.checkpoint import run_checkpoint
    from nexus_sim.scenario import demo_tenant

    sc = demo_tenant(NS)
    sc.fence(expires_at=None)  # cutover step 1: the '*' fence is armed
    sc.write(range_engine)
    sim = OldRuntimeSimulator(range_engine, NS, writer_id="old-ingress-1", worker_id="old-worker-1")
    assert sim.live_old_work() > 0
    assert sim.run(poll_s=0.01, exit_when_drained=True) == 0
    assert sim.live_old_work() == 0
    procs = _rows(
        range_engine,
        ProcessRegistry,
        ProcessRegistry.c.ProcessId.in_(["old-ingress-1", "old-worker-1"]),
        cols=[ProcessRegistry.c.StoppedAt],
    )
    assert len(procs) == 2 and all(p.StoppedAt is not None for p in procs)
    for pack in ("pk-billing", "pk-crm-sync"):
        assert run_checkpoint(range_engine, pack, timeout_s=30, written_by="test").outcome == "written"
    assert run_host(range_engine, NS, process_id="new", drain_and_exit=True, poll_s=0.01) == 0

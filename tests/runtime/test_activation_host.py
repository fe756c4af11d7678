"""Activation gate, process registry, receipt materializer and the runnable host (library and CLI)."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
import time

import pytest
from sqlalchemy import func, select

from nexus_cutover import catalog
from nexus_cutover.catalog import Event, IngressReceipt, ProcessRegistry, WorkItem
from nexus_cutover.db import make_engine
from nexus_cutover.runtime.activation import check_activation
from nexus_cutover.runtime.errors import NotActivated
from nexus_cutover.runtime.host import run_host
from nexus_cutover.runtime.materializer import materialize
from nexus_cutover.runtime.model import Routing
from nexus_cutover.runtime.worker import ProjectionWorker
from nexus_cutover.schema import create_legacy_schema

from ..support import history_checksum
from .support import NS, PACK, assert_membership, range_generations, range_tenant


def _receipts(sc, n, lanes=("a", "b"), pack=PACK):
    for i in range(n):
        sc.receipt(pack, lanes[i % len(lanes)], f"rc-{i:03d}")


def _process(engine, pid):
    with engine.connect() as conn:
        return conn.execute(select(ProcessRegistry).where(ProcessRegistry.c.ProcessId == pid)).first()


def _count(engine, table, *where):
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar()


class Recorder:
    def __init__(self):
        self.seen = {}

    def __call__(self, claimed, payloads):
        self.seen[claimed.work_id] = [p.receipt_id for p in payloads]


def test_gate_refuses_without_protocol_row_for_every_active_pack(range_engine):
    range_tenant(range_engine, packs=("pk-1", "pk-2"), legacy_max=None)
    verdict = check_activation(range_engine, NS)
    assert not verdict.ok and len(verdict.reasons) == 2 and "pk-2" in verdict.reasons[1]
    with pytest.raises(NotActivated):
        ProjectionWorker(range_engine, NS, "standalone").start()
    worker = ProjectionWorker(range_engine, NS, "standalone")
    with pytest.raises(NotActivated, match="start"):
        worker.work_one()


def test_gate_refuses_incomplete_workitem_schema(legacy_engine):
    verdict = check_activation(legacy_engine, NS)
    assert not verdict.ok and "InputStartOrdinal" in verdict.reasons[0]


def test_gate_passes_and_ignores_uninstalled_packs(range_engine):
    def build(sc):
        sc.pack("pk-old", status=catalog.PACK_UNINSTALLED)

    range_tenant(range_engine, build=build)
    verdict = check_activation(range_engine, NS)
    assert verdict.ok and verdict.packs == [PACK]


def test_drain_and_exit_refused_by_gate_exits_3_having_admitted_nothing(range_engine):
    range_tenant(range_engine, legacy_max=None, build=lambda sc: _receipts(sc, 3))
    before = history_checksum(range_engine)
    assert run_host(range_engine, NS, process_id="host-1", drain_and_exit=True, heartbeat_s=0.05) == 3
    assert history_checksum(range_engine) == before
    row = _process(range_engine, "host-1")
    assert row.Role == "integration_host" and row.ProjectionProtocol == 1
    assert row.ActivatedAt is None and row.StoppedAt is not None
    assert _count(range_engine, IngressReceipt, IngressReceipt.c.MaterializedAt.is_not(None)) == 0


def test_host_materializes_receipts_and_completes_every_generation(range_engine):
    range_tenant(range_engine, build=lambda sc: _receipts(sc, 7))
    recorder = Recorder()
    routing = Routing(route_version=3, flow_version="2.1.0", work_type="connector.projection")
    code = run_host(range_engine, NS, process_id="host-1", drain_and_exit=True, execute=recorder, routing=routing, poll_s=0.01)
    assert code == 0
    row = _process(range_engine, "host-1")
    assert row.ActivatedAt is not None and row.StoppedAt is not None
    assert _count(range_engine, IngressReceipt, IngressReceipt.c.ConfirmedAt.is_(None)) == 0
    gens = range_generations(range_engine)
    assert {g.Status for g in gens} == {"completed"}
    assert {(g.RouteVersion, g.FlowVersion) for g in gens} == {(3, "2.1.0")}
    owner = assert_membership(range_engine)
    assert sorted(r for rs in recorder.seen.values() for r in rs) == [f"rc-{i:03d}" for i in range(7)]
    assert len(owner) == 7


def test_crash_between_admission_commit_and_confirmation_is_retried_idempotently(range_engine):
    range_tenant(range_engine, build=lambda sc: _receipts(sc, 4))

    class Crash(Exception):
        pass

    def crash(_result):
        raise Crash

    with pytest.raises(Crash):
        materialize(range_engine, PACK, Routing(), after_commit=crash)
    assert _count(range_engine, Event) == 4
    assert _count(range_engine, IngressReceipt, IngressReceipt.c.MaterializedAt.is_not(None)) == 4
    assert _count(range_engine, IngressReceipt, IngressReceipt.c.ConfirmedAt.is_not(None)) == 0
    work_before = _count(range_engine, WorkItem)
    assert run_host(range_engine, NS, process_id="host-2", drain_and_exit=True, poll_s=0.01) == 0
    assert _count(range_engine, Event) == 4 and _count(range_engine, WorkItem) == work_before
    assert _count(range_engine, IngressReceipt, IngressReceipt.c.ConfirmedAt.is_(None)) == 0


def test_host_waits_at_the_gate_until_the_protocol_row_exists(range_engine):
    range_tenant(range_engine, legacy_max=None, build=lambda sc: _receipts(sc, 2))
    stop = threading.Event()
    codes = []
    thread = threading.Thread(
        target=lambda: codes.append(run_host(range_engine, NS, process_id="h", stop_event=stop, poll_s=0.02, heartbeat_s=0.05))
    )
    thread.start()
    try:
        for _ in range(200):  # the heartbeat thread beats while the gate refuses
            row = _process(range_engine, "h")
            if row is not None and row.LastHeartbeatAt > row.StartedAt:
                break
            time.sleep(0.05)
        assert row.LastHeartbeatAt > row.StartedAt
        assert _process(range_engine, "h").ActivatedAt is None
        assert _count(range_engine, Event) == 0
        from nexus_cutover.protocol_row import insert_protocol_row

        with range_engine.begin() as conn:
            insert_protocol_row(conn, PACK, 0, "test")
        for _ in range(200):
            if _count(range_engine, IngressReceipt, IngressReceipt.c.ConfirmedAt.is_(None)) == 0:
                break
            time.sleep(0.05)
        assert _process(range_engine, "h").ActivatedAt is not None
    finally:
        stop.set()
        thread.join(30)
    assert codes == [0] and _process(range_engine, "h").StoppedAt is not None
    assert _count(range_engine, Event) == 2


def _cli_env(url):
    env = dict(os.environ, NEXUS_TENANT_DSN=url, NEXUS_HOST_HEARTBEAT_S="0.1", NEXUS_HOST_POLL_S="0.05")
    return env


@pytest.mark.parametrize("backend", ["sqlite", "mysql"])
def test_cli_sigterm_stops_cleanly_and_drain_refusal_exits_3(backend, request):
    url = request.getfixturevalue(f"{backend}_url")
    engine = make_engine(url)
    try:
        create_legacy_schema(engine)
        from nexus_cutover.schema import apply_steps, projection_steps

        apply_steps(engine, projection_steps(engine))
        range_tenant(engine, legacy_max=None, build=lambda sc: _receipts(sc, 2))
        refused = subprocess.run(
            [sys.executable, "-m", "nexus_cutover.cli.host", "--namespace", NS, "--process-id", "cli-1", "--drain-and-exit"],
            env=_cli_env(url),
            capture_output=True,
            text=True,
            timeout=60,
        )
        assert refused.returncode == 3, refused.stderr
        assert "no connector projection protocol row" in refused.stderr
        assert "nexus-test" not in refused.stderr + refused.stdout  # the password never shows
        from nexus_cutover.protocol_row import insert_protocol_row

        with engine.begin() as conn:
            insert_protocol_row(conn, PACK, 0, "test")
        proc = subprocess.Popen(
            [sys.executable, "-m", "nexus_cutover.cli.host", "-namespace", NS, "-process-id", "cli-2"],
            env=_cli_env(url),
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
        )
        try:
            for _ in range(300):
                row = _process(engine, "cli-2")
                if row is not None and row.ActivatedAt is not None and _count(engine, WorkItem, WorkItem.c.Status == "completed") == 2:
                    break
                time.sleep(0.05)
            proc.send_signal(signal.SIGTERM)
            _out, err = proc.communicate(timeout=30)
        finally:
            if proc.poll() is None:
                proc.kill()
        assert proc.returncode == 0, err
        row = _process(engine, "cli-2")
        assert row.ActivatedAt is not None and row.StoppedAt is not None
        assert _count(engine, WorkItem, WorkItem.c.Status == "completed") == 2
    finally:
        engine.dispose()


def test_cli_without_dsn_or_with_a_malformed_one_is_bad_input():
    base = {k: v for k, v in os.environ.items() if k not in ("NEXUS_TENANT_DSN", "CONNECTOR_CUTOVER_DSN")}
    missing = subprocess.run(
        [sys.executable, "-m", "nexus_cutover.cli.host", "--namespace", NS], env=base, capture_output=True, text=True, timeout=60
    )
    assert missing.returncode == 2 and "NEXUS_TENANT_DSN" in missing.stderr
    malformed = subprocess.run(
        [sys.executable, "-m", "nexus_cutover.cli.host", "--namespace", NS],
        env=dict(base, NEXUS_TENANT_DSN="postgres://u:secret@h/db"),
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert malformed.returncode == 2 and "secret" not in malformed.stderr
    usage = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.host"], env=base, capture_output=True, text=True, timeout=60)
    assert usage.returncode == 2


def test_uncovered_receipt_is_left_unmaterialized_and_ends_the_drain_with_missing_coverage(range_engine):
    import datetime as dt

    from nexus_cutover.runtime.errors import MissingCoverage

    range_tenant(range_engine, build=lambda sc: _receipts(sc, 3))
    with range_engine.begin() as conn:  # receipt rc-001 already has an Event above the cutoff, with no generation
        conn.execute(
            Event.insert().values(
                EventId=500,
                Namespace=NS,
                PackInstallId=PACK,
                EventKind="contact.changed",
                RouteVersion=1,
                FlowVersion="1.0.0",
                WorkType="connector.projection",
                SourceLane="b",
                EnqueueOrdinal=1,
                ReceiptId="rc-001",
                Status="skipped",
                Payload="{}",
                ReceivedAt=dt.datetime(2026, 1, 1),
            )
        )
        conn.execute(catalog.EnqueueOrdinal.update().values(LastOrdinal=1))
    with pytest.raises(MissingCoverage, match="rc-001"):
        run_host(range_engine, NS, process_id="h", drain_and_exit=True, poll_s=0.01)
    with range_engine.connect() as conn:
        rows = conn.execute(select(IngressReceipt.c.ReceiptId, IngressReceipt.c.ConfirmedAt).order_by(IngressReceipt.c.ReceiptId)).all()
    assert [(r.ReceiptId, r.ConfirmedAt is not None) for r in rows] == [("rc-000", True), ("rc-001", False), ("rc-002", True)]
    assert _process(range_engine, "h").StoppedAt is not None
    assert _count(range_engine, WorkItem, WorkItem.c.Status == "completed") == 1  # rc-000 and rc-002: lane a, one generation

"""Old-protocol work above a cutoff (contract, the reference host's activation gate; "Greenfield activation").

An old runtime that runs after a pack's checkpoint admits old-protocol work above the cutoff: through the runbook's
rollback (old writers restarted, the fence released by L2 before ``resume_admission``) or through a greenfield
activation over a live old runtime. Nothing works it afterwards. The host refuses to serve (exit 3, naming the pack,
the WorkIds and the Events, nothing admitted); ``cutover_standing``, the status view and ``plan`` call it a stop.
Greenfield activation refuses while an old runtime is live and no cutover fence is in force. MariaDB and SQLite.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pytest
from sqlalchemy import func, select, text, update

from nexus_cutover import catalog
from nexus_cutover.above_cutoff import (
    identity_tops_statement,
    namespace_above_cutoff,
    old_work_statement,
    reached_events_statement,
)
from nexus_cutover.catalog import ConnectorProjectionProtocol, Event, IngressReceipt, WorkItem
from nexus_cutover.db import make_engine
from nexus_cutover.identity import ProjectionIdentity
from nexus_cutover.projection import audit, steps
from nexus_cutover.projection.checkpoint import REFUSED, WRITTEN, run_checkpoint
from nexus_cutover.projection.cutover_fence import arm_fence, release_fence
from nexus_cutover.projection.greenfield import activate_pack
from nexus_cutover.runtime.activation import ServedPacks, check_activation
from nexus_cutover.runtime.host import run_host
from nexus_cutover.tenant_status import read_tenant_state
from nexus_sim.old_runtime import OldRuntimeSimulator
from nexus_sim.scenario import TenantScenario
from tests.support import make_cutover_ready

from .support import NS, PACK

STALE = dt.timedelta(seconds=60)
LANE = "Lane-Ä "  # hostile: a trailing space and a non-ASCII letter


def count(engine, table, *where) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar_one()


def rolled_back_after_the_checkpoint(engine) -> tuple[int, list[int]]:
    """The runbook's rollback: drained history, the fence, the checkpoint (cutoff L); then the fence released by L2
    and the old writers restarted before resume_admission: they admit two receipts above L, old style.

    Returns (L, the old WorkIds above L).
    """
    sc = TenantScenario(namespace=NS)
    lane = sc.pack(PACK).lane(LANE)
    lane.generation(2)
    lane.generation(1)
    sc.receipt(PACK, LANE, "rc-after-rollback-1")
    sc.receipt(PACK, LANE, "rc-after-rollback-2")
    sc.write(engine)
    armed = arm_fence(engine, NS, armed_by="eng", timeout_s=30)
    checkpoint = run_checkpoint(engine, PACK, timeout_s=30, written_by="eng")
    assert checkpoint.outcome == WRITTEN
    with engine.begin() as conn:  # L2's process releases the fence for the rollback (not this tool's release)
        conn.execute(update(catalog.AdmissionFence).where(catalog.AdmissionFence.c.FenceId == armed.fence_id)
                     .values(ReleasedAt=dt.datetime(2026, 12, 1), ReleasedBy="l2-rollback"))
    old = OldRuntimeSimulator(engine, NS, process_id="old-restarted", work_per_step=0)
    assert old.step().admitted == 2
    old.stop()
    with engine.connect() as conn:
        above = conn.execute(select(WorkItem.c.WorkId).where(WorkItem.c.LaneOrdinal > checkpoint.legacy_max_ordinal,
                                                              WorkItem.c.InputStartOrdinal.is_(None))).scalars().all()
    assert above
    return checkpoint.legacy_max_ordinal, sorted(above)


def test_the_host_refuses_to_serve_naming_the_pack_workids_and_events_and_admits_nothing(range_engine):
    cutoff, old_work = rolled_back_after_the_checkpoint(range_engine)
    with range_engine.connect() as conn:
        verdict = check_activation(conn, NS)
        events_above = sorted(conn.execute(select(Event.c.EventId).where(Event.c.EnqueueOrdinal > cutoff)).scalars())
    assert not verdict.ok
    (reason,) = verdict.reasons
    assert f"pack '{PACK}' holds old-protocol work above its cutoff LegacyMaxOrdinal={cutoff}" in reason
    assert all(str(w) in reason for w in old_work) and all(str(e) in reason for e in events_above)
    assert "separately reviewed recovery decision" in reason
    with range_engine.begin() as conn:  # a receipt waiting for the new host: it must stay unmaterialized
        conn.execute(IngressReceipt.insert().values(PackInstallId=PACK, SourceLane="new-lane", ReceiptId="rc-new",
                                                    EventKind="contact.changed", Payload="{}",
                                                    ReceivedAt=dt.datetime(2026, 12, 2)))
    events_before = count(range_engine, Event)
    assert run_host(range_engine, NS, process_id="host-1", drain_and_exit=True, poll_s=0.01) == 3
    assert count(range_engine, Event) == events_before  # nothing admitted
    assert count(range_engine, WorkItem, WorkItem.c.InputStartOrdinal.is_not(None)) == 0
    assert count(range_engine, IngressReceipt, IngressReceipt.c.MaterializedAt.is_(None)) == 1


def test_the_standing_the_status_view_and_plan_show_it_as_a_stop(range_engine, tenant_url):
    cutoff, old_work = rolled_back_after_the_checkpoint(range_engine)
    standing = steps.cutover_standing(range_engine, NS)
    assert standing["checkpointed"] == standing["packs"] == 1 and standing["fence_held_by"] is None
    assert standing["cut_over"] is False
    (above,) = standing["old_work_above_cutoff"]
    assert (above["pack_install_id"], above["legacy_max_ordinal"], above["work_ids"]) == (PACK, cutoff, old_work)
    state = read_tenant_state(range_engine, NS)
    assert state["phase"] == "stop" and state["packs"][0]["old_work_above_cutoff"]["work_ids"] == old_work
    env = {**os.environ, "NEXUS_TENANT_DSN": tenant_url}
    plan = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", "plan", "-namespace", NS, "-json"], env=env,
                          capture_output=True, text=True, timeout=120)
    assert plan.returncode == 3, plan.stderr
    verdict = plan.stdout.strip().splitlines()[-1]
    assert '"verdict": "stop: ' in verdict and "holds old-protocol work above its cutoff" in verdict
    status = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", "status", "-namespace", NS], env=env,
                            capture_output=True, text=True, timeout=120)
    assert status.returncode == 0 and "tenant acme: stop" in status.stdout and "STOP: pack 'pk-1'" in status.stdout


def test_one_meaning_of_cut_over_a_rerun_stops_at_the_fence_instead_of_finding_nothing_to_do(range_engine):
    """The fence decides "cut over" as the standing, the status view and plan do: every pack checkpointed and no
    fence in force is not enough while old work lies above a cutoff; the run stops there, arming nothing."""
    from nexus_cutover.projection.cutover_fence import OldWorkAboveCutoff

    _cutoff, old_work = rolled_back_after_the_checkpoint(range_engine)
    fences_before = count(range_engine, catalog.AdmissionFence)
    for dry_run in (True, False):
        with pytest.raises(OldWorkAboveCutoff) as err:
            arm_fence(range_engine, NS, armed_by="eng-2", timeout_s=30, packs=[PACK], dry_run=dry_run)
        assert err.value.above[0]["work_ids"] == old_work and "is not cut over" in str(err.value)
    assert count(range_engine, catalog.AdmissionFence) == fences_before  # nothing armed


def test_one_meaning_of_cut_over_a_silent_host_after_the_release_does_not_undo_it(range_engine):
    """Cut over (checkpointed, released, nothing above a cutoff) whatever the new host does afterwards: the standing
    the rollout skips on, the status view's phase and the fence's not_needed agree."""
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK).lane(LANE).generation(1)
    sc.write(range_engine)
    armed = arm_fence(range_engine, NS, armed_by="eng", timeout_s=30)
    assert run_checkpoint(range_engine, PACK, timeout_s=30, written_by="eng").outcome == WRITTEN
    with range_engine.begin() as conn:  # released; no new host heartbeats now
        conn.execute(update(catalog.AdmissionFence).where(catalog.AdmissionFence.c.FenceId == armed.fence_id)
                     .values(ReleasedAt=dt.datetime(2026, 12, 1), ReleasedBy="eng"))
    assert steps.cutover_standing(range_engine, NS)["cut_over"] is True
    state = read_tenant_state(range_engine, NS)
    assert state["phase"] == "cut over" and not state["host"].get("ready")
    assert arm_fence(range_engine, NS, armed_by="eng-2", timeout_s=30, packs=[PACK]).outcome == "not_needed"


def test_range_work_the_new_host_admits_above_the_cutoff_is_not_old_work(range_engine):
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK).lane(LANE).generation(3)
    for i in range(4):
        sc.receipt(PACK, LANE if i % 2 else "b", f"rc-{i}")
    sc.write(range_engine)
    arm_fence(range_engine, NS, armed_by="eng", timeout_s=30)
    assert run_checkpoint(range_engine, PACK, timeout_s=30, written_by="eng").outcome == WRITTEN
    assert run_host(range_engine, NS, process_id="host-1", drain_and_exit=True, poll_s=0.01) == 0
    assert count(range_engine, WorkItem, WorkItem.c.InputStartOrdinal.is_not(None)) >= 2
    with range_engine.connect() as conn:
        assert namespace_above_cutoff(conn, NS) == [] and check_activation(conn, NS).ok
    assert steps.cutover_standing(range_engine, NS)["old_work_above_cutoff"] == []


def test_a_running_host_does_not_pick_up_a_pack_whose_row_appears_over_old_work(range_engine):
    """Pack pk-2's protocol row is written while it holds old work above it (written by hand here, as an
    activation over a live old runtime did before it refused): the host keeps serving pk-1 and skips pk-2, naming it."""
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK)
    sc.protocol_row(PACK, 0)
    other = sc.pack("pk-2")
    other.lane(LANE).generation(2, status="pending")  # an old runtime's work, above cutoff 0
    sc.write(range_engine)
    served = ServedPacks(range_engine, NS, 0.0, initial=[PACK])
    with range_engine.begin() as conn:
        conn.execute(ConnectorProjectionProtocol.insert().values(PackInstallId="pk-2", ProtocolVersion=1,
                                                                  LegacyMaxOrdinal=0, WrittenAt=dt.datetime(2026, 1, 1),
                                                                  WrittenBy="by hand"))
    assert served.refresh() == []
    assert served.packs == [PACK] and "holds old-protocol work above its cutoff" in served.skipped["pk-2"]


# -- greenfield activation over a live old runtime ---------------------------------------------------------------


def greenfield(engine, *processes: tuple[str, str, dict]) -> None:
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK)
    for role, process_id, kw in processes:
        sc.process(role, process_id=process_id, **kw)
    sc.write(engine)


def protocol_rows(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(select(ConnectorProjectionProtocol)).all()


def test_activation_refuses_while_an_old_runtime_is_live_naming_it_and_writes_nothing(range_engine):
    greenfield(range_engine,
               (catalog.ROLE_INGRESS_WRITER, "old-ingress Ä ", {}),
               (catalog.ROLE_PROJECTION_WORKER, "OLD-worker", {"heartbeat_age_s": 5}),
               (catalog.ROLE_RECEIPT_MATERIALIZER, "old-materializer-stopped", {"stopped": True}),
               (catalog.ROLE_DEPENDENCY_RESOLVER, "old-resolver", {}))  # not one that admits or works projection
    result = activate_pack(range_engine, PACK, timeout_s=30, written_by="eng", stale_heartbeat=STALE)
    assert (result.outcome, result.legacy_max_ordinal) == (REFUSED, None) and protocol_rows(range_engine) == []
    (finding,) = result.as_json()["findings"]
    assert finding["finding"] == audit.OLD_RUNTIME_LIVE
    assert sorted(finding["process_ids"]) == sorted(["old-ingress Ä ", "OLD-worker"])
    assert "old-protocol work above cutoff 0" in finding["explanation"]


def test_activation_goes_on_when_the_old_runtime_is_stopped_or_silent_or_fenced(range_engine):
    greenfield(range_engine, (catalog.ROLE_INGRESS_WRITER, "old-ingress", {"stopped": True}),
               (catalog.ROLE_PROJECTION_WORKER, "old-worker", {"heartbeat_age_s": 3600}))
    assert activate_pack(range_engine, PACK, timeout_s=30, written_by="eng", stale_heartbeat=STALE).outcome == WRITTEN


def test_a_fence_in_force_lets_activation_go_on_beside_a_live_old_runtime(range_engine):
    greenfield(range_engine, (catalog.ROLE_INGRESS_WRITER, "old-ingress", {}))
    armed = arm_fence(range_engine, NS, armed_by="eng", timeout_s=30)
    assert activate_pack(range_engine, PACK, timeout_s=30, written_by="eng", stale_heartbeat=STALE).outcome == WRITTEN
    release_fence(range_engine, NS, armed.fence_id, released_by="eng", timeout_s=30)


def test_the_activate_pack_command_exits_3_naming_the_live_process(range_engine, tenant_url):
    greenfield(range_engine, (catalog.ROLE_RECEIPT_MATERIALIZER, "old-materializer-1", {}))
    env = {**os.environ, "NEXUS_TENANT_DSN": tenant_url}
    proc = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", "activate-pack", "-pack-install-id", PACK],
                          env=env, capture_output=True, text=True, timeout=120)
    assert proc.returncode == 3, proc.stdout + proc.stderr
    assert "old_runtime_live" in proc.stdout and "old-materializer-1" in proc.stdout
    assert protocol_rows(range_engine) == []


def test_the_above_cutoff_statements_are_index_ranges(mysql_url):
    """EXPLAIN: the identity tops and the old work above a cutoff on ix_WorkItem_ProjectionOrder, the Events in reach
    on ix_Event_SourceLane (a tenant with deep history below the cutoff and many lanes)."""
    engine = make_engine(mysql_url)
    try:
        make_cutover_ready(engine)
        sc = TenantScenario(namespace=NS)
        pack = sc.pack(PACK)
        for lane in range(60):
            for _ in range(8):
                pack.lane(f"lane-{lane:03d}").generation(2)
        sc.write(engine)
        ident = ProjectionIdentity(PACK, "contact.changed", 1, "1.0.0", catalog.PROJECTION_WORK_TYPE, "lane-007")
        statements = {
            "tops": identity_tops_statement(PACK, 900),
            "old work": old_work_statement(ident, 900),
            "reached events": reached_events_statement(ident, 900, 950),
        }
        expected = {"tops": "ix_WorkItem_ProjectionOrder", "old work": "ix_WorkItem_ProjectionOrder",
                    "reached events": "ix_Event_SourceLane"}
        with engine.connect() as conn:
            conn.execute(text("ANALYZE TABLE `_System_WorkItem`, `_System_Event`"))
            for what, stmt in statements.items():
                sql = stmt.compile(engine, compile_kwargs={"literal_binds": True})
                plan = conn.execute(text(f"EXPLAIN {sql}")).mappings().all()
                assert plan[0]["key"] == expected[what] and plan[0]["type"] in ("range", "ref", "index"), (what, plan)
    finally:
        engine.dispose()

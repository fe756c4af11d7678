"""The back-out (issue 51, item 7): the cutover fence released without a cutover, only before any checkpoint.

On MariaDB and SQLite (and under ``NEXUS_TIDB_SEMANTICS=1``): the release and its no-op rerun; the refusal once a
pack is checkpointed; whose fence may be backed out (a finished run's, one named by the person, never one still at
work); every check-then-act with a conflicting commit between its check and its act (the product's seam: a
barrier); the command line, recorded in the delivery ledger and told to its webhook.
"""

from __future__ import annotations

import datetime as dt
import os
import subprocess
import sys

import pytest
from sqlalchemy import func, insert, select, update

from nexus_cutover import catalog
from nexus_cutover import ledger as L
from nexus_cutover.errors import BadInput
from nexus_cutover.projection import back_out as B
from nexus_cutover.projection import cutover_fence
from nexus_cutover.projection.transition import BACK_OUT
from nexus_sim.scenario import TenantScenario, utcnow
from tests.notify_sinks import SlackWebhookSink
from tests.projection.test_check_then_act import COMMITTED, Conflict, expected_outcome, fence_of, url_of
from tests.support import table_checksum

NS, PACK = "acme", "pk-1"
STALE = dt.timedelta(seconds=60)
FAILED_RUN = "airflow:connector_projection_cutover:manual__2026-12-07T10:00:00+00:00"
ME = "airflow:connector_projection_back_out:manual__2026-12-07T11:00:00+00:00"
FINISHED = lambda _holder: cutover_fence.HOLDER_FINISHED  # noqa: E731 - the DAG's answer for a failed run
ACTIVE = lambda _holder: cutover_fence.HOLDER_ACTIVE  # noqa: E731


def fenced_tenant(engine, *, holder: str = FAILED_RUN, checkpointed: bool = False) -> int:
    """A tenant with history and stopped old writers, its cutover fence armed by ``holder`` (a rejected run)."""
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK).lane("a").generation(1)
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id="old-writer Ä", stopped=True)
    if checkpointed:
        sc.protocol_row(PACK, 1)
    sc.write(engine)
    return cutover_fence.arm_fence(engine, NS, armed_by=holder, timeout_s=30).fence_id


def history(engine) -> tuple[str, str]:
    return table_checksum(engine, catalog.Event), table_checksum(engine, catalog.WorkItem)


def test_backs_out_before_any_checkpoint_and_a_rerun_is_a_no_op(engine):
    fence_id = fenced_tenant(engine)
    before = history(engine)
    seen = B.look(engine, NS, holder=ME, holder_state=FINISHED, stale_heartbeat=STALE)
    assert (seen.refusal, seen.fence["FenceId"], seen.holder_state, seen.checkpointed) == (
        None, fence_id, cutover_fence.HOLDER_FINISHED, [])
    assert BACK_OUT["look_before_back_out"].verdict(seen.as_json()).proceeds
    assert "old-writer Ä" in seen.as_markdown() and FAILED_RUN in seen.as_markdown()
    result = B.back_out(engine, NS, fence_id, holder=ME, holder_state=FINISHED, timeout_s=30)
    row = fence_of(engine, fence_id)
    assert (result.outcome, result.previous_holder, row["ArmedBy"], row["ReleasedBy"]) == (
        B.BACKED_OUT, FAILED_RUN, FAILED_RUN, ME)
    assert result.admission_pause_s is not None and result.admission_pause_s >= 0
    assert cutover_fence.cutover_fence_in_force(engine, NS) is None
    again = B.back_out(engine, NS, fence_id, holder=ME, holder_state=FINISHED, timeout_s=30)
    assert (again.outcome, fence_of(engine, fence_id)["ReleasedAt"]) == (B.ALREADY_BACKED_OUT, row["ReleasedAt"])
    assert B.look(engine, NS, holder=ME, stale_heartbeat=STALE).already["fence_id"] == fence_id
    with pytest.raises(cutover_fence.ReleasedByAnother):
        B.back_out(engine, NS, fence_id, holder="cli:someone-else", timeout_s=30)
    nothing = B.look(engine, NS, holder="cli:someone-else", stale_heartbeat=STALE)
    assert nothing.refusal.startswith(f"nothing to back out: namespace '{NS}' has no cutover fence in force")
    assert not BACK_OUT["look_before_back_out"].verdict(nothing.as_json()).proceeds
    assert history(engine) == before  # no Event or WorkItem touched


def test_refused_once_a_pack_is_checkpointed(engine):
    fence_id = fenced_tenant(engine, checkpointed=True)
    seen = B.look(engine, NS, holder=ME, holder_state=FINISHED, stale_heartbeat=STALE)
    assert seen.checkpointed == [PACK] and "already have their one-time checkpoint" in seen.refusal
    verdict = BACK_OUT["look_before_back_out"].verdict(seen.as_json())
    assert not verdict.proceeds and PACK in verdict.reason
    with pytest.raises(B.CheckpointWritten, match=PACK):
        B.back_out(engine, NS, fence_id, holder=ME, holder_state=FINISHED, timeout_s=30)
    assert fence_of(engine, fence_id)["ReleasedAt"] is None


def test_whose_fence_a_back_out_may_release(engine):
    """A run still at work: never, named or not. A holder nobody can read (a command, by hand): only when named."""
    fence_id = fenced_tenant(engine, holder="cli:eng@host:1")
    with pytest.raises(cutover_fence.FenceHeld, match="has not finished"):
        B.back_out(engine, NS, fence_id, holder=ME, holder_state=ACTIVE, adopt="cli:eng@host:1", timeout_s=30)
    with pytest.raises(cutover_fence.FenceHeld, match="cli:eng@host:1"):
        B.back_out(engine, NS, fence_id, holder=ME, timeout_s=30)
    assert fence_of(engine, fence_id)["ReleasedAt"] is None
    assert B.back_out(engine, NS, fence_id, holder=ME, adopt="cli:eng@host:1", timeout_s=30).outcome == B.BACKED_OUT


def test_only_the_fence_shown(engine):
    fence_id = fenced_tenant(engine)
    with pytest.raises(BadInput, match="does not exist"):
        B.back_out(engine, "other-ns", fence_id, holder=ME, holder_state=FINISHED, timeout_s=30)
    with pytest.raises(BadInput, match="does not exist"):
        B.back_out(engine, NS, fence_id + 1000, holder=ME, holder_state=FINISHED, timeout_s=30)


#: Conflicting commits between the back-out's check and its act. A checkpoint row inserted by a session that takes
#: no lock is new (nothing of ours can block it on MySQL): the re-check after the write must see it and roll back.
BACK_OUT_CONFLICTS = {
    "a checkpoint is written without the lock": lambda conn: conn.execute(insert(catalog.ConnectorProjectionProtocol).values(
        PackInstallId=PACK, ProtocolVersion=1, LegacyMaxOrdinal=0, WrittenAt=utcnow(), WrittenBy="by hand")),
    "the fence is released by hand": lambda conn: conn.execute(update(catalog.AdmissionFence).values(
        ReleasedAt=utcnow(), ReleasedBy="l2-by-hand")),
    "the fence is adopted by hand": lambda conn: conn.execute(update(catalog.AdmissionFence).values(ArmedBy="someone-else")),
}


@pytest.mark.parametrize("conflict", list(BACK_OUT_CONFLICTS))
def test_a_back_out_never_releases_after_a_conflicting_commit(engine, conflict):
    fence_id = fenced_tenant(engine)
    seam = Conflict(url_of(engine), BACK_OUT_CONFLICTS[conflict])
    try:
        result = B.back_out(engine, NS, fence_id, holder=ME, holder_state=FINISHED, timeout_s=30,
                            between_check_and_act=seam)
    except (B.CheckpointWritten, cutover_fence.FenceChanged) as refused:
        result = refused
    row = fence_of(engine, fence_id)
    assert seam.outcome == expected_outcome(engine, conflict)  # the fence rows are read FOR UPDATE: those wait
    if seam.outcome == COMMITTED:
        assert isinstance(result, B.CheckpointWritten), f"backed out after {conflict!r} committed between check and act"
        assert row["ReleasedAt"] is None
    else:
        assert (result.outcome, row["ReleasedBy"]) == (B.BACKED_OUT, ME), (conflict, result)


# -- the command line ------------------------------------------------------------------------------------------


def cli(url: str, *args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", "back-out", "-namespace", NS, *args],
                          env={**os.environ, "NEXUS_TENANT_DSN": url, "NEXUS_STATSD": "", **(env or {})},
                          capture_output=True, text=True, timeout=120)


def test_the_command_line_backs_out_the_fence_it_is_told_records_it_and_says_so(engine, tmp_path):
    url = url_of(engine)
    fence_id = fenced_tenant(engine, holder="cli:eng@host:1")
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    with SlackWebhookSink() as hook:
        env = {"NEXUS_LEDGER_DSN": ledger, "NEXUS_NOTIFY_WEBHOOK": f"http://127.0.0.1:{hook.port}/notices"}
        check = cli(url, "-check", env=env)
        assert check.returncode == 0, check.stderr
        assert f"cutover fence {fence_id} of tenant {NS}" in check.stdout and f"-fence-id {fence_id}" in check.stdout
        unnamed = cli(url, "-holder", "cli:unnamed", env=env)
        assert unnamed.returncode == 3 and f"-fence-id {fence_id}" in unnamed.stderr
        wrong = cli(url, "-holder", "cli:unnamed", "-fence-id", str(fence_id + 7), env=env)
        assert wrong.returncode == 3 and "is not the cutover fence in force" in wrong.stderr
        assert fence_of(engine, fence_id)["ReleasedAt"] is None
        done = cli(url, "-holder", "cli:backer", "-actor", "dana", "-fence-id", str(fence_id), env=env)
        assert done.returncode == 0, done.stderr
        assert "released without a cutover" in done.stdout and "restart the old writers" in done.stdout
        again = cli(url, "-holder", "cli:backer", "-fence-id", str(fence_id), env=env)
        assert again.returncode == 0 and "already backed out by you" in again.stdout, again.stderr
        subjects = hook.subjects()
    row = fence_of(engine, fence_id)
    assert (row["ArmedBy"], row["ReleasedBy"]) == ("cli:eng@host:1", "cli:backer")
    engine_l = L.ledger_engine(ledger)
    try:
        rows = L.history(engine_l, NS)
    finally:
        engine_l.dispose()
    # a run is its -holder: the unnamed attempt was asked, answered no and stopped (the wrong id's replay is one row)
    assert [(r["step"], r["kind"], r["outcome"]) for r in rows if r["run_id"] == "cli:unnamed"] == [
        ("confirm_back_out", L.EVIDENCE_SHOWN, "asked"), ("confirm_back_out", L.ANSWER, "rejected"),
        ("confirm_back_out", L.STOPPED, "stopped")]
    mine = [r for r in rows if r["run_id"] == "cli:backer"]
    assert [(r["step"], r["kind"], r["outcome"]) for r in mine] == [
        ("confirm_back_out", L.EVIDENCE_SHOWN, "asked"), ("confirm_back_out", L.ANSWER, "confirmed"),
        ("back_out", L.BACKED_OUT, B.BACKED_OUT)]  # the rerun's no-op is the same event: one row
    shown = mine[0]["detail"]["evidence"]
    assert [p["process_id"] for p in shown["processes"]] == ["old-writer Ä"] and shown["fence"]["FenceId"] == fence_id
    assert mine[1]["digest"] == mine[0]["digest"]  # the answer is on the evidence shown
    assert (mine[2]["actor"], mine[2]["detail"]["previous_holder"]) == ("dana", "cli:eng@host:1")
    assert subjects.count(f"[nexus] BACKED OUT: tenant {NS}, nexus-cutover.back_out") == 1, subjects


def test_the_command_line_needs_adopt_for_an_airflow_runs_fence_and_refuses_after_a_checkpoint(engine):
    url = url_of(engine)
    fence_id = fenced_tenant(engine, checkpointed=False)
    held = cli(url, "-holder", "cli:backer", "-fence-id", str(fence_id))
    assert held.returncode == 3 and "whose state this command cannot read" in held.stderr, held.stderr
    assert fence_of(engine, fence_id)["ReleasedAt"] is None
    with engine.begin() as conn:
        conn.execute(insert(catalog.ConnectorProjectionProtocol).values(
            PackInstallId=PACK, ProtocolVersion=1, LegacyMaxOrdinal=3, WrittenAt=utcnow(), WrittenBy=FAILED_RUN))
    late = cli(url, "-holder", "cli:backer", "-fence-id", str(fence_id), "-adopt", FAILED_RUN, "-json")
    assert late.returncode == 3 and "already have their one-time checkpoint" in late.stderr
    with engine.connect() as conn:
        assert conn.execute(select(catalog.AdmissionFence.c.ReleasedAt)).scalars().all() == [None]


def test_a_production_shaped_tenant_is_backed_out_and_a_checkpoint_of_an_uninstalled_pack_still_refuses(
        mysql_server_url):
    """nexus_sim's production-shaped tenant (ordinary work beside projection work, hostile lane and receipt ids, the
    full 10,000 stopped registry rows, an uninstalled incarnation of its first pack): the look shows a bounded
    evidence table, and one checkpoint row of the *uninstalled* pack is enough to refuse; without it the back-out
    releases the fence and touches no Event or WorkItem."""
    from nexus_cutover.db import make_engine
    from nexus_cutover.schema import apply_steps, projection_steps
    from nexus_sim.scenario.production import build_production_tenant
    from nexus_sim.scenario.production_model import UNINSTALLED_PACK
    from tests.support import mysql_database

    with mysql_database(mysql_server_url) as url:
        engine = make_engine(url)
        try:
            build_production_tenant(engine, namespace=NS, seed=7, active_packs=1, plain_lanes=2, generations=2,
                                    greenfield_pack=False)
            apply_steps(engine, projection_steps(engine))
            fence_id = cutover_fence.arm_fence(engine, NS, armed_by=FAILED_RUN, timeout_s=30).fence_id
            before = history(engine)
            seen = B.look(engine, NS, holder=ME, holder_state=FINISHED, stale_heartbeat=STALE)
            r = catalog.ProcessRegistry
            with engine.connect() as conn:
                stopped = conn.execute(select(func.count()).select_from(r).where(
                    r.c.Namespace == NS, r.c.StoppedAt.is_not(None), r.c.Role.in_(catalog.OLD_WRITER_ROLES),
                    r.c.ProjectionProtocol == catalog.PROTOCOL_OLD)).scalar()
            assert seen.refusal is None and stopped > 1000
            assert len(seen.evidence["processes"]) < 200  # the question's table stays bounded, every stop counted
            assert sum(seen.evidence["stopped_by_role"].values()) == stopped
            with engine.begin() as conn:
                conn.execute(insert(catalog.ConnectorProjectionProtocol).values(
                    PackInstallId=UNINSTALLED_PACK, ProtocolVersion=1, LegacyMaxOrdinal=0, WrittenAt=utcnow(),
                    WrittenBy="an earlier incarnation"))
            with pytest.raises(B.CheckpointWritten, match=UNINSTALLED_PACK):
                B.back_out(engine, NS, fence_id, holder=ME, holder_state=FINISHED, timeout_s=30)
            with engine.begin() as conn:  # the test's own row, removed: the back-out itself deletes nothing
                conn.execute(catalog.ConnectorProjectionProtocol.delete().where(
                    catalog.ConnectorProjectionProtocol.c.PackInstallId == UNINSTALLED_PACK))
            assert B.back_out(engine, NS, fence_id, holder=ME, holder_state=FINISHED, timeout_s=30).outcome == B.BACKED_OUT
            assert history(engine) == before
        finally:
            engine.dispose()

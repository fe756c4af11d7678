"""The code pin of a run (issue 37, item 4), at unit level: the check itself, and the fence's record, on MariaDB and SQLite.

A run's steps record the product version they ran on; a step whose process loaded another version stops before it
touches the tenant, naming both versions and the two ways on; going on with the new version is a new run, which
adopts the fence the stopped run left (the ordinary adoption of a finished run's fence), and the fence's ``Reason``
then records the new version. The real thing (two builds of the wheel, a run parked at the confirmation across an
upgrade) is tests/pinning/test_upgrade_under_a_run.py.
"""

from __future__ import annotations

import importlib.metadata

import pytest
from sqlalchemy import select

import nexus_cutover
from nexus_cutover import catalog, code_version
from nexus_cutover.holders import holder_of_airflow_run
from nexus_cutover.projection import cutover_fence
from nexus_cutover.tenant_status import read_tenant_state
from nexus_sim.scenario import TenantScenario
from tests.support import history_checksum

NS, PACK = "acme", "pk-1"
GO_ON = "trigger a new run for the tenant on it"
OLD, NEW = "1.4.0", "1.5.0"


def test_the_running_version_is_the_installed_distributions_read_at_import():
    assert code_version.RUNNING == nexus_cutover.__version__ == importlib.metadata.version(code_version.DISTRIBUTION)


def test_the_same_version_passes():
    code_version.check("wait_for_drain", [("resolve_packs", OLD), ("arm_fence", OLD)], go_on=GO_ON, running=OLD)
    code_version.check("resolve_packs", [], go_on=GO_ON, running=OLD)  # the first step: nothing recorded yet
    code_version.check("history_digest", [("resolve_packs", None)], go_on=GO_ON, running=NEW)  # a run from before pins


def test_another_version_stops_naming_both_and_the_two_ways_on():
    with pytest.raises(code_version.VersionChanged) as stopped:
        code_version.check("confirm_writers_stopped", [("resolve_packs", OLD), ("check_old_writers", OLD)],
                           where="this step's worker", go_on=GO_ON, running=NEW)
    exc, message = stopped.value, str(stopped.value)
    assert (exc.started, exc.running, exc.exit_code) == (OLD, NEW, 3)
    assert f"ran on nexus-cutover {OLD} (recorded by resolve_packs)" in message
    assert f"this step's worker runs nexus-cutover {NEW}" in message
    assert "nothing was read or written" in message
    assert f"finish this run on {OLD}: redeploy nexus-cutover {OLD}" in message and "clear confirm_writers_stopped" in message
    assert f"go on with {NEW}: leave this run failed and {GO_ON}" in message
    assert exc.report == {"version_changed": True, "started_on": OLD, "running": NEW, "recorded_by": "resolve_packs",
                          "step": "confirm_writers_stopped"}


def test_a_first_step_cleared_alone_does_not_re_pin_the_run():
    """The first step rerun on the new version records it; the step before the stopped one still says the old."""
    with pytest.raises(code_version.VersionChanged, match=f"recorded by check_old_writers.*runs nexus-cutover {NEW}"):
        code_version.check("confirm_writers_stopped", [("resolve_packs", NEW), ("check_old_writers", OLD)],
                           go_on=GO_ON, running=NEW)


def test_the_fence_reason_records_a_version_that_reads_back():
    reason = code_version.fence_reason(cutover_fence.FENCE_REASON, OLD)
    assert reason == f"connector projection range cutover (nexus-cutover {OLD})"
    assert code_version.version_in_reason(reason) == OLD
    assert code_version.version_in_reason(f"{reason}; adopted from x (its run finished)") == OLD
    assert code_version.version_in_reason("connector projection range cutover") is None
    assert code_version.version_in_reason(None) is None


def _fence(engine) -> dict:
    with engine.connect() as conn:
        (row,) = conn.execute(select(catalog.AdmissionFence)).all()
        return dict(row._mapping)


def _checkpoints(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(select(catalog.ConnectorProjectionProtocol)).all()


def test_a_stopped_run_is_taken_over_by_a_new_run_adopting_its_fence_with_the_new_version(engine):
    """Run A armed the fence on the old version (recorded in Reason); its next step on the new version stops, the
    tenant unchanged; run B, on the version this process runs, adopts A's fence once A is finished, and the fence
    records B's version; B's own steps then pass the check."""
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK).lane("a").generation(2)
    sc.write(engine)
    run_a = holder_of_airflow_run("connector_projection_cutover", "manual__a")
    run_b = holder_of_airflow_run("connector_projection_cutover", "manual__b")
    armed = cutover_fence.arm_fence(engine, NS, armed_by=run_a, timeout_s=30, packs=[PACK],
                                    reason=code_version.fence_reason(cutover_fence.FENCE_REASON, OLD))
    assert armed.outcome == "armed"
    assert code_version.version_in_reason(_fence(engine)["Reason"]) == OLD
    fence_state = read_tenant_state(engine, NS)["fence"]
    assert fence_state["holder_version"] == OLD and f"by {run_a} on nexus-cutover {OLD})" in fence_state["text"]

    before = (history_checksum(engine), _fence(engine))
    with pytest.raises(code_version.VersionChanged, match=f"{OLD}.*{code_version.RUNNING}"):
        code_version.check("confirm_writers_stopped", [("resolve_packs", OLD), ("check_old_writers", OLD)],
                           go_on=GO_ON)  # this process's version, RUNNING: not the one run A started on
    assert (history_checksum(engine), _fence(engine)) == before and _checkpoints(engine) == []

    # run A failed at that stop (a final state): a new run adopts its fence, as any failed run's is adopted
    states = {run_a: cutover_fence.HOLDER_FINISHED}
    taken = cutover_fence.arm_fence(engine, NS, armed_by=run_b, timeout_s=30, packs=[PACK], holder_state=states.get)
    assert (taken.outcome, taken.fence_id, taken.previous_holder) == ("adopted", armed.fence_id, run_a)
    fence = _fence(engine)
    assert fence["ArmedBy"] == run_b and fence["ReleasedAt"] is None
    assert code_version.version_in_reason(fence["Reason"]) == code_version.RUNNING
    assert f"adopted from {run_a} (its run finished)" in fence["Reason"]
    code_version.check("confirm_writers_stopped", [("resolve_packs", code_version.RUNNING)], go_on=GO_ON)


def test_a_fence_still_held_by_an_unfinished_run_on_the_old_version_is_not_adopted(engine):
    """No new bypass: a new version does not take a tenant from a run that has not finished."""
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK).lane("a").generation(2)
    sc.write(engine)
    run_a = holder_of_airflow_run("connector_projection_cutover", "manual__a")
    cutover_fence.arm_fence(engine, NS, armed_by=run_a, timeout_s=30, packs=[PACK],
                            reason=code_version.fence_reason(cutover_fence.FENCE_REASON, OLD))
    with pytest.raises(cutover_fence.FenceHeld):
        cutover_fence.arm_fence(engine, NS, armed_by=holder_of_airflow_run("connector_projection_cutover", "manual__b"),
                                timeout_s=30, packs=[PACK], holder_state=lambda _h: cutover_fence.HOLDER_ACTIVE)
    assert _fence(engine)["ArmedBy"] == run_a


def test_the_same_holder_on_another_version_does_not_reuse_its_fence(engine):
    """A run cleared from its first step on a new release (or a command given -holder after an upgrade) stops at
    arming, under the lock, writing nothing; a new holder then adopts the fence as any other takes one over."""
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK).lane("a").generation(2)
    sc.write(engine)
    run_a = holder_of_airflow_run("connector_projection_cutover", "manual__a")
    cutover_fence.arm_fence(engine, NS, armed_by=run_a, timeout_s=30, packs=[PACK],
                            reason=code_version.fence_reason(cutover_fence.FENCE_REASON, OLD))
    before = _fence(engine)
    again = cutover_fence.arm_fence(engine, NS, armed_by=run_a, timeout_s=30, packs=[PACK],
                                    reason=code_version.fence_reason(cutover_fence.FENCE_REASON, OLD))
    assert again.outcome == "reused"  # the same holder on the same version: reused as ever
    for dry_run in (True, False):
        with pytest.raises(code_version.VersionChanged) as stopped:
            cutover_fence.arm_fence(engine, NS, armed_by=run_a, timeout_s=30, packs=[PACK], dry_run=dry_run)
        message = str(stopped.value)
        assert f"this holder armed the fence on nexus-cutover {OLD}" in message
        assert f"this step runs nexus-cutover {code_version.RUNNING}" in message and "nothing was written" in message
        assert f"go on as a new holder: if {run_a} is finished" in message
        assert _fence(engine) == before
    unversioned = holder_of_airflow_run("connector_projection_cutover", "manual__hand")
    with engine.begin() as conn:  # a fence armed by hand (or before versions were recorded) records none
        conn.execute(catalog.AdmissionFence.update().values(ArmedBy=unversioned, Reason="by hand"))
    assert cutover_fence.arm_fence(engine, NS, armed_by=unversioned, timeout_s=30, packs=[PACK]).outcome == "reused"

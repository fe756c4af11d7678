"""The checkpoint's fence precondition (contract, "Audit") and one cutover per tenant (fence holders), both backends."""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pytest
from sqlalchemy import select

from nexus_cutover import catalog
from nexus_cutover.projection import cutover_fence
from nexus_cutover.projection.checkpoint import ALREADY_WRITTEN, REFUSED, WRITTEN, run_checkpoint
from nexus_sim.scenario import TenantScenario
from tests.support import history_checksum, table_checksum

FUTURE = dt.datetime(2999, 1, 1)
PAST = dt.datetime(2000, 1, 1)


def _tenant(engine, *, history: bool = True) -> TenantScenario:
    sc = TenantScenario(namespace="acme")
    pack = sc.pack("pk-1")
    if history:
        pack.lane("a").generation(3)
    return sc


def _checkpoint(engine):
    return run_checkpoint(engine, "pk-1", timeout_s=30, written_by="test")


def _protocol_rows(engine):
    with engine.connect() as conn:
        return conn.execute(select(catalog.ConnectorProjectionProtocol.c.PackInstallId)).all()


def _findings(result):
    return {f.finding: f for f in result.findings}


@pytest.mark.parametrize(
    ("arrange", "fence_namespace"),
    [
        pytest.param(lambda sc: None, "acme", id="no-fence"),
        pytest.param(lambda sc: sc.fence(released=True), "acme", id="released"),
        pytest.param(lambda sc: sc.fence(expires_at=FUTURE), "acme", id="expiring"),
        pytest.param(lambda sc: sc.fence(scope="pk-1"), "acme", id="narrow-scope"),
        pytest.param(lambda sc: sc.fence(), "globex", id="other-namespace"),
    ],
)
def test_history_without_a_cutover_fence_in_force_is_refused(engine, arrange, fence_namespace):
    sc = _tenant(engine)
    arrange(sc)
    for row in sc.fences:
        row["Namespace"] = fence_namespace
    sc.write(engine)
    before = history_checksum(engine), table_checksum(engine, catalog.AdmissionFence)
    result = _checkpoint(engine)
    assert result.outcome == REFUSED and result.legacy_max_ordinal is None
    assert list(_findings(result)) == ["fence_not_in_force"]
    assert _protocol_rows(engine) == []
    assert (history_checksum(engine), table_checksum(engine, catalog.AdmissionFence)) == before


def test_active_override_is_refused_listing_it(engine):
    sc = _tenant(engine)
    f = sc.fence()
    sc.fence_override(f, "pk-1/a")
    sc.write(engine)
    result = _checkpoint(engine)
    assert result.outcome == REFUSED
    finding = _findings(result)["fence_override_active"]
    assert finding.override_ids == [1] and finding.fence_ids == [f["FenceId"]]
    assert "fence_not_in_force" not in _findings(result)
    assert _protocol_rows(engine) == []


@pytest.mark.parametrize("override", ["revoked", "expired"], ids=["revoked", "expired"])
def test_revoked_or_expired_overrides_do_not_refuse(engine, override):
    sc = _tenant(engine)
    f = sc.fence()
    row = sc.fence_override(f, "pk-1/a", revoked=override == "revoked")
    if override == "expired":
        row["ExpiresAt"] = PAST
    sc.write(engine)
    result = _checkpoint(engine)
    assert (result.outcome, result.legacy_max_ordinal) == (WRITTEN, 3)


def test_greenfield_pack_needs_no_fence(engine):
    sc = _tenant(engine, history=False)
    sc.write(engine)
    result = _checkpoint(engine)
    assert (result.outcome, result.legacy_max_ordinal) == (WRITTEN, 0)


def test_existing_row_is_returned_unchanged_whatever_the_fence(engine):
    sc = _tenant(engine)
    sc.protocol_row("pk-1", 3)
    sc.write(engine)  # no fence at all
    result = _checkpoint(engine)
    assert (result.outcome, result.legacy_max_ordinal) == (ALREADY_WRITTEN, 3)


def test_a_fence_released_before_the_checkpoint_is_seen_under_the_locks(engine):
    sc = _tenant(engine)
    sc.write(engine)
    armed = cutover_fence.arm_fence(engine, "acme", armed_by="run-1", timeout_s=10)
    assert _checkpoint(engine).outcome == WRITTEN
    # a second pack, checkpointed after the fence was released, is refused
    sc2 = TenantScenario(namespace="acme", event_id_start=1000, work_id_start=1000)
    sc2.pack("pk-2").lane("b").generation(2)
    sc2.write(engine)
    cutover_fence.release_fence(engine, "acme", armed.fence_id, released_by="run-1", timeout_s=10)
    result = run_checkpoint(engine, "pk-2", timeout_s=30, written_by="test")
    assert result.outcome == REFUSED and list(_findings(result)) == ["fence_not_in_force"]


def test_cli_refusal_names_the_fence_finding_and_exits_3(tenant_url):
    from nexus_cutover.db import make_engine
    from tests.support import make_cutover_ready

    engine = make_engine(tenant_url)
    try:
        make_cutover_ready(engine)
        _tenant(engine).write(engine)
    finally:
        engine.dispose()
    proc = subprocess.run(
        [sys.executable, "-m", "nexus_cutover.cli.lifecycle_entrypoint", "-pack-install-id", "pk-1", "-timeout", "30s", "-json"],
        env={**os.environ, "CONNECTOR_CUTOVER_DSN": tenant_url}, capture_output=True, text=True, timeout=120,
    )
    assert proc.returncode == 3, proc.stderr
    out = json.loads(proc.stdout)
    assert out["outcome"] == "refused" and out["legacy_max_ordinal"] is None
    assert [f["finding"] for f in out["findings"]] == ["fence_not_in_force"]
    assert out["findings"][0]["override_ids"] == [] and "arm it" in out["findings"][0]["explanation"]


# -- one cutover per tenant: the fence's holder ----------------------------------


def _fence_rows(engine):
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(catalog.AdmissionFence))]


def test_a_fence_held_by_an_unfinished_holder_stops_another_and_writes_nothing(engine):
    first = cutover_fence.arm_fence(engine, "acme", armed_by="run-1", timeout_s=10)
    before = _fence_rows(engine)
    with pytest.raises(cutover_fence.FenceHeld) as err:
        cutover_fence.arm_fence(
            engine, "acme", armed_by="run-2", timeout_s=10,
            holder_state=lambda holder: cutover_fence.HOLDER_ACTIVE if holder == "run-1" else cutover_fence.HOLDER_FINISHED)
    assert err.value.holder == "run-1" and "'run-1'" in str(err.value) and "Nothing was written" in str(err.value)
    assert err.value.exit_code == 3
    assert _fence_rows(engine) == before
    assert cutover_fence.arm_fence(engine, "acme", armed_by="run-1", timeout_s=10).outcome == "reused"
    assert first.fence_id == before[0]["FenceId"]


def test_a_finished_holders_fence_is_adopted_and_then_only_the_adopter_releases_it(engine):
    first = cutover_fence.arm_fence(engine, "acme", armed_by="run-1", timeout_s=10)
    dry = cutover_fence.arm_fence(engine, "acme", armed_by="run-2", timeout_s=10, dry_run=True,
                                  holder_state=lambda h: cutover_fence.HOLDER_FINISHED)
    assert (dry.outcome, dry.previous_holder) == ("would_adopt", "run-1")
    adopted = cutover_fence.arm_fence(engine, "acme", armed_by="run-2", timeout_s=10, holder_state=lambda h: cutover_fence.HOLDER_FINISHED)
    assert (adopted.outcome, adopted.fence_id, adopted.previous_holder) == ("adopted", first.fence_id, "run-1")
    rows = _fence_rows(engine)
    assert len(rows) == 1 and rows[0]["ArmedBy"] == "run-2"
    with pytest.raises(cutover_fence.FenceHeld):
        cutover_fence.release_fence(engine, "acme", first.fence_id, released_by="run-1", timeout_s=10)
    assert _fence_rows(engine)[0]["ReleasedAt"] is None
    assert cutover_fence.release_fence(engine, "acme", first.fence_id, released_by="run-2", timeout_s=10).outcome == "released"
    assert _fence_rows(engine)[0]["ReleasedBy"] == "run-2"

"""The cutover admission fence: arm / reuse / refuse on overrides / release, on MariaDB and SQLite."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import func, select

from nexus_cutover import catalog
from nexus_cutover.admission_fences import fence_in_force
from nexus_cutover.db import make_engine
from nexus_cutover.errors import BadInput
from nexus_cutover.projection import cutover_fence
from nexus_sim.scenario import TenantScenario
from tests.support import make_cutover_ready, table_checksum


def _fences(engine):
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(catalog.AdmissionFence).order_by("FenceId"))]


def test_arm_then_rerun_reuses_the_same_fence(engine):
    first = cutover_fence.arm_fence(engine, "acme", armed_by="test", timeout_s=10)
    again = cutover_fence.arm_fence(engine, "acme", armed_by="test", timeout_s=10)
    assert first.outcome == "armed" and again.outcome == "reused"
    assert again.fence_id == first.fence_id
    rows = _fences(engine)
    assert len(rows) == 1
    assert rows[0]["Scope"] == "*" and rows[0]["ExpiresAt"] is None and rows[0]["ReleasedAt"] is None
    assert cutover_fence.cutover_fence_in_force(engine, "acme")["FenceId"] == first.fence_id


def test_dry_run_writes_nothing(engine):
    locks = table_checksum(engine, catalog.Lock)
    assert cutover_fence.arm_fence(engine, "acme", armed_by="t", timeout_s=10, dry_run=True).outcome == "would_arm"
    assert _fences(engine) == []
    assert table_checksum(engine, catalog.Lock) == locks  # not even a lock row


def test_expiring_or_scoped_fences_are_not_reused(engine):
    sc = TenantScenario(namespace="acme")
    sc.fence(expires_at=dt.datetime(2999, 1, 1))
    sc.fence(scope="lane-a")
    sc.fence(released=True)
    sc.write(engine)
    result = cutover_fence.arm_fence(engine, "acme", armed_by="t", timeout_s=10)
    assert result.outcome == "armed" and result.fence_id not in (1, 2, 3)
    assert sorted(f["FenceId"] for f in result.other_fences_in_force) == [1, 2]


def test_active_overrides_refuse_and_are_listed_not_revoked(engine):
    sc = TenantScenario(namespace="acme")
    f = sc.fence()
    sc.fence_override(f, "lane-vip")
    sc.fence_override(f, "lane-old", revoked=True)
    sc.write(engine)
    before = table_checksum(engine, catalog.AdmissionFenceOverride), _fences(engine)
    with pytest.raises(cutover_fence.ActiveOverrides) as err:
        cutover_fence.arm_fence(engine, "acme", armed_by="t", timeout_s=10)
    assert err.value.exit_code == 3
    assert [o["Scope"] for o in err.value.overrides] == ["lane-vip"]
    assert "lane-vip" in str(err.value) and "revokes nothing" in str(err.value)
    assert (table_checksum(engine, catalog.AdmissionFenceOverride), _fences(engine)) == before


def test_release_is_idempotent(engine):
    armed = cutover_fence.arm_fence(engine, "acme", armed_by="t", timeout_s=10)
    assert cutover_fence.release_fence(engine, "acme", armed.fence_id, released_by="t", timeout_s=10, dry_run=True).outcome == (
        "would_release"
    )
    assert _fences(engine)[0]["ReleasedAt"] is None
    assert cutover_fence.release_fence(engine, "acme", armed.fence_id, released_by="t", timeout_s=10).outcome == "released"
    released_at = _fences(engine)[0]["ReleasedAt"]
    assert released_at is not None
    again = cutover_fence.release_fence(engine, "acme", armed.fence_id, released_by="t", timeout_s=10)
    assert again.outcome == "already_released"
    with pytest.raises(cutover_fence.ReleasedByAnother, match="already released by 't'.*not by 't2'") as other:
        cutover_fence.release_fence(engine, "acme", armed.fence_id, released_by="t2", timeout_s=10)  # not a success
    assert other.value.exit_code == 3
    assert _fences(engine)[0]["ReleasedAt"] == released_at and _fences(engine)[0]["ReleasedBy"] == "t"
    assert cutover_fence.cutover_fence_in_force(engine, "acme") is None
    # a new arm after release is a new fence
    assert cutover_fence.arm_fence(engine, "acme", armed_by="t", timeout_s=10).fence_id != armed.fence_id


def test_release_refuses_foreign_or_non_cutover_fences(engine):
    sc = TenantScenario(namespace="other")
    sc.fence()
    sc.fence(scope="lane-a")
    sc.write(engine)
    with pytest.raises(BadInput, match="does not exist in namespace"):
        cutover_fence.release_fence(engine, "acme", 1, released_by="t", timeout_s=10)
    with pytest.raises(BadInput, match="not a non-expiring"):
        cutover_fence.release_fence(engine, "other", 2, released_by="t", timeout_s=10)


def test_concurrent_arms_converge_on_one_fence(engine):
    from concurrent.futures import ThreadPoolExecutor

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(lambda _: cutover_fence.arm_fence(engine, "acme", armed_by="t", timeout_s=30), range(4)))
    assert len({r.fence_id for r in results}) == 1
    with engine.connect() as conn:
        assert conn.execute(select(func.count()).select_from(catalog.AdmissionFence)).scalar_one() == 1


def test_rerun_after_a_completed_cutover_does_not_fence_again(engine):
    sc = TenantScenario(namespace="acme")
    sc.pack("pk-a")
    sc.pack("pk-b")
    sc.protocol_row("pk-a", 5)
    sc.write(engine)
    armed = cutover_fence.arm_fence(engine, "acme", armed_by="t", timeout_s=10, packs=["pk-a", "pk-b"])
    assert armed.outcome == "armed"  # pk-b has no checkpoint yet
    cutover_fence.release_fence(engine, "acme", armed.fence_id, released_by="t", timeout_s=10)
    assert cutover_fence.arm_fence(engine, "acme", armed_by="t", timeout_s=10, packs=["pk-a", "pk-b"]).outcome == "armed"
    second = cutover_fence.cutover_fence_in_force(engine, "acme")["FenceId"]
    with engine.begin() as conn:
        conn.execute(catalog.ConnectorProjectionProtocol.insert().values(
            PackInstallId="pk-b", ProtocolVersion=1, LegacyMaxOrdinal=0, WrittenAt=dt.datetime(2026, 1, 1), WrittenBy="t"))
    # a fence in force is still reused, even when every pack is checkpointed
    assert cutover_fence.arm_fence(engine, "acme", armed_by="t", timeout_s=10, packs=["pk-a", "pk-b"]).fence_id == second
    cutover_fence.release_fence(engine, "acme", second, released_by="t", timeout_s=10)
    again = cutover_fence.arm_fence(engine, "acme", armed_by="t", timeout_s=10, packs=["pk-a", "pk-b"])
    assert (again.outcome, again.fence_id) == ("not_needed", second)
    assert len(_fences(engine)) == 2


def test_fence_queries_use_the_namespace_index(mysql_url):
    from sqlalchemy import text

    eng = make_engine(mysql_url)
    try:
        make_cutover_ready(eng)
        rows = []
        for ns in range(60):
            for released in (dt.datetime(2026, 1, 1), None):
                rows.append({"Namespace": f"ns-{ns}", "Scope": "*", "Reason": "r", "ArmedBy": "t",
                             "ArmedAt": dt.datetime(2026, 1, 1), "ReleasedAt": released})
        with eng.begin() as conn:
            conn.execute(catalog.AdmissionFence.insert(), rows)
        now = dt.datetime(2026, 6, 1)
        stmt = select(catalog.AdmissionFence).where(catalog.AdmissionFence.c.Namespace == "ns-3", fence_in_force(now))
        with eng.connect() as conn:
            conn.execute(text("ANALYZE TABLE `_System_AdmissionFence`"))
            plan = conn.execute(text(f"EXPLAIN {stmt.compile(eng, compile_kwargs={'literal_binds': True})}")).mappings().all()
        assert plan[0]["key"] == "ix_AdmissionFence_Namespace", plan
    finally:
        eng.dispose()

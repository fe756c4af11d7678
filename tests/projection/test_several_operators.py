"""Several operators on one tenant (contract, "One cutover per tenant at a time"), on MariaDB and SQLite.

Holders are unique (two command-line invocations never share one); a fence is adopted only from a provably
finished holder or one the person names (``-adopt HOLDER``, recorded); a fence armed by hand or by a CLI
invocation is never adopted silently; two cutover fences in force are a refusal naming both, for every step;
releasing a fence another holder released is not a success; a held tenant is refused before any write.
"""

from __future__ import annotations

import datetime as dt
import os
import re
import subprocess
import sys

import pytest
from sqlalchemy import inspect, select

from nexus_cutover import catalog
from nexus_cutover.cli.common import default_holder
from nexus_cutover.projection import audit, cutover_fence, steps
from nexus_cutover.projection.checkpoint import REFUSED, run_checkpoint
from nexus_cutover.schema import create_legacy_schema
from nexus_cutover.tenant_status import read_tenant_state
from nexus_sim.scenario import TenantScenario
from tests.support import history_checksum, make_cutover_ready, table_checksum

NS, PACK = "acme", "pk-1"


def cli(dsn: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEXUS_TENANT_DSN": dsn}
    return subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def fences(engine) -> list[dict]:
    with engine.connect() as conn:
        return [dict(r._mapping) for r in conn.execute(select(catalog.AdmissionFence).order_by("FenceId"))]


def drained(engine) -> TenantScenario:
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK).lane("a").generation(2)
    sc.write(engine)
    return sc


def test_default_holders_are_unique_and_say_who_where_and_when():
    one, two = default_holder(), default_holder()
    assert one != two and len(one) <= 128
    assert re.fullmatch(r"cli:[^@]+@[^:]+:pid\d+:\d{8}T\d{6}\.\d{6}Z\.[0-9a-f]{4}", one), one
    long_program = default_holder("x" * 200)
    assert len(long_program) == 128 and re.search(r":pid\d+:\d{8}T", long_program)  # the unique tail is kept


def test_two_cli_invocations_with_the_default_holder_do_not_share_the_fence(engine, tenant_url):
    drained(engine)
    first = cli(tenant_url, "arm-fence", "-namespace", NS, "-json")
    assert first.returncode == 0, first.stderr
    holder = fences(engine)[0]["ArmedBy"]
    assert holder.startswith("cli:") and f"-holder '{holder}'" in cli(tenant_url, "arm-fence", "-namespace", NS,
                                                                       "-holder", holder).stdout
    second = cli(tenant_url, "arm-fence", "-namespace", NS, "-json")
    assert second.returncode == 3, second.stderr
    assert f"held by '{holder}'" in second.stderr and "not adopted silently" in second.stderr
    assert f"-adopt '{holder}'" in second.stderr  # how to take over, once the person knows it is finished
    assert "overrides" not in second.stderr
    assert [f["ArmedBy"] for f in fences(engine)] == [holder]


def test_a_named_holder_is_adopted_and_the_adoption_is_recorded(engine, tenant_url):
    drained(engine)
    first = cutover_fence.arm_fence(engine, NS, armed_by="cli:alice@box:pid1:20261201T000000.000000Z.abcd", timeout_s=10)
    taken = cli(tenant_url, "arm-fence", "-namespace", NS, "-holder", "cli:bob@box:pid2:x", "-adopt",
                "cli:alice@box:pid1:20261201T000000.000000Z.abcd", "-json")
    assert taken.returncode == 0, taken.stderr
    (row,) = fences(engine)
    assert (row["FenceId"], row["ArmedBy"]) == (first.fence_id, "cli:bob@box:pid2:x")
    assert "adopted from cli:alice@box:pid1:20261201T000000.000000Z.abcd (named by cli:bob@box:pid2:x)" in row["Reason"]
    assert row["ReleasedAt"] is None


def test_a_dag_run_never_adopts_a_cli_or_hand_armed_fence_silently(engine):
    """The DAG's holder states: a CLI holder is unknown (nothing here can read it): refused unless named."""
    drained(engine)
    cli_holder = "cli:alice@box:pid7:20261201T000000.000000Z.0001"
    cutover_fence.arm_fence(engine, NS, armed_by=cli_holder, timeout_s=10)
    before = fences(engine)
    run = "airflow:connector_projection_cutover:manual__2"
    with pytest.raises(cutover_fence.FenceHeld) as held:
        cutover_fence.arm_fence(engine, NS, armed_by=run, timeout_s=10, holder_state=lambda h: cutover_fence.HOLDER_UNKNOWN)
    assert held.value.state == cutover_fence.HOLDER_UNKNOWN and "not adopted silently" in str(held.value)
    with pytest.raises(cutover_fence.FenceHeld):  # the read-only check the DAG's first task makes
        steps.held_by_another(engine, NS, holder=run, holder_state=lambda h: cutover_fence.HOLDER_UNKNOWN)
    assert fences(engine) == before
    with pytest.raises(cutover_fence.FenceHeld, match="has not finished"):  # a running Airflow holder: not even when named
        cutover_fence.arm_fence(engine, NS, armed_by=run, timeout_s=10, adopt=cli_holder,
                                holder_state=lambda h: cutover_fence.HOLDER_ACTIVE)
    adopted = cutover_fence.arm_fence(engine, NS, armed_by=run, timeout_s=10, adopt=cli_holder,
                                      holder_state=lambda h: cutover_fence.HOLDER_UNKNOWN)
    assert (adopted.outcome, adopted.previous_holder) == ("adopted", cli_holder)


def cutover_fence_row(fence_id: int, armed_by: str) -> dict:
    return {"FenceId": fence_id, "Namespace": NS, "Scope": "*", "Reason": "by hand", "ArmedBy": armed_by,
            "ArmedAt": dt.datetime(2026, 1, 1), "ExpiresAt": None, "ReleasedAt": None, "ReleasedBy": None}


def test_two_cutover_fences_in_force_are_a_refusal_naming_both_for_every_step(engine, tenant_url):
    drained(engine)
    with engine.begin() as conn:
        conn.execute(catalog.AdmissionFence.insert(), [cutover_fence_row(1, "run-a"), cutover_fence_row(2, "run-b ")])
    before = table_checksum(engine, catalog.AdmissionFence), history_checksum(engine)
    for call in (
        lambda: cutover_fence.arm_fence(engine, NS, armed_by="run-a", timeout_s=10),
        lambda: cutover_fence.release_fence(engine, NS, 1, released_by="run-a", timeout_s=10),
        lambda: steps.held_by_another(engine, NS, holder="run-a"),
        lambda: cutover_fence.cutover_fence_in_force(engine, NS),
    ):
        with pytest.raises(cutover_fence.SeveralCutoverFences) as several:
            call()
        assert "FenceId=1 ArmedBy='run-a'" in str(several.value) and "FenceId=2 ArmedBy='run-b '" in str(several.value)
        assert several.value.exit_code == 3
    result = run_checkpoint(engine, PACK, timeout_s=30, written_by="run-a")
    assert result.outcome == REFUSED
    assert [(f.finding, f.fence_ids) for f in result.findings] == [(audit.SEVERAL_CUTOVER_FENCES, [1, 2])]
    assert (table_checksum(engine, catalog.AdmissionFence), history_checksum(engine)) == before
    with engine.connect() as conn:
        assert conn.execute(select(catalog.ConnectorProjectionProtocol)).all() == []
    state = read_tenant_state(engine, NS)
    assert state["fence"]["cutover_fences"] == 2 and state["fence"]["text"].startswith("STOP: 2 cutover fences")
    proc = cli(tenant_url, "run", "-namespace", NS, "--confirm-writers-stopped")
    assert proc.returncode == 3 and "2 cutover fences in force" in proc.stderr


def test_the_cli_run_refuses_a_held_tenant_before_the_schema_step_writes_anything(tenant_url):
    from nexus_cutover.db import make_engine

    engine = make_engine(tenant_url)
    try:
        create_legacy_schema(engine)  # before cutover step 1: apply_schema would add InputStartOrdinal
        drained(engine)
        with engine.begin() as conn:
            conn.execute(catalog.AdmissionFence.insert(), [cutover_fence_row(1, "airflow:connector_projection_cutover:r1")])
        before = table_checksum(engine, catalog.AdmissionFence)
        proc = cli(tenant_url, "run", "-namespace", NS, "--confirm-writers-stopped")
        assert proc.returncode == 3, proc.stderr
        assert "held by 'airflow:connector_projection_cutover:r1'" in proc.stderr
        assert "-adopt 'airflow:connector_projection_cutover:r1'" in proc.stderr and "overrides" not in proc.stderr
        columns = {c["name"] for c in inspect(engine).get_columns(catalog.WorkItem.name)}
        assert "InputStartOrdinal" not in columns  # apply_schema never ran
        assert table_checksum(engine, catalog.AdmissionFence) == before
    finally:
        engine.dispose()


def test_releasing_a_fence_released_by_another_holder_is_not_a_success_on_the_cli(engine, tenant_url):
    drained(engine)
    armed = cutover_fence.arm_fence(engine, NS, armed_by="eng-1", timeout_s=10)
    with engine.begin() as conn:
        conn.execute(catalog.AdmissionFence.update().values(ReleasedAt=dt.datetime(2026, 1, 2), ReleasedBy="l2-by-hand"))
    proc = cli(tenant_url, "release-fence", "-namespace", NS, "-fence-id", str(armed.fence_id), "-holder", "eng-1")
    assert proc.returncode == 3 and "already released by 'l2-by-hand'" in proc.stderr and "not by 'eng-1'" in proc.stderr


def test_releasing_a_fence_another_holder_holds_says_how_to_take_it_over(engine):
    make_cutover_ready(engine)
    drained(engine)
    armed = cutover_fence.arm_fence(engine, NS, armed_by="eng-1", timeout_s=10)
    with pytest.raises(cutover_fence.FenceHeld) as held:
        cutover_fence.release_fence(engine, NS, armed.fence_id, released_by="eng-2", timeout_s=10)
    assert "-holder 'eng-1'" in str(held.value) and "-adopt 'eng-1'" in str(held.value)
    assert fences(engine)[0]["ReleasedAt"] is None

"""The grants listed in docs/runbook.md are enough, and no more than that, to run the whole pipeline.

A MariaDB user is created from the runbook's ```sql grants``` block itself (so the
document cannot drift from what is tested). As that user, every cutover step
runs through the same domain functions the DAG operators call -- and step 4 also
through the ``connector-projection-cutover`` CLI -- then the three Field History
gates. The same user is refused an UPDATE/DELETE of ``_System_Event`` /
``_System_WorkItem``: the pipeline never needs them.
"""

from __future__ import annotations

import json
import os
import pathlib
import random
import re
import subprocess
import sys
import uuid

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url
from sqlalchemy.exc import DBAPIError

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.errors import CutoverError
from nexus_cutover.field_history import gates
from nexus_cutover.projection.checkpoint import run_checkpoint
from nexus_cutover.projection.cutover_fence import arm_fence, release_fence
from nexus_cutover.projection.drain import drain_report
from nexus_cutover.projection.writers import old_writer_evidence, readiness
from nexus_cutover.schema import apply_steps, create_legacy_schema, projection_steps, require_v2_prerequisite
from nexus_sim.scenario import TenantScenario, drained_pack_history

REPO = pathlib.Path(__file__).resolve().parents[2]
RUNBOOK = REPO / "docs" / "runbook.md"
STAGE1_RELEASE, PRODUCER_RELEASE = "4.12.0", "4.13.0"


def runbook_grants(database: str, user: str) -> list[str]:
    block = re.search(r"```sql grants\n(.*?)```", RUNBOOK.read_text(), re.S)
    assert block, "docs/runbook.md has no ```sql grants block"
    body = "\n".join(line for line in block.group(1).splitlines() if not line.strip().startswith("--"))
    statements = [s.strip() for s in body.split(";") if s.strip()]
    assert statements and all(s.upper().startswith("GRANT ") for s in statements)
    return [s.replace("`tenant_db`", f"`{database}`").replace("'cutover'@'%'", f"'{user}'@'%'") for s in statements]


def _seed(engine) -> None:
    create_legacy_schema(engine)
    sc = TenantScenario(namespace="acme")
    rng = random.Random(11)
    for pack, zero in (("pk-one", 1), ("pk-two", 0)):
        drained_pack_history(sc.pack(pack), rng, lanes=3, generations=4, legacy_zero_lanes=zero)
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="old-worker", stopped=True)
    sc.process(catalog.ROLE_INTEGRATION_HOST, protocol=catalog.PROTOCOL_RANGES, version="5.0.0", process_id="host-1",
               activated=True)
    for role in (catalog.ROLE_RUNTIME_API, catalog.ROLE_SERVICE_MANAGER, catalog.ROLE_AUDIT_OUTBOX_WORKER):
        sc.process(role, version=PRODUCER_RELEASE, process_id=f"{role}-new")
    sc.field(1, track_history=True, intervals=[(0, 50)], last_sequence=100)
    sc.field(2, track_history=False)
    for seq in range(1, 100, 7):
        sc.audit_change(1, history_sequence=seq)
        sc.audit_change(2, history_sequence=seq)
    sc.outbox_row(producer_version="4.11.0", status="delivered")
    sc.write(engine)


@pytest.fixture
def limited(mysql_url):
    """(root engine, limited-user URL): the tenant seeded as root, a user holding only the runbook's grants."""
    root = make_engine(mysql_url)
    _seed(root)
    u = make_url(mysql_url)
    user, password = f"nxg_{uuid.uuid4().hex[:8]}", f"pw-{uuid.uuid4().hex}"
    with root.begin() as conn:
        conn.execute(text(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{password}'"))
        for grant in runbook_grants(u.database, user):
            conn.execute(text(grant))
    url = u.set(username=user, password=password).render_as_string(hide_password=False)
    yield root, url
    with root.begin() as conn:
        conn.execute(text(f"DROP USER IF EXISTS '{user}'@'%'"))
    root.dispose()


def test_runbook_grants_run_every_step(limited):
    root, url = limited
    engine = make_engine(url)
    try:
        # step 1: additive schema and the fence
        require_v2_prerequisite(engine)
        created = apply_steps(engine, projection_steps(engine))
        assert len(created) == 2
        fence = arm_fence(engine, "acme", armed_by="grants-test", timeout_s=30)
        assert fence.outcome == "armed"
        # step 2 and 3: drain and writer evidence (read only)
        assert drain_report(engine, "acme", deadline=_in(60), stale_heartbeat=_s(60)).state == "drained"
        assert old_writer_evidence(engine, "acme", stale_heartbeat=_s(60)).all_stopped_or_silent
        # step 4: audit + checkpoint under the locks, per pack
        for pack in ("pk-one", "pk-two"):
            result = run_checkpoint(engine, pack, timeout_s=30, written_by="grants-test")
            assert result.outcome == "written", result.as_json()
        # ... and the lifecycle entrypoint CLI, as the same user
        cli = subprocess.run(
            [sys.executable, "-m", "nexus_cutover.cli.lifecycle_entrypoint", "-pack-install-id", "pk-one", "-timeout", "30s", "-json"],
            env={**os.environ, "CONNECTOR_CUTOVER_DSN": url}, capture_output=True, text=True, timeout=120)
        assert cli.returncode == 0, cli.stderr
        assert json.loads(cli.stdout)["outcome"] == "already_written"
        # step 5: readiness (read) and the fence release
        assert readiness(engine, "acme", stale_heartbeat=_s(10**9)).ready
        assert release_fence(engine, "acme", fence.fence_id, released_by="grants-test", timeout_s=30).outcome == "released"

        # Field History, stages 1-3
        assert gates.stage_1(engine, stage1_release=STAGE1_RELEASE).passed
        assert gates.stage_2_producers(engine, producer_release=PRODUCER_RELEASE).passed
        assert gates.stage_2_materialize(engine).passed
        s3 = gates.stage_3(engine, producer_release=PRODUCER_RELEASE, updated_by="grants-test")
        assert s3.passed, s3.render()

        # what the grants do not allow: the pipeline never needs it
        for stmt in ("UPDATE `_System_WorkItem` SET `Status` = `Status`", "DELETE FROM `_System_Event`",
                     "UPDATE `_System_Event` SET `Status` = `Status`", "DELETE FROM `_System_ConnectorProjectionProtocol`"):
            with pytest.raises((DBAPIError, CutoverError)) as denied, engine.begin() as conn:
                conn.execute(text(stmt))
            assert "denied" in str(denied.value).lower(), stmt
    finally:
        engine.dispose()
    with root.connect() as conn:
        cutoffs = conn.execute(text("SELECT COUNT(*) FROM `_System_ConnectorProjectionProtocol`")).scalar_one()
        settings = dict(conn.execute(text("SELECT `Name`, `Value` FROM `_System_RuntimeSetting`")).all())
    assert cutoffs == 2
    assert settings[catalog.SETTING_READ_MODE] == catalog.READ_MODE_BOOLEAN_ONLY


def _s(seconds: float):
    import datetime as dt

    return dt.timedelta(seconds=seconds)


def _in(seconds: float):
    import datetime as dt

    return dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(seconds=seconds)

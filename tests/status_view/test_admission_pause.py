"""The admission pause (issue 27): ReleasedAt - ArmedAt of the fence row, in the release's result and the tenant view.

Real tenant databases on both backends, opened by the status view's own reader through a real
``nexus_tenant_*`` connection; the fence armed and released by the domain's own steps. Also the pure parts of
the ``nexus.*`` metrics (names safe for hostile tenant ids, the rollout's progress and ETA, the pause summary).
"""

from __future__ import annotations

import datetime as dt
import random
import time

from hypothesis import given
from sqlalchemy import select, update

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.projection.cutover_fence import admission_pause_s, arm_fence, release_fence
from nexus_sim.scenario import TenantScenario, drained_pack_history
from tests.dags.airflow_harness import connection_json
from tests.hostile import hostile_text
from tests.support import make_cutover_ready

NS = "pausetenant"


def _tenant(url: str) -> None:
    engine = make_engine(url)
    try:
        make_cutover_ready(engine)
        sc = TenantScenario(namespace=NS)
        drained_pack_history(sc.pack("pk-p"), random.Random(7), lanes=2, generations=2)
        sc.write(engine)
    finally:
        engine.dispose()


def _row(engine, fence_id: int):
    f = catalog.AdmissionFence
    with engine.connect() as conn:
        return conn.execute(select(f.c.ArmedAt, f.c.ReleasedAt).where(f.c.FenceId == fence_id)).one()


def test_the_pause_is_the_fence_rows_own_interval_in_the_release_and_the_tenant_view(tenant_url, monkeypatch):
    from nexus_status.tenants import read_tenant

    _tenant(tenant_url)
    conn_id = "nexus_tenant_" + NS
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection_json(tenant_url))
    engine = make_engine(tenant_url)
    try:
        armed = arm_fence(engine, NS, armed_by="pause-test", timeout_s=30)
        assert armed.admission_pause_s is None and armed.as_json()["admission_pause_s"] is None
        while_armed = read_tenant(conn_id)["fence"]
        assert while_armed["armed"] and while_armed["admission_pause_s"] is None
        time.sleep(0.3)
        released = release_fence(engine, NS, armed.fence_id, released_by="pause-test", timeout_s=30)
        row = _row(engine, armed.fence_id)
        expected = (row.ReleasedAt - row.ArmedAt).total_seconds()
        assert expected >= 0.3
        assert released.outcome == "released" and abs(released.admission_pause_s - expected) < 1e-6
        assert released.as_json()["admission_pause_s"] == released.admission_pause_s
        assert released.as_json()["released_at"] == row.ReleasedAt.isoformat()

        again = release_fence(engine, NS, armed.fence_id, released_by="pause-test", timeout_s=30)
        assert again.outcome == "already_released" and again.admission_pause_s == released.admission_pause_s

        state = read_tenant(conn_id)
        assert state["fence"]["admission_pause_s"] == released.admission_pause_s
        assert f"last admission pause {expected:.1f} s (fence {armed.fence_id})" in state["fence"]["text"]

        # the pause follows the row, not the ids: a fence whose ArmedAt is moved an hour back shows an hour more
        with engine.begin() as conn:
            conn.execute(update(catalog.AdmissionFence).where(catalog.AdmissionFence.c.FenceId == armed.fence_id)
                         .values(ArmedAt=row.ArmedAt - dt.timedelta(hours=1)))
        moved = read_tenant(conn_id)["fence"]["admission_pause_s"]
        moved_row = _row(engine, armed.fence_id)
        assert moved == admission_pause_s({"ArmedAt": moved_row.ArmedAt, "ReleasedAt": moved_row.ReleasedAt})
        assert moved > 3600
    finally:
        engine.dispose()


@given(hostile_text(max_size=40))
def test_metric_names_stay_one_segment_per_tag_for_any_tenant(tenant):
    from nexus_airflow.metrics import STEP_FAILED, name_safe, named

    segment = name_safe(tenant)
    assert segment and "." not in segment and len(segment) <= 100
    assert all(c.isascii() and (c.isalnum() or c in "_-") for c in segment)
    name = named(STEP_FAILED, {"tenant": tenant, "step": "task_group.step", "reason": "refused"})  # a per-tenant metric
    assert name.split(".")[:3] == ["nexus", "step", "failed"] and len(name.split(".")) == 3 + 3


def test_rollout_progress_and_eta_at_the_measured_pace():
    from nexus_airflow.metrics import rollout_progress

    assert rollout_progress(10, 3, 1, 400.0) == {"done": 3, "failed": 1, "waiting": 6, "eta_s": 600.0}
    assert rollout_progress(10, 0, 0, 400.0)["eta_s"] is None  # nothing ended: no pace yet
    assert rollout_progress(10, 3, 1, None)["eta_s"] is None
    assert rollout_progress(4, 3, 1, 400.0) == {"done": 3, "failed": 1, "waiting": 0, "eta_s": 0.0}


def test_pause_summary_median_p95_max():
    from nexus_airflow.metrics import pause_summary

    assert pause_summary([]) is None
    values = [float(v) for v in range(1, 101)]
    random.Random(1).shuffle(values)
    assert pause_summary(values) == {"tenants": 100, "median_s": 50.5, "p95_s": 95.0, "max_s": 100.0}
    assert pause_summary([2.0]) == {"tenants": 1, "median_s": 2.0, "p95_s": 2.0, "max_s": 2.0}

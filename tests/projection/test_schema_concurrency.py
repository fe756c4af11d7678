"""apply_schema tolerates a concurrent identical DDL, as stage 1 does (both backends)."""

from __future__ import annotations

import concurrent.futures

from nexus_cutover.db import make_engine
from nexus_cutover.schema import apply_steps, create_legacy_schema, field_history_steps, projection_steps


def test_steps_planned_before_another_run_added_the_objects_converge(legacy_engine):
    stale = projection_steps(legacy_engine) + field_history_steps(legacy_engine)
    assert not any(step.present for step in stale)
    assert len(apply_steps(legacy_engine, projection_steps(legacy_engine) + field_history_steps(legacy_engine))) == 3
    assert apply_steps(legacy_engine, stale) == []  # every object exists: nothing to create, no error
    assert all(step.present for step in projection_steps(legacy_engine) + field_history_steps(legacy_engine))


def test_concurrent_runs_create_each_object_once(tenant_url):
    engines = [make_engine(tenant_url) for _ in range(4)]
    try:
        create_legacy_schema(engines[0])
        plans = [projection_steps(e) for e in engines]  # all planned before any DDL ran
        with concurrent.futures.ThreadPoolExecutor(4) as pool:
            created = list(pool.map(apply_steps, engines, plans))
        labels = sorted(label for batch in created for label in batch)
        assert labels == sorted(step.label for step in plans[0])  # each created by exactly one run
        assert all(step.present for step in projection_steps(engines[0]))
    finally:
        for e in engines:
            e.dispose()

"""One liveness rule (contract, "Drain"): the SQL clause, the Python state and every user agree, boundary included."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import select

from nexus_cutover import catalog, liveness
from nexus_cutover.field_history import inventory
from nexus_cutover.projection import drain, writers
from nexus_sim.scenario import TenantScenario
from tests.support import make_cutover_ready, prepared_engine

NOW = dt.datetime(2026, 3, 1, 12, 0, 0)
WINDOW = dt.timedelta(seconds=60)
US = dt.timedelta(microseconds=1)


@pytest.mark.parametrize(
    ("stopped_at", "beat", "state"),
    [
        (None, NOW, "live"),
        (None, NOW - WINDOW + US, "live"),
        (None, NOW - WINDOW, "live"),  # exactly one window old: still live (inclusive boundary)
        (None, NOW - WINDOW - US, "silent"),
        (None, NOW + dt.timedelta(hours=1), "live"),  # a clock ahead of the reader's
        (NOW, NOW, "stopped"),  # stopped wins over a fresh heartbeat
        (NOW - dt.timedelta(days=1), NOW - dt.timedelta(days=1), "stopped"),
    ],
)
def test_process_state_and_boundary(stopped_at, beat, state):
    assert liveness.process_state(stopped_at, beat, NOW, WINDOW) == state
    assert liveness.process_state(stopped_at, beat, NOW, WINDOW.total_seconds()) == state  # seconds accepted
    assert liveness.is_live(stopped_at, beat, NOW, WINDOW) is (state == "live")


def test_window_of():
    assert liveness.window_of(120) == dt.timedelta(seconds=120)
    assert liveness.window_of(WINDOW) is WINDOW
    assert liveness.heartbeat_cutoff(NOW, WINDOW) == NOW - WINDOW
    with pytest.raises(ValueError):
        liveness.window_of(-1)


def test_one_default_window():
    assert liveness.DEFAULT_STALE_HEARTBEAT_S == 120.0
    assert inventory.DEFAULT_HEARTBEAT_WINDOW_S == liveness.DEFAULT_STALE_HEARTBEAT_S  # gates.py imports this name


@pytest.mark.parametrize(
    ("stopped", "age_s", "state"),
    [(False, 0.0, "live"), (False, 120.0, "live"), (False, 120.000001, "silent"), (False, 10_000.0, "silent"), (True, 0.0, "stopped")],
)
def test_inventory_uses_the_rule(stopped, age_s, state):
    p = inventory.ProducerProcess("p", catalog.ROLE_AUDIT_OUTBOX_WORKER, "4.11.0", stopped, age_s)
    assert p.state() == state  # default window: the liveness default
    assert p.live() is (state == "live")
    assert p.live(age_s + 1) is (not stopped)
    assert p.deployed() is (not stopped)  # deployed is another concept: not stopped, whatever the heartbeat


AGES = {
    "fresh": dt.timedelta(0),
    "inside": WINDOW - US,
    "boundary": WINDOW,
    "outside": WINDOW + US,
    "old": dt.timedelta(hours=2),
    "future": -dt.timedelta(minutes=5),
}


@pytest.fixture
def engine(tenant_url):
    with prepared_engine(tenant_url, make_cutover_ready) as eng:
        yield eng


def test_sql_clause_and_python_rule_agree_and_every_user_follows_them(engine):
    sc = TenantScenario(namespace="acme", now=NOW)
    expected = {}
    for name, age in AGES.items():
        for stopped in (False, True):
            pid = f"{name}{'-stopped' if stopped else ''}"
            row = sc.process(catalog.ROLE_DEPENDENCY_RESOLVER, process_id=pid, heartbeat_age_s=age.total_seconds(), stopped=stopped)
            expected[pid] = liveness.process_state(row["StoppedAt"], row["LastHeartbeatAt"], NOW, WINDOW)
    sc.write(engine)
    assert {k for k, v in expected.items() if v == "live"} == {"fresh", "inside", "boundary", "future"}
    assert {k for k, v in expected.items() if v == "silent"} == {"outside", "old"}

    t = catalog.ProcessRegistry
    with engine.connect() as conn:
        in_sql = set(conn.execute(select(t.c.ProcessId).where(liveness.live_clause(NOW, WINDOW))).scalars())
        resolvers = drain.live_old_dependency_resolvers(conn, "acme", stale_heartbeat=WINDOW, now=NOW)
    live = {k for k, v in expected.items() if v == "live"}
    assert in_sql == live
    assert resolvers == sorted(live)
    evidence = writers.old_writer_evidence(engine, "acme", stale_heartbeat=WINDOW, now=NOW)
    shown = {p["process_id"]: p["state"] for p in evidence.processes}
    # every live and silent process is listed; stopped ones are counted, the most recently stopped listed
    assert {k: v for k, v in shown.items() if v != "stopped"} == {k: v for k, v in expected.items() if v != "stopped"}
    stopped = {k for k, v in expected.items() if v == "stopped"}
    assert evidence.stopped_by_role == {catalog.ROLE_DEPENDENCY_RESOLVER: len(stopped)}
    assert {k for k, v in shown.items() if v == "stopped"} <= stopped
    assert len([v for v in shown.values() if v == "stopped"]) == min(len(stopped), writers.STOPPED_SHOWN)

"""Drain status and stuck-blocker classification (contract, "Drain"), on MariaDB and SQLite."""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import text

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_cutover.projection import drain
from nexus_sim.scenario import TenantScenario, drained_pack_history, utcnow
from tests.support import history_checksum, make_cutover_ready

STALE = dt.timedelta(seconds=60)


def _scenario(**kw) -> TenantScenario:
    import random

    sc = TenantScenario(namespace="acme", **kw)
    drained_pack_history(sc.pack("pk-a"), random.Random(3), lanes=2, generations=3)
    return sc


def _report(engine, *, deadline_in=dt.timedelta(minutes=10), now=None):
    now = now or utcnow()
    return drain.drain_report(engine, "acme", deadline=now + deadline_in, stale_heartbeat=STALE, now=now)


def test_drained_history_reports_drained(engine):
    sc = _scenario()
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="w1")
    sc.write(engine)
    rep = _report(engine)
    assert rep.drained and not rep.stuck and rep.state == "drained"
    assert rep.counts == {"pending": 0, "blocked": 0, "retry": 0, "processing": 0}


def test_progressing_work_is_draining_not_stuck(engine):
    now = utcnow()
    sc = _scenario(now=now)
    lane = sc.packs[0].lane("live")
    lane.generation(2, status="pending")
    lane.generation(1, status="retry", next_attempt_at=now + dt.timedelta(minutes=1))
    lane.generation(1, status="processing", lease_owner="w1", lease_expires_at=now + dt.timedelta(minutes=5))
    lane.generation(1, status="processing", lease_owner="w1")  # no lease expiry recorded: held
    lane.generation(1, status="blocked")  # not on an external dependency
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="w1")
    sc.write(engine)
    rep = _report(engine, now=now)
    assert rep.counts == {"pending": 1, "blocked": 1, "retry": 1, "processing": 2}
    assert rep.state == "draining", rep.report_text()
    assert rep.live_old_workers == ["w1"]


def test_each_stuck_cause_is_reported_with_its_items(engine):
    now = utcnow()
    sc = _scenario(now=now)
    lane = sc.packs[0].lane("live")
    _, retry = lane.generation(1, status="retry", next_attempt_at=now + dt.timedelta(hours=2))
    _, blocked = lane.generation(1, status="blocked", blocked_on="erp://accounts/42")
    _, expired = lane.generation(1, status="processing", lease_owner="w-gone", lease_expires_at=now - dt.timedelta(minutes=1))
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="w1")
    sc.write(engine)
    before = history_checksum(engine)
    rep = _report(engine, now=now)
    assert rep.stuck
    assert {k: [i["work_id"] for i in v] for k, v in rep.as_json()["blockers"].items()} == {
        drain.CAUSE_RETRY_NOT_DUE: [retry["WorkId"]],
        drain.CAUSE_BLOCKED_EXTERNAL: [blocked["WorkId"]],
        drain.CAUSE_EXPIRED_LEASE: [expired["WorkId"]],
    }
    assert rep.blockers[drain.CAUSE_BLOCKED_EXTERNAL][0]["blocked_on"] == "erp://accounts/42"
    text_report = rep.report_text()
    assert "external dependency" in text_report and "Do not change WorkItem status" in text_report
    assert history_checksum(engine) == before  # read only


def _blocked_tenant(now, *resolvers: dict):
    """A drained history plus one item blocked on an external dependency, a live old worker and ``resolvers``."""
    sc = _scenario(now=now)
    _, blocked = sc.packs[0].lane("live").generation(1, status="blocked", blocked_on="erp://accounts/42")
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="w1")
    for kw in resolvers:
        sc.process(catalog.ROLE_DEPENDENCY_RESOLVER, **kw)
    return sc, blocked


def test_blocked_with_a_live_resolver_is_draining(engine):
    now = utcnow()
    sc, _ = _blocked_tenant(now, {"process_id": "dr-1", "heartbeat_age_s": 30}, {"process_id": "dr-stopped", "stopped": True})
    sc.write(engine)
    rep = _report(engine, now=now)
    assert rep.counts["blocked"] == 1
    assert rep.state == "draining" and not rep.stuck, rep.report_text()
    assert rep.live_old_resolvers == ["dr-1"]
    assert rep.as_json()["live_old_resolvers"] == ["dr-1"] and rep.as_json()["blockers"] == {}
    assert "blocked items are progressing" in rep.report_text() and "dr-1" in rep.report_text()


@pytest.mark.parametrize(
    "resolver",
    [
        None,
        {"process_id": "dr-silent", "heartbeat_age_s": 61},  # just outside the 60 s window
        {"process_id": "dr-stopped", "stopped": True},
        {"process_id": "dr-new", "protocol": catalog.PROTOCOL_RANGES},  # not an old-protocol resolver
        {"process_id": "dr-other-ns", "namespace": "other"},
    ],
    ids=["none", "stale", "stopped", "new-protocol", "other-namespace"],
)
def test_blocked_without_a_live_old_resolver_is_stuck(engine, resolver):
    now = utcnow()
    resolver = dict(resolver or {})
    namespace = resolver.pop("namespace", None)
    sc, blocked = _blocked_tenant(now, *([resolver] if resolver and not namespace else []))
    sc.write(engine)
    if namespace:
        other = TenantScenario(namespace=namespace, now=now)
        other.process(catalog.ROLE_DEPENDENCY_RESOLVER, **resolver)
        other.write(engine)
    rep = _report(engine, now=now)
    assert rep.live_old_resolvers == []
    assert rep.state == "stuck"
    assert list(rep.as_json()["blockers"]) == [drain.CAUSE_BLOCKED_EXTERNAL]
    assert [i["work_id"] for i in rep.blockers[drain.CAUSE_BLOCKED_EXTERNAL]] == [blocked["WorkId"]]
    assert "dependency_resolver" in rep.report_text()


def test_resolver_heartbeat_exactly_one_window_old_is_live(engine):
    now = utcnow()
    sc, _ = _blocked_tenant(now, {"process_id": "dr-edge", "heartbeat_age_s": STALE.total_seconds()})
    sc.write(engine)
    rep = _report(engine, now=now)
    assert rep.live_old_resolvers == ["dr-edge"] and rep.state == "draining"


def test_still_blocked_at_the_deadline_is_reported_despite_a_live_resolver(engine):
    now = utcnow()
    sc, blocked = _blocked_tenant(now, {"process_id": "dr-1"})
    sc.write(engine)
    rep = _report(engine, now=now, deadline_in=dt.timedelta(0))
    assert rep.timed_out and rep.state == "stuck"
    assert drain.CAUSE_BLOCKED_EXTERNAL not in rep.as_json()["blockers"]  # not stuck on its own: the deadline passed
    assert [i["work_id"] for i in rep.blockers[drain.CAUSE_TIMED_OUT]] == [blocked["WorkId"]]
    assert rep.blockers[drain.CAUSE_TIMED_OUT][0]["blocked_on"] == "erp://accounts/42"


def test_pending_without_live_old_worker_is_stuck(engine):
    now = utcnow()
    sc = _scenario(now=now)
    lane = sc.packs[0].lane("live")
    _, pending = lane.generation(2, status="pending")
    _, due_retry = lane.generation(1, status="retry", next_attempt_at=now + dt.timedelta(seconds=5))
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="w-silent", heartbeat_age_s=600)
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="w-stopped", stopped=True)
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="w-new", protocol=catalog.PROTOCOL_RANGES)
    sc.write(engine)
    rep = _report(engine, now=now)
    assert rep.live_old_workers == []
    assert [i["work_id"] for i in rep.blockers[drain.CAUSE_NO_LIVE_OLD_WORKER]] == [pending["WorkId"], due_retry["WorkId"]]
    assert rep.stuck


def test_timeout_reports_everything_still_live(engine):
    now = utcnow()
    sc = _scenario(now=now)
    sc.packs[0].lane("live").generation(1, status="pending")
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="w1")
    sc.write(engine)
    rep = _report(engine, now=now, deadline_in=dt.timedelta(0))
    assert rep.timed_out and rep.stuck
    assert rep.blocker_totals[drain.CAUSE_TIMED_OUT] == 1


def test_new_protocol_and_ordinary_work_are_not_old_work(engine):
    now = utcnow()
    sc = _scenario(now=now)
    lane = sc.packs[0].lane("live")
    ev = lane.event(status="pending")
    lane.work_item(ev, status="pending", input_start_ordinal=ev["EnqueueOrdinal"])
    sc.ordinary_work(None, status="pending")
    sc.write(engine)
    assert _report(engine, now=now).drained


def test_other_namespaces_are_ignored(engine):
    sc = TenantScenario(namespace="other")
    sc.pack("pk-o").lane("l").generation(1, status="pending")
    sc.write(engine)
    assert _report(engine).drained


def test_before_apply_schema_every_projection_row_is_old(legacy_engine):
    sc = TenantScenario(namespace="acme")
    sc.pack("pk-a").lane("l").generation(1, status="pending")
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="w1")
    sc.write(legacy_engine)
    rep = drain.drain_report(legacy_engine, "acme", deadline=utcnow() + STALE, stale_heartbeat=STALE)
    assert rep.counts["pending"] == 1 and rep.state == "draining"


def test_drain_queries_use_the_state_index(mysql_url):
    eng = make_engine(mysql_url)
    try:
        make_cutover_ready(eng)
        sc = _scenario()
        for i in range(30):
            sc.packs[0].lane(f"bulk-{i}").generation(1, status="completed")
        sc.write(eng)
        with eng.connect() as conn:
            conn.execute(text("ANALYZE TABLE `_System_WorkItem`"))
            counts = drain.live_counts_statement("acme", True)
            ids = drain.live_old_work_ids_statement("acme", True)  # the pre-arm wait's look (issue 36)
            for stmt in [counts, ids] + [
                drain.select(drain.func.count()).select_from(catalog.WorkItem).where(drain._old_work("acme", status, True))
                for status in catalog.WORK_LIVE_STATUSES
            ]:
                compiled = stmt.compile(eng, compile_kwargs={"literal_binds": True})
                plan = conn.execute(text(f"EXPLAIN {compiled}")).mappings().all()
                assert plan[0]["key"] == "ix_WorkItem_State", plan
    finally:
        eng.dispose()


def test_a_runaway_count_of_one_role_never_hides_the_other_roles_processes(engine, monkeypatch):
    """The one read of both roles is capped; when it comes back full, each role is read on its own."""
    monkeypatch.setattr(drain, "PROCESS_LIST_LIMIT", 3)
    sc = _scenario()
    for i in range(7):  # sorts before projection_worker, and more than the whole capped read
        sc.process(catalog.ROLE_DEPENDENCY_RESOLVER, process_id=f"r{i}")
    sc.process(catalog.ROLE_PROJECTION_WORKER, process_id="w1")
    sc.write(engine)
    rep = _report(engine)
    assert rep.live_old_workers == ["w1"]
    assert rep.live_old_resolvers == ["r0", "r1", "r2"]

"""Ordinary work beside projection work (contract, "Ordinary work"): the drain does not wait for it, the audit
reads projection inputs only, and the history digest leaves it out. On MariaDB and SQLite.

A real tenant runs ordinary one-Event/one-WorkItem work before, during and after the cutover: ordinary Events of
the pack (any WorkType but a projection one) with their ordinary WorkItem in every state, a retry due next week,
and ordinary Events whose WorkItem retention already deleted. Source lanes are hostile text (case variants,
trailing spaces, non-ASCII).
"""

from __future__ import annotations

import datetime as dt
import random

from sqlalchemy import func, select

from nexus_cutover import catalog
from nexus_cutover.clock import utcnow
from nexus_cutover.projection import audit
from nexus_cutover.projection.actions import history_digest, verify_history
from nexus_cutover.projection.checkpoint import REFUSED, WRITTEN, run_checkpoint
from nexus_cutover.projection.drain import drain_report
from nexus_sim.scenario import TenantScenario, drained_pack_history
from tests.support import fence_pack_namespace, history_checksum

NS, PACK = "acme", "pk-1"
ORDINARY_TYPE = "email.send"
HOSTILE_LANES = ("Mail", "mail", "mail ", "Måil-Ü", "MÅIL-ü")  # latin1-safe: the test server's default charset
STALE = dt.timedelta(seconds=60)


def ordinary_work(sc: TenantScenario, pack, lane: str, status: str | None, *, ordinal: int | None = None) -> dict:
    """An ordinary Event of ``pack`` and, unless ``status`` is None (retention deleted it), its ordinary WorkItem."""
    event = pack.lane(lane, event_kind="mail.requested", work_type=ORDINARY_TYPE).event(
        status="pending" if status in catalog.WORK_LIVE_STATUSES else "processed", ordinal=ordinal)
    if status is not None:
        work = sc.ordinary_work(event, status=status)
        work["WorkType"] = ORDINARY_TYPE
        if status == "retry":
            work["NextAttemptAt"] = utcnow() + dt.timedelta(days=7)  # due next week: the drain must not wait for it
        elif status == "blocked":
            work["BlockedOn"] = "smtp-relay"
        elif status == "processing":
            work.update(LeaseOwner="ordinary-worker-1", LeaseExpiresAt=utcnow() - dt.timedelta(hours=1))
    return event


def tenant_with_ordinary_work(engine) -> TenantScenario:
    """A drained projection history, with ordinary work in every state and retention-trimmed ordinary Events,
    the greatest ordinal of the pack an ordinary one."""
    sc = TenantScenario(namespace=NS)
    pack = sc.pack(PACK)
    drained_pack_history(pack, random.Random(5), lanes=3, generations=4)
    statuses = (*catalog.WORK_LIVE_STATUSES, *catalog.WORK_TERMINAL_STATUSES, None, None, None)
    for i, status in enumerate(statuses):
        ordinary_work(sc, pack, HOSTILE_LANES[i % len(HOSTILE_LANES)], status)
    return sc


def test_ordinary_work_in_every_state_does_not_stop_the_checkpoint(engine):
    sc = tenant_with_ordinary_work(engine)
    sc.write(engine)
    before = history_checksum(engine)
    fence_pack_namespace(engine, PACK)
    result = run_checkpoint(engine, PACK, timeout_s=30, written_by="test")
    assert (result.outcome, result.findings) == (WRITTEN, []), [f.describe() for f in result.findings]
    top = max(e["EnqueueOrdinal"] for e in sc.events)
    assert sc.events[-1]["WorkType"] == ORDINARY_TYPE and sc.events[-1]["EnqueueOrdinal"] == top
    assert result.legacy_max_ordinal == top  # ordinals are per pack, whatever the work type
    assert history_checksum(engine) == before


def test_a_projection_refusal_beside_ordinary_work_names_only_projection_inputs(engine):
    sc = tenant_with_ordinary_work(engine)
    orphan = sc.packs[0].lane("Lane-Ä ").event()  # a projection input no WorkItem reaches
    _, live = sc.packs[0].lane("lane-live").generation(1, status="retry")
    sc.write(engine)
    fence_pack_namespace(engine, PACK)
    result = run_checkpoint(engine, PACK, timeout_s=30, written_by="test")
    assert result.outcome == REFUSED
    found = {(f.finding, tuple(f.event_ids), tuple(f.work_ids)) for f in result.findings}
    assert found == {(audit.MISSING_OWNER, (orphan["EventId"],), ()), (audit.LIVE_WORK, (), (live["WorkId"],))}


def test_a_projection_input_selected_by_live_ordinary_work_is_still_live_work(engine):
    sc = TenantScenario(namespace=NS)
    events, _ = sc.pack(PACK).lane("a").generation(2)
    odd = sc.ordinary_work(events[0], status="pending")  # an ordinary WorkItem holding a projection input
    sc.write(engine)
    fence_pack_namespace(engine, PACK)
    result = run_checkpoint(engine, PACK, timeout_s=30, written_by="test")
    assert {(f.finding, tuple(f.work_ids)) for f in result.findings} == {(audit.LIVE_WORK, (odd["WorkId"],))}


def test_the_server_decides_which_spellings_of_the_work_type_are_projection_inputs(engine):
    """'CONNECTOR.PROJECTION' and a trailing space are the projection work type where the collation says so
    (MariaDB's default folds case and pads spaces; SQLite compares bytes): the audit agrees with the server."""
    sc = TenantScenario(namespace=NS)
    pack = sc.pack(PACK)
    pack.lane("a").generation(1)
    spelled = [pack.lane(f"odd-{i}", work_type=work_type).event()  # no WorkItem reaches either
               for i, work_type in enumerate(("CONNECTOR.PROJECTION", catalog.PROJECTION_WORK_TYPE + " "))]
    sc.write(engine)
    with engine.connect() as conn:
        server = set(conn.execute(select(catalog.Event.c.EventId).where(
            catalog.Event.c.EventId.in_([e["EventId"] for e in spelled]),
            catalog.Event.c.WorkType.in_(catalog.PROJECTION_WORK_TYPES))).scalars())
    if engine.dialect.name != "sqlite":
        assert server == {e["EventId"] for e in spelled}  # the case-folding, space-padding collation
    else:
        assert server == set()
    fence_pack_namespace(engine, PACK)
    result = run_checkpoint(engine, PACK, timeout_s=30, written_by="test")
    missing = {e for f in result.findings if f.finding == audit.MISSING_OWNER for e in f.event_ids}
    assert missing == server and (result.outcome == WRITTEN) == (not server)


def test_the_drain_does_not_wait_for_ordinary_work_and_says_so(engine):
    sc = tenant_with_ordinary_work(engine)
    sc.write(engine)
    report = drain_report(engine, NS, deadline=utcnow() + dt.timedelta(hours=1), stale_heartbeat=STALE)
    assert report.drained and not report.stuck and report.state == "drained"
    assert report.ordinary_live == len(catalog.WORK_LIVE_STATUSES)
    assert "4 live ordinary WorkItem(s), not waited for" in report.report_text()
    assert report.as_json()["ordinary_live"] == 4 and report.as_json()["ordinary_work"] == "not waited for"


def test_after_the_release_the_new_runtimes_ordinary_work_never_fails_the_history_check(engine):
    """The digest is taken with ordinary work live; afterwards ordinary work finishes, retention deletes some of
    it and the new runtime creates more: every verification still passes, and a projection row changed is named."""
    from sqlalchemy import delete, update

    sc = tenant_with_ordinary_work(engine)
    sc.write(engine)
    fence_pack_namespace(engine, PACK)
    digest = history_digest(engine, NS, timeout_s=30, chunk_rows=7)
    assert run_checkpoint(engine, PACK, timeout_s=30, written_by="test").outcome == WRITTEN
    wi, ev = catalog.WorkItem, catalog.Event
    with engine.begin() as conn:
        conn.execute(update(wi).where(wi.c.WorkClass == catalog.WORK_CLASS_ORDINARY).values(Status="completed", Attempt=2))
        first_ordinary = min(w["WorkId"] for w in sc.work_items if w["WorkClass"] == catalog.WORK_CLASS_ORDINARY)
        conn.execute(delete(wi).where(wi.c.WorkId == first_ordinary))  # retention
        top_event = conn.execute(select(func.max(ev.c.EventId))).scalar()
        top_work = conn.execute(select(func.max(wi.c.WorkId))).scalar()
    new = TenantScenario(namespace=NS, event_id_start=top_event + 1, work_id_start=top_work + 1)
    mail = new.pack(PACK).lane("Mail", event_kind="mail.requested", work_type=ORDINARY_TYPE).event(
        status="pending", ordinal=sc.packs[0].last_ordinal + 1)
    new.ordinary_work(mail, status="pending")
    from nexus_sim.scenario import insert_rows

    insert_rows(engine, ev, new.events)
    insert_rows(engine, wi, new.work_items)
    result = verify_history(engine, digest, timeout_s=30)
    assert result.ok, result.summary()
    projection_event = next(e for e in sc.events if e["WorkType"] == catalog.PROJECTION_WORK_TYPE)
    with engine.begin() as conn:
        conn.execute(update(ev).where(ev.c.EventId == projection_event["EventId"]).values(Status="skipped"))
    assert [(d.kind, d.key) for d in verify_history(engine, digest, timeout_s=30).differences] == [
        ("changed", projection_event["EventId"])]

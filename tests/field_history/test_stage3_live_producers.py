"""Stage 3 against producers that keep writing (contract, "Field History eligibility": stage 3), on MariaDB.

Upgraded producers still write NULL rows with a HistorySequence for unresolved fields while sequence reservation is
on. Each test lets a real producer transaction in at one point of stage 3 (hooks of :mod:`nexus_cutover.field_history.
switch`, threads and waits on what the server shows, never a sleep) and checks that the switch to boolean-only reads
happens only when no eligible NULL row can exist at that moment:

* during the comparison (a row committed behind the comparison's cursor), by a producer following the switch and by
  one that ignores it;
* between the comparison and the switch;
* in flight before reservation was turned off (it holds its sequence lock: the barrier waits for it);
* through the outbox (a reservation carried by an undelivered outbox row);
* a field whose first sequence an interval proves but that has no sequence row yet.
"""

from __future__ import annotations

import concurrent.futures
import threading

import pytest
from sqlalchemy import delete, select, update
from sqlalchemy.engine import make_url

from nexus_cutover import catalog, tx
from nexus_cutover.db import Deadline
from nexus_cutover.field_history import gates
from nexus_cutover.field_history.provenance import may_reserve
from nexus_cutover.field_history.status import read_status
from nexus_cutover.field_history.switch import Hooks
from nexus_sim import outbox_worker
from nexus_sim.producers import AdmittedSchema, AuditTarget, FieldDiff, record_audit_field_changes
from nexus_sim.scenario import TenantScenario

from .test_stage3_locked import _wait_until_blocked

pytestmark = pytest.mark.mysql

RELEASE = "4.13.0"
Audit = catalog.AuditFieldChange
SEQUENCE_LOCK = "_System_FieldHistorySequence"


def _tenant(engine, *, stamped=40):
    """Field 1 tracked from sequence 10 (its sequence row at 20); ``stamped`` TRUE rows, ChangeIds 100 and up."""
    sc = TenantScenario(namespace="acme")
    sc.field(1, intervals=[(10, None)], last_sequence=20)
    sc.change_ids = iter(range(100, 100 + stamped))
    for _ in range(stamped):
        sc.audit_change(1, history_sequence=None, eligible=True, producer_version=RELEASE)
    sc.process(catalog.ROLE_RUNTIME_API, version=RELEASE, process_id="api-1")
    sc.write(engine)


def mutation(engine, change_id, *, follows_switch=True, via_outbox=None, inside=None):
    """An upgraded producer's mutation of unresolved field 1 (no decision in its admitted schema: a NULL row).

    Following the switch, it decides whether to reserve by the producer rule (``may_reserve``: its sequence row locked
    first, the switch read after); otherwise it reserves regardless (a producer that ignores the switch).
    ``inside(conn)`` runs in its transaction after its rows are written, before the commit.
    """
    target = AuditTarget(audit_id=change_id, object_name="Contact", record_id="r-1", producer_version=RELEASE)

    def body(conn):
        reserve = may_reserve(conn, [1]) if follows_switch else True
        written = record_audit_field_changes(
            conn, AdmittedSchema({}, 1), [FieldDiff(1, "a", "b")], [change_id], target, reservation_enabled=reserve, via_outbox=via_outbox
        )
        if inside is not None:
            inside(conn)
        return written

    return tx.run(engine, body, what=f"mutation {change_id}", deadline=Deadline(60))


def _row(engine, change_id):
    with engine.connect() as conn:
        return conn.execute(
            select(Audit.c.HistorySequence, Audit.c[catalog.FIELD_HISTORY_ELIGIBLE.column_name]).where(Audit.c.ChangeId == change_id)
        ).one()


def _switched(engine) -> bool:
    return read_status(engine).settings.read_mode == catalog.READ_MODE_BOOLEAN_ONLY


def _stage_3(engine, **kw):
    return gates.stage_3(engine, producer_release=RELEASE, updated_by="test", deadline=Deadline(60), chunk_rows=10, **kw)


def test_a_producer_following_the_switch_writes_during_the_comparison_without_an_eligible_null_row(mysql_fh_engine):
    _tenant(mysql_fh_engine)
    during = []

    def in_comparison(chunk):
        if chunk == 2 and not during:  # ChangeId 50 lies behind the comparison's cursor
            during.append(mutation(mysql_fh_engine, 50))

    report = _stage_3(mysql_fh_engine, hooks=Hooks(during_comparison=in_comparison))
    assert during and report.passed, report.render()
    assert report.comparison["chunks"] > 2
    assert not during[0].reserved_sequences and _row(mysql_fh_engine, 50) == (None, None)  # fail-closed, not eligible
    st = read_status(mysql_fh_engine)
    assert st.settings.read_mode == catalog.READ_MODE_BOOLEAN_ONLY and st.eligible_null_rows == 0


def test_an_eligible_null_row_committed_behind_the_comparison_is_found_and_refuses_the_switch(mysql_fh_engine):
    """A producer that ignores the switch reserves and commits during the comparison, behind its cursor: the sequence
    table moved since the barrier, so stage 3 settles again, compares again, finds the row and does not switch."""
    _tenant(mysql_fh_engine)
    during = []

    def in_comparison(chunk):
        if chunk == 2 and not during:
            during.append(mutation(mysql_fh_engine, 50, follows_switch=False))

    report = _stage_3(mysql_fh_engine, hooks=Hooks(during_comparison=in_comparison))
    assert during and during[0].reserved_sequences and _row(mysql_fh_engine, 50) == (21, None)  # an eligible NULL row
    assert not report.passed and report.counts["barriers"] == 2, report.render()
    assert [(f["finding"], f["change_id"]) for f in report.findings] == [("read_flip", 50)]
    assert report.counts["eligible_null_rows"] == 1 and not _switched(mysql_fh_engine)
    assert "stays off" in report.summary
    assert gates.stage_2_materialize(mysql_fh_engine).passed
    again = _stage_3(mysql_fh_engine)
    assert again.passed and read_status(mysql_fh_engine).eligible_null_rows == 0


def test_a_producer_between_the_comparison_and_the_switch_waits_and_then_reads_the_switch_off(mysql_fh_engine, mysql_url):
    _tenant(mysql_fh_engine)
    database = make_url(mysql_url).database
    with concurrent.futures.ThreadPoolExecutor(1) as pool:
        started = []

        def before_switch():
            started.append(pool.submit(mutation, mysql_fh_engine, 50))
            _wait_until_blocked(mysql_fh_engine, database, SEQUENCE_LOCK, alive=lambda: not started[0].done())

        report = _stage_3(mysql_fh_engine, hooks=Hooks(before_switch=before_switch))
        written = started[0].result(timeout=60)
    assert report.passed, report.render()
    assert not written.reserved_sequences and _row(mysql_fh_engine, 50) == (None, None)
    assert _switched(mysql_fh_engine) and read_status(mysql_fh_engine).eligible_null_rows == 0


def test_a_mutation_in_flight_before_reservation_was_turned_off_is_waited_for_and_found(mysql_fh_engine, mysql_url):
    """It saw the switch on and holds its sequence lock: the barrier waits for its commit, then the comparison sees
    its eligible NULL row and stage 3 refuses (reservation stays off); materialized, stage 3 switches."""
    _tenant(mysql_fh_engine)
    database = make_url(mysql_url).database
    written, release = threading.Event(), threading.Event()

    def hold(_conn):
        written.set()
        assert release.wait(60)

    with concurrent.futures.ThreadPoolExecutor(2) as pool:
        producer = pool.submit(mutation, mysql_fh_engine, 50, inside=hold)
        assert written.wait(60)
        stage = pool.submit(_stage_3, mysql_fh_engine)
        _wait_until_blocked(mysql_fh_engine, database, SEQUENCE_LOCK, alive=lambda: not stage.done())
        release.set()
        assert producer.result(timeout=60).reserved_sequences
        report = stage.result(timeout=60)
    assert not report.passed and report.actions == ["set FieldHistorySequenceReservationEnabled = false"], report.render()
    assert [(f["finding"], f["change_id"]) for f in report.findings] == [("read_flip", 50)]
    assert not _switched(mysql_fh_engine)
    assert gates.stage_2_materialize(mysql_fh_engine).passed
    assert _stage_3(mysql_fh_engine).passed and read_status(mysql_fh_engine).eligible_null_rows == 0


def test_a_reservation_carried_by_an_undelivered_outbox_row_is_waited_for(mysql_fh_engine):
    _tenant(mysql_fh_engine)
    assert mutation(mysql_fh_engine, 50, via_outbox=7).reserved_sequences  # committed with reservation on, not delivered
    waited = []

    def deliver(ids):
        waited.append(ids)
        outbox_worker.run_once(mysql_fh_engine)

    report = _stage_3(mysql_fh_engine, hooks=Hooks(waiting_for_outbox=deliver))
    assert waited == [[7]]
    assert not report.passed and [(f["finding"], f["change_id"]) for f in report.findings] == [("read_flip", 50)], report.render()
    assert gates.stage_2_materialize(mysql_fh_engine).passed
    assert _stage_3(mysql_fh_engine).passed


def test_a_failed_outbox_row_open_at_the_barrier_refuses_the_switch(mysql_fh_engine):
    _tenant(mysql_fh_engine)
    mutation(mysql_fh_engine, 50, via_outbox=7)

    def fail(ids):
        with mysql_fh_engine.begin() as conn:
            conn.execute(update(catalog.AuditOutbox).where(catalog.AuditOutbox.c.OutboxId.in_(ids)).values(Status="failed"))

    report = _stage_3(mysql_fh_engine, hooks=Hooks(waiting_for_outbox=fail))
    assert not report.passed and {"finding": "outbox_failed", "outbox_id": 7} in report.findings, report.render()
    assert not _switched(mysql_fh_engine)


def test_a_field_whose_first_sequence_an_interval_proves_refuses_the_switch(mysql_fh_engine):
    _tenant(mysql_fh_engine)
    sc = TenantScenario(namespace="acme")
    sc.field(7, intervals=[(0, None)])
    sc.write(mysql_fh_engine)
    with mysql_fh_engine.begin() as conn:  # tracked from sequence 0, never reserved: no sequence row to lock
        conn.execute(delete(catalog.FieldHistorySequence).where(catalog.FieldHistorySequence.c.FieldId == 7))
    report = _stage_3(mysql_fh_engine)
    assert not report.passed and {"finding": "field_without_sequence_row", "field_id": 7} in report.findings, report.render()
    assert not _switched(mysql_fh_engine)

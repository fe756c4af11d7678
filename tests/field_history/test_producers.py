"""Reference producers: the single stamping producer, the pre-cutover binary, and the Audit V2 outbox worker."""

from __future__ import annotations

import pytest
from sqlalchemy import select, update

from nexus_cutover import catalog
from nexus_sim import outbox_worker
from nexus_sim.producers import (
    AuditTarget,
    FieldDiff,
    RetryableConflict,
    capture_schema,
    record_audit_field_changes,
    record_legacy_audit_field_changes,
    run_mutation,
)
from nexus_sim.scenario import TenantScenario

from .helpers import ELIGIBLE, audit_table

NEW = AuditTarget(audit_id=1, object_name="Contact", record_id="c-1", producer_version="4.13.0")
OLD = AuditTarget(audit_id=2, object_name="Contact", record_id="c-1", producer_version="4.11.0")
Outbox = catalog.AuditOutbox
Sequence = catalog.FieldHistorySequence


@pytest.fixture
def tenant(fh_engine):
    sc = TenantScenario()
    sc.field(1, track_history=True, intervals=[(0, None)], last_sequence=10)
    sc.field(2, track_history=False, last_sequence=20)
    sc.write(fh_engine)
    return fh_engine


def publish(engine, field_id: int, track: bool) -> None:
    """Publish revision R+1 of a field (another session, committed)."""
    f = catalog.Field
    with engine.begin() as conn:
        conn.execute(update(f).where(f.c.FieldId == field_id).values(TrackHistory=track, Revision=f.c.Revision + 1))


def sequences(engine) -> dict[int, int]:
    with engine.connect() as conn:
        return dict(conn.execute(select(Sequence.c.FieldId, Sequence.c.LastSequence)).all())


def test_stamps_from_the_admitted_schema_without_sequence_reservation(tenant):
    diffs = [FieldDiff(1, "a", "b"), FieldDiff(2, "x", "y"), FieldDiff(None, "p", "q")]
    written = run_mutation(tenant, diffs, [101, 102, 103], NEW)
    assert not written.reserved_sequences
    assert audit_table(tenant) == {101: (1, None, True), 102: (2, None, False), 103: (None, None, None)}
    assert sequences(tenant) == {1: 10, 2: 20}  # nothing reserved


def test_retry_reuses_the_schema_captured_before_the_loop(tenant):
    def before(attempt):
        if attempt == 2:
            publish(tenant, 1, False)  # R+1 published between attempts

    def fail_first(conn, attempt):
        if attempt == 1:
            raise RetryableConflict  # rolls back attempt 1's writes

    written = run_mutation(tenant, [FieldDiff(1, "a", "b")], [201], NEW, before_attempt=before, inside_attempt=fail_first)
    assert written.rows[0][ELIGIBLE] is True
    assert audit_table(tenant) == {201: (1, None, True)}  # R's value, written once
    later = run_mutation(tenant, [FieldDiff(1, "b", "c")], [202], NEW)  # a later admission sees R+1
    assert later.rows[0][ELIGIBLE] is False


def test_a_diff_without_provenance_falls_back_to_sequence_reservation(tenant):
    diffs = [FieldDiff(1, "a", "b"), FieldDiff(7, "u", "v"), FieldDiff(None, "p", "q")]  # field 7: not admitted
    written = run_mutation(tenant, diffs, [301, 302, 303], NEW)
    assert written.reserved_sequences
    assert audit_table(tenant) == {301: (1, 11, True), 302: (7, 1, None), 303: (None, None, None)}
    assert sequences(tenant) == {1: 11, 2: 20, 7: 1}


def test_with_reservation_switched_off_an_unresolved_diff_stays_fail_closed(tenant):
    run_mutation(tenant, [FieldDiff(7, "u", "v")], [401], NEW, reservation_enabled=False)
    assert audit_table(tenant) == {401: (7, None, None)}


def test_generic_audit_only_diff_does_not_force_siblings_onto_the_sequence_path(tenant):
    written = run_mutation(tenant, [FieldDiff(None, "p", "q"), FieldDiff(2, "x", "y")], [501, 502], NEW)
    assert not written.reserved_sequences and sequences(tenant) == {1: 10, 2: 20}


def test_create_and_delete_pseudo_rows_keep_their_semantics(tenant):
    run_mutation(tenant, [FieldDiff(1, None, None, kind="create"), FieldDiff(1, None, None, kind="delete")], [601, 602], NEW)
    assert audit_table(tenant) == {601: (None, None, None), 602: (None, None, None)}
    with tenant.connect() as conn:
        assert set(conn.scalars(select(catalog.AuditFieldChange.c.NewValue))) == {"<created>", "<deleted>"}


def test_legacy_producer_reserves_in_field_order_and_writes_null(tenant):
    with tenant.begin() as conn:
        written = record_legacy_audit_field_changes(conn, [FieldDiff(2, "x", "y"), FieldDiff(1, "a", "b")], [701, 702], OLD)
    assert written.reserved_sequences
    assert audit_table(tenant) == {701: (2, 21, None), 702: (1, 11, None)}


def test_delayed_outbox_delivery_keeps_the_admitted_value(tenant):
    with tenant.connect() as conn:
        admitted = capture_schema(conn)
    with tenant.begin() as conn:
        record_audit_field_changes(conn, admitted, [FieldDiff(1, "a", "b"), FieldDiff(2, "x", "y")], [801, 802], NEW, via_outbox=1)
    publish(tenant, 1, False)
    publish(tenant, 2, True)  # both flipped before the worker runs
    result = outbox_worker.run_once(tenant)
    assert result.delivered == [1] and result.rows_inserted == 2
    assert audit_table(tenant) == {801: (1, None, True), 802: (2, None, False)}


def test_legacy_outbox_payload_is_delivered_null_with_its_sequence(tenant):
    with tenant.begin() as conn:
        record_legacy_audit_field_changes(conn, [FieldDiff(1, "a", "b")], [901], OLD, via_outbox=2)
    outbox_worker.run_once(tenant)
    assert audit_table(tenant) == {901: (1, 11, None)}


def test_worker_restart_between_claim_and_delivery_then_duplicate_delivery(tenant):
    with tenant.connect() as conn:
        admitted = capture_schema(conn)
    with tenant.begin() as conn:
        record_audit_field_changes(conn, admitted, [FieldDiff(1, "a", "b")], [1001], NEW, via_outbox=3)
        record_audit_field_changes(conn, admitted, [FieldDiff(2, "x", "y")], [1002], NEW, via_outbox=4)

    class Died(Exception):
        pass

    def die(ids):
        raise Died

    with pytest.raises(Died):
        outbox_worker.run_once(tenant, after_claim=die)
    with tenant.connect() as conn:
        assert dict(conn.execute(select(Outbox.c.OutboxId, Outbox.c.Status)).all()) == {3: "processing", 4: "processing"}
    assert audit_table(tenant) == {}

    publish(tenant, 1, False)
    restarted = outbox_worker.run_once(tenant)  # recovers the stranded processing rows
    assert restarted.delivered == [3, 4]
    once = audit_table(tenant)
    assert once == {1001: (1, None, True), 1002: (2, None, False)}

    duplicate = outbox_worker.redeliver(tenant, 3)
    assert (duplicate.rows_inserted, duplicate.rows_already_present) == (0, 1)
    assert audit_table(tenant) == once
    with tenant.connect() as conn:
        assert dict(conn.execute(select(Outbox.c.OutboxId, Outbox.c.Attempts)).all()) == {3: 2, 4: 2}


def test_undecodable_payload_is_marked_failed(tenant):
    """A payload without rows ("{}") cannot be delivered: failed, left for an operator."""
    sc = TenantScenario()
    sc.outbox_row(producer_version="4.11.0")
    sc.write(tenant)
    result = outbox_worker.run_once(tenant)
    assert result.failed == [1]
    with tenant.connect() as conn:
        assert conn.scalar(select(Outbox.c.Status)) == "failed"

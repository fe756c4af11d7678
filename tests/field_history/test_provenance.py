"""The producer and the stage-2 gate agree on one provenance rule (field_history.provenance), both backends."""

from __future__ import annotations

from nexus_cutover import catalog
from nexus_cutover.field_history import gates, provenance
from nexus_cutover.field_history.materialize import materialize
from nexus_sim.producers import AuditTarget, FieldDiff, run_mutation
from nexus_sim.scenario import TenantScenario

from .helpers import audit_table, boolean_set, compat_set

RELEASE = "4.13.0"
NEW = AuditTarget(audit_id=1, object_name="Contact", record_id="c-1", producer_version="4.13.0")


def _tenant(engine) -> None:
    sc = TenantScenario()
    sc.field(1, track_history=True, intervals=[(0, None)], last_sequence=10)
    sc.field(2, track_history=False, last_sequence=20)
    sc.process(catalog.ROLE_RUNTIME_API, version="4.13.0", process_id="api-1")
    sc.process(catalog.ROLE_SERVICE_MANAGER, version="4.13.0", process_id="sm-1")
    sc.write(engine)


def test_rule_unit():
    assert provenance.eligibility(True, True) is True and provenance.eligibility(True, False) is False
    assert provenance.eligibility(True, None) is None and provenance.eligibility(False, True) is None
    assert provenance.reserves_sequences([True, None], reservation_enabled=True)
    assert not provenance.reserves_sequences([True, None], reservation_enabled=False)
    assert not provenance.reserves_sequences([True, False], reservation_enabled=True)
    assert not provenance.reserves_sequences([], reservation_enabled=True)


def test_an_unresolved_field_written_by_an_upgraded_producer_passes_stage_2_and_is_materialized(fh_engine):
    """Field 7 is absent from the admitted schema: NULL plus a reserved sequence, a legitimate legacy-like row."""
    _tenant(fh_engine)
    written = run_mutation(fh_engine, [FieldDiff(1, "a", "b"), FieldDiff(7, "x", "y")], [101, 102], NEW)
    assert written.reserved_sequences
    table = audit_table(fh_engine)
    assert table[101] == (1, 11, True) and table[102][0] == 7 and table[102][1] is not None and table[102][2] is None
    report = gates.stage_2_producers(fh_engine, producer_release=RELEASE)
    assert report.passed, report.render()
    compat_before = compat_set(fh_engine)
    materialize(fh_engine)
    assert audit_table(fh_engine)[102][2] is False  # no interval of field 7 proves it
    assert boolean_set(fh_engine) == compat_before


def test_every_row_the_stamping_producer_writes_passes_the_gate(fh_engine):
    _tenant(fh_engine)
    run_mutation(fh_engine, [FieldDiff(1, "a", "b"), FieldDiff(2, "c", "d"), FieldDiff(None, "e", "f")], [201, 202, 203], NEW)
    run_mutation(fh_engine, [FieldDiff(2, "a", "b"), FieldDiff(9, "c", "d")], [211, 212], NEW)
    run_mutation(fh_engine, [FieldDiff(8, "a", "b")], [221], NEW, reservation_enabled=False)  # breaker off: fail-closed
    with fh_engine.connect() as conn:
        assert gates.unstamped_by_new_producers(conn, RELEASE) == (0, [])
    assert gates.stage_2_producers(fh_engine, producer_release=RELEASE).passed


def test_a_resolved_field_left_null_without_a_sequence_still_fails_stage_2(fh_engine):
    _tenant(fh_engine)
    sc = TenantScenario()
    sc.change_ids = iter(range(300, 310))
    sc.audit_change(1, history_sequence=None, producer_version="4.13.0")  # field 1 is in _System_Field: unstamped
    sc.audit_change(7, history_sequence=None, producer_version="4.13.0")  # field 7 is not: unresolved, allowed
    sc.audit_change(1, history_sequence=None, producer_version="4.11.0")  # a pre-cutover producer: not this check
    sc.write(fh_engine)
    report = gates.stage_2_producers(fh_engine, producer_release=RELEASE)
    assert not report.passed
    assert [f["change_id"] for f in report.findings if f["finding"] == "unstamped_row"] == [300]
    assert report.counts["unstamped_rows"] == 1 and "resolved field" in report.summary

"""Read-equivalence, proven as it is made (issue 12), on MariaDB and SQLite.

Each materialization batch proves that the rows the compatibility reader accepted
before its UPDATE are the rows the boolean-only reader accepts after it; a planted
change (real SQL, on the batch's own connection, through the materializer's test
seam) rolls that batch back and names the row. Stage 3 switches only on an equal
whole-table comparison; ``stage3 -check`` prints it without switching.
"""

from __future__ import annotations

import json
import logging

import pytest
from sqlalchemy import delete, func, insert, select, update

from nexus_cutover import catalog
from nexus_cutover.errors import ReadEquivalenceBroken
from nexus_cutover.field_history import gates
from nexus_cutover.field_history.materialize import DecidedDigest, materialize
from nexus_cutover.field_history.status import Fingerprint, compare_readers, read_comparison
from nexus_sim.scenario import TenantScenario

from .helpers import ELIGIBLE, Audit, audit_table, boolean_set, compat_set
from .test_cli import run_cli
from .test_gates import settings_rows

Interval = catalog.FieldHistoryTrackingInterval
RELEASE = "4.13.0"


def interleaved(engine) -> None:
    """Nine materializable rows with stamped and undecidable rows between them; ChangeIds step by 10.

    Field 1 is tracked from 10, field 2 within (100, 200), field 3 never. With
    batches of 3 the batches cover ChangeIds 10..40, 50..90 and 110..140.
    """
    sc = TenantScenario()
    sc.field(1, intervals=[(10, None)])
    sc.field(2, intervals=[(100, 200)])
    sc.field(3, track_history=False)
    sc.change_ids = iter(range(10, 1000, 10))
    for fid, seq, value in [
        (1, 5, None),  # 10 -> FALSE
        (1, 20, None),  # 20 -> TRUE
        (1, 30, True),  # 30 stamped TRUE
        (2, 150, None),  # 40 -> TRUE
        (3, 50, None),  # 50 -> FALSE
        (1, 40, False),  # 60 stamped FALSE inside an interval
        (1, None, None),  # 70 no sequence: never decided
        (2, 50, None),  # 80 -> FALSE
        (1, 60, None),  # 90 -> TRUE
        (None, 70, None),  # 100 no FieldId: never decided
        (3, 80, None),  # 110 -> FALSE
        (1, 90, False),  # 120 stamped FALSE
        (2, 160, None),  # 130 -> TRUE
        (1, 3, None),  # 140 -> FALSE
    ]:
        sc.audit_change(fid, history_sequence=seq, eligible=value)
    sc.write(engine)


DECIDED = {10: False, 20: True, 40: True, 50: False, 80: False, 90: True, 110: False, 130: True, 140: False}


def digest_of(decisions: dict[int, bool]) -> str:
    """The decided digest, computed from the decisions themselves (the definition of DecidedDigest)."""
    d = DecidedDigest()
    d.add(Fingerprint.of_ids(decisions), Fingerprint.of_ids(c for c, v in decisions.items() if v))
    return d.hex


def plant_when_batch_holds(change_id: int, plant):
    """A seam running ``plant(conn)`` in the batch whose range holds ``change_id`` (every attempt of it)."""
    calls = []

    def seam(conn, lo, hi):
        if lo < change_id <= hi:
            calls.append((lo, hi))
            plant(conn)

    seam.calls = calls
    return seam


def set_value(change_id: int, value):
    return lambda conn: conn.execute(update(Audit).where(Audit.c.ChangeId == change_id).values({ELIGIBLE: value}))


def intervals(engine) -> list[tuple]:
    with engine.connect() as conn:
        stmt = select(Interval.c.FieldId, Interval.c.StartedSequence, Interval.c.EndedSequence).order_by(Interval.c.IntervalId)
        return conn.execute(stmt).all()


def broken_run(engine, seam) -> ReadEquivalenceBroken:
    with pytest.raises(ReadEquivalenceBroken) as caught:
        materialize(engine, batch_size=3, between_read_and_write=seam)
    return caught.value


def assert_only_batch_1_committed(engine, before: dict) -> None:
    after = audit_table(engine)
    for cid in (10, 20, 40):
        assert after[cid][2] is DECIDED[cid], cid
    assert {cid: v for cid, v in after.items() if cid > 40} == {cid: v for cid, v in before.items() if cid > 40}


# -- the per-batch proof ------------------------------------------------------------


def test_a_clean_run_proves_every_batch_and_digests_exactly_its_decisions(fh_engine):
    interleaved(fh_engine)
    compat_before = compat_set(fh_engine)
    result = materialize(fh_engine, batch_size=3)
    assert boolean_set(fh_engine) == compat_before
    assert {cid: v[2] for cid, v in audit_table(fh_engine).items() if cid in DECIDED} == DECIDED
    assert (result.rows, result.batches, result.set_true, result.set_false) == (9, 3, 4, 5)
    assert result.decided_rows == 9 and result.decided_digest == digest_of(DECIDED)
    assert result.as_json()["decided_digest"] == digest_of(DECIDED)
    again = materialize(fh_engine, batch_size=3)
    assert (again.decided_rows, again.decided_digest) == (0, digest_of({}))


def test_the_digest_depends_on_the_decisions_only_not_on_batches_or_resumption(fh_engine, tmp_path):
    from nexus_cutover.db import make_engine

    from .conftest import make_stage1

    (tmp_path / "reference.db").touch()
    reference = make_engine(f"sqlite:///{tmp_path / 'reference.db'}")
    make_stage1(reference)
    interleaved(fh_engine)
    interleaved(reference)
    whole = materialize(reference, batch_size=1)
    reference.dispose()

    def stop_after_first(progress):
        if progress.batches == 1:
            raise KeyboardInterrupt

    with pytest.raises(KeyboardInterrupt):
        materialize(fh_engine, batch_size=4, on_batch=stop_after_first)
    resumed = materialize(fh_engine, batch_size=4)
    assert whole.decided_digest == digest_of(DECIDED)
    first = {cid: v for cid, v in DECIDED.items() if cid <= 50}  # the first batch of 4 decided 10, 20, 40, 50
    assert resumed.decided_rows == 5 and resumed.decided_digest == digest_of({c: v for c, v in DECIDED.items() if c not in first})


def test_a_stamped_false_row_set_true_between_the_read_and_the_update_rolls_the_batch_back_and_is_named(fh_engine):
    interleaved(fh_engine)
    before = audit_table(fh_engine)
    exc = broken_run(fh_engine, plant_when_batch_holds(60, set_value(60, True)))
    assert [r["change_id"] for r in exc.rows] == [60]
    assert "ChangeId 60: stamped FALSE before (compatibility reader: rejected), but TRUE after" in str(exc)
    assert "a stamped row was touched" in str(exc) and "ChangeIds 50..90" in str(exc)
    assert (exc.batches, exc.decided_rows, exc.decided_digest) == (1, 3, digest_of({10: False, 20: True, 40: True}))
    assert_only_batch_1_committed(fh_engine, before)  # the bad batch's rows unchanged, the plant rolled back with it


def test_an_interval_added_between_the_read_and_the_update_is_named_with_the_row_it_flips(fh_engine):
    interleaved(fh_engine)
    before, ivs = audit_table(fh_engine), intervals(fh_engine)
    plant = plant_when_batch_holds(50, lambda conn: conn.execute(insert(Interval).values(FieldId=3, StartedSequence=0)))
    exc = broken_run(fh_engine, plant)
    assert [r["change_id"] for r in exc.rows] == [50]
    assert exc.rows[0]["before"] == "NULL" and exc.rows[0]["after"] == "TRUE"
    assert "ChangeId 50: NULL before, no interval of field 3 proving sequence 50 (compatibility reader: rejected)" in str(exc)
    assert "the intervals of field 3 changed during the batch" in str(exc)
    assert len(plant.calls) == 2  # the aggregate proof, then the row-by-row one that names the row
    assert_only_batch_1_committed(fh_engine, before)
    assert intervals(fh_engine) == ivs


def test_an_interval_removed_between_the_read_and_the_update_is_named(fh_engine):
    interleaved(fh_engine)
    before = audit_table(fh_engine)
    exc = broken_run(fh_engine, plant_when_batch_holds(90, lambda conn: conn.execute(delete(Interval).where(Interval.c.FieldId == 1))))
    assert [r["change_id"] for r in exc.rows] == [90]
    assert "ChangeId 90: NULL before, an interval of field 1 proving sequence 60 (compatibility reader: accepted), but FALSE" in str(exc)
    assert_only_batch_1_committed(fh_engine, before)


def test_a_row_materialization_never_decides_is_caught_when_edited(fh_engine):
    interleaved(fh_engine)
    exc = broken_run(fh_engine, plant_when_batch_holds(70, set_value(70, True)))
    assert [r["change_id"] for r in exc.rows] == [70]
    assert "NULL before without a HistorySequence" in str(exc) and "a row materialization never decides was changed" in str(exc)


def test_a_touched_stamped_row_is_caught_even_when_its_read_result_does_not_flip(fh_engine):
    """Row 30 (TRUE, inside an interval) set NULL: the UPDATE decides it TRUE again, so no read flips; it is still caught."""
    interleaved(fh_engine)
    before = audit_table(fh_engine)
    exc = broken_run(fh_engine, plant_when_batch_holds(30, set_value(30, None)))
    assert "its UPDATE decided 4 row(s) but 3 were read as materializable before it" in str(exc)
    assert exc.batches == 0 and audit_table(fh_engine) == before


def test_a_broken_proof_stops_stage_2_with_the_rows_as_findings(fh_engine):
    interleaved(fh_engine)
    report = gates.stage_2_materialize(fh_engine, batch_size=3, between_read_and_write=plant_when_batch_holds(120, set_value(120, True)))
    assert not report.passed and "read-equivalence broken" in report.summary and "rerun materialize" in report.summary
    assert [(f["finding"], f["change_id"]) for f in report.findings] == [("read_equivalence_broken", 120)]
    assert report.counts["batches"] == 2 and report.counts["decided_rows"] == 6
    assert report.counts["materializable_rows"] == 3
    clean = gates.stage_2_materialize(fh_engine, batch_size=3)  # rerun: resumes and proves the rest
    assert clean.passed and clean.counts["decided_rows"] == 3
    assert clean.counts["decided_digest"] == digest_of({c: v for c, v in DECIDED.items() if c > 90})


def test_a_row_inserted_into_the_range_by_another_session_is_re_proven_row_by_row_and_committed(mysql_fh_engine, caplog):
    """A committed insert (a new producer's stamped TRUE row) lands in the batch's range mid-batch: not a read flip."""
    engine = mysql_fh_engine
    interleaved(engine)
    compat_before = compat_set(engine)
    inserted = []

    def other_session_inserts(conn, lo, hi):
        if lo < 55 <= hi and not inserted:
            with engine.begin() as other:
                row = TenantScenario().audit_change(1, history_sequence=55, eligible=True, producer_version=RELEASE)
                other.execute(insert(Audit).values({**row, "ChangeId": 55, "AuditId": 55}))
            inserted.append(55)

    with caplog.at_level(logging.WARNING, logger="nexus_cutover.field_history.materialize"):
        result = materialize(engine, batch_size=3, between_read_and_write=other_session_inserts)
    assert inserted and any("proving it again row by row" in r.getMessage() for r in caplog.records)
    assert result.decided_rows == 9 and result.decided_digest == digest_of(DECIDED)
    assert boolean_set(engine) == compat_before | {55}


# -- stage 3: the whole-table comparison ---------------------------------------------


def materialized(engine) -> None:
    interleaved(engine)
    materialize(engine, batch_size=3)


def test_the_comparison_is_equal_after_materialization_and_names_a_planted_eligible_null_row(fh_engine):
    materialized(fh_engine)
    clean = read_comparison(fh_engine)
    assert clean.equal and clean.compat_accepted == clean.boolean_accepted == len(boolean_set(fh_engine)) == 5
    with fh_engine.begin() as conn:  # row 20 (field 1, sequence 20) back to NULL: the compat reader accepts it again
        set_value(20, None)(conn)
    planted = read_comparison(fh_engine)
    assert not planted.equal and (planted.compat_only, planted.boolean_only) == (1, 0)
    assert [d["change_id"] for d in planted.differences] == [20] and "eligible NULL row" in planted.differences[0]["why"]
    assert "DIFFERENT" in planted.render() and "ChangeId 20:" in planted.render()


def test_a_stamped_false_row_whose_interval_now_proves_it_does_not_flip(fh_engine):
    materialized(fh_engine)
    with fh_engine.begin() as conn:
        conn.execute(insert(Interval).values(FieldId=1, StartedSequence=0))  # now proves row 10 (FALSE, sequence 5)
    assert read_comparison(fh_engine).equal


def test_stage_3_refuses_on_a_planted_difference_and_switches_on_the_clean_table(fh_engine):
    materialized(fh_engine)
    with fh_engine.begin() as conn:
        set_value(130, None)(conn)
    refused = gates.stage_3(fh_engine, producer_release=RELEASE, updated_by="test")
    assert not refused.passed and refused.summary.startswith("refused, reads not switched (sequence reservation is off")
    assert refused.actions == ["set FieldHistorySequenceReservationEnabled = false"]  # and it stays off: no new ones
    assert refused.counts["eligible_null_rows"] == 1
    assert settings_rows(fh_engine) == {"FieldHistorySequenceReservationEnabled": "false"}
    assert [(f["finding"], f["change_id"]) for f in refused.findings] == [("read_flip", 130)]
    assert refused.comparison["equal"] is False and refused.comparison["rows_only_compat_accepts"] == 1
    assert "read comparison: DIFFERENT" in refused.render()
    assert gates.stage_2_materialize(fh_engine).passed
    switched = gates.stage_3(fh_engine, producer_release=RELEASE, updated_by="test")
    assert switched.passed and switched.comparison["equal"] is True and switched.comparison["compat_accepted"] == 5
    assert settings_rows(fh_engine) == {"FieldHistoryReadMode": "boolean_only", "FieldHistorySequenceReservationEnabled": "false"}


def test_the_comparison_chunks_cover_sparse_ids_and_empty_gaps_exactly(fh_engine):
    sc = TenantScenario()
    sc.field(1, intervals=[(10, None)])
    ids = [1, 2, 3, 50, 51, 10_000, 10_001, 10_002, 5_000_000, 900_000_000_000]
    sc.change_ids = iter(ids)
    for i in range(len(ids)):
        sc.audit_change(1, history_sequence=20, eligible=[True, False, None][i % 3])  # the NULLs are eligible
    sc.write(fh_engine)
    with fh_engine.connect() as conn:
        comparison = compare_readers(conn, chunk_rows=2)
    eligible_nulls = [cid for i, cid in enumerate(ids) if i % 3 == 2]
    assert comparison.compat_accepted == len(compat_set(fh_engine)) and comparison.boolean_accepted == len(boolean_set(fh_engine))
    assert [d["change_id"] for d in comparison.differences] == eligible_nulls
    assert comparison.chunks > 3 and comparison.chunks < 60  # many chunks, yet the 900-billion gap costs a few only
    assert (comparison.first_change_id, comparison.last_change_id) == (1, 900_000_000_000)


def test_an_empty_table_compares_equal(fh_engine):
    comparison = read_comparison(fh_engine)
    assert comparison.equal and comparison.chunks == 0 and "an empty table" in comparison.render()


# -- stage3 -check on the command line ------------------------------------------------


def test_stage3_check_prints_the_comparison_and_switches_nothing(tenant_url):
    from nexus_cutover.db import make_engine

    from .conftest import make_stage1

    engine = make_engine(tenant_url)
    make_stage1(engine)
    materialized(engine)
    equal = run_cli(tenant_url, "stage3", "-check")
    assert equal.returncode == 0, equal.stderr
    assert "read comparison: EQUAL" in equal.stdout and "nothing switched (-check)" in equal.stdout
    with engine.begin() as conn:
        set_value(90, None)(conn)
    different = run_cli(tenant_url, "stage3", "--check", "--json")
    assert different.returncode == 3, different.stderr
    out = json.loads(different.stdout)
    assert out["check"] is True and out["passed"] is False and out["exit_code"] == 3
    assert [d["change_id"] for d in out["comparison"]["differences"]] == [90]
    assert settings_rows(engine) == {}
    with engine.connect() as conn:  # read-only: the planted NULL is still there
        assert conn.scalar(select(func.count()).select_from(Audit).where(Audit.c[ELIGIBLE].is_(None), Audit.c.ChangeId == 90)) == 1
    needs_release = run_cli(tenant_url, "stage3")
    assert needs_release.returncode == 2 and "-producer-release" in needs_release.stderr
    engine.dispose()

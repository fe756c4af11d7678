"""Property (issue 12): for random histories, materialization proves itself and stage 3's comparison is equal;
a single planted corruption that flips a read result always fails the proof (or the comparison) and names the row.

Histories and batch sizes as in test_property. The corruption is planted with
real SQL: inside a random batch's transaction through the materializer's test
seam (a stamped row flipped, an undecidable NULL row set TRUE, the intervals of
a batch row's field changed so its decision flips), or after materialization
for the stage-3 comparison (a row with a FieldId and a sequence back to NULL,
with an interval proving it).
"""

from __future__ import annotations

from hypothesis import HealthCheck, event, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, insert, select, update

from nexus_cutover import catalog
from nexus_cutover.errors import ReadEquivalenceBroken
from nexus_cutover.field_history import readers
from nexus_cutover.field_history.materialize import DecidedDigest, materialize
from nexus_cutover.field_history.status import Fingerprint, read_comparison

from .helpers import ELIGIBLE, Audit, audit_table, boolean_set, compat_set
from .test_property import FIELDS, intervals, load, row, rows

Interval = catalog.FieldHistoryTrackingInterval
#: Histories with at least one materializable row (a FieldId, a sequence, NULL) somewhere among random rows.
decidable = st.tuples(st.sampled_from(FIELDS + (5,)), st.integers(0, 14), st.just(None))
rows_with_work = st.tuples(st.lists(row, max_size=25), decidable, st.lists(row, max_size=25)).map(lambda t: [*t[0], t[1], *t[2]])


def expected_digest(before: dict, compat: set[int]) -> str:
    decided = [cid for cid, (fid, seq, value) in before.items() if value is None and fid is not None and seq is not None]
    d = DecidedDigest()
    d.add(Fingerprint.of_ids(decided), Fingerprint.of_ids(c for c in decided if c in compat))
    return d.hex


def targets(conn, lo: int, hi: int) -> list[tuple[str, int, int | None, int | None]]:
    """(kind, ChangeId, FieldId, sequence) of every corruption possible in ``(lo, hi]`` that flips a read result."""
    found = []
    for cid, fid, seq, value in conn.execute(
        select(Audit.c.ChangeId, Audit.c.FieldId, Audit.c.HistorySequence, readers.eligible_column()).where(
            Audit.c.ChangeId > lo, Audit.c.ChangeId <= hi
        )
    ):
        if value is not None:
            found.append(("flip_stamped", cid, fid, seq))
        elif fid is None or seq is None:
            found.append(("undecidable_to_true", cid, fid, seq))
        else:
            found.append(("flip_decision", cid, fid, seq))
    return found


def plant(conn, kind: str, cid: int, fid, seq) -> None:
    if kind == "flip_stamped":
        value = conn.scalar(select(readers.eligible_column()).where(Audit.c.ChangeId == cid))
        conn.execute(update(Audit).where(Audit.c.ChangeId == cid).values({ELIGIBLE: not value}))
    elif kind == "undecidable_to_true":
        conn.execute(update(Audit).where(Audit.c.ChangeId == cid).values({ELIGIBLE: True}))
    else:
        proven = conn.scalar(select(readers.interval_proves()).select_from(Audit).where(Audit.c.ChangeId == cid))
        if proven:
            conn.execute(delete(Interval).where(Interval.c.FieldId == fid))
        else:
            conn.execute(insert(Interval).values(FieldId=fid, StartedSequence=seq - 1))


def check_clean(engine, ivs, audit_rows, batch_size) -> None:
    load(engine, ivs, audit_rows)
    before, compat = audit_table(engine), compat_set(engine)
    result = materialize(engine, batch_size=batch_size, progress_every_s=3600)
    assert boolean_set(engine) == compat
    assert result.decided_digest == expected_digest(before, compat)
    comparison = read_comparison(engine, chunk_rows=3)
    assert comparison.equal and comparison.compat_accepted == len(compat)


def check_planted_in_a_batch(engine, data, ivs, audit_rows, batch_size) -> None:
    load(engine, ivs, audit_rows)
    before, compat = audit_table(engine), compat_set(engine)
    materializable = sum(1 for fid, seq, value in before.values() if value is None and fid is not None and seq is not None)
    batch_no = data.draw(st.integers(0, (materializable - 1) // batch_size), label="batch")
    seen: list[int] = []
    planted: dict = {}

    def seam(conn, lo, hi):
        if lo not in seen:
            seen.append(lo)
        if seen.index(lo) != batch_no:
            return
        if not planted:  # the first attempt chooses; the row-by-row attempt plants the same again
            choices = targets(conn, lo, hi)
            kind = data.draw(st.sampled_from(sorted({k for k, *_ in choices})), label="kind")
            chosen = data.draw(st.sampled_from([c for c in choices if c[0] == kind]), label="row")
            planted.update(zip(("kind", "cid", "fid", "seq"), chosen, strict=True))
            planted["lo"] = lo
        plant(conn, planted["kind"], planted["cid"], planted["fid"], planted["seq"])

    try:
        materialize(engine, batch_size=batch_size, between_read_and_write=seam)
    except ReadEquivalenceBroken as exc:
        assert planted["cid"] in [r["change_id"] for r in exc.rows], (planted, str(exc))
        assert f"ChangeId {planted['cid']}: " in str(exc), (planted, str(exc))
        event(f"caught {planted['kind']}")
    else:
        raise AssertionError(f"the planted corruption {planted} was not caught")
    after = audit_table(engine)
    assert {c: v for c, v in after.items() if c > planted["lo"]} == {c: v for c, v in before.items() if c > planted["lo"]}
    rerun = materialize(engine, batch_size=batch_size)  # nothing of the plant was kept: the rest proves clean
    assert rerun.remaining == 0 and boolean_set(engine) == compat


def check_planted_for_stage_3(engine, data, ivs, audit_rows) -> None:
    load(engine, ivs, audit_rows)
    materialize(engine, batch_size=5)
    assert read_comparison(engine).equal
    decided = [cid for cid, (fid, seq, _v) in audit_table(engine).items() if fid is not None and seq is not None]
    cid = data.draw(st.sampled_from(decided), label="row")
    with engine.begin() as conn:
        fid, seq = conn.execute(select(Audit.c.FieldId, Audit.c.HistorySequence).where(Audit.c.ChangeId == cid)).one()
        conn.execute(update(Audit).where(Audit.c.ChangeId == cid).values({ELIGIBLE: None}))
        conn.execute(insert(Interval).values(FieldId=fid, StartedSequence=seq - 1))
    comparison = read_comparison(engine, chunk_rows=data.draw(st.integers(1, 8), label="chunk"))
    assert not comparison.equal and [d["change_id"] for d in comparison.differences] == [cid]
    event("stage 3 caught the planted row")


PROPERTY = settings(max_examples=80, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
PROPERTY_MYSQL = settings(max_examples=30, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])


@PROPERTY
@given(ivs=intervals, audit_rows=rows, batch_size=st.integers(1, 7))
def test_clean_histories_prove_and_compare_equal_on_sqlite(sqlite_fh_engine, ivs, audit_rows, batch_size):
    check_clean(sqlite_fh_engine, ivs, audit_rows, batch_size)


@PROPERTY_MYSQL
@given(ivs=intervals, audit_rows=rows, batch_size=st.integers(1, 7))
def test_clean_histories_prove_and_compare_equal_on_mariadb(mysql_fh_engine, ivs, audit_rows, batch_size):
    check_clean(mysql_fh_engine, ivs, audit_rows, batch_size)


@PROPERTY
@given(data=st.data(), ivs=intervals, audit_rows=rows_with_work, batch_size=st.integers(1, 7))
def test_a_corruption_planted_in_a_batch_is_caught_and_named_on_sqlite(sqlite_fh_engine, data, ivs, audit_rows, batch_size):
    check_planted_in_a_batch(sqlite_fh_engine, data, ivs, audit_rows, batch_size)


@PROPERTY_MYSQL
@given(data=st.data(), ivs=intervals, audit_rows=rows_with_work, batch_size=st.integers(1, 7))
def test_a_corruption_planted_in_a_batch_is_caught_and_named_on_mariadb(mysql_fh_engine, data, ivs, audit_rows, batch_size):
    check_planted_in_a_batch(mysql_fh_engine, data, ivs, audit_rows, batch_size)


@PROPERTY
@given(data=st.data(), ivs=intervals, audit_rows=rows_with_work)
def test_a_corruption_planted_before_stage_3_fails_the_comparison_on_sqlite(sqlite_fh_engine, data, ivs, audit_rows):
    check_planted_for_stage_3(sqlite_fh_engine, data, ivs, audit_rows)


@PROPERTY_MYSQL
@given(data=st.data(), ivs=intervals, audit_rows=rows_with_work)
def test_a_corruption_planted_before_stage_3_fails_the_comparison_on_mariadb(mysql_fh_engine, data, ivs, audit_rows):
    check_planted_for_stage_3(mysql_fh_engine, data, ivs, audit_rows)

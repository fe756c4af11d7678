"""Property: after materialization the boolean-only reader returns exactly what the compat reader returned before.

Random histories of fields, open and closed intervals, rows with and without a
sequence, stamped TRUE/FALSE, NULL FieldId; random batch sizes. The SQL readers
are also checked against a plain-Python model of the contract's predicate.
"""

from __future__ import annotations

import datetime as dt

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import delete, insert

from nexus_cutover import catalog
from nexus_cutover.field_history.materialize import materialize

from .helpers import ELIGIBLE, audit_table, boolean_set, compat_set

FIELDS = (1, 2, 3, 4)
NOW = dt.datetime(2026, 1, 1)

interval = st.tuples(st.integers(0, 10), st.one_of(st.none(), st.integers(1, 6))).map(
    lambda t: (t[0], None if t[1] is None else t[0] + t[1])
)
intervals = st.dictionaries(st.sampled_from(FIELDS), st.lists(interval, max_size=3), max_size=len(FIELDS))
row = st.tuples(
    st.one_of(st.none(), st.sampled_from(FIELDS + (5,))),  # 5: a field with no interval row at all
    st.one_of(st.none(), st.integers(0, 14)),  # a small range, so sequences hit interval bounds often
    st.sampled_from([None, None, True, False]),
)
rows = st.lists(row, max_size=40)


def model_compat(fid, seq, value, ivs) -> bool:
    """The contract's compatibility reader, in plain Python."""
    if value is True:
        return True
    if value is not None or seq is None or fid is None:
        return False
    return any(s < seq and (e is None or seq < e) for s, e in ivs.get(fid, []))


def load(engine, ivs, audit_rows) -> None:
    with engine.begin() as conn:
        for table in (catalog.AuditFieldChange, catalog.FieldHistoryTrackingInterval):
            conn.execute(delete(table))
        iv_rows = [{"FieldId": f, "StartedSequence": s, "EndedSequence": e} for f, lst in ivs.items() for s, e in lst]
        if iv_rows:
            conn.execute(insert(catalog.FieldHistoryTrackingInterval), iv_rows)
        for cid, (fid, seq, value) in enumerate(audit_rows, start=1):
            conn.execute(
                insert(catalog.AuditFieldChange).values(
                    ChangeId=cid,
                    AuditId=cid,
                    ObjectName="Contact",
                    RecordId="r",
                    FieldId=fid,
                    HistorySequence=seq,
                    ProducerVersion="4.11.0",
                    CreatedAt=NOW,
                    **{ELIGIBLE: value},
                )
            )


def check(engine, ivs, audit_rows, batch_size) -> None:
    load(engine, ivs, audit_rows)
    before = audit_table(engine)
    compat_before = compat_set(engine)
    assert compat_before == {cid for cid, (fid, seq, value) in enumerate(audit_rows, start=1) if model_compat(fid, seq, value, ivs)}
    materialize(engine, batch_size=batch_size, progress_every_s=3600)
    after = audit_table(engine)
    assert boolean_set(engine) == compat_before
    for cid, (fid, seq, value) in before.items():
        if value is not None or seq is None or fid is None:
            assert after[cid] == before[cid], f"row {cid} must be unchanged"
        else:
            assert after[cid][2] is not None, f"row {cid} must be decided"
    assert materialize(engine, batch_size=batch_size).rows == 0


@settings(max_examples=150, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ivs=intervals, audit_rows=rows, batch_size=st.integers(1, 7))
def test_property_on_sqlite(sqlite_fh_engine, ivs, audit_rows, batch_size):
    check(sqlite_fh_engine, ivs, audit_rows, batch_size)


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(ivs=intervals, audit_rows=rows, batch_size=st.integers(1, 7))
def test_property_on_mariadb(mysql_fh_engine, ivs, audit_rows, batch_size):
    check(mysql_fh_engine, ivs, audit_rows, batch_size)

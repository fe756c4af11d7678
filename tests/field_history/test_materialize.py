"""Stage-2 materialization on MariaDB and SQLite: decisions, guards, batches, resumption."""

from __future__ import annotations

import pytest
from sqlalchemy import update

from nexus_cutover.db import make_engine
from nexus_cutover.errors import MissingSchema
from nexus_cutover.field_history.materialize import materialize
from nexus_cutover.schema import create_legacy_schema

from .conftest import make_stage1
from .helpers import ELIGIBLE, Audit, audit_table, boolean_set, compat_set, expected_after, mixed_history


def test_materialize_decides_exactly_the_materializable_rows(fh_engine):
    mixed_history().write(fh_engine)
    before = audit_table(fh_engine)
    compat_before = compat_set(fh_engine)

    result = materialize(fh_engine, batch_size=4)

    after = audit_table(fh_engine)
    for cid, (fid, seq, value) in before.items():
        if value is None and fid is not None and seq is not None:
            assert after[cid] == (fid, seq, expected_after(fid, seq)), cid
        else:
            assert after[cid] == (fid, seq, value), f"row {cid} must not be touched"
    assert boolean_set(fh_engine) == compat_before
    assert result.set_true == sum(1 for fid, seq, v in after.values() if v) - 2  # two rows were stamped TRUE before
    assert result.rows == 27 and result.remaining == 0
    assert result.batches == 7  # ceil(27 / 4)


def test_a_stamped_false_never_falls_back_to_an_interval(fh_engine):
    mixed_history().write(fh_engine)
    stamped_false = [cid for cid, (fid, seq, v) in audit_table(fh_engine).items() if v is False]
    assert stamped_false and not set(stamped_false) & compat_set(fh_engine)
    materialize(fh_engine)
    assert all(audit_table(fh_engine)[cid][2] is False for cid in stamped_false)


def test_second_run_changes_nothing(fh_engine):
    mixed_history().write(fh_engine)
    materialize(fh_engine, batch_size=5)
    once = audit_table(fh_engine)
    again = materialize(fh_engine, batch_size=5)
    assert again.rows == 0 and again.batches == 0
    assert audit_table(fh_engine) == once


def test_progress_reports_each_batch_within_the_bound(fh_engine, caplog):
    mixed_history().write(fh_engine)
    seen = []
    with caplog.at_level("INFO", logger="nexus_cutover.field_history.materialize"):
        materialize(fh_engine, batch_size=4, on_batch=seen.append)
    done = [0] + [p.rows_done for p in seen]
    assert [p.batches for p in seen] == list(range(1, 8))
    assert all(0 < b - a <= 4 for a, b in zip(done, done[1:], strict=False))
    assert seen[-1].rows_done == seen[-1].total == 27
    assert any("materialized 4/27 rows" in r.getMessage() and "rows/s, ETA" in r.getMessage() for r in caplog.records)


class Interrupt(Exception):
    pass


def test_interrupted_between_batches_then_resumed_gives_the_identical_table(tenant_url, tmp_path):
    (tmp_path / "reference.db").touch()
    reference = make_engine(f"sqlite:///{tmp_path / 'reference.db'}")
    engine = make_engine(tenant_url)
    for e in (reference, engine):
        make_stage1(e)
        mixed_history().write(e)
    materialize(reference, batch_size=3)

    def kill_after_third(progress):
        if progress.batches == 3:
            raise Interrupt

    with pytest.raises(Interrupt):
        materialize(engine, batch_size=3, on_batch=kill_after_third)
    partial = audit_table(engine)
    assert sum(1 for v in partial.values() if v[2] is not None) == 3 + 9  # 3 stamped by producers, 3 batches of 3
    resumed = materialize(engine, batch_size=3)
    assert resumed.rows == 27 - 9
    assert audit_table(engine) == audit_table(reference)
    engine.dispose()
    reference.dispose()


def test_a_row_stamped_between_batches_keeps_its_stamp(fh_engine):
    mixed_history().write(fh_engine)
    # ChangeId 25 (field 1, seq 100) would become TRUE; a producer stamps it FALSE after batch 1
    assert audit_table(fh_engine)[27] == (3, 100, None)

    def stamp(progress):
        if progress.batches == 1:
            with fh_engine.begin() as conn:
                conn.execute(update(Audit).where(Audit.c.ChangeId == 25).values({ELIGIBLE: False}))

    materialize(fh_engine, batch_size=4, on_batch=stamp)
    assert audit_table(fh_engine)[25] == (1, 100, False)


def test_missing_column_is_a_missing_schema_error(tenant_url):
    engine = make_engine(tenant_url)
    create_legacy_schema(engine)
    with pytest.raises(MissingSchema, match="FieldHistoryEligible.*target_stage=1"):
        materialize(engine)
    engine.dispose()

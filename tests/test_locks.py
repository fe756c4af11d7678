"""nexus_cutover.locks: the one acquisition order of lifecycle locks, and acquire on SQLite."""

from __future__ import annotations

import time

import pytest
from sqlalchemy import func, select

from nexus_cutover import catalog
from nexus_cutover.db import Deadline, make_engine
from nexus_cutover.errors import LockTimeout
from nexus_cutover.locks import acquire, insert_lock_row_if_absent, lifecycle_lock_names


def test_namespace_first_then_packs_ascending_without_duplicates():
    names = lifecycle_lock_names("acme", ["pk-b", "pk-a", "pk-c", "pk-a", "pk-b"])
    assert names == ["namespace/acme", "pack/pk-a", "pack/pk-b", "pack/pk-c"]


def test_the_order_does_not_depend_on_the_order_given():
    packs = ["pk-10", "pk-9", "PK-2", "pk-1"]
    expected = ["namespace/zeta", "pack/PK-2", "pack/pk-1", "pack/pk-10", "pack/pk-9"]  # PackInstallId ascending, as strings
    assert lifecycle_lock_names("zeta", packs) == expected
    assert lifecycle_lock_names("zeta", reversed(packs)) == expected
    assert lifecycle_lock_names("zeta", iter(packs)) == expected  # any iterable, consumed once


def test_namespace_alone():
    assert lifecycle_lock_names("acme") == [catalog.namespace_lock_name("acme")] == ["namespace/acme"]
    assert lifecycle_lock_names("acme", []) == ["namespace/acme"]


@pytest.fixture
def engine(sqlite_url):
    eng = make_engine(sqlite_url)
    catalog.metadata.create_all(eng, tables=[catalog.Lock])
    yield eng
    eng.dispose()


def _locked(engine, names, deadline):
    with engine.connect().execution_options(sqlite_begin="IMMEDIATE") as conn, conn.begin():
        acquire(conn, names, deadline)


def test_acquire_on_a_missing_row_raises_lock_timeout(engine):
    with pytest.raises(LockTimeout) as info:
        _locked(engine, ["namespace/acme"], Deadline(5))
    assert "lock row 'namespace/acme' disappeared" in str(info.value) and "nothing written" in str(info.value)
    assert info.value.exit_code == 4


def test_acquire_takes_existing_rows_and_stops_at_the_first_missing_one(engine):
    names = lifecycle_lock_names("acme", ["pk-1", "pk-2"])
    with engine.begin() as conn:
        for name in names[:2]:
            insert_lock_row_if_absent(conn, name)
    _locked(engine, names[:2], Deadline(5))
    with pytest.raises(LockTimeout, match="'pack/pk-2'"):
        _locked(engine, names, Deadline(5))


def test_acquire_checks_the_deadline_before_each_lock(engine):
    with engine.begin() as conn:
        insert_lock_row_if_absent(conn, "namespace/acme")
    expired = Deadline(1, started=time.monotonic() - 2)
    with pytest.raises(LockTimeout, match="timed out after 1s while waiting for lock 'namespace/acme'"):
        _locked(engine, ["namespace/acme"], expired)


def test_insert_lock_row_if_absent_is_idempotent(engine):
    for _ in range(3):
        with engine.begin() as conn:
            insert_lock_row_if_absent(conn, "namespace/acme")
    with engine.connect() as conn:
        assert conn.scalar(select(func.count()).select_from(catalog.Lock)) == 1

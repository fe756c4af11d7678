"""nexus_cutover.tx without a database: which failures each Retry flag retries, the backoff, the attempt loop's limits.

The failures are the real SQLAlchemy wrappers of PyMySQL / sqlite3 errors
(``tests/test_db.py`` builds them the same way); ``time.sleep`` is replaced so
no test waits.
"""

from __future__ import annotations

import inspect
import sqlite3
import time

import pytest

from nexus_cutover import tx
from nexus_cutover.db import Deadline
from nexus_cutover.errors import LockTimeout
from nexus_cutover.tx import Retry, attempts, retryable
from tests.test_db import mysql_error, sqlite_error

DEADLOCK = mysql_error(1213, "Deadlock found when trying to get lock; try restarting transaction")
LOCK_WAIT = mysql_error(1205, "Lock wait timeout exceeded; try restarting transaction")
SQLITE_BUSY = sqlite_error(sqlite3.OperationalError, "database is locked")
DUPLICATE = mysql_error(1062, "Duplicate entry '7' for key 'PRIMARY'")
SQLITE_DUPLICATE = sqlite_error(sqlite3.IntegrityError, "UNIQUE constraint failed: _System_Event.EventId")
OTHER = mysql_error(1146, "Table 'tenant._System_Event' doesn't exist")

ALL = Retry.DEADLOCK | Retry.LOCK_WAIT | Retry.DUPLICATE_KEY


@pytest.mark.parametrize(
    ("exc", "flag"),
    [(DEADLOCK, Retry.DEADLOCK), (LOCK_WAIT, Retry.LOCK_WAIT), (SQLITE_BUSY, Retry.LOCK_WAIT), (DUPLICATE, Retry.DUPLICATE_KEY),
     (SQLITE_DUPLICATE, Retry.DUPLICATE_KEY)],
    ids=["deadlock", "lock-wait", "sqlite-busy", "duplicate-key", "sqlite-unique"],
)
def test_each_failure_is_retried_exactly_under_its_own_flag(exc, flag):
    assert retryable(exc, flag) and retryable(exc, ALL)
    for other in (Retry.DEADLOCK, Retry.LOCK_WAIT, Retry.DUPLICATE_KEY):
        if other is not flag:
            assert not retryable(exc, other), other
    assert not retryable(exc, Retry.NONE)
    assert not retryable(exc, ALL & ~flag)


def test_duplicate_id_retries_a_primary_key_duplicate_and_never_a_receipt_key():
    receipt = mysql_error(1062, "Duplicate entry 'pk-1-a-R1' for key 'ux_Event_Receipt'")
    sqlite_receipt = sqlite_error(
        sqlite3.IntegrityError, "UNIQUE constraint failed: _System_Event.PackInstallId, _System_Event.SourceLane, _System_Event.ReceiptId"
    )
    assert retryable(DUPLICATE, Retry.DUPLICATE_ID) and retryable(SQLITE_DUPLICATE, Retry.DUPLICATE_ID)
    assert not retryable(receipt, Retry.DUPLICATE_ID) and not retryable(sqlite_receipt, Retry.DUPLICATE_ID)
    assert not retryable(DEADLOCK, Retry.DUPLICATE_ID)


@pytest.mark.parametrize("exc", [OTHER, RuntimeError("deadlock"), LockTimeout("timed out"), KeyboardInterrupt()])
def test_other_failures_are_never_retried(exc):
    assert not retryable(exc, ALL)


def test_the_default_retries_deadlocks_only():
    assert inspect.signature(attempts).parameters["retry"].default == Retry.DEADLOCK
    assert inspect.signature(tx.run).parameters["retry"].default == Retry.DEADLOCK


@pytest.fixture
def sleeps(monkeypatch):
    """The pauses tx would take (nothing sleeps)."""
    taken: list[float] = []
    monkeypatch.setattr(tx.time, "sleep", taken.append)
    return taken


def test_backoff_doubles_from_2ms_and_is_capped_at_half_a_second(monkeypatch, sleeps):
    bounds = []
    monkeypatch.setattr(tx.random, "uniform", lambda low, high: bounds.append((low, high)) or high)
    for attempt in range(0, 40):
        tx.backoff(attempt)
    assert all(low == 0 for low, _ in bounds)
    highs = [high for _, high in bounds]
    assert highs[:9] == pytest.approx([0.002, 0.004, 0.008, 0.016, 0.032, 0.064, 0.128, 0.256, 0.5])
    assert set(highs[8:]) == {0.5} and sleeps == highs


def test_backoff_is_jittered_within_its_bound(sleeps):
    for attempt in (1, 3, 10, 10**6):  # a huge attempt number neither overflows nor exceeds the cap
        for _ in range(50):
            tx.backoff(attempt)
    assert all(0 <= s <= 0.5 for s in sleeps) and len(set(sleeps)) > 1


def test_a_first_success_takes_one_attempt_and_no_pause(sleeps):
    seen = []
    for attempt in attempts("doing x", deadline=Deadline(5)):
        with attempt:
            seen.append(attempt.number)
    assert seen == [1] and sleeps == []


def test_a_retryable_failure_reruns_the_block_after_a_pause(sleeps):
    failures = [DEADLOCK, DEADLOCK]
    seen = []
    for attempt in attempts("doing x", deadline=Deadline(5)):
        with attempt:
            seen.append(attempt.number)
            if failures:
                raise failures.pop()
    assert seen == [1, 2, 3] and len(sleeps) == 2


def test_a_failure_outside_the_flags_propagates_at_once(sleeps):
    seen = []
    with pytest.raises(type(LOCK_WAIT)) as info:
        for attempt in attempts("doing x", deadline=Deadline(5), retry=Retry.DEADLOCK):
            with attempt:
                seen.append(attempt.number)
                raise LOCK_WAIT
    assert info.value is LOCK_WAIT and seen == [1] and sleeps == []


def test_also_names_more_retryable_classes(sleeps):
    class Conflict(Exception):
        pass

    seen = []
    for attempt in attempts("doing x", deadline=Deadline(5), retry=Retry.NONE, also=(Conflict,)):
        with attempt:
            seen.append(attempt.number)
            if len(seen) < 3:
                raise Conflict()
    assert seen == [1, 2, 3]


def test_lock_timeout_after_max_attempts(sleeps):
    seen = []
    with pytest.raises(LockTimeout) as info:
        for attempt in attempts("allocating an id", deadline=Deadline(60), retry=ALL, max_attempts=4):
            with attempt:
                seen.append(attempt.number)
                raise DUPLICATE
    assert seen == [1, 2, 3, 4] and len(sleeps) == 3
    assert str(info.value) == "gave up after 4 conflicting attempts while allocating an id; nothing written"
    assert info.value.__cause__ is DUPLICATE and info.value.exit_code == 4


def test_lock_timeout_when_the_deadline_passed_between_attempts(sleeps):
    deadline = Deadline(10)
    seen = []
    with pytest.raises(LockTimeout) as info:
        for attempt in attempts("arming the fence", deadline=deadline, retry=Retry.LOCK_WAIT):
            with attempt:
                seen.append(attempt.number)
                deadline.started = time.monotonic() - 11  # the attempt used up the deadline
                raise LOCK_WAIT
    assert seen == [1] and sleeps == []
    assert str(info.value).startswith("timed out after 10s while arming the fence (last conflict: (1205, 'Lock wait timeout")
    assert info.value.__cause__ is LOCK_WAIT and info.value.exit_code == 4


def test_no_attempt_starts_after_the_deadline(sleeps):
    expired = Deadline(1, started=time.monotonic() - 2)
    with pytest.raises(LockTimeout, match="timed out after 1s while doing x; nothing written"):
        for attempt in attempts("doing x", deadline=expired):
            with attempt:
                pytest.fail("an attempt ran after the deadline")

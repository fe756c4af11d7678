"""The waits' schedule of looks (:mod:`nexus_cutover.polling`): soon at first, then every poll_interval."""

from __future__ import annotations

import itertools

import pytest

from nexus_cutover.polling import FIRST_GAP_S, gaps, settled_after


def test_gaps_double_from_one_second_up_to_the_interval_and_stay_there():
    assert list(itertools.islice(gaps(10), 7)) == [1.0, 2.0, 4.0, 8.0, 10.0, 10.0, 10.0]
    assert list(itertools.islice(gaps(30), 7)) == [1.0, 2.0, 4.0, 8.0, 16.0, 30.0, 30.0]


@pytest.mark.parametrize("interval", [0, 0.25, 1, 3.5, 10, 30, 3600])
def test_no_gap_is_ever_above_the_interval_and_the_schedule_reaches_it(interval):
    schedule = list(itertools.islice(gaps(interval), 20))
    assert all(0 <= g <= interval for g in schedule)
    assert schedule[0] == min(FIRST_GAP_S, interval) and schedule[-1] == interval
    assert schedule == sorted(schedule)


def test_settled_after_is_the_sum_of_the_gaps_shorter_than_the_interval():
    assert settled_after(10) == 1 + 2 + 4 + 8
    assert settled_after(30) == 1 + 2 + 4 + 8 + 16
    assert settled_after(1) == 0 and settled_after(0) == 0


def test_wait_until_looks_until_the_wait_ends_or_its_bound_runs_out():
    """The command line's one wait loop (issue 35, item 4): spaced by gaps(), ended by the look or by the bound."""
    from nexus_cutover.polling import wait_until

    now, slept, looks = [0.0], [], iter([3, 2, 1, 0])

    def sleep(s: float) -> None:
        slept.append(s)
        now[0] += s

    result, ran_out = wait_until(lambda: next(looks), lambda left: left > 0, poll_interval=4, sleep=sleep,
                                 clock=lambda: now[0])
    assert (result, ran_out, slept) == (0, False, [1.0, 2.0, 4.0])
    now[0], slept[:] = 0.0, []
    result, ran_out = wait_until(lambda: 5, lambda left: left > 0, poll_interval=4, timeout_s=6, sleep=sleep,
                                 clock=lambda: now[0])
    assert (result, ran_out, slept) == (5, True, [1.0, 2.0, 4.0])  # looked at 0, 1, 3 and 7 s: past 6 s, it stops

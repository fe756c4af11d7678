"""How a wait spaces its looks: soon at first, then every ``poll_interval``.

Every wait of a cutover (the drain, the old writers, the new host's
readiness) looks again 1 s after its first look, then 2 s, 4 s, ... until the
gap reaches the run's ``poll_interval``, where it stays. A host that is ready
two seconds after it was started is seen then, not one whole interval later:
that interval was most of the CLI's admission pause (10.7 s of 10.7 s at
``poll_interval`` 10 s, docs/performance.md), and every second of it is a
second in which the tenant admits nothing. A wait that lasts costs the same
looks as before after its first few, so a triggerer holding a thousand
waiting tenants pays for the early looks once per wait, not per interval.

The CLI's waits and the deferred sensors' trigger use this one schedule; the
``poke``/``reschedule`` sensor modes keep Airflow's own fixed ``poke_interval``.
:func:`wait_until` is the command line's one wait loop (``run``'s waiting steps,
``drain --wait``); the trigger runs the same schedule on the triggerer's event loop.
"""

from __future__ import annotations

import time
from collections.abc import Callable, Iterator
from typing import TypeVar

T = TypeVar("T")

FIRST_GAP_S = 1.0


def gaps(poll_interval: float) -> Iterator[float]:
    """The seconds to wait before each next look: 1, 2, 4, ... capped at ``poll_interval`` (never above it)."""
    cap = max(float(poll_interval), 0.0)
    gap = min(FIRST_GAP_S, cap)
    while True:
        yield gap
        gap = min(gap * 2, cap)


def settled_after(poll_interval: float) -> float:
    """Seconds from a wait's first look until its gaps reach ``poll_interval`` (where a steady state starts)."""
    total, schedule = 0.0, gaps(poll_interval)
    while (gap := next(schedule)) < poll_interval:
        total += gap
    return total


def wait_until(look: Callable[[], T], waiting: Callable[[T], bool], *, poll_interval: float,
               timeout_s: float | None = None, sleep: Callable[[float], None] = time.sleep,
               clock: Callable[[], float] = time.monotonic) -> tuple[T, bool]:
    """Look (``look()``) until ``waiting(result)`` is False, spaced by :func:`gaps`, or until ``timeout_s`` has
    passed since the first look (None: no bound of its own, the look's verdict ends it): the last result, and
    whether the bound ran out while it was still waiting."""
    started, schedule = clock(), gaps(poll_interval)
    while True:
        result = look()
        if not waiting(result):
            return result, False
        if timeout_s is not None and clock() - started >= timeout_s:
            return result, True
        sleep(next(schedule))


def measured_rate(samples: list[tuple[float, int]]) -> float | None:
    """Items done per minute over ``samples`` ((seconds, remaining), oldest first): the drop from the first
    to the last sample over their span; None until two samples lie apart in time. Negative when work grew."""
    if len(samples) < 2 or samples[-1][0] <= samples[0][0]:
        return None
    return (samples[0][1] - samples[-1][1]) * 60.0 / (samples[-1][0] - samples[0][0])


def eta_seconds(remaining: int, rate_per_min: float | None) -> float | None:
    """Seconds until ``remaining`` reaches 0 at ``rate_per_min`` (0 when none remains; None while not shrinking
    or not measured yet)."""
    if remaining <= 0:
        return 0.0
    if rate_per_min is None or rate_per_min <= 0:
        return None
    return remaining * 60.0 / rate_per_min

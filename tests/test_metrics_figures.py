"""What a step's result and its exception say as ``nexus.*`` figures (:mod:`nexus_cutover.metrics`), without Airflow
running: the failure reasons, the fence's arming time, the rollout's halted gauge."""

from __future__ import annotations

import datetime as dt

import pytest

from nexus_cutover.metrics import (
    ADMISSION_PAUSE,
    FAILURE_REASONS,
    FENCE_ARMED_AT,
    epoch_seconds,
    failure_reason,
)
from nexus_cutover.recording import step_figures


class AirflowSensorTimeout(Exception):
    """Named as Airflow's own timeouts are (the reason is read from the name: any ``*Timeout*`` exception)."""


@pytest.mark.parametrize(("exc", "reason"), [
    (SystemExit(2), "bad_input"), (SystemExit(3), "refused"), (SystemExit(4), "timeout"),
    (SystemExit(1), "error"), (SystemExit("text"), "error"), (AirflowSensorTimeout("x"), "timeout"),
    (RuntimeError("db gone"), "error"), (None, "error"),
])
def test_a_failure_is_counted_by_its_reason(exc, reason):
    assert failure_reason(exc) == reason and reason in FAILURE_REASONS


def test_the_fence_arming_time_is_sent_while_held_and_zero_once_released():
    armed = "2026-12-05T10:00:00.250000"  # naive UTC, as the fence row's column holds it
    epoch = dt.datetime(2026, 12, 5, 10, 0, 0, 250000, tzinfo=dt.UTC).timestamp()
    assert epoch_seconds(armed) == epoch == epoch_seconds(dt.datetime(2026, 12, 5, 10, 0, 0, 250000))
    for outcome in ("armed", "adopted", "reused"):
        assert step_figures("arm_fence", {"outcome": outcome, "armed_at": armed}) == [(FENCE_ARMED_AT, epoch)]
    assert step_figures("arm_fence", {"outcome": "would_arm", "armed_at": None}) == []
    released = {"outcome": "released", "armed_at": armed, "admission_pause_s": 12.5}
    assert step_figures("resume_admission", released) == [(ADMISSION_PAUSE, 12.5), (FENCE_ARMED_AT, 0.0)]

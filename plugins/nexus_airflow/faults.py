"""The one test seam of the Airflow plugins: every way a test reaches inside a task is here, inactive by default.

* :func:`fault_point` / :func:`pause_point`: fault injection and pauses (below);
* :func:`materialize_batch_pause`: the pause inside one stage-2 materialization batch's transaction;
* :func:`poll_floor_s`: the floor of every poll interval, lowered by the in-process test harness.

The domain's own seams are parameters its tests pass (``on_created``, ``on_chunk``, ``between_check_and_act``,
``between_read_and_write``): a production caller passes none, except through the functions here.

Fault-injection points for the rerun tests (inactive unless ``NEXUS_AIRFLOW_FAULT`` names one).

Each task calls :func:`fault_point` right after its first write (or mid-way
where it writes nothing). Setting ``NEXUS_AIRFLOW_FAULT=<point>`` in the task's
environment makes that call raise :class:`InjectedFault`, which is how the tests
prove that clearing and rerunning a task that died mid-way converges.

Test-only, for the stack tests (real processes, real signals): with
``NEXUS_AIRFLOW_PAUSE_DIR=<dir>`` in the workers' environment, a fault point whose
name is a file in that directory holds the task there (writing ``<name>.reached``
with its pid) until the file is removed, at most :data:`PAUSE_MAX_S`; so a test can
SIGKILL the worker at that exact point. Unset (the default), it does nothing.

Their three variables (``NEXUS_AIRFLOW_FAULT``, ``NEXUS_AIRFLOW_PAUSE_DIR``, ``NEXUS_MIN_POLL_INTERVAL_S``) are test
hooks, no settings: read from the environment only, here only (:data:`TEST_HOOKS`), and not in Airflow's ``[nexus]``
section (:mod:`nexus_cutover.settings`): a deployment has no business setting them.
"""

from __future__ import annotations

import os

FAULT_ENV = "NEXUS_AIRFLOW_FAULT"
PAUSE_DIR_ENV = "NEXUS_AIRFLOW_PAUSE_DIR"
POLL_FLOOR_ENV = "NEXUS_MIN_POLL_INTERVAL_S"
#: The environment variables read here, test hooks (tests/test_architecture.py allows these reads, nothing else).
TEST_HOOKS = (FAULT_ENV, PAUSE_DIR_ENV, POLL_FLOOR_ENV)
PAUSE_MAX_S = 600.0


class InjectedFault(RuntimeError):
    pass


def fault_point(name: str) -> None:
    pause_point(name)
    if os.environ.get(FAULT_ENV) == name:
        raise InjectedFault(f"injected fault at {name} ({FAULT_ENV}); clear the task to rerun it")


def pause_point(name: str) -> None:
    """Hold here while ``$NEXUS_AIRFLOW_PAUSE_DIR/<name>`` exists (test-only; see the module docstring)."""
    folder = os.environ.get(PAUSE_DIR_ENV)
    if not folder:
        return
    gate = os.path.join(folder, name)
    if not os.path.exists(gate):
        return
    import time

    with open(gate + ".reached", "w") as f:
        f.write(str(os.getpid()))
    deadline = time.monotonic() + PAUSE_MAX_S
    while os.path.exists(gate) and time.monotonic() < deadline:
        time.sleep(0.5)


def materialize_batch_pause():
    """With ``NEXUS_AIRFLOW_PAUSE_DIR`` set (the stack tests), the k-th batch of one materialization call holds
    inside its transaction, after its read and before its writes, at the pause point ``stage_2_materialize.batch_<k>``
    (a retried attempt of a batch keeps its k). Unset (production): None, no seam is passed."""
    if not os.environ.get(PAUSE_DIR_ENV):
        return None
    numbers: dict = {}

    def seam(_conn, lo, _hi) -> None:
        pause_point(f"stage_2_materialize.batch_{numbers.setdefault(lo, len(numbers) + 1)}")

    return seam


def poll_floor_s() -> int:
    """The runbook's floor for poll intervals, 10 s (apache/airflow#71172: very short pokes can be marked failed);
    the in-process test harness lowers it with ``NEXUS_MIN_POLL_INTERVAL_S`` (tests/conftest.py)."""
    return int(os.environ.get(POLL_FLOOR_ENV, "10"))

"""Fault-injection points for the rerun tests (inactive unless ``NEXUS_AIRFLOW_FAULT`` names one).

Each task calls :func:`fault_point` right after its first write (or mid-way
where it writes nothing). Setting ``NEXUS_AIRFLOW_FAULT=<point>`` in the task's
environment makes that call raise :class:`InjectedFault`, which is how the tests
prove that clearing and rerunning a task that died mid-way converges.

Test-only, for the stack tests (real processes, real signals): with
``NEXUS_AIRFLOW_PAUSE_DIR=<dir>`` in the workers' environment, a fault point whose
name is a file in that directory holds the task there (writing ``<name>.reached``
with its pid) until the file is removed, at most :data:`PAUSE_MAX_S`; so a test can
SIGKILL the worker at that exact point. Unset (the default), it does nothing.
"""

from __future__ import annotations

import os

FAULT_ENV = "NEXUS_AIRFLOW_FAULT"
PAUSE_DIR_ENV = "NEXUS_AIRFLOW_PAUSE_DIR"
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

"""Fault-injection points for the rerun tests (inactive unless ``NEXUS_AIRFLOW_FAULT`` names one).

Each task calls :func:`fault_point` right after its first write (or mid-way
where it writes nothing). Setting ``NEXUS_AIRFLOW_FAULT=<point>`` in the task's
environment makes that call raise :class:`InjectedFault`, which is how the tests
prove that clearing and rerunning a task that died mid-way converges.
"""

from __future__ import annotations

import os

FAULT_ENV = "NEXUS_AIRFLOW_FAULT"


class InjectedFault(RuntimeError):
    pass


def fault_point(name: str) -> None:
    if os.environ.get(FAULT_ENV) == name:
        raise InjectedFault(f"injected fault at {name} ({FAULT_ENV}); clear the task to rerun it")

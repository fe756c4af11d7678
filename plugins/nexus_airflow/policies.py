"""Airflow cluster policies of nexus-cutover: the heavy reads of a run go to its database cluster's pool, the tasks of
its admission pause to the armed pool.

Invariant: a task instance of a step declared heavy (:data:`nexus_airflow.declared.HEAVY_READS`) runs in the pool
its run's conf names (``read_pool``: the tenant's database cluster's pool, set by the form, or by a rollout from the
tenant connection's extra ``nexus_read_pool``); every other task instance, and a run naming no pool, keeps the
task's own pool (Airflow's ``default_pool``). So a fleet's digests and materializations on one cluster take at
most that pool's slots at once, whatever the number of tenants in flight.

Invariant: a task instance of a run's admission pause (after its fence step, up to and including its release:
:data:`nexus_airflow.declared.ARMED_WINDOWS`), not a dry run's, runs in the pool ``nexus_armed`` when it exists
(sized as ``[nexus] armed_slots``: :mod:`nexus_airflow.armed_slots`), counted apart from unarmed work: with
``default_pool`` sized to the worker slots less ``nexus_armed``'s (the deployment's settings), no unarmed task takes
the slot an armed tenant's next task needs. Without that pool a task keeps its own. A heavy read's ``read_pool``
comes first (none is inside the window today).

A pool that does not exist is not used: Airflow never schedules a task instance of a missing pool, and a heavy
read runs inside a tenant's admission pause, so a typo would hold the tenant fenced for ever. The task instance
keeps its own pool and the process that creates it (the scheduler or the API server) logs a warning naming the
pool and how to create it.

The hook runs where Airflow creates task instances, inside that transaction: it reads the task instance, its
run's conf and, through the run's own session, whether the pool exists (no connection, no Variable). Registered
with Airflow by the wheel's ``airflow.policy`` entry point (:mod:`nexus_airflow.policy_hooks`): every Airflow
process that has the wheel installed applies it, whatever its ``airflow_local_settings``.
"""

from __future__ import annotations

import logging
from collections.abc import Mapping
from typing import Any

from nexus_airflow.armed_slots import ARMED_POOL
from nexus_airflow.declared import ARMED_WINDOWS, HEAVY_READS
from nexus_airflow.params import is_pool_name

log = logging.getLogger(__name__)


def read_pool_of(dag_id: str, task_id: str, conf: Mapping[str, Any] | None) -> str | None:
    """The pool the task instance ``dag_id.task_id`` of a run with ``conf`` runs in; None: its task's own."""
    if task_id not in HEAVY_READS.get(dag_id, ()) or not conf:
        return None
    pool = conf.get("read_pool")
    return pool if is_pool_name(pool) else None


def armed_pool_of(dag_id: str, task_id: str, conf: Mapping[str, Any] | None) -> str | None:
    """:data:`~nexus_airflow.armed_slots.ARMED_POOL` for a task of a run's admission pause (after its fence step, up
    to its release: :data:`~nexus_airflow.declared.ARMED_WINDOWS`) unless the run is a dry run; else None."""
    window = ARMED_WINDOWS.get(dag_id)
    if window is None or task_id not in window[2] or (conf or {}).get("dry_run"):
        return None
    return ARMED_POOL


def task_instance_mutation_hook(task_instance, dag_run=None) -> None:
    """Airflow's hook (called as task instances are created): a heavy read goes to its run's ``read_pool``, a task
    of the admission pause to the armed pool (each when that pool exists)."""
    conf = getattr(dag_run, "conf", None)
    pool = read_pool_of(task_instance.dag_id, task_instance.task_id, conf)
    if not pool:
        armed = armed_pool_of(task_instance.dag_id, task_instance.task_id, conf)
        if armed and pool_exists(armed, dag_run):  # no pool nexus_armed: the deployment does not use one
            task_instance.pool = armed
        return
    if pool_exists(pool, dag_run) is False:
        log.warning("nexus-cutover: %s.%s of run %s runs in its own pool %s: the run's read_pool %r does not exist "
                    "(create it: airflow pools set %s <slots> <description>)", task_instance.dag_id,
                    task_instance.task_id, getattr(dag_run, "run_id", "?"), task_instance.pool, pool, pool)
        return
    task_instance.pool = pool


def pool_exists(pool: str, dag_run) -> bool | None:
    """Whether Airflow has the pool ``pool`` (:func:`nexus_airflow.compat.pool_exists`: read on the transaction that
    is creating the run's task instances); None when the run has no session to read on."""
    from nexus_airflow.compat import pool_exists as exists

    return exists(pool, dag_run)

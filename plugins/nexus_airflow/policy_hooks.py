"""nexus-cutover's cluster policy, registered with Airflow through the ``airflow.policy`` entry point (pyproject.toml).

Airflow's own way for a distribution to ship a policy (``airflow.settings.load_policy_plugins`` loads every
``airflow.policy`` entry point in every Airflow process): installing the wheel is all a deployment does; no
``airflow_local_settings.py`` of its own needs to import anything for it. The one hook,
:func:`task_instance_mutation_hook`, is :func:`nexus_airflow.policies.task_instance_mutation_hook` (a run's heavy
reads in its database cluster's pool), imported when first called so that no Airflow process's start depends on the
nexus modules beyond this one.
"""

from __future__ import annotations

from airflow.policies import hookimpl


@hookimpl
def task_instance_mutation_hook(task_instance, dag_run) -> None:
    """Airflow's hook as task instances are created: a heavy read goes to its run's ``read_pool``."""
    from nexus_airflow.policies import task_instance_mutation_hook as heavy_reads_to_their_pool

    heavy_reads_to_their_pool(task_instance, dag_run)

"""Airflow's local settings for nexus-cutover (imported by every Airflow process from the plugins folder on
``sys.path``):

* the cluster policy that runs a tenant's heavy reads in its database cluster's pool
  (:mod:`nexus_airflow.policies`);
* in a Celery worker, the nexus modules imported once before the worker forks its tasks
  (:mod:`nexus_airflow.preload`, on Celery's ``import_modules`` signal, beside Airflow's own preload).

A deployment with an ``airflow_local_settings`` of its own (in ``$AIRFLOW_HOME/config``, which comes first on
``sys.path``) adds both to it (docs/runbook.md). The policy is imported when first called, so no Airflow
process's start depends on the nexus packages; connecting the preload costs an import of ``celery.signals``."""


def task_instance_mutation_hook(task_instance, dag_run=None):
    """:func:`nexus_airflow.policies.task_instance_mutation_hook`."""
    from nexus_airflow.policies import task_instance_mutation_hook as heavy_reads_to_their_pool

    heavy_reads_to_their_pool(task_instance, dag_run)


def _connect_preload() -> None:
    try:
        from nexus_airflow.preload import connect_to_celery
    except ImportError:  # the nexus plugins are not on this process's path: nothing to preload
        return
    connect_to_celery()


_connect_preload()

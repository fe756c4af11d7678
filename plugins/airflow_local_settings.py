"""Airflow's local settings for nexus-cutover, shipped in the wheel as ``nexus_cutover_airflow.airflow_local_settings``.
A deployment's own ``$AIRFLOW_HOME/config/airflow_local_settings.py`` (which every Airflow process imports) adds it with
``from nexus_cutover_airflow.airflow_local_settings import *`` (README, "Install into your Airflow"); a plugins folder
that is this repository's ``plugins/`` still finds it on ``sys.path`` as before:

* the cluster policy that runs a tenant's heavy reads in its database cluster's pool
  (:mod:`nexus_airflow.policies`);
* in a Celery worker, the nexus modules imported once before the worker forks its tasks
  (:mod:`nexus_airflow.preload`, on Celery's ``import_modules`` signal, beside Airflow's own preload).

A deployment whose settings file has a ``task_instance_mutation_hook`` of its own calls this one from it. The policy
is imported when first called, so no Airflow process's start depends on the nexus packages; connecting the preload
costs an import of ``celery.signals``."""


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

"""Airflow's local settings for nexus-cutover, shipped in the wheel as ``nexus_cutover_airflow.airflow_local_settings``.
A deployment's own ``$AIRFLOW_HOME/config/airflow_local_settings.py`` (which every Airflow process imports) adds it with
``from nexus_cutover_airflow.airflow_local_settings import *`` (README, "Install into your Airflow"); a plugins folder
that is this repository's ``plugins/`` still finds it on ``sys.path`` as before:

* in a Celery worker, the nexus modules imported once before the worker forks its tasks
  (:mod:`nexus_airflow.preload`, on Celery's ``import_modules`` signal, beside Airflow's own preload): a speed-up,
  nothing depends on it.

The cluster policy (a tenant's heavy reads in its database cluster's pool) is not here: the wheel registers it
through Airflow's ``airflow.policy`` entry point (:mod:`nexus_airflow.policy_hooks`), so it holds whether or not a
deployment imports this file. Connecting the preload costs an import of ``celery.signals``."""


def _connect_preload() -> None:
    try:
        from nexus_airflow.preload import connect_to_celery
    except ImportError:  # the nexus plugins are not on this process's path: nothing to preload
        return
    connect_to_celery()


_connect_preload()

"""Airflow's local settings for nexus-cutover (imported by every Airflow process from the plugins folder on
``sys.path``): the cluster policy that runs a tenant's heavy reads in its database cluster's pool.

A deployment with an ``airflow_local_settings`` of its own (in ``$AIRFLOW_HOME/config``, which comes first on
``sys.path``) adds this function to it. The policy is imported when first called, so no Airflow process's start
depends on the nexus packages."""


def task_instance_mutation_hook(task_instance, dag_run=None):
    """:func:`nexus_airflow.policies.task_instance_mutation_hook`."""
    from nexus_airflow.policies import task_instance_mutation_hook as heavy_reads_to_their_pool

    heavy_reads_to_their_pool(task_instance, dag_run)

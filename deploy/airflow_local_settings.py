"""A deployment's ``$AIRFLOW_HOME/config/airflow_local_settings.py`` with nexus-cutover's local settings: the heavy-reads
cluster policy and the Celery workers' preload of the nexus modules (deploy/Dockerfile copies it there; the Helm
chart's ``airflowLocalSettings`` in deploy/helm-values.yaml says the same). With settings of your own, add this import
to them; a ``task_instance_mutation_hook`` of your own calls the product's from it."""

from nexus_cutover_airflow.airflow_local_settings import *  # noqa: F403

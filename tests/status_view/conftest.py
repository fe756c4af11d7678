"""The status view tests' process environment: :mod:`tests.dags.airflow_harness` first (a temporary
``AIRFLOW_HOME`` before anything imports Airflow), so the in-process tests open ``nexus_tenant_*``
connections from ``AIRFLOW_CONN_*`` variables; the stack tests' ``airflow standalone`` gets its own
environment (``scripts.demo_airflow.AirflowStack`` drops inherited Airflow settings)."""

from __future__ import annotations

import tests.dags.airflow_harness  # noqa: F401 - imported for its environment setup, first

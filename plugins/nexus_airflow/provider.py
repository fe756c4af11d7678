"""The provider description Airflow reads through the ``apache_airflow_provider`` entry point (pyproject.toml).

It puts nexus-cutover on the Providers page with the version that is installed (one source: pyproject's ``version``,
``nexus_cutover.__version__``) and names the notifier and the hook for Airflow's listings. The tenant
connections keep the ``mysql`` and ``sqlite`` connection types of their own providers, so no connection type is
declared here. The plugin (the status view) registers through the ``airflow.plugins`` entry point, not here, so Airflow
loads it once. Called while Airflow reads its configuration: it imports nothing of Airflow's.

``config`` is the ``[nexus]`` section, made from the one declaration of the product's settings
(:func:`nexus_cutover.settings.provider_config`): ``airflow config list --section nexus`` shows each option, a
DSN hidden as sensitive, and ``AIRFLOW__NEXUS__<NAME>`` sets it.
"""

from __future__ import annotations

import nexus_cutover
from nexus_cutover import settings


def get_provider_info() -> dict:
    return {
        "package-name": "nexus-cutover",
        "name": "Nexus cutover",
        "description": "Per-tenant CRM database cutovers (connector projection ranges, Field History eligibility).",
        "versions": [nexus_cutover.__version__],
        "integrations": [{"integration-name": "Nexus tenant database", "tags": ["service"]}],
        "hooks": [{"integration-name": "Nexus tenant database", "python-modules": ["nexus_airflow.hooks"]}],
        "notifications": ["nexus_airflow.notify.CutoverNotifier"],
        "config": settings.provider_config(),
    }

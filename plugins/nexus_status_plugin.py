"""Registers the tenant status view (``plugins/nexus_status``): a FastAPI app and two nav entries (tenants, rollouts)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from nexus_status.app import app

URL_PREFIX = "/nexus-status"


class NexusStatusPlugin(AirflowPlugin):
    name = "nexus_status"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Nexus tenant status"}]
    external_views = [
        {
            "name": "Nexus tenants",
            "href": f"{URL_PREFIX}/",
            "destination": "nav",
            "category": "browse",
            "url_route": "nexus-tenants",
        },
        {
            "name": "Nexus rollouts",
            "href": f"{URL_PREFIX}/rollouts",
            "destination": "nav",
            "category": "browse",
            "url_route": "nexus-rollouts",
        },
    ]

"""Registers the tenant status view (``plugins/nexus_status``): a FastAPI app and two nav entries (tenants, rollouts),
and the API server middleware that makes a refused trigger form's answer readable (``nexus_status.form_errors``)."""

from __future__ import annotations

from airflow.plugins_manager import AirflowPlugin
from nexus_status.app import app
from nexus_status.form_errors import ReadableFormErrors

URL_PREFIX = "/nexus-status"


class NexusStatusPlugin(AirflowPlugin):
    name = "nexus_status"
    fastapi_apps = [{"app": app, "url_prefix": URL_PREFIX, "name": "Nexus tenant status"}]
    fastapi_root_middlewares = [{"middleware": ReadableFormErrors, "name": "Readable trigger-form errors"}]
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

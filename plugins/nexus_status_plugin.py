"""Registers the tenant status view (``plugins/nexus_status``): a FastAPI app and two nav entries (tenants, rollouts),
the API server middleware that makes a refused trigger form's answer readable (``nexus_status.form_errors``), and, in the
API server, one HITL question per try (``nexus_airflow.compat.install_question_per_try``: a cleared confirmation asks
with its own evidence; ``NEXUS_AIRFLOW_COMPAT_QUESTION_PER_TRY=0`` leaves Airflow's sessions untouched).

Airflow loads every plugin in every process it starts, each task's included (to integrate macros and listeners);
only the API server reads ``fastapi_apps`` and ``fastapi_root_middlewares``. So the FastAPI app and the middleware
are imported when those are first read, never at import: importing the app pulls in FastAPI and the API server's
security modules (~550 modules, ~0.9 s of CPU), which every task process of a cutover paid before
(docs/performance.md, "Every task loaded the status view"). ``plugins/.airflowignore`` keeps the plugin manager
from running the packages' own files as plugin modules.
"""

from __future__ import annotations

from functools import cached_property

from airflow.plugins_manager import AirflowPlugin

URL_PREFIX = "/nexus-status"


class NexusStatusPlugin(AirflowPlugin):
    name = "nexus_status"
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

    @cached_property
    def fastapi_apps(self) -> list[dict]:
        from nexus_status.app import app

        from nexus_airflow.compat import install_question_per_try

        install_question_per_try()  # a cleared HITL task asks its own question (issue 34.4): the API server clears tasks

        return [{"app": app, "url_prefix": URL_PREFIX, "name": "Nexus tenant status"}]

    @cached_property
    def fastapi_root_middlewares(self) -> list[dict]:
        from nexus_status.form_errors import ReadableFormErrors

        return [{"middleware": ReadableFormErrors, "name": "Readable trigger-form errors"}]

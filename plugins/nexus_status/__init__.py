"""The tenant status view: an Airflow 3 plugin page (FastAPI app + a nav entry) over the tenant connections.

``state`` reads one tenant through :mod:`nexus_cutover` (no Airflow), ``tenants``
finds the tenant connections and opens them through ``NexusTenantHook``,
``history`` keeps the recent drain samples for the chart, ``app`` serves the
page and its JSON. Registered by ``plugins/nexus_status_plugin.py``.
"""

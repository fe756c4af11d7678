"""The settings page of the status view: every ``[nexus]`` setting as the API server reads it, with its source.

What a person asks when a run behaves unexpectedly is "which value is in force, and who set it": each setting shows
its value (a secret only as set or unset), where it came from (``AIRFLOW__NEXUS__<NAME>``, its ``NEXUS_*`` alias,
Airflow's configuration, or the default) and what it sets. The values are the API server's own; a worker, a
triggerer or the command line reads its own environment (the page says so).
"""

from __future__ import annotations

import html
from typing import Any

COLUMNS = ("name", "value", "source", "default", "alias", "description")


def page(rows: list[dict[str, Any]]) -> str:
    """The settings as an HTML page (every cell escaped)."""
    head = "".join(f"<th>{html.escape(c)}</th>" for c in COLUMNS)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(c) if r.get(c) is not None else 'unset'))}</td>"
                                    for c in COLUMNS) + "</tr>" for r in rows)
    return ("<!doctype html><html><head><meta charset='utf-8'><title>Nexus settings</title><style>"
            "body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;width:100%;table-layout:fixed}"
            "td,th{border:1px solid #ccc;padding:4px;text-align:left;vertical-align:top;overflow-wrap:anywhere}"
            "</style></head><body><h1>Nexus settings</h1><p>Each <code>[nexus]</code> setting as this API server "
            "reads it: set as <code>AIRFLOW__NEXUS__&lt;NAME&gt;</code>, as its <code>NEXUS_*</code> alias, in "
            "Airflow's configuration (<code>airflow.cfg [nexus]</code>, a secrets backend), or its default, in that "
            "order. Workers, triggerers and the command line read their own environment. The product's Airflow "
            "Variables (<code>nexus_notify_conn_id</code>, <code>nexus_host_command</code>) are in Admin, "
            f"Variables.</p><table><tr>{head}</tr>{body}</table></body></html>")

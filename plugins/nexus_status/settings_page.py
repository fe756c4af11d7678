"""The settings page of the status view: every ``[nexus]`` setting as the API server reads it, with its source.

What a person asks when a run behaves unexpectedly is "which value is in force, and who set it": each setting shows
its value (a secret only as set or unset), where it came from (``AIRFLOW__NEXUS__<NAME>``, its ``NEXUS_*`` alias,
Airflow's configuration, or the default) and what it sets. The values are the API server's own; a worker, a
triggerer or the command line reads its own environment (the page says so).

Below them, the product's Airflow Variables (:data:`nexus_airflow.variables.VARIABLES`), read from Airflow's
metadata database: each one's value (credentials in a URL masked) or ``unset``, and for a per-run Variable the
number of runs that have one.
"""

from __future__ import annotations

import html
from typing import Any

COLUMNS = ("name", "value", "source", "default", "alias", "description")
VARIABLE_COLUMNS = ("variable", "value", "source", "description")


def variable_rows(session) -> list[dict[str, Any]]:
    """Each declared Variable as this Airflow stores it, in three indexed reads whatever the number of runs: the
    fixed Variables by key, and one count per per-run prefix. A value shows with a URL's password masked (a person
    allowed on this page may read Variables in Admin too)."""
    from sqlalchemy import func, select

    from nexus_airflow.compat import model
    from nexus_airflow.variables import VARIABLES
    from nexus_cutover.notices import scrub

    variable = model("Variable")
    fixed = [v.key for v in VARIABLES if not v.per_run]
    stored = {row.key: row for row in session.execute(select(variable).where(variable.key.in_(fixed))).scalars()}
    prefixes = [v.key for v in VARIABLES if v.per_run]
    runs = select(func.count()).select_from(variable)
    counts = {p: session.execute(runs.where(variable.key.startswith(p, autoescape=True))).scalar_one() for p in prefixes}
    rows = []
    for v in VARIABLES:
        if v.per_run:
            rows.append({"variable": v.key + "<run>", "value": f"{counts[v.key]} run(s)",
                         "source": "Variable" if counts[v.key] else "unset", "description": v.description})
            continue
        row = stored.get(v.key)
        rows.append({"variable": v.key, "value": scrub(str(row.get_val() or "")) if row else None,
                     "source": "Variable" if row else "unset", "description": v.description})
    return rows


def _table(columns: tuple[str, ...], rows: list[dict[str, Any]]) -> str:
    head = "".join(f"<th>{html.escape(c)}</th>" for c in columns)
    body = "".join("<tr>" + "".join(f"<td>{html.escape(str(r.get(c) if r.get(c) is not None else 'unset'))}</td>"
                                    for c in columns) + "</tr>" for r in rows)
    return f"<table><tr>{head}</tr>{body}</table>"


def page(rows: list[dict[str, Any]], variables: list[dict[str, Any]]) -> str:
    """The settings and the Variables as an HTML page (every cell escaped)."""
    return ("<!doctype html><html><head><meta charset='utf-8'><title>Nexus settings</title><style>"
            "body{font-family:sans-serif;margin:1em}table{border-collapse:collapse;width:100%;table-layout:fixed}"
            "td,th{border:1px solid #ccc;padding:4px;text-align:left;vertical-align:top;overflow-wrap:anywhere}"
            "</style></head><body><h1>Nexus settings</h1><p>Each <code>[nexus]</code> setting as this API server "
            "reads it: set as <code>AIRFLOW__NEXUS__&lt;NAME&gt;</code>, as its <code>NEXUS_*</code> alias, in "
            "Airflow's configuration (<code>airflow.cfg [nexus]</code>, a secrets backend), or its default, in that "
            "order. Workers, triggerers and the command line read their own environment.</p>"
            f"{_table(COLUMNS, rows)}<h2>Airflow Variables</h2><p>What the product reads from Airflow's Variables "
            "(Admin, Variables), as Airflow stores them now; a run reads them when it needs them.</p>"
            f"{_table(VARIABLE_COLUMNS, variables)}</body></html>")

"""A tenant's report: its whole history from the delivery ledger (:mod:`nexus_cutover.ledger`), as a page, JSON
and CSV -- what a reviewer keeps, the same after Airflow's metadata of the runs was cleaned.

The ledger is the Airflow connection ``nexus_ledger`` (:mod:`nexus_airflow.ledger`); only its masked DSN is ever
shown. Every free text (reasons, subjects) goes through :func:`nexus_status.redact.redact` before a page or a
download shows it. The CSV download is :func:`nexus_cutover.ledger.to_csv`'s, the command line's: a cell a
spreadsheet would run as a formula gets a leading ``'`` (:mod:`nexus_cutover.spreadsheet`, the preflight's rule).
"""

from __future__ import annotations

import html
from typing import Any

#: The columns the page shows, in order (the CSV and JSON carry every column of the ledger).
PAGE_COLUMNS = ("recorded_at", "run_id", "step", "kind", "outcome", "actor", "holder", "pack", "cutoff", "digest",
                "reason")
FREE_TEXT = ("reason",)


def tenant_history(tenant: str) -> dict[str, Any]:
    """``{"tenant", "ledger" (masked), "events"}``; :class:`~nexus_cutover.errors.CutoverError` when the ledger cannot
    be read (no connection: BadInput; down: Unreachable)."""
    from nexus_airflow.ledger import masked_ledger, open_ledger
    from nexus_cutover.ledger import history
    from nexus_status.redact import redact

    engine = open_ledger()
    try:
        rows = history(engine, tenant)
    finally:
        engine.dispose()
    for row in rows:
        for name in FREE_TEXT:
            if isinstance(row.get(name), str):
                row[name] = redact(row[name])
    return {"tenant": tenant, "ledger": masked_ledger(), "events": rows}


def page(report: dict[str, Any]) -> str:
    """The report as a page: one table row per event, in the ledger's order, with the JSON and CSV links."""
    from urllib.parse import quote

    from nexus_cutover.ledger import evidence_lines
    from nexus_status.redact import redact

    tenant = report["tenant"]
    q = quote(tenant, safe="")

    def cell(row: dict[str, Any], name: str) -> str:
        value = row.get(name)
        if name == "step" and row.get("map_index", -1) >= 0:
            value = f"{value}[{row['map_index']}]"
        return f"<td class=\"{name}\">{html.escape('' if value is None else str(value))}</td>"

    head = "".join(f"<th>{html.escape(c)}</th>" for c in PAGE_COLUMNS)
    def shown(row: dict[str, Any]) -> str:  # the evidence a person was shown, under its row (the ledger keeps it)
        lines = evidence_lines(row)
        if not lines:
            return ""
        text = html.escape(redact("\n".join(lines)))
        return f"<tr class=\"evidence\"><td></td><td colspan=\"{len(PAGE_COLUMNS) - 1}\"><pre>{text}</pre></td></tr>"

    body = "".join(f"<tr class=\"event {html.escape(r['kind'])}\">" + "".join(cell(r, c) for c in PAGE_COLUMNS) + "</tr>"
                   + shown(r) for r in report["events"]) or f"<tr><td colspan=\"{len(PAGE_COLUMNS)}\">no event recorded</td></tr>"
    return (
        "<!doctype html><html><head><meta charset=\"utf-8\"><title>Report: " + html.escape(tenant) + "</title>"
        # The table fits its frame (issue 51, item 9: Airflow's iframe is narrower than a window): long ids, digests
        # and evidence lines wrap anywhere rather than widen the table (a step, a kind and a time keep a
        # readable width); a frame too narrow for even that scrolls
        # the table inside its own box, never the page.
        "<style>body{font:13px system-ui,sans-serif;margin:16px}div.frame{max-width:100%;overflow-x:auto}"
        "table{border-collapse:collapse;width:100%}"
        "td,th{border:1px solid #ddd;padding:3px 6px;vertical-align:top;text-align:left}"
        "td{overflow-wrap:anywhere}td.step,td.kind,td.outcome{min-width:7em}td.recorded_at{min-width:10em}"
        "th{background:#f4f4f4}td.digest,td.run_id,td.holder{font-family:monospace;font-size:11px}.muted{color:#666}"
        "tr.evidence pre{margin:0;font-size:11px;white-space:pre-wrap;overflow-wrap:anywhere}</style></head><body>"
        f"<h2>Delivery ledger of tenant <code>{html.escape(tenant)}</code></h2>"
        f"<p class=\"muted\">{len(report['events'])} event(s) from {html.escape(redact(report['ledger']))}, in the "
        "order they happened; kept outside Airflow's metadata. "
        f"<a href=\"api/report?tenant={q}&amp;format=json\">JSON</a> · "
        f"<a href=\"api/report?tenant={q}&amp;format=csv\">CSV</a> · <a href=\"./\">all tenants</a></p>"
        f"<div class=\"frame\"><table><thead><tr>{head}</tr></thead><tbody>{body}</tbody></table></div></body></html>")

"""The FastAPI app of the status view, mounted by Airflow at ``/nexus-status``.

* ``GET /nexus-status/`` -- the tenant page (HTML + a little JS that refreshes every
  ``refresh_s`` seconds, the cache's interval);
* ``GET /nexus-status/api/tenants?page=&page_size=&state=&wave=&rollout=&search=`` --
  one page of the tenant connections' states (``nexus_status.fleet``: fence,
  drain remaining and its ETA, checkpoint per pack, new host, receipts, Field
  History stage), each tenant's latest cutover and Field History runs with the
  step, reason, link and next action (``nexus_status.runs``), what they proved
  (``nexus_status.proofs``), the drain samples, and the counts of the tenants
  not shown;
* ``GET /nexus-status/rollouts`` and ``GET /nexus-status/api/rollouts`` -- the
  latest ``tenant_rollout`` runs (``nexus_status.rollouts``), each with its preflight table;
* ``GET /nexus-status/report?tenant=`` and ``GET /nexus-status/api/report?tenant=&format=json|csv`` -- the tenant's
  whole history from the delivery ledger (``nexus_status.report``), the same after Airflow's metadata was cleaned;
* ``GET /nexus-status/api/rollouts/preflight.csv?run_id=`` -- one rollout run's preflight
  table as a CSV download (``nexus_cutover.projection.preflight.to_csv``: RFC 4180 quoting,
  ids exactly as stored, free text redacted).

Access goes through the auth manager, not merely a login: every route needs
permission to read the tenant connections (``requires_access_connection("GET")``:
the page shows what is behind them) and to read the runs of the DAGs it shows
(``requires_access_dag("GET", RUN)``); a logged-in user without them gets 403
(with SimpleAuthManager: roles VIEWER and USER lack connections; OP and ADMIN
have both). No DSN or password leaves: only connection ids, the database kind
and domain state, and every string of the JSON goes through
``nexus_status.redact`` last.
"""

from __future__ import annotations

import pathlib
from typing import Any

from airflow.api_fastapi.auth.managers.models.resource_details import DagAccessEntity
from airflow.api_fastapi.core_api.security import (
    requires_access_configuration,
    requires_access_connection,
    requires_access_dag,
    requires_access_variable,
)
from fastapi import Depends, FastAPI, HTTPException, Query
from fastapi.responses import HTMLResponse, Response

HERE = pathlib.Path(__file__).parent
CUTOVER_DAG = "connector_projection_cutover"
ROLLOUT_DAG = "tenant_rollout"
FIELD_HISTORY_DAG = "field_history_eligibility"


def _reads(*dag_ids: str) -> list:
    """The permissions of a route: read the tenant connections, and read the runs of ``dag_ids``."""
    return [Depends(requires_access_connection("GET"))] + [
        Depends(requires_access_dag("GET", DagAccessEntity.RUN, param_dag_id=d)) for d in dag_ids]


TENANT_READS = _reads(CUTOVER_DAG, FIELD_HISTORY_DAG)
ROLLOUT_READS = _reads(ROLLOUT_DAG, CUTOVER_DAG)

app = FastAPI(title="Nexus tenant status", description="Cutover state of every nexus_tenant_* connection")


def redact_tree(value: Any) -> Any:
    """``value`` with every string redacted (keys too): the JSON's last guard against a DSN or a password."""
    from nexus_status.redact import redact

    if isinstance(value, dict):
        return {redact(k): redact_tree(v) for k, v in value.items()}
    if isinstance(value, list | tuple):
        return [redact_tree(v) for v in value]
    return redact(value) if isinstance(value, str) else value


@app.get("/api/tenants", dependencies=TENANT_READS)
def tenants(page: int = Query(1, ge=1), page_size: int = Query(50, ge=1), state: str | None = None,  # noqa: B008
            wave: int | None = None, rollout: str | None = None, search: str | None = None) -> dict[str, Any]:
    from nexus_status.fleet import listing

    return redact_tree(listing(page=page, page_size=page_size, state=state or None, wave=wave,
                               rollout=rollout or None, search=search or None))


@app.get("/api/rollouts", dependencies=ROLLOUT_READS)
def rollouts(limit: int = Query(5, ge=1, le=20)) -> dict[str, Any]:  # noqa: B008 - FastAPI query
    from nexus_status.rollouts import rollouts as read_rollouts

    return redact_tree(read_rollouts(limit))


#: The free-text columns of the preflight table (redacted like every text of the page); ids are written as stored.
PREFLIGHT_TEXT = ("reason", "plan_verdict", "drain_eta")


@app.get("/api/rollouts/preflight.csv", dependencies=ROLLOUT_READS)
def preflight_csv(run_id: str = Query(..., min_length=1, max_length=250)) -> Response:  # noqa: B008 - FastAPI query
    """The preflight table of rollout run ``run_id`` as a CSV download (404 while it has none)."""
    import re

    from nexus_cutover.projection.preflight import to_csv
    from nexus_status.redact import redact
    from nexus_status.rollouts import preflight_rows

    rows = preflight_rows(run_id)
    if rows is None:
        raise HTTPException(404, "no preflight table for this tenant_rollout run (yet)")
    rows = [{**r, **{k: redact(r[k]) for k in PREFLIGHT_TEXT if isinstance(r.get(k), str)}} for r in rows]
    name = "preflight_" + re.sub(r"[^A-Za-z0-9_.-]", "_", run_id)[:120] + ".csv"
    return Response(to_csv(rows), media_type="text/csv; charset=utf-8",
                    headers={"Content-Disposition": f'attachment; filename="{name}"'})


def _report(tenant: str) -> dict[str, Any]:
    from nexus_cutover.errors import BadInput, CutoverError
    from nexus_status.redact import redact
    from nexus_status.report import tenant_history

    try:
        return tenant_history(tenant)
    except BadInput as exc:
        raise HTTPException(404, redact(str(exc))) from None
    except CutoverError as exc:  # the ledger is down: said, never a page of nothing
        raise HTTPException(503, redact(str(exc))) from None


@app.get("/api/report", dependencies=TENANT_READS)
def report(tenant: str = Query(..., min_length=1, max_length=190),  # noqa: B008 - FastAPI query
           format: str = Query("json", pattern="^(json|csv)$")) -> Response:  # noqa: A002,B008 - the query's name
    """The tenant's history from the delivery ledger, as JSON or a CSV download."""
    import json
    import re

    from nexus_cutover.ledger import to_csv

    got = _report(tenant)
    if format == "csv":
        name = "ledger_" + re.sub(r"[^A-Za-z0-9_.-]", "_", tenant)[:120] + ".csv"
        return Response(to_csv(got["events"]), media_type="text/csv; charset=utf-8",
                        headers={"Content-Disposition": f'attachment; filename="{name}"'})
    return Response(json.dumps(redact_tree(got), default=str), media_type="application/json")


@app.get("/report", response_class=HTMLResponse, dependencies=TENANT_READS)
def report_page(tenant: str = Query(..., min_length=1, max_length=190)) -> str:  # noqa: B008 - FastAPI query
    from nexus_status.report import page as render

    return render(_report(tenant))


#: The settings page reads Airflow's configuration: the permission to read it.
CONFIG_READS = [Depends(requires_access_configuration("GET"))]
#: The settings page also lists the product's Variables: the permission to read Variables too.
SETTINGS_READS = [*CONFIG_READS, Depends(requires_access_variable("GET"))]


@app.get("/api/settings", dependencies=CONFIG_READS)
def settings_json() -> list[dict[str, Any]]:
    """Every ``[nexus]`` setting as this API server reads it (:func:`nexus_cutover.settings.listing`)."""
    return _settings()


def _settings() -> list[dict[str, Any]]:
    """The listing with any credentials in a URL masked (a secret setting is never shown at all; a URL such as the
    Airflow base URL stays readable)."""
    from nexus_cutover.notices import scrub
    from nexus_cutover.settings import listing

    return [{k: scrub(v) if isinstance(v, str) else v for k, v in row.items()} for row in listing()]


@app.get("/settings", response_class=HTMLResponse, dependencies=SETTINGS_READS)
def settings_page() -> str:
    from nexus_airflow.compat import session
    from nexus_status.settings_page import page as render
    from nexus_status.settings_page import variable_rows

    with session() as metadata:
        variables = variable_rows(metadata)
    return render(_settings(), variables)


@app.get("/embedded.js")
def embedded_js() -> Response:
    """The status view's pages' one script for links inside Airflow's sandboxed frame (no secret, no data)."""
    return Response((HERE / "embedded.js").read_text(), media_type="text/javascript; charset=utf-8")


@app.get("/", response_class=HTMLResponse, dependencies=TENANT_READS)
def page() -> str:
    return (HERE / "page.html").read_text()


@app.get("/rollouts", response_class=HTMLResponse, dependencies=ROLLOUT_READS)
def rollouts_page() -> str:
    return (HERE / "rollouts.html").read_text()

"""The FastAPI app of the status view, mounted by Airflow at ``/nexus-status``.

* ``GET /nexus-status/`` -- the page (HTML + a little JS that refreshes every few seconds);
* ``GET /nexus-status/api/tenants`` -- the JSON it renders: every tenant connection's
  state (fence, drain remaining, checkpoint per pack, new host, receipts, Field
  History stage), what its latest runs proved (the history digest and its
  verification, the Field History comparisons: ``nexus_status.proofs``) and the
  recent samples for the drain chart.

Both need a logged-in Airflow user (the ``_token`` cookie the UI sets, or a
bearer token), exactly like the REST API. The JSON holds no DSN or password:
only connection ids, the database kind and domain state.
"""

from __future__ import annotations

import pathlib
from typing import Any

from airflow.api_fastapi.core_api.security import get_user
from fastapi import Depends, FastAPI
from fastapi.responses import HTMLResponse

PAGE = pathlib.Path(__file__).with_name("page.html")

app = FastAPI(title="Nexus tenant status", description="Cutover state of every nexus_tenant_* connection")


@app.get("/api/tenants")
def tenants(_user=Depends(get_user)) -> dict[str, Any]:  # noqa: B008 - FastAPI dependency
    from nexus_status import history
    from nexus_status.proofs import latest_proofs
    from nexus_status.tenants import read_tenant, tenant_conn_ids, tenant_of

    conn_ids = tenant_conn_ids()
    proofs = latest_proofs([tenant_of(c) for c in conn_ids])
    out = []
    for conn_id in conn_ids:
        state = read_tenant(conn_id)
        state["samples"] = history.record(state["tenant"], state) if "error" not in state else []
        state["proofs"] = proofs.get(state["tenant"], {})
        out.append(state)
    return {"tenants": out}


@app.get("/", response_class=HTMLResponse)
def page(_user=Depends(get_user)) -> str:  # noqa: B008 - FastAPI dependency
    return PAGE.read_text()

"""Readable trigger-form errors: the API's 400 for a refused form says which field and why, in words.

Airflow validates a run's ``conf`` against the DAG's Params with jsonschema and
answers ``POST /api/v2/dags/{dag_id}/dagRuns`` with jsonschema's whole text:
the failed keyword, the field's schema as a Python dict and the instance. The
trigger form shows that text as it is. :class:`ReadableFormErrors`, a root
middleware of the API server (registered by ``nexus_status_plugin``), rewrites
the ``detail`` of exactly those answers into one sentence: the field's title,
what was wrong, and the field's own description (what it accepts), e.g.

    Tenant (namespace) (tenant): 'Bad Name' is not allowed here. The tenant's namespace, e.g. acme. ...

Invariants:

* Only a 400 answer to a run trigger whose detail is Airflow's param error is
  touched; every other request and answer passes through unchanged (streamed,
  not buffered).
* The field's title and description come from the form's one definition
  (:mod:`nexus_airflow.params`); for any other DAG only jsonschema's first line
  is kept.
* Nothing is added that the request did not hold: the refused value is quoted
  back (the person typed it), never a connection or a secret.
"""

from __future__ import annotations

import json
import re
from collections.abc import Mapping
from typing import Any

TRIGGER_PATH = re.compile(r"^/api/v2/dags/(?P<dag_id>[^/]+)/dagRuns/?$")
PARAM_ERROR = re.compile(r"^Invalid input for param (?P<name>[^:]+): (?P<reason>.*)$")


def _form_fields() -> dict[str, Mapping[str, Any]]:
    """dag_id -> its form's fields (imported when first needed: the API server has the plugins on its path)."""
    from nexus_airflow.field_history import FH_FIELDS
    from nexus_airflow.params import CUTOVER_FIELDS, ROLLOUT_FIELDS

    return {"connector_projection_cutover": CUTOVER_FIELDS, "field_history_eligibility": FH_FIELDS,
            "tenant_rollout": ROLLOUT_FIELDS}


def readable_param_error(dag_id: str, detail: str) -> str | None:
    """``detail`` (Airflow's param error) as one readable sentence; None when it is not a param error."""
    lines = detail.splitlines()
    match = PARAM_ERROR.match(lines[0]) if lines else None
    if not match:
        return None
    name, reason = match["name"].strip(), match["reason"].strip()
    reason = re.sub(r" does not match '.*'$", " is not allowed here", reason)
    field = (_form_fields().get(dag_id) or {}).get(name)
    if field is None:
        return f"The form was refused: {name}: {reason}."
    return f"The form was refused: {field.title} ({name}): {reason}. {field.description}"


class ReadableFormErrors:
    """ASGI middleware: a refused trigger form's 400 answer made readable (see the module invariants)."""

    def __init__(self, app) -> None:
        self.app = app

    async def __call__(self, scope, receive, send) -> None:
        match = TRIGGER_PATH.match(scope.get("path", "")) if scope["type"] == "http" else None
        if match is None or scope.get("method") != "POST":
            await self.app(scope, receive, send)
            return
        held: dict[str, Any] = {}

        async def send_readable(message) -> None:
            if message["type"] == "http.response.start" and message["status"] == 400:
                held["start"], held["body"] = message, b""  # hold a 400 until its body is read
                return
            if "start" not in held:
                await send(message)
                return
            held["body"] += message.get("body", b"")
            if message.get("more_body"):
                return
            await self._send_rewritten(send, match["dag_id"], held["start"], held["body"])

        await self.app(scope, receive, send_readable)

    @staticmethod
    async def _send_rewritten(send, dag_id: str, start, body: bytes) -> None:
        try:
            payload = json.loads(body)
            readable = readable_param_error(dag_id, payload.get("detail", "")) if isinstance(payload, dict) else None
        except ValueError:
            readable = None
        if readable:
            body = json.dumps({**payload, "detail": readable}).encode()
            headers = [(k, v) for k, v in start.get("headers", []) if k.lower() != b"content-length"]
            start = {**start, "headers": [*headers, (b"content-length", str(len(body)).encode())]}
        await send(start)
        await send({"type": "http.response.body", "body": body})

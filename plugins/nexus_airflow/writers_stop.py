"""How the cutover's writer-stop step stops the old writers in Airflow: the form's ``writers_stop_controller`` with
the deployment's configuration, read by its step's operator (:class:`nexus_airflow.operators.StopOldWritersOperator`)
and checked by the run's first task (issue 50, item 1; the controller itself is the domain's,
:mod:`nexus_cutover.projection.writers_stop`, the one ``nexus-cutover run`` uses).

Invariants:

* ``command`` runs the argv of the Airflow Variable ``nexus_writers_stop_command`` (a JSON list; ``{tenant}`` is
  replaced by the namespace); there is no default command. ``http`` POSTs to the endpoint :data:`HTTP_ENDPOINT` of
  the HTTP connection ``writers_stop_http_conn_id`` (its ``schema`` the URL's scheme, its login and password as
  basic authentication, its extra ``headers`` as further headers; each secret given to Airflow's ``mask_secret``).
  Both are configured by the deployment, never taken from the trigger form.
* A missing or malformed configuration is bad input, refused by the run's first task before anything is written
  (:func:`require_configuration`); should it go missing later, the step stops with the fence held, nothing run.
* ``manual`` reads no configuration and runs nothing.
"""

from __future__ import annotations

import base64
import json

from nexus_airflow.base import params_of

WRITERS_STOP_COMMAND_VARIABLE = "nexus_writers_stop_command"
HTTP_ENDPOINT = "/api/v1/tenants/{tenant}/connector-projection-old-writers/stop"


def command_argv() -> list[str]:
    """The deployment's stop command (the Variable :data:`WRITERS_STOP_COMMAND_VARIABLE`, a JSON list of strings)."""
    from airflow.sdk import Variable

    from nexus_cutover.errors import BadInput

    raw = Variable.get(WRITERS_STOP_COMMAND_VARIABLE, default=None)
    try:
        argv = json.loads(raw) if raw else None
    except ValueError:
        argv = None
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) and a for a in argv):
        raise BadInput(f"writers_stop_controller command needs the Airflow Variable {WRITERS_STOP_COMMAND_VARIABLE}: "
                       "the stop command's argv as a JSON list of strings ({tenant} is replaced by the namespace)")
    return argv


def endpoint(conn_id: str, tenant: str) -> tuple[str, dict[str, str]]:
    """The URL and headers of the deployment API the HTTP connection ``conn_id`` names."""
    from airflow.sdk import BaseHook
    from airflow.sdk.log import mask_secret

    conn = BaseHook.get_connection(conn_id)
    host = (conn.host or "").rstrip("/")
    base = host if "://" in host else f"{conn.schema or 'http'}://{host}" + (f":{conn.port}" if conn.port else "")
    headers: dict[str, str] = {}
    if conn.login:
        token = base64.b64encode(f"{conn.login}:{conn.password or ''}".encode()).decode()
        mask_secret(token)
        headers["Authorization"] = f"Basic {token}"
    extra = conn.extra_dejson.get("headers") if isinstance(conn.extra_dejson, dict) else None
    for name, value in (extra or {}).items():
        mask_secret(str(value))
        headers[str(name)] = str(value)
    return base + HTTP_ENDPOINT.format(tenant=tenant), headers


def require_configuration(context) -> None:
    """Refuse (bad input) a run whose ``writers_stop_controller`` is not configured in this deployment: checked by the
    run's first task, before anything is written, so a missing Variable or connection never stops the run at step 3
    with the fence held. The same reads as the step's own (:func:`configure`), whose values it does not keep."""
    from airflow.sdk import BaseHook

    from nexus_cutover.errors import BadInput
    from nexus_cutover.projection import steps

    ws, p = steps.writers_stop, params_of(context)
    if p.writers_stop_controller == ws.COMMAND:
        command_argv()
    elif p.writers_stop_controller == ws.HTTP:
        try:
            BaseHook.get_connection(p.writers_stop_http_conn_id)
        except Exception as exc:  # noqa: BLE001 - Airflow's not-found error differs by version: one message
            raise BadInput(f"writers_stop_controller http needs the Airflow connection {p.writers_stop_http_conn_id!r} "
                           f"(writers_stop_http_conn_id): {type(exc).__name__}") from None


def configure(context, run) -> None:
    """Give the step's run its writer-stop controller (bad input raised here, inside the step's error handling)."""
    from nexus_cutover.projection import steps

    ws, p = steps.writers_stop, params_of(context)
    kind, timeout = p.writers_stop_controller, p.writers_stop_controller_timeout
    if kind == ws.COMMAND:
        run.writers_stop = ws.controller(kind, argv=command_argv(), timeout_s=timeout)
    elif kind == ws.HTTP:
        url, headers = endpoint(p.writers_stop_http_conn_id, p.tenant)
        run.writers_stop = ws.controller(kind, url=url, headers=headers, timeout_s=timeout)
    else:
        run.writers_stop = ws.controller(kind, timeout_s=timeout)

"""How ``start_new_host`` starts the matching new host: ``command`` or ``http`` (``manual`` is a HITL step).

Invariants:

* ``command`` runs the argv of the Airflow Variable ``nexus_host_command``
  (a JSON list; ``{tenant}`` is replaced by the namespace), by default the
  project's reference host ``nexus-host --namespace {tenant}``. The tenant DSN
  reaches the child only through its environment (``NEXUS_TENANT_DSN``, with its
  TLS query parameters, so the host connects as the run does); each secret it
  carries is given to Airflow's ``mask_secret`` first; the logged and returned
  argv never contain it. The child gets no other secret of the worker's
  environment (:func:`nexus_cutover.db.host_environment`: no ``AIRFLOW*``
  configuration or connection, no variable named like a password, token or key). The child is detached (its own
  session) and keeps running after the task; an exit within the grace period is
  a failure reported with the tail of its log. The grace ends early once the
  host is ready (registered, activated, heartbeating): that wait is admission
  paused.
* ``http`` POSTs ``{tenant, pack_install_ids, projection_protocol: 1, run_id}``
  to the deployer endpoint of an Airflow HTTP connection (no secret in the body);
  any non-2xx answer fails the task.
* The command is configured by the deployment, never taken from the trigger form.
"""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from typing import Any

HOST_COMMAND_VARIABLE = "nexus_host_command"
HTTP_ENDPOINT = "/api/v1/tenants/{tenant}/connector-projection-host"
START_GRACE_S = 3.0
READY_POLL_S = 0.2


def default_host_argv() -> list[str]:
    exe = shutil.which("nexus-host") or os.path.join(os.path.dirname(sys.executable), "nexus-host")
    if os.path.exists(exe):
        return [exe, "--namespace", "{tenant}"]
    return [sys.executable, "-m", "nexus_cutover.cli.host", "--namespace", "{tenant}"]


def host_argv(tenant: str) -> list[str]:
    from airflow.sdk import Variable

    raw = Variable.get(HOST_COMMAND_VARIABLE, default=None)
    argv = json.loads(raw) if raw else default_host_argv()
    if not isinstance(argv, list) or not argv or not all(isinstance(a, str) for a in argv):
        raise ValueError(f"Variable {HOST_COMMAND_VARIABLE} must be a JSON list of strings (argv)")
    return [a.replace("{tenant}", tenant) for a in argv]


def start_command(tenant: str, dsn: str, log, ready: Callable[[], bool] | None = None) -> dict[str, Any]:
    """Start the host detached; watch it for :data:`START_GRACE_S` (an exit then fails with its log's tail),
    or until ``ready()`` says it registered and activated, whichever comes first: the grace is inside the
    admission pause, and a host that is ready has passed it."""
    from airflow.sdk.log import mask_secret

    from nexus_cutover.db import dsn_secrets, host_environment

    for secret in dsn_secrets(dsn):  # the child's environment holds the DSN: no log line may show it
        mask_secret(secret)
    argv = host_argv(tenant)
    log_path = os.path.join(tempfile.gettempdir(), f"nexus-host-{tenant}-{int(time.time())}.log")
    env = host_environment(os.environ, dsn)  # the worker's, less Airflow's secrets and every other secret
    log.info("starting the new host: %s (log %s)", " ".join(argv), log_path)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    started = time.monotonic()
    while time.monotonic() - started < START_GRACE_S and proc.poll() is None:
        if ready is not None and _looks_ready(ready, log):
            log.info("the new host is ready %.1f s after its start", time.monotonic() - started)
            break
        time.sleep(READY_POLL_S)
    if proc.poll() is not None:
        with open(log_path, "rb") as f:
            tail = f.read()[-4000:].decode(errors="replace")
        raise RuntimeError(f"the new host exited with {proc.returncode} right after starting; its log:\n{tail}")
    return {"controller": "command", "pid": proc.pid, "argv": argv, "log": log_path}


def _looks_ready(ready: Callable[[], bool], log) -> bool:
    """One look at the host's readiness; a look that fails only lets the grace run its course."""
    try:
        return bool(ready())
    except Exception as exc:  # noqa: BLE001 - a shortcut that cannot be taken, never a failure of the start
        log.warning("could not look at the new host's readiness (%s): watching it for the whole grace",
                    type(exc).__name__)
        return False


def start_http(tenant: str, http_conn_id: str, pack_install_ids: list[str], run_id: str, log) -> dict[str, Any]:
    from airflow.providers.http.hooks.http import HttpHook

    endpoint = HTTP_ENDPOINT.format(tenant=tenant)
    body = {"tenant": tenant, "pack_install_ids": pack_install_ids, "projection_protocol": 1, "run_id": run_id}
    log.info("asking the deployer (%s) to start the new host: POST %s (tenant %s, packs %s, run %s)", http_conn_id,
             endpoint, tenant, ", ".join(pack_install_ids) or "none", run_id)
    resp = HttpHook(method="POST", http_conn_id=http_conn_id).run(
        endpoint=endpoint, json=body, headers={"Content-Type": "application/json"}
    )
    return {"controller": "http", "status": resp.status_code, "endpoint": endpoint, "response": resp.text[:2000]}

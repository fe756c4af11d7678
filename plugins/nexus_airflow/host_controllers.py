"""How ``start_new_host`` starts the matching new host: ``command`` or ``http`` (``manual`` is a HITL step).

Invariants:

* ``command`` runs the argv of the Airflow Variable ``nexus_host_command``
  (a JSON list; ``{tenant}`` is replaced by the namespace), by default the
  project's reference host ``nexus-host --namespace {tenant}``. The tenant DSN
  reaches the child only through its environment (``NEXUS_TENANT_DSN``); the
  logged and returned argv never contain it. The child is detached (its own
  session) and keeps running after the task; an exit within the grace period is
  a failure reported with the tail of its log.
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
from typing import Any

HOST_COMMAND_VARIABLE = "nexus_host_command"
HTTP_ENDPOINT = "/api/v1/tenants/{tenant}/connector-projection-host"
START_GRACE_S = 3.0


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


def start_command(tenant: str, dsn: str, log) -> dict[str, Any]:
    argv = host_argv(tenant)
    log_path = os.path.join(tempfile.gettempdir(), f"nexus-host-{tenant}-{int(time.time())}.log")
    env = dict(os.environ, NEXUS_TENANT_DSN=dsn)
    log.info("starting the new host: %s (log %s)", " ".join(argv), log_path)
    with open(log_path, "ab") as out:
        proc = subprocess.Popen(argv, stdout=out, stderr=subprocess.STDOUT, stdin=subprocess.DEVNULL,
                                env=env, start_new_session=True)
    deadline = time.monotonic() + START_GRACE_S
    while time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.1)
    if proc.returncode is not None:
        with open(log_path, "rb") as f:
            tail = f.read()[-4000:].decode(errors="replace")
        raise RuntimeError(f"the new host exited with {proc.returncode} right after starting; its log:\n{tail}")
    return {"controller": "command", "pid": proc.pid, "argv": argv, "log": log_path}


def start_http(tenant: str, http_conn_id: str, pack_install_ids: list[str], run_id: str, log) -> dict[str, Any]:
    from airflow.providers.http.hooks.http import HttpHook

    endpoint = HTTP_ENDPOINT.format(tenant=tenant)
    body = {"tenant": tenant, "pack_install_ids": pack_install_ids, "projection_protocol": 1, "run_id": run_id}
    log.info("asking the deployer (%s) to start the new host: POST %s %s", http_conn_id, endpoint, body)
    resp = HttpHook(method="POST", http_conn_id=http_conn_id).run(
        endpoint=endpoint, json=body, headers={"Content-Type": "application/json"}
    )
    return {"controller": "http", "status": resp.status_code, "endpoint": endpoint, "response": resp.text[:2000]}

"""``start_new_host``'s ``command`` controller: the start grace catches a host that dies at once, and ends as soon
as the host is ready (that grace is admission paused)."""

from __future__ import annotations

import json
import logging
import os
import signal
import sys
import time

import pytest

LOG = logging.getLogger("test_host_controllers")


@pytest.fixture
def host_command(monkeypatch):
    def use(code: str) -> None:
        monkeypatch.setenv("AIRFLOW_VAR_NEXUS_HOST_COMMAND", json.dumps([sys.executable, "-c", code]))

    return use


def _stop(result):
    os.killpg(result["pid"], signal.SIGTERM)


def test_the_grace_ends_when_the_host_is_ready(airflow_db, host_command):
    from nexus_airflow.host_controllers import START_GRACE_S, start_command

    host_command("import time; time.sleep(60)")
    looks = []

    def ready():
        looks.append(1)
        return len(looks) >= 2

    result = start_command("acme", "mysql://u:secret@h/db", LOG, ready=ready)
    try:
        assert result["controller"] == "command" and len(looks) == 2  # no look after it was ready
        assert len(looks) < START_GRACE_S / 0.2
        assert "secret" not in json.dumps(result)
    finally:
        _stop(result)


def test_a_host_that_exits_at_once_fails_the_start_with_its_log_even_when_looks_are_taken(airflow_db, host_command):
    from nexus_airflow.host_controllers import start_command

    host_command("import sys; print('cannot reach the tenant database'); sys.exit(3)")
    with pytest.raises(RuntimeError, match=r"exited with 3 right after starting(.|\n)*cannot reach the tenant database"):
        start_command("acme", "mysql://u:secret@h/db", LOG, ready=lambda: False)


def test_a_readiness_look_that_fails_lets_the_grace_run_its_course(airflow_db, host_command, caplog):
    from nexus_airflow.host_controllers import START_GRACE_S, start_command

    host_command("import time; time.sleep(60)")
    looks = []

    def broken():
        looks.append(1)
        raise ConnectionError("tenant database restarting")

    started = time.monotonic()
    result = start_command("acme", "mysql://u:secret@h/db", LOG, ready=broken)
    try:  # watched for the whole grace (a lower bound: a loaded machine only makes it longer), the host kept
        assert time.monotonic() - started >= START_GRACE_S and len(looks) >= 2
        assert "could not look at the new host's readiness (ConnectionError)" in caplog.text
    finally:
        _stop(result)


def test_the_host_gets_its_dsn_and_no_other_secret_of_the_worker(airflow_db, host_command, tmp_path, monkeypatch):
    """The child's environment: the tenant DSN (with its TLS parameters) as NEXUS_TENANT_DSN, the worker's ordinary
    variables, and none of Airflow's configuration or connections, nor a variable named like a secret; each secret
    the DSN carries is registered with Airflow's secrets masker first."""
    from airflow.sdk._shared.secrets_masker.secrets_masker import redact

    from nexus_airflow.host_controllers import start_command

    seen = tmp_path / "env.json"
    monkeypatch.setenv("AIRFLOW__CORE__FERNET_KEY", "fernet-key-of-the-worker")
    monkeypatch.setenv("AIRFLOW_CONN_NEXUS_TENANT_OTHER", "mysql://other:other-tenant-pw@h/db")
    monkeypatch.setenv("DEPLOYER_API_TOKEN", "token-of-the-worker")
    monkeypatch.setenv("NEXUS_STACK_ID", "stack-marker")  # an ordinary variable: kept
    host_command(f"import json, os, time; json.dump(dict(os.environ), open({str(seen)!r}, 'w')); time.sleep(60)")
    dsn = "mysql+pymysql://cutover:Host-pw-31c@tidb.example.com:4000/t?ssl_mode=VERIFY_CA&ssl_ca=/etc/ca.pem&ssl_key=/etc/k.pem"
    result = start_command("acme", dsn, LOG, ready=lambda: seen.exists() and seen.stat().st_size > 0)
    try:
        deadline = time.monotonic() + 10
        while not (seen.exists() and seen.stat().st_size) and time.monotonic() < deadline:
            time.sleep(0.1)
        env = json.loads(seen.read_text())
    finally:
        _stop(result)
    assert env["NEXUS_TENANT_DSN"] == dsn and env["NEXUS_STACK_ID"] == "stack-marker" and env["PATH"]
    assert not [k for k in env if k.startswith("AIRFLOW")], sorted(env)
    assert "DEPLOYER_API_TOKEN" not in env
    shown = redact(f"host env NEXUS_TENANT_DSN={dsn}; key /etc/k.pem")
    assert "Host-pw-31c" not in shown and "/etc/k.pem" not in shown

"""No console script shows a secret a DSN carries: the password before the ``@`` or in the query string
(``?password=``, which PyMySQL accepts), TLS key material (``ssl_key``), an Airflow ``ssl`` mapping.

Black-box, as an engineer runs them (``python -m nexus_cutover.cli.<module>``): stdout, stderr, ``-json`` and the
error line, against a closed port (the connection fails) and against MariaDB with a user whose password is given
in the query string (the connection works). The start-up line shows the DSN through ``mask_dsn``.
"""

from __future__ import annotations

import os
import subprocess
import sys
import uuid
from urllib.parse import quote_plus

import pytest
from sqlalchemy import text
from sqlalchemy.engine import make_url

from nexus_cutover.db import make_engine, mask_dsn
from nexus_cutover.schema import create_legacy_schema
from nexus_sim.scenario import TenantScenario

QUERY_PASSWORD, KEY_MATERIAL, USERINFO_PASSWORD = "Qpw-7f3a9e", "Kkey-c41d0b", "Upw-2be8d5"
SECRETS = (QUERY_PASSWORD, KEY_MATERIAL, USERINFO_PASSWORD)
CLOSED = "127.0.0.1:1"  # nothing listens on port 1: the connection is refused at once

DSNS = {
    "password in the query": f"mysql+pymysql://nexus@{CLOSED}/tenant?password={QUERY_PASSWORD}",
    "passwd and TLS key in the query": (f"mysql+pymysql://nexus@{CLOSED}/tenant?passwd={QUERY_PASSWORD}"
                                        f"&ssl_key={KEY_MATERIAL}&ssl_cert=/etc/nexus/client.pem"),
    "ssl-key spelled with a dash": f"mysql+pymysql://nexus:{USERINFO_PASSWORD}@{CLOSED}/tenant?ssl-key={KEY_MATERIAL}",
    "Airflow's ssl mapping": (f"mysql://nexus:{USERINFO_PASSWORD}@{CLOSED}/tenant?ssl="
                              + quote_plus(str({"ca": "/etc/nexus/ca.pem", "key": KEY_MATERIAL}))),
}

#: (module, arguments, the DSN variable it reads, whether it prints the masked DSN in its start-up line)
COMMANDS = {
    "nexus-cutover status": ("cutover_steps", ["status", "-namespace", "acme"], "NEXUS_TENANT_DSN", True),
    "nexus-cutover status -json": ("cutover_steps", ["status", "-namespace", "acme", "-json"], "NEXUS_TENANT_DSN", True),
    "nexus-cutover plan -json": ("cutover_steps", ["plan", "-namespace", "acme", "-json", "-timeout", "5s"], "NEXUS_TENANT_DSN", True),
    "connector-projection-cutover": ("lifecycle_entrypoint", ["-pack-install-id", "pk-1", "-timeout", "5s"], "CONNECTOR_CUTOVER_DSN", True),
    "connector-projection-cutover -json": ("lifecycle_entrypoint", ["-pack-install-id", "pk-1", "-timeout", "5s", "-json"],
                                           "CONNECTOR_CUTOVER_DSN", True),
    "field-history-eligibility status": ("field_history", ["status"], "NEXUS_TENANT_DSN", True),
    "field-history-eligibility status -json": ("field_history", ["status", "-json"], "NEXUS_TENANT_DSN", True),
    "field-history-eligibility stage3 -check -json": ("field_history", ["stage3", "-check", "-json"], "NEXUS_TENANT_DSN", True),
    "nexus-host": ("host", ["--namespace", "acme", "--drain-and-exit"], "NEXUS_TENANT_DSN", False),
}


def run(module: str, args: list[str], env_name: str, dsn: str) -> subprocess.CompletedProcess:
    env = {k: v for k, v in os.environ.items() if k not in ("NEXUS_TENANT_DSN", "CONNECTOR_CUTOVER_DSN")}
    env[env_name] = dsn
    return subprocess.run([sys.executable, "-m", f"nexus_cutover.cli.{module}", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def assert_no_secret(proc: subprocess.CompletedProcess) -> None:
    for secret in SECRETS:
        assert secret not in proc.stdout, (secret, proc.stdout)
        assert secret not in proc.stderr, (secret, proc.stderr)


@pytest.mark.parametrize("dsn", DSNS.values(), ids=DSNS.keys())
@pytest.mark.parametrize("command", COMMANDS, ids=COMMANDS.keys())
def test_a_dsn_secret_is_masked_in_every_output_when_the_connection_fails(command, dsn):
    module, args, env_name, prints_dsn = COMMANDS[command]
    proc = run(module, args, env_name, dsn)
    assert proc.returncode != 0, proc.stdout + proc.stderr  # nothing listens there
    assert "error:" in proc.stderr
    assert_no_secret(proc)
    if prints_dsn:  # the start-up line names the target, masked
        assert mask_dsn(dsn) in proc.stderr, proc.stderr
        assert "***" in mask_dsn(dsn)


@pytest.fixture
def password_in_the_query(mysql_url):
    """A MariaDB tenant (Part A, one pack of 'acme') and a DSN whose user's password is only in the query string."""
    root = make_engine(mysql_url)
    create_legacy_schema(root)
    sc = TenantScenario(namespace="acme")
    sc.pack("pk-1")
    sc.write(root)
    u = make_url(mysql_url)
    user = f"nxs_{uuid.uuid4().hex[:8]}"
    with root.begin() as conn:
        conn.execute(text(f"CREATE USER '{user}'@'%' IDENTIFIED BY '{QUERY_PASSWORD}'"))
        conn.execute(text(f"GRANT ALL ON `{u.database}`.* TO '{user}'@'%'"))
    dsn = u.set(username=user, password=None, query={**u.query, "password": QUERY_PASSWORD}).render_as_string(
        hide_password=False)
    yield dsn
    with root.begin() as conn:
        conn.execute(text(f"DROP USER IF EXISTS '{user}'@'%'"))
    root.dispose()


@pytest.mark.parametrize("command", [c for c in COMMANDS if COMMANDS[c][3]], ids=[c for c in COMMANDS if COMMANDS[c][3]])
def test_a_query_string_password_that_connects_is_masked_in_every_output(password_in_the_query, command):
    """The connection works with the password from the query string; no output shows it."""
    module, args, env_name, _ = COMMANDS[command]
    proc = run(module, args, env_name, password_in_the_query)
    assert "cannot reach" not in proc.stderr and "refused the credentials" not in proc.stderr, proc.stderr
    assert_no_secret(proc)
    assert mask_dsn(password_in_the_query) in proc.stderr and "password=***" in proc.stderr


def test_the_host_with_a_query_string_password_shows_no_secret(password_in_the_query):
    proc = run("host", ["--namespace", "acme", "--drain-and-exit"], "NEXUS_TENANT_DSN", password_in_the_query)
    assert "cannot reach" not in proc.stderr and "refused the credentials" not in proc.stderr, proc.stderr
    assert_no_secret(proc)


def test_a_wrong_query_string_password_is_refused_without_echoing_it(mysql_url):
    """The server refuses the credentials (exit 2; PyMySQL takes the query's password over the one before the ``@``):
    the message names the user, never either password."""
    u = make_url(mysql_url)
    dsn = u.set(query={**u.query, "password": QUERY_PASSWORD}).render_as_string(hide_password=False)
    proc = run("cutover_steps", ["status", "-namespace", "acme", "-json"], "NEXUS_TENANT_DSN", dsn)
    assert proc.returncode == 2 and "refused the credentials" in proc.stderr, proc.stderr
    assert_no_secret(proc)
    assert u.password not in proc.stdout + proc.stderr


@pytest.mark.parametrize(("name", "kept"), [
    ("PATH", True), ("NEXUS_STACK_ID", True), ("PYTHONPATH", True), ("KUBECONFIG", True),
    ("AIRFLOW__CORE__FERNET_KEY", False), ("AIRFLOW__DATABASE__SQL_ALCHEMY_CONN", False),
    ("AIRFLOW_CONN_NEXUS_TENANT_OTHER", False), ("AIRFLOW_HOME", False), ("CONNECTOR_CUTOVER_DSN", False),
    ("AWS_SECRET_ACCESS_KEY", False), ("VAULT_TOKEN", False), ("DB_PASSWORD", False), ("GCP_CREDENTIALS", False),
    ("NEXUS_LEDGER_DSN", False), ("NEXUS_NOTIFY_WEBHOOK", False), ("NEXUS_STATSD", True),  # secret settings: withheld
])
def test_a_new_host_gets_its_tenant_dsn_and_none_of_its_starters_secrets(name, kept):
    """``host_environment``: what ``start_new_host`` (command) and ``nexus-cutover run -host-command`` give the host."""
    from nexus_cutover.db import DSN_ENV_TENANT, host_environment

    dsn = "mysql+pymysql://nexus:pw@tidb:4000/t?ssl_mode=REQUIRED"
    env = host_environment({name: "value", DSN_ENV_TENANT: "mysql://old"}, dsn)
    assert env[DSN_ENV_TENANT] == dsn
    assert (name in env) is kept

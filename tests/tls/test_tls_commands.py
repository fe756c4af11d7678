"""TLS through what a team uses: the command line's DSN (query parameters), the Airflow connection's extras (the
tenant hook), the child host's environment, and one dry-run cutover DAG run; what each reports, and no secret shown.

The TLS MariaDB of :func:`tests.tls.conftest.tls_server`: its user ``REQUIRE SSL``, so a command that worked is one
that connected over TLS; its certificate is for ``localhost`` only.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from sqlalchemy import text

from nexus_cutover.db import mask_dsn, tls_report
from tests.tls.conftest import TLS_PASSWORD


def run(args: list[str], dsn: str, env: dict, module: str = "cutover_steps", env_name: str = "NEXUS_TENANT_DSN"):
    return subprocess.run([sys.executable, "-m", f"nexus_cutover.cli.{module}", *args], env={**env, env_name: dsn},
                          capture_output=True, text=True, timeout=120)


def assert_nothing_secret(proc, *secrets: str) -> None:
    for secret in (TLS_PASSWORD, *secrets):
        assert secret not in proc.stdout and secret not in proc.stderr, (secret, proc.stdout, proc.stderr)


def client_dsn(tls_server, database: str, **extra) -> str:
    return tls_server.dsn(database, ssl_mode="VERIFY_IDENTITY", ssl_ca=tls_server.ca, ssl_cert=tls_server.client_cert,
                          ssl_key=tls_server.client_key, **extra)


def test_status_over_tls_from_the_dsn_reports_the_mode(tls_server, tls_tenant, cli_env):
    name, _ = tls_tenant
    dsn = client_dsn(tls_server, name)
    proc = run(["status", "-namespace", "acme", "-json"], dsn, cli_env)
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)["tls"]
    assert (report["mode"], report["default"], report["ca"], report["cert"]) == (
        "VERIFY_IDENTITY", False, tls_server.ca, tls_server.client_cert)
    assert report["client_key"] is True and report["in_use"].startswith("TLSv")
    assert mask_dsn(dsn) in proc.stderr and "ssl_key=***" in proc.stderr  # the start-up line: the key's path hidden
    assert_nothing_secret(proc, tls_server.client_key)
    text_proc = run(["status", "-namespace", "acme"], dsn, cli_env)
    assert text_proc.returncode == 0, text_proc.stderr
    assert f"database: TLS VERIFY_IDENTITY, in use: {report['in_use']}" in text_proc.stdout


def test_a_cutover_step_over_tls_from_the_dsn(tls_server, tls_tenant, cli_env):
    """``apply-schema`` (step 1's DDL) and ``connector-projection-cutover`` (its own DSN variable) over TLS."""
    name, engine = tls_tenant
    dsn = client_dsn(tls_server, name)
    proc = run(["apply-schema", "-json"], dsn, cli_env)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["created"], proc.stdout
    with engine.connect() as conn:  # the step's DDL is on the TLS server
        assert conn.execute(text("SELECT COUNT(*) FROM information_schema.COLUMNS WHERE TABLE_SCHEMA = :s "
                                 "AND COLUMN_NAME = 'InputStartOrdinal'"), {"s": name}).scalar() > 0
    cutover = run(["-pack-install-id", "pk-1", "-timeout", "10s", "-json"], dsn, cli_env, module="lifecycle_entrypoint",
                  env_name="CONNECTOR_CUTOVER_DSN")
    assert "cannot connect" not in cutover.stderr and "refused the credentials" not in cutover.stderr, cutover.stderr
    assert_nothing_secret(proc, tls_server.client_key)
    assert_nothing_secret(cutover, tls_server.client_key)


def test_the_new_host_connects_over_tls_from_its_dsn(tls_server, tls_tenant, cli_env):
    """``nexus-host``, which ``start_new_host`` starts with the run's DSN in ``NEXUS_TENANT_DSN``: the TLS parameters
    in that DSN are all it needs (the user REQUIRE SSL): it registers, then its activation gate stops it on this
    tenant without the cutover's schema, as on any server."""
    name, _ = tls_tenant
    proc = run(["--namespace", "acme", "--drain-and-exit"], client_dsn(tls_server, name), cli_env, module="host")
    assert "registered for namespace 'acme'" in proc.stderr and "activation gate refused" in proc.stderr, proc.stderr
    assert "cannot connect" not in proc.stderr
    assert_nothing_secret(proc, tls_server.client_key)


@pytest.mark.parametrize(("query", "code", "words"), [
    ({"ssl_mode": "VERIFY-EVERYTHING"}, 2, "ssl_mode 'VERIFY-EVERYTHING' is not a TLS mode"),
    ({"ssl_mode": "VERIFY_CA", "ssl_ca": "/nonexistent/ca.pem"}, 2, "the ssl_ca file '/nonexistent/ca.pem' does not exist"),
    ({"ssl_mode": "VERIFY_CA", "ssl_ca": "{other_ca}"}, 1, "cannot connect to the tenant database while"),
    ({"ssl_mode": "DISABLED"}, 2, "ssl_mode=DISABLED: if this user must connect over TLS (REQUIRE SSL)"),
])
def test_the_command_line_refuses_in_words_with_the_contract_exit_code(tls_server, cli_env, query, code, words):
    query = {k: (tls_server.other_ca if v == "{other_ca}" else v) for k, v in query.items()}
    proc = run(["status", "-namespace", "acme"], tls_server.dsn(**query), cli_env)
    assert proc.returncode == code, proc.stderr
    assert words in proc.stderr, proc.stderr
    assert_nothing_secret(proc)


@pytest.mark.parametrize("style", ["flat extras", "MySqlHook's ssl mapping", "ssl mapping as JSON text"])
def test_the_hook_connects_over_tls_from_the_connections_extras(tls_server, tls_tenant, airflow_connection, style):
    from airflow.sdk._shared.secrets_masker.secrets_masker import redact

    from nexus_airflow.hooks import NexusTenantHook

    name, _ = tls_tenant
    files = {"ca": tls_server.ca, "cert": tls_server.client_cert, "key": tls_server.client_key}
    extra = {"client": "pymysql", "ssl_mode": "VERIFY_IDENTITY", "charset": "utf8mb4"}
    if style == "flat extras":
        extra |= {f"ssl_{k}": v for k, v in files.items()}
    else:
        extra["ssl"] = files if style == "MySqlHook's ssl mapping" else json.dumps(files)
    conn_id = airflow_connection("nexus_tenant_tls", {"conn_type": "mysql", "host": "localhost", "port": tls_server.port,
                                                      "login": "tls_user", "password": TLS_PASSWORD, "schema": name,
                                                      "extra": extra})
    hook = NexusTenantHook(conn_id)
    assert hook.tls_text == "TLS VERIFY_IDENTITY"
    engine = hook.get_engine()
    try:
        with engine.connect() as conn:
            report = tls_report(engine, conn)
    finally:
        engine.dispose()
    assert report["mode"] == "VERIFY_IDENTITY" and report["in_use"].startswith("TLSv") and report["client_key"] is True
    masked = hook.masked_dsn
    assert TLS_PASSWORD not in masked and tls_server.client_key not in masked and "ssl_key=***" in masked
    assert "ssl_mode=VERIFY_IDENTITY" in masked and "charset=utf8mb4" in masked
    child = hook.dsn_for_child_process()  # the host's NEXUS_TENANT_DSN: the TLS parameters travel with it
    assert f"@localhost:{tls_server.port}/{name}?" in child and "ssl_mode=VERIFY_IDENTITY" in child
    assert "ssl_key=" in child and "ssl_ca=" in child
    shown = redact(f"env NEXUS_TENANT_DSN={child}")  # registered with Airflow's secrets masker
    assert TLS_PASSWORD not in shown and child not in shown


def test_a_connection_without_ssl_mode_on_a_non_local_host_requires_tls(airflow_db, airflow_connection):
    from nexus_airflow.hooks import NexusTenantHook

    conn_id = airflow_connection("nexus_tenant_remote", {"conn_type": "mysql", "host": "tidb.example.com", "port": 4000,
                                                         "login": "nexus", "password": "pw-remote-1", "schema": "tenant"})
    assert NexusTenantHook(conn_id).tls_text == "TLS REQUIRED (the default for a non-local server)"


def test_a_dry_run_of_the_cutover_dag_over_tls_reports_the_mode(tls_server, tls_tenant, airflow_db, airflow_connection,
                                                                 capfd):
    """One dry-run DAG run through the hook (extras): every task connects over TLS (the user REQUIRE SSL), the task
    log names the mode, the schema step's XCom reports it, and neither the password nor the key's path is shown."""
    from tests.dags.airflow_harness import load_dag, run_dag
    from tests.dags.cutover_support import DAG_ID, base_conf

    name, _ = tls_tenant
    conn_id = airflow_connection("nexus_tenant_tls_dag", {
        "conn_type": "mysql", "host": "localhost", "port": tls_server.port, "login": "tls_user", "password": TLS_PASSWORD,
        "schema": name, "extra": {"ssl_mode": "VERIFY_IDENTITY", "ssl_ca": tls_server.ca, "ssl_cert": tls_server.client_cert,
                                  "ssl_key": tls_server.client_key}})
    result = run_dag(load_dag(DAG_ID), base_conf(conn_id, dry_run=True, pack_install_ids=["pk-1"]))
    out = capfd.readouterr()
    logs = out.out + out.err
    assert result.state_of("apply_schema") == "success", result.task_states
    reported = result.xcom("apply_schema")["tls"]
    assert reported["mode"] == "VERIFY_IDENTITY" and reported["in_use"].startswith("TLSv"), reported
    first = result.xcom("resolve_packs", "tls")  # the run's first step reports it: every run's report says it
    assert (first["mode"], first["ca"], first["cert"], first["client_key"]) == (
        "VERIFY_IDENTITY", tls_server.ca, tls_server.client_cert, True), first
    assert first["in_use"].startswith("TLSv")
    assert f"(connection {conn_id}, TLS VERIFY_IDENTITY)" in logs
    assert f"tenant database: TLS VERIFY_IDENTITY, in use: {first['in_use']}" in logs
    every_xcom = json.dumps(list(result.xcoms.values()), default=str)
    for secret in (TLS_PASSWORD, tls_server.client_key):
        assert secret not in logs and secret not in every_xcom


def test_a_field_history_run_over_tls_reports_the_mode(tls_server, tls_database, airflow_db, airflow_connection, capfd):
    """A Field History DAG run through the connection's extras (the user REQUIRE SSL): its first step, stage_1,
    reports the mode and the TLS version in use (XCom ``tls``, a log line); no password, no key path anywhere."""
    from tests.dags.airflow_harness import load_dag, run_dag
    from tests.dags.test_field_history_dag import DAG_ID as FH_DAG
    from tests.dags.test_field_history_dag import conf, legacy

    name, engine = tls_database
    legacy(engine)
    airflow_connection("nexus_tenant_acme", {
        "conn_type": "mysql", "host": "localhost", "port": tls_server.port, "login": "tls_user", "password": TLS_PASSWORD,
        "schema": name, "extra": {"ssl_mode": "VERIFY_IDENTITY", "ssl_ca": tls_server.ca, "ssl_cert": tls_server.client_cert,
                                  "ssl_key": tls_server.client_key}})
    result = run_dag(load_dag(FH_DAG), conf(target_stage=1, producer_release=""))
    out = capfd.readouterr()
    logs = out.out + out.err
    assert result.state_of("stage_1") == "success", result.task_states
    reported = result.xcom("stage_1", "tls")
    assert reported["mode"] == "VERIFY_IDENTITY" and reported["in_use"].startswith("TLSv"), reported
    assert f"tenant database: TLS VERIFY_IDENTITY, in use: {reported['in_use']}" in logs
    every_xcom = json.dumps(list(result.xcoms.values()), default=str)
    for secret in (TLS_PASSWORD, tls_server.client_key):
        assert secret not in logs and secret not in every_xcom


def test_plan_over_tls_from_the_dsn_reports_the_mode(tls_server, tls_tenant, cli_env):
    """``nexus-cutover plan -json`` (every step's dry run, the first one reporting the connection) carries the
    ``tls`` it connected with, and says it."""
    name, _ = tls_tenant
    plan = run(["plan", "-namespace", "acme", "-json"], client_dsn(tls_server, name), cli_env)
    assert plan.returncode == 0, plan.stderr
    reported = json.loads(plan.stdout)["tls"]
    assert reported["mode"] == "VERIFY_IDENTITY" and reported["in_use"].startswith("TLSv"), reported
    text_plan = run(["plan", "-namespace", "acme"], client_dsn(tls_server, name), cli_env)
    assert text_plan.returncode == 0, text_plan.stderr
    assert f"tenant database: TLS VERIFY_IDENTITY, in use: {reported['in_use']}" in text_plan.stdout
    for proc in (plan, text_plan):
        assert_nothing_secret(proc, tls_server.client_key)


def test_a_field_history_stage_over_tls_from_the_dsn_reports_the_mode(tls_server, tls_database, cli_env):
    """``field-history-eligibility stage1 -json`` (and every stage command) carries the ``tls`` it connected with."""
    from tests.dags.test_field_history_dag import STAGE1, legacy

    name, engine = tls_database
    legacy(engine)
    stage1 = run(["stage1", "-stage1-release", STAGE1, "-json"], client_dsn(tls_server, name), cli_env, module="field_history")
    assert stage1.returncode == 0, stage1.stderr
    reported = json.loads(stage1.stdout)["tls"]
    assert reported["mode"] == "VERIFY_IDENTITY" and reported["in_use"].startswith("TLSv"), reported
    assert f"tenant database: TLS VERIFY_IDENTITY, in use: {reported['in_use']}" in stage1.stderr
    assert_nothing_secret(stage1, tls_server.client_key)


def test_the_status_view_reads_a_tenant_over_tls_from_the_extras(tls_server, tls_tenant, airflow_db, airflow_connection):
    """The status view's read of a tenant (the API's row) through the connection's extras, over TLS (the user
    REQUIRE SSL): readable, its row names the TLS mode, and carries no password and no key path."""
    from nexus_status.tenants import read_tenant

    name, _ = tls_tenant
    conn_id = airflow_connection("nexus_tenant_acme", {
        "conn_type": "mysql", "host": "localhost", "port": tls_server.port, "login": "tls_user", "password": TLS_PASSWORD,
        "schema": name, "extra": {"ssl_mode": "VERIFY_IDENTITY", "ssl_ca": tls_server.ca, "ssl_cert": tls_server.client_cert,
                                  "ssl_key": tls_server.client_key}})
    state = read_tenant(conn_id)
    assert state["phase"] != "unreadable", state
    assert state["tls"] == "TLS VERIFY_IDENTITY" and state["packs"], state
    shown = json.dumps(state, default=str)
    assert TLS_PASSWORD not in shown and tls_server.client_key not in shown

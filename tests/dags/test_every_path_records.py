"""Every path leaves the same record (issue 48): a DAG cutover, ``nexus-cutover run`` and the step-by-step commands,
each on a production-shaped tenant of the same shape (the old runtime draining, then stopped), write the same
delivery-ledger event kinds in the same order and send the same metric names -- the DAG through Airflow's
connection and metrics client, the command line through ``NEXUS_LEDGER_DSN`` and ``NEXUS_STATSD``."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time

import pytest

from nexus_cutover import ledger as L
from nexus_cutover.db import make_engine
from nexus_cutover.metrics import ALL
from nexus_sim.scenario.production import build_production_tenant
from tests.dags.cutover_support import DAG_ID, NS, old_runtime
from tests.dags.test_ledger_runs import cutover, expected_kinds
from tests.statsd_listener import StatsdListener
from tests.support import mysql_database

PREFIX = "everypath"
HOLDER_RUN, HOLDER_STEPS = "cli:run-of-acme", "cli:steps-of-acme"
FAST = ["-poll-interval", "200ms", "-stale-heartbeat", "30s"]
#: Figures sent only once measured: a drain's rate needs two looks 0.2 s apart or more.
MEASURED = {"nexus.drain.rate"}


@pytest.fixture
def three_tenants(request, mysql_server_url):
    """Three databases holding the same production-shaped tenant (utf8mb4, its default collation)."""
    request.node._nexus_uses_mysql = True
    with mysql_database(mysql_server_url, charset="utf8mb4") as a, mysql_database(mysql_server_url, charset="utf8mb4") as b, \
            mysql_database(mysql_server_url, charset="utf8mb4") as c:
        engines = [make_engine(url) for url in (a, b, c)]
        try:
            for engine in engines:
                build_production_tenant(engine, namespace=NS, in_flight_generations=2)
            yield list(zip(engines, (a, b, c), strict=True))
        finally:
            for engine in engines:
                engine.dispose()


def cli(url: str, statsd_port: int, ledger: str, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEXUS_TENANT_DSN": url, "NEXUS_LEDGER_DSN": ledger, "NEXUS_STATSD": f"127.0.0.1:{statsd_port}",
           "NEXUS_STATSD_PREFIX": PREFIX, "NEXUS_HOST_HEARTBEAT_S": "0.5", "NEXUS_HOST_POLL_S": "0.2"}
    return subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", *args], env=env, capture_output=True,
                          text=True, timeout=300)


def host_command() -> str:
    return f"{sys.executable} -m nexus_cutover.cli.host --namespace {NS}"


def names(listener: StatsdListener) -> set[str]:
    """The bare metric names that arrived (tags dropped, as plain StatsD keeps them)."""
    return {name.split(".", 1)[1] for name in (line.split(":", 1)[0] for line in listener.lines)
            if name.startswith(f"{PREFIX}.nexus.")} & {m.name for m in ALL}


def run_steps(url: str, port: int, ledger: str, digest_file: str) -> int | None:
    """The cutover as a person runs it command by command, one -holder for all of them; the host's pid."""
    common = ["-stale-heartbeat", "30s", "-holder", HOLDER_STEPS, "-actor", "dana"]

    def ok(*args: str) -> dict:
        proc = cli(url, port, ledger, *args, *common, "-json")
        assert proc.returncode == 0, (args, proc.stderr[-2000:])
        return json.loads(proc.stdout.strip().splitlines()[-1])

    ok("apply-schema")
    ok("arm-fence", "-namespace", NS)
    ok("drain", "-namespace", NS, "--wait", "-poll-interval", "200ms")
    deadline = time.monotonic() + 60
    while cli(url, port, ledger, "writers", "-namespace", NS, *common).returncode != 0:  # a look, not a stop
        assert time.monotonic() < deadline, "the old writers did not stop"
        time.sleep(0.3)
    ok("confirm-writers", "-namespace", NS, "--confirm-writers-stopped")
    ok("digest", "-namespace", NS, "-out", digest_file)
    for pack in ok("status", "-namespace", NS)["packs"]:
        ok("checkpoint", "-pack-install-id", pack["pack_install_id"])
    host_pid = ok("start-host", "-namespace", NS, "-host-command", host_command()).get("host_pid")
    deadline = time.monotonic() + 60
    while cli(url, port, ledger, "readiness", "-namespace", NS, *common).returncode != 0:
        assert time.monotonic() < deadline, "the new host did not become ready"
        time.sleep(0.3)
    ok("release-fence", "-namespace", NS)
    ok("verify", "-namespace", NS, "-expect", digest_file)
    return host_pid


def test_a_dag_run_the_run_command_and_the_step_by_step_commands_record_the_same(
        airflow_db, three_tenants, tenant_connection, tmp_path, monkeypatch):
    from nexus_airflow import metrics

    # this machine's ledger spool, empty: what an earlier test left in the default one would be caught up here and
    # counted (nexus.ledger.caught_up) on one path only
    monkeypatch.setenv("NEXUS_LEDGER_SPOOL_DIR", str(tmp_path / "spool"))
    ledger_file = tmp_path / "ledger.db"
    ledger = f"sqlite:///{ledger_file}"
    tenant_connection("nexus_ledger", raw_json=json.dumps({"conn_type": "sqlite", "host": str(ledger_file)}))
    (dag_engine, dag_url), (run_engine, run_url), (steps_engine, steps_url) = three_tenants
    hosts: list[int] = []
    with StatsdListener() as dag_statsd, StatsdListener() as cli_statsd:
        for key, value in {"STATSD_ON": "True", "STATSD_HOST": "127.0.0.1", "STATSD_PORT": str(dag_statsd.port),
                           "STATSD_PREFIX": PREFIX}.items():
            monkeypatch.setenv(f"AIRFLOW__METRICS__{key}", value)
        monkeypatch.setattr(metrics, "_initialized_in", None)
        try:
            result = cutover(dag_engine, tenant_connection("nexus_tenant_acme_every_path", dag_url), tenant_connection)
        finally:
            monkeypatch.setattr(metrics, "_initialized_in", None)
        with old_runtime(run_engine, fail_attempts=1, retry_delay_s=0.3):
            proc = cli(run_url, cli_statsd.port, ledger, "run", "-namespace", NS, *FAST, "-holder", HOLDER_RUN,
                       "--confirm-writers-stopped", "-host-command", host_command(), "-json")
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        hosts.append(out.get("host_pid"))
        assert proc.returncode == 0 and out["outcome"] == "cut_over", proc.stderr[-3000:]
        time.sleep(0.5)
        run_names = names(cli_statsd)
        cli_statsd.lines.clear()
        with old_runtime(steps_engine, fail_attempts=1, retry_delay_s=0.3):
            hosts.append(run_steps(steps_url, cli_statsd.port, ledger, str(tmp_path / "digest.json")))
        time.sleep(0.5)
        steps_names, dag_names = names(cli_statsd), names(dag_statsd)
    for pid in hosts:
        _stop(pid)

    engine = L.ledger_engine(ledger)
    try:
        rows = L.history(engine, NS)
    finally:
        engine.dispose()
    by_run = {}
    for r in rows:
        by_run.setdefault((r["dag_id"], r["run_id"]), []).append(r["kind"])
    dag_kinds = by_run[(DAG_ID, result.run_id)]
    assert dag_kinds == expected_kinds(result)
    assert by_run[("nexus-cutover", HOLDER_RUN)] == dag_kinds  # `run`: the same kinds, in the same order
    assert by_run[("nexus-cutover", HOLDER_STEPS)] == dag_kinds  # step by step: the same again
    actors = {r["actor"] for r in rows if r["run_id"] == HOLDER_STEPS}
    assert actors == {"dana"}  # -actor names the person on every row of the command line's run
    # the same metric names on both paths (the CLI's plain StatsD, the DAG's Airflow client); a drain's rate is sent
    # only once two looks measured it, which depends on how fast the old runtime drained this tenant, not on the path
    assert dag_names and run_names - MEASURED == dag_names - MEASURED == steps_names - MEASURED, (
        dag_names ^ run_names, dag_names ^ steps_names)


def _stop(pid) -> None:
    import contextlib
    import signal

    if pid:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(pid, signal.SIGTERM)

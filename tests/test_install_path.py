"""The whole install path in one test (issue 49, item 6): what README's "Install into your Airflow" says, step by step,
from ``make dist``'s outputs only, to a real cutover of a TLS tenant.

1. ``make dist`` from a bare Python (a venv with nothing but pip) in a copy of what a release is made of; from then
   on only its outputs are used: the wheel and ``dist/constraints-<version>.txt``.
2. A fresh venv outside the checkout (no ``PYTHONPATH``, its working directory the Airflow home): Airflow 3.3.2 with
   Airflow's constraints and the release's, then the wheel with them. Airflow's own constraints file
   (``constraints-3.3.2/constraints-3.11.txt`` of the Airflow project, on GitHub) is not reachable from here: the dev
   lock ``constraints-dev.txt`` stands in for it (it pins the same Airflow and what Airflow brought when ``make test``
   passed; tests/test_constraints.py proves the release's file alone resolves with a fresh Airflow). The wheel with
   ``[airflow,stack]``: the metadata database is PostgreSQL, whose driver (``psycopg2-binary``) is the ``stack``
   extra's, as the README says for a PostgreSQL deployment.
3. ``airflow db migrate`` on a PostgreSQL metadata database (a throwaway server this test starts:
   tests/ledger_support.py's, ``initdb`` + ``pg_ctl``).
4. The DAG loader written from the installed package (``python -m nexus_cutover_airflow.dags_loader``) into an empty
   dags folder; the deployment's ``config/airflow_local_settings.py`` imports the product's; the plugins folder empty.
5. ``airflow standalone`` (scheduler, DAG processor, triggerer, API server; LocalExecutor, whose worker processes
   run the tasks; CeleryExecutor's topology is tests/stack's) on that PostgreSQL, with ``[metrics] statsd_on`` to a
   real UDP listener and the ``nexus_ledger`` connection (``conn_type`` postgres) on a database of the same server.
6. A REAL cutover (not dry) of a small drained MariaDB tenant (two packs; built by nexus_sim in this test process,
   never in the installed venv) on a MariaDB serving TLS (tests/tls/server.py's certificates and server), its
   Airflow connection ``VERIFY_CA`` with the CA (the certificate names ``localhost``; the connection's host is
   ``127.0.0.1``): the writer-stop question answered over Airflow's REST API (``PATCH .../hitlDetails``), the new
   host started by the ``http`` controller (tests/dags/cutover_support.Deployer, a real HTTP server here).
7. Asserts: the run succeeded; every pack has its checkpoint row; the fence is released; the ledger on PostgreSQL
   has the run's events in order (fence_armed ... digest_verified); the metrics arrived (``nexus.step.duration``,
   ``nexus.admission.pause``); the run reached its tenant with ``VERIFY_CA`` (resolve_packs' XCom ``tls``).

Every wait is bounded; every process started here (the bare and the team venv's pip, both database servers, the
whole ``airflow standalone`` process group, the deployer and its host threads, the UDP listener) is stopped on the
way out, failed or not."""

from __future__ import annotations

import contextlib
import os
import pathlib
import shutil
import sys
import time

import pytest
from sqlalchemy import text

from nexus_cutover import ledger as L
from nexus_cutover.db import make_engine
from nexus_cutover.schema import create_legacy_schema
from scripts.demo_airflow import LOCAL_SETTINGS_IMPORT, AirflowStack
from tests.dags.cutover_support import DAG_ID, NS, PACKS, Deployer, base_conf, drained_tenant, snapshot
from tests.dags.test_ledger_runs import RUN_KINDS
from tests.ledger_support import ledger_postgres
from tests.statsd_listener import StatsdListener
from tests.test_wheel_install import AIRFLOWS_CONSTRAINTS, DAG_IDS, REPO, VERSION, airflow_json, run
from tests.tls.server import TLS_PASSWORD, tls_mariadb

pytestmark = pytest.mark.airflow

CONFIRM = "Confirm: all old writers stopped"
STATSD_PREFIX = "airflow"  # the deployed [metrics] statsd_prefix (deploy/airflow-settings.toml)


def make_dist(where: pathlib.Path) -> pathlib.Path:
    """``make dist`` in a copy of what a release is made of, with a Python that has nothing but pip; its dist/."""
    tree = where / "release"
    tree.mkdir()
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    for name in ("Makefile", "pyproject.toml", "README.md", "LICENSE", "constraints.txt"):
        shutil.copy(REPO / name, tree / name)
    for folder in ("include", "plugins", "dags", "deploy"):
        shutil.copytree(REPO / folder, tree / folder, ignore=ignore)
    run([sys.executable, "-m", "venv", str(where / "bare")], cwd=where, timeout=300)
    run(["make", "dist", f"PYTHON={where / 'bare' / 'bin' / 'python'}"], cwd=tree, env=_no_checkout(), timeout=300)
    return tree / "dist"


def _no_checkout() -> dict[str, str]:
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def install(dist: pathlib.Path, where: pathlib.Path) -> pathlib.Path:
    """A fresh venv: Airflow 3.3.2 with (the stand-in for) Airflow's constraints and the release's, then the wheel."""
    (wheel,) = dist.glob(f"nexus_cutover-{VERSION}-*.whl")
    release = dist / f"constraints-{VERSION}.txt"
    # Airflow's constraints file is on GitHub, which this machine and CI cannot reach: the dev lock stands in for it.
    pins = ["-c", str(AIRFLOWS_CONSTRAINTS), "-c", str(release)]
    run([sys.executable, "-m", "venv", str(where / "venv")], cwd=where, timeout=300)
    pip = str(where / "venv" / "bin" / "pip")
    run([pip, "install", "-q", "apache-airflow[statsd]==3.3.2", *pins], cwd=where, env=_no_checkout(), timeout=1500)
    run([pip, "install", "-q", f"{wheel}[airflow,stack]", *pins], cwd=where, env=_no_checkout(), timeout=900)
    return where / "venv"


def wait_until(what: str, check, timeout_s: float, every_s: float = 2.0):
    deadline = time.monotonic() + timeout_s
    while not (got := check()):
        assert time.monotonic() < deadline, f"{what}: not after {timeout_s:.0f} s"
        time.sleep(every_s)
    return got


def test_the_whole_install_path_from_make_dist_to_a_real_cutover_over_tls(request, tmp_path):
    request.node._nexus_uses_mysql = True  # counted in the terminal summary: the tenant is on MariaDB (over TLS)
    started = time.monotonic()
    dist = make_dist(tmp_path)
    assert sorted(p.name for p in dist.iterdir()) == [
        f"constraints-{VERSION}.txt", f"nexus-cutover-deploy-{VERSION}.tar.gz", f"nexus_cutover-{VERSION}-py3-none-any.whl"]
    venv = install(dist, tmp_path)

    with contextlib.ExitStack() as stop:
        pg = stop.enter_context(ledger_postgres())  # the metadata DB (`airflow`) and the ledger's, one server
        ledger_url = pg.database_url()
        ledger_db = ledger_url.rsplit("/", 1)[1]
        statsd = stop.enter_context(StatsdListener())
        tls_server = stop.enter_context(tls_mariadb())

        # the tenant, over VERIFY_CA by 127.0.0.1 (the server's certificate names localhost only)
        tenant_db = "nx_install_path"
        tls_query = {"ssl_mode": "VERIFY_CA", "ssl_ca": tls_server.ca}
        admin = make_engine(tls_server.dsn("mysql", host="127.0.0.1", **tls_query))
        with admin.begin() as conn:
            conn.execute(text(f"CREATE DATABASE `{tenant_db}`"))
        admin.dispose()
        engine = make_engine(tls_server.dsn(tenant_db, host="127.0.0.1", **tls_query))
        stop.callback(engine.dispose)
        create_legacy_schema(engine)
        drained_tenant().write(engine)  # nexus_sim runs here, in the test process only
        deployer = stop.enter_context(Deployer(engine))  # the deployer endpoint: starts the new host on its POST

        home = tmp_path / "airflow"
        (home / "dags").mkdir(parents=True)
        env = _no_checkout()
        run([str(venv / "bin" / "python"), "-m", "nexus_cutover_airflow.dags_loader", str(home / "dags")],
            cwd=home, env=env)
        assert [p.name for p in (home / "dags").iterdir()] == ["load_nexus_cutover_dags.py"]
        stack = AirflowStack(home, parallelism=4, bin_dir=venv / "bin", extra_env={
            "AIRFLOW__CORE__DAGS_FOLDER": str(home / "dags"),
            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": pg.url,
            "AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
            "AIRFLOW__METRICS__STATSD_PORT": str(statsd.port), "AIRFLOW__METRICS__STATSD_PREFIX": STATSD_PREFIX,
            "AIRFLOW_CONN_NEXUS_LEDGER": json_conn(conn_type="postgres", host="127.0.0.1", port=pg.port,
                                                   login="airflow", password=pg.password, schema=ledger_db),
            "NEXUS_LEDGER_SPOOL_DIR": str(home / "nexus-ledger-spool"),
        })
        assert "sqlite" not in stack.env["AIRFLOW__DATABASE__SQL_ALCHEMY_CONN"]
        run([str(venv / "bin" / "airflow"), "db", "migrate"], cwd=home, env=stack.env, timeout=600)
        stop.callback(stack.stop)
        stack.start(timeout_s=600)
        assert (home / "config" / "airflow_local_settings.py").read_text() == LOCAL_SETTINGS_IMPORT
        assert not any((home / "plugins").iterdir())

        for dag_id in sorted(DAG_IDS):
            stack.wait_for_dag(dag_id, timeout_s=300)
        assert airflow_json(stack, "dags", "list-import-errors") == []
        (ours,) = [p for p in airflow_json(stack, "plugins") if p["name"] == "nexus_status"]
        assert ours["source"].startswith(f"nexus-cutover=={VERSION}: EntryPoint("), ours

        conn_id = f"nexus_tenant_{NS}"
        stack.put_connection(conn_id, "mysql", host="127.0.0.1", port=tls_server.port, login="tls_user",
                             password=TLS_PASSWORD, schema=tenant_db, extra=json_text(tls_query))
        port = deployer.server.server_address[1]
        stack.put_connection("nexus_deployer_test", "http", host="127.0.0.1", port=port, schema="http")

        # poll 10 s: the runbook's floor (apache/airflow#71172); the drained tenant's waits end at their first looks
        conf = base_conf(conn_id, poll_interval=10, stale_heartbeat=20, drain_timeout=300, writers_stop_timeout=120,
                         readiness_timeout=120, confirm_timeout=600, lock_timeout=60, digest_timeout=120)
        run_id = stack.trigger(DAG_ID, conf)["dag_run_id"]

        def asked():
            state = stack.dag_run(DAG_ID, run_id)["state"]
            assert state not in ("success", "failed"), f"the run ended {state} before asking: {states()}"
            return any(d["task_instance"]["task_id"] == "confirm_writers_stopped"
                       for d in stack.pending_hitl(DAG_ID, run_id))

        def states():
            return {ti["task_id"] + (f"[{ti['map_index']}]" if ti["map_index"] >= 0 else ""): ti["state"]
                    for ti in stack.task_instances(DAG_ID, run_id)}

        wait_until("the writer-stop question asked", asked, 420)
        answer = stack.answer_hitl(DAG_ID, run_id, "confirm_writers_stopped", CONFIRM)  # PATCH .../hitlDetails
        assert answer["chosen_options"] == [CONFIRM], answer
        state = wait_until("the run's end", lambda: (s := stack.dag_run(DAG_ID, run_id)["state"]) in ("success", "failed")
                           and s, 600, every_s=3)
        assert state == "success", (states(), f"see {stack.log_path}")

        # the tenant is cut over: a checkpoint row for every pack, the fence released
        after = snapshot(engine)
        assert sorted(row[0] for row in after["protocol_rows"]) == sorted(PACKS), after
        assert after["fences"] and all(released for _scope, _no_expiry, released in after["fences"]), after["fences"]
        assert deployer.requests and deployer.requests[0]["tenant"] == NS, deployer.requests

        # the run reached its tenant with VERIFY_CA, the CA it was given
        tls_report = stack.xcom(DAG_ID, run_id, "resolve_packs", key="tls")
        assert tls_report["mode"] == "VERIFY_CA" and tls_report["ca"] == tls_server.ca, tls_report

        # the delivery ledger on PostgreSQL: the run's events, in order
        packs = stack.xcom(DAG_ID, run_id, "resolve_packs")
        expected = [k for kind in RUN_KINDS for k in ([L.CHECKPOINT] * len(packs) if kind == "checkpoint" else [kind])]
        reader = L.ledger_engine(ledger_url, create=False)
        stop.callback(reader.dispose)
        rows = [r for r in L.history(reader, NS) if r["run_id"] == run_id]
        assert [r["kind"] for r in rows] == expected, [(r["step"], r["kind"]) for r in rows]
        assert not list((home / "nexus-ledger-spool").glob("*")), "events left in the spool"

        # the metrics, at the real UDP listener
        got = wait_until("the StatsD lines", lambda: (v := statsd.values(STATSD_PREFIX)) and
                         ("nexus.step.duration", "ms") in v and (f"nexus.admission.pause.{NS}", "ms") in v and v, 30, 1)
        assert got[("nexus.step.duration.arm_fence.success", "ms")], sorted(got)[:60]  # fleet-wide: by step
        (pause_ms,) = got[(f"nexus.admission.pause.{NS}", "ms")]
        assert abs(pause_ms - stack.xcom(DAG_ID, run_id, "resume_admission")["admission_pause_s"] * 1000) < 1
    print(f"the whole install path: {time.monotonic() - started:.0f} s")


def json_text(value) -> str:
    import json

    return json.dumps(value)


def json_conn(**fields) -> str:
    return json_text(fields)

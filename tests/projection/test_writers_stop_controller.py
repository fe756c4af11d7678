"""The writer-stop controller (issue 50, item 1) against real processes: a command and an HTTP endpoint that stop a
real running old-runtime simulator; a failing, a hanging and an unknown controller stop with the fence held and no
checkpoint written. ``nexus-cutover run`` on MariaDB, the delivery ledger on SQLite."""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import signal
import subprocess
import sys
import threading
import time
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest
from sqlalchemy import select

from nexus_cutover import catalog
from nexus_cutover import ledger as L
from nexus_cutover.errors import BadInput
from nexus_cutover.projection import steps
from tests.projection.test_cutover_steps_cli import NS, as_json, drained_tenant_at

FAST = ["-poll-interval", "200ms", "-stale-heartbeat", "5s", "-writers-stop-timeout", "60s"]
#: The old runtime's registered processes (ProcessIds).
SIM_PROCESSES = ["old-rt/dependency_resolver", "old-rt/ingress_writer", "old-rt/projection_worker"]
HOST = f"{sys.executable} -m nexus_cutover.cli.host --namespace {NS}"
#: The deployment's stop command of the tests: SIGTERM to the tenant's old runtime (its pid file named by the tenant
#: in the environment), then wait until it exited; says whether it was given a DSN.
STOP_SCRIPT = """
import os, signal, sys, time
tenant = os.environ["NEXUS_TENANT"]
pid = int(open(os.path.join(sys.argv[1], tenant + ".pid")).read())
os.kill(pid, signal.SIGTERM)
for _ in range(300):
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        break
    time.sleep(0.1)
else:
    sys.exit("old runtime %d of %s still running" % (pid, tenant))
print("stopped old runtime", pid, "of", tenant, "dsn given" if "NEXUS_TENANT_DSN" in os.environ else "no dsn")
"""


@pytest.fixture
def tenant_on_mariadb(mysql_url):
    """The drained two-pack tenant of the CLI tests (old writers registered and stopped), on MariaDB."""
    engine = drained_tenant_at(mysql_url)
    yield engine, mysql_url
    engine.dispose()


@pytest.fixture
def old_runtime(tenant_on_mariadb, tmp_path):
    """A real old-runtime simulator process of the tenant, live (heartbeating), its pid in ``<tmp>/<tenant>.pid``;
    reaped as soon as it exits (so a stop command sees it gone)."""
    engine, url = tenant_on_mariadb
    env = {**os.environ, "NEXUS_TENANT_DSN": url}
    proc = subprocess.Popen([sys.executable, "-m", "nexus_sim.old_runtime", "--namespace", NS, "--process-id", "old-rt",
                             "--poll", "0.1"], env=env, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    (tmp_path / f"{NS}.pid").write_text(str(proc.pid))
    reaper = threading.Thread(target=proc.wait, daemon=True)
    reaper.start()
    try:
        _until(lambda: sorted(_live(engine)) == SIM_PROCESSES, "the old runtime registers and heartbeats")
        yield engine, url, proc
    finally:
        if proc.poll() is None:
            proc.terminate()
        reaper.join(timeout=30)


def _live(engine) -> list[str]:
    return [p["process_id"] for p in steps.writer_evidence(engine, NS, stale_heartbeat=dt.timedelta(seconds=5)).live]


def _until(condition, what: str, timeout: float = 60.0) -> None:
    deadline = time.monotonic() + timeout
    while not condition():
        assert time.monotonic() < deadline, f"timed out waiting until {what}"
        time.sleep(0.1)


def run(url: str, tmp_path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEXUS_TENANT_DSN": url, "NEXUS_HOST_HEARTBEAT_S": "0.5", "NEXUS_HOST_POLL_S": "0.2",
           "NEXUS_LEDGER_DSN": f"sqlite:///{tmp_path / 'ledger.db'}", "NEXUS_LEDGER_SPOOL_DIR": str(tmp_path / "spool")}
    return subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", "run", "-namespace", NS, *FAST,
                           "--confirm-writers-stopped", "-host-command", HOST, "-holder", "eng-1", "-json", *args],
                          env=env, capture_output=True, text=True, timeout=300)


def kinds(tmp_path) -> list[tuple[str, str]]:
    engine = L.ledger_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        return [(r["step"], r["kind"]) for r in L.history(engine, NS)]
    finally:
        engine.dispose()


def ledger_rows(tmp_path, kind: str) -> list[dict]:
    engine = L.ledger_engine(f"sqlite:///{tmp_path / 'ledger.db'}")
    try:
        return [r for r in L.history(engine, NS) if r["kind"] == kind]
    finally:
        engine.dispose()


def _kill_host(out: dict) -> None:
    with contextlib.suppress(ProcessLookupError, TypeError):
        os.killpg(out.get("host_pid"), signal.SIGTERM)


def _nothing_written_after_the_fence(engine) -> None:
    with engine.connect() as conn:
        assert conn.execute(select(catalog.ConnectorProjectionProtocol)).all() == []
        assert conn.execute(select(catalog.AdmissionFence.c.ReleasedAt)).scalars().all() == [None]  # fence kept


def test_a_command_stops_the_real_old_runtime_then_the_cutover_proceeds(old_runtime, tmp_path):
    engine, url, sim = old_runtime
    command = f"{sys.executable} -c '{STOP_SCRIPT}' {tmp_path}"
    proc = run(url, tmp_path, "-writers-stop-controller", "command", "-writers-stop-command", command)
    out = as_json(proc)
    _kill_host(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert sim.poll() is not None  # the controller stopped the real process
    answer = out["writers_stop"]
    assert answer["ok"] and answer["controller"] == "command" and answer["exit_code"] == 0
    assert sorted(answer["live_before"]) == SIM_PROCESSES
    assert answer["still_live"] == [] and sorted(answer["stopped"]) == sorted(answer["live_before"])
    assert f"stopped old runtime {sim.pid} of {NS} no dsn" in answer["output_tail"]  # the tenant, never the DSN
    assert out["outcome"] == "cut_over" and all(c["outcome"] == "written" for c in out["checkpoints"])
    seen = kinds(tmp_path)
    order = [k for _, k in seen]
    assert order.index(L.DRAIN_DONE) < order.index(L.WRITERS_STOPPED) < order.index(L.EVIDENCE_SHOWN)
    (row,) = ledger_rows(tmp_path, L.WRITERS_STOPPED)
    assert row["step"] == "stop_old_writers" and row["outcome"] == "stopped by command"
    assert row["detail"]["exit_code"] == 0 and "no dsn" in row["detail"]["output_tail"]
    (shown,) = ledger_rows(tmp_path, L.EVIDENCE_SHOWN)  # the person was shown the controller's answer too
    assert shown["detail"]["evidence"]["writers_stop"]["ran"] == answer["ran"]
    report = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", "report", "-namespace", NS],
                            env={**os.environ, "NEXUS_LEDGER_DSN": f"sqlite:///{tmp_path / 'ledger.db'}"},
                            capture_output=True, text=True, timeout=120)
    assert report.returncode == 0, report.stderr
    assert f"{answer['ran']}: exit 0" in report.stdout and "| stopped old runtime" in report.stdout  # its own row
    assert "with the writer-stop controller's answer:" in report.stdout  # and with the evidence shown


class _Deployer(BaseHTTPRequestHandler):
    """A deployment API: POST /tenants/<tenant>/old-writers/stop stops the tenant's old runtime and says so."""

    sim: subprocess.Popen
    calls: list

    def do_POST(self):  # noqa: N802 - http.server's name
        body = json.loads(self.rfile.read(int(self.headers["Content-Length"])))
        type(self).calls.append((self.path, body))
        self.sim.send_signal(signal.SIGTERM)
        self.sim.wait(timeout=30)
        data = json.dumps({"ok": True, "stopped": [f"deployment/{body['tenant']}-old-runtime"]}).encode()
        self.send_response(200)
        self.send_header("Content-Type", "application/json")
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *_args):
        return None


def test_an_http_endpoint_stops_the_real_old_runtime_its_answer_checked(old_runtime, tmp_path):
    engine, url, sim = old_runtime
    handler = type("Deployer", (_Deployer,), {"sim": sim, "calls": []})
    server = ThreadingHTTPServer(("127.0.0.1", 0), handler)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = run(url, tmp_path, "-writers-stop-controller", "http", "-writers-stop-url",
                   f"http://127.0.0.1:{server.server_port}/tenants/{{tenant}}/old-writers/stop")
    finally:
        server.shutdown()
    out = as_json(proc)
    _kill_host(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    (path, body), = handler.calls
    assert path == f"/tenants/{NS}/old-writers/stop" and body["tenant"] == NS and body["holder"] == "eng-1"
    assert sorted(body["live_old_writers"]) == SIM_PROCESSES
    answer = out["writers_stop"]
    assert answer["ok"] and answer["http_status"] == 200 and answer["reported_stopped"] == [f"deployment/{NS}-old-runtime"]
    assert answer["still_live"] == [] and out["outcome"] == "cut_over"
    (row,) = ledger_rows(tmp_path, L.WRITERS_STOPPED)
    assert row["outcome"] == "stopped by http" and row["detail"]["http_status"] == 200


def test_a_deployment_api_that_refuses_stops_the_run_with_the_fence_held(old_runtime, tmp_path):
    engine, url, sim = old_runtime

    class Refusing(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            self.rfile.read(int(self.headers["Content-Length"]))
            self.send_response(503)
            self.end_headers()
            self.wfile.write(b"scale-down refused: deployment locked")

        def log_message(self, *_args):
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Refusing)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = run(url, tmp_path, "-writers-stop-controller", "http", "-writers-stop-url",
                   f"http://127.0.0.1:{server.server_port}/stop")
    finally:
        server.shutdown()
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "answered HTTP 503" in proc.stderr and "deployment locked" in proc.stderr
    _nothing_written_after_the_fence(engine)
    assert sim.poll() is None  # nothing stopped it


def test_a_failing_command_stops_the_run_with_the_fence_held_and_nothing_after_it(old_runtime, tmp_path):
    engine, url, sim = old_runtime
    command = f"{sys.executable} -c \"print('kubectl: forbidden'); raise SystemExit(5)\""
    proc = run(url, tmp_path, "-writers-stop-controller", "command", "-writers-stop-command", command)
    assert proc.returncode == 3, proc.stderr[-3000:]
    assert "stop_old_writers:" in proc.stderr and "exited with 5" in proc.stderr and "kubectl: forbidden" in proc.stderr
    assert "The fence stays armed" in proc.stderr
    _nothing_written_after_the_fence(engine)
    seen = kinds(tmp_path)
    assert seen[-1] == ("stop_old_writers", L.STOPPED)  # nothing recorded after it: no question asked, no checkpoint
    assert L.EVIDENCE_SHOWN not in [k for _, k in seen] and L.WRITERS_STOPPED not in [k for _, k in seen]
    assert sim.poll() is None


def test_a_hanging_command_is_killed_at_its_timeout_and_reported(old_runtime, tmp_path):
    engine, url, sim = old_runtime
    pid_file = tmp_path / "hung.pid"
    command = (f"{sys.executable} -c \"import os, time; open('{pid_file}', 'w').write(str(os.getpid())); "
               "print('waiting for the rollout', flush=True); time.sleep(600)\"")
    started = time.monotonic()
    proc = run(url, tmp_path, "-writers-stop-controller", "command", "-writers-stop-command", command,
               "-writers-stop-controller-timeout", "2s")
    assert proc.returncode == 4, proc.stderr[-3000:]  # a timeout, not a refusal
    assert time.monotonic() - started < 120
    assert "did not finish within its timeout" in proc.stderr and "waiting for the rollout" in proc.stderr
    hung = int(pid_file.read_text())
    with pytest.raises(ProcessLookupError):  # killed, not left behind
        os.kill(hung, 0)
    _nothing_written_after_the_fence(engine)
    assert kinds(tmp_path)[-1] == ("stop_old_writers", L.STOPPED)


def test_an_unknown_controller_or_one_without_its_configuration_is_refused_before_anything(tenant_on_mariadb, tmp_path):
    engine, url = tenant_on_mariadb
    bogus = run(url, tmp_path, "-writers-stop-controller", "kubernetes")
    assert bogus.returncode == 2 and "invalid choice: 'kubernetes'" in bogus.stderr
    env_free = {k: v for k, v in os.environ.items() if k not in ("NEXUS_WRITERS_STOP_COMMAND", "NEXUS_WRITERS_STOP_URL")}
    bare = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", "run", "-namespace", NS,
                           "-writers-stop-controller", "command", "--confirm-writers-stopped"],
                          env={**env_free, "NEXUS_TENANT_DSN": url}, capture_output=True, text=True, timeout=120)
    assert bare.returncode == 2 and "-writers-stop-command" in bare.stderr, bare.stderr
    with engine.connect() as conn:  # refused before anything was armed
        assert conn.execute(select(catalog.AdmissionFence)).all() == []
    with pytest.raises(BadInput, match="unknown writers_stop_controller 'ssh': one of manual, command, http"):
        steps.writers_stop.controller("ssh")
    with pytest.raises(BadInput, match="http:// or https://"):
        steps.writers_stop.controller("http", url="ftp://deployer")


def test_the_manual_default_runs_nothing_and_records_nothing(tenant_on_mariadb, tmp_path):
    engine, url = tenant_on_mariadb
    proc = run(url, tmp_path)
    out = as_json(proc)
    _kill_host(out)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert out["writers_stop"] == {"controller": "manual"}
    seen = [k for _, k in kinds(tmp_path)]
    assert L.WRITERS_STOPPED not in seen and L.EVIDENCE_SHOWN in seen
    (shown,) = ledger_rows(tmp_path, L.EVIDENCE_SHOWN)
    assert "writers_stop" not in shown["detail"]["evidence"]  # the evidence as before
    with engine.connect() as conn:
        assert len(conn.execute(select(catalog.ConnectorProjectionProtocol)).all()) == 2


def test_stop_writers_alone_runs_only_with_the_fence_in_force_and_records_as_the_step(old_runtime, tmp_path):
    engine, url, sim = old_runtime
    command = f"{sys.executable} -c '{STOP_SCRIPT}' {tmp_path}"
    env = {**os.environ, "NEXUS_TENANT_DSN": url, "NEXUS_LEDGER_DSN": f"sqlite:///{tmp_path / 'ledger.db'}",
           "NEXUS_LEDGER_SPOOL_DIR": str(tmp_path / "spool")}

    def cli(*args: str) -> subprocess.CompletedProcess:
        return subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", *args, "-holder", "eng-2",
                               "-json"], env=env, capture_output=True, text=True, timeout=120)

    stop = ("stop-writers", "-namespace", NS, "-writers-stop-controller", "command", "-writers-stop-command", command)
    unfenced = cli(*stop)
    assert unfenced.returncode == 3 and "no cutover fence is in force" in unfenced.stderr, unfenced.stderr
    assert sim.poll() is None  # nothing was run
    assert cli("apply-schema").returncode == 0 and cli("arm-fence", "-namespace", NS).returncode == 0
    fenced = cli(*stop)
    assert fenced.returncode == 0, fenced.stderr
    assert as_json(fenced)["ok"] and sorted(as_json(fenced)["stopped"]) == SIM_PROCESSES and sim.poll() is not None
    assert [k for _, k in kinds(tmp_path)] == [L.STOPPED, L.FENCE_ARMED, L.WRITERS_STOPPED]


def test_a_deployment_api_that_hangs_is_reported_at_the_timeout_its_credentials_never_shown(old_runtime, tmp_path):
    engine, url, sim = old_runtime
    seen = []

    class Hanging(BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802
            seen.append(self.headers.get("Authorization"))
            time.sleep(20)

        def log_message(self, *_args):
            return None

    server = ThreadingHTTPServer(("127.0.0.1", 0), Hanging)
    threading.Thread(target=server.serve_forever, daemon=True).start()
    try:
        proc = run(url, tmp_path, "-writers-stop-controller", "http", "-writers-stop-controller-timeout", "1s",
                   "-writers-stop-url", f"http://deployer:s3cret@127.0.0.1:{server.server_port}/stop?token=t0ken")
    finally:
        server.shutdown()
    assert proc.returncode == 4, proc.stderr[-3000:]
    assert "did not answer within its timeout" in proc.stderr and "token=***" in proc.stderr
    assert seen and seen[0].startswith("Basic ")  # the URL's credentials, sent as basic authentication
    everything = proc.stdout + proc.stderr + json.dumps(kinds(tmp_path)) + json.dumps(ledger_rows(tmp_path, L.STOPPED))
    assert "s3cret" not in everything and "t0ken" not in everything
    _nothing_written_after_the_fence(engine)

"""What the command line records (issue 48): the delivery ledger (``NEXUS_LEDGER_DSN``) and the metrics
(``NEXUS_STATSD``) of every command that runs a declared step, on SQLite (the embedded default) and MariaDB; a
refusal's stop with its reason; the fence gauge back to 0 from ``release-fence``; a release rerun by its holder;
a single step given ``-holder`` on another product version than the one that armed its fence; the notices a
command sends to ``NEXUS_NOTIFY_WEBHOOK`` (a stop with its reason, a cut-over with its cutoffs and pause)."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time

from sqlalchemy import select, update

from nexus_cutover import catalog
from nexus_cutover import ledger as L
from nexus_cutover.code_version import RUNNING
from tests.notify_sinks import SlackWebhookSink
from tests.projection.test_cutover_steps_cli import FAST, NS, as_json, tenant  # noqa: F401 - the fixture
from tests.projection.test_cutover_steps_cli import cli as steps_cli
from tests.statsd_listener import StatsdListener

PREFIX = "clirecords"


def cli(dsn: str, ledger: str, *args: str, statsd: int | None = None) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEXUS_TENANT_DSN": dsn, "NEXUS_LEDGER_DSN": ledger, "NEXUS_STATSD_PREFIX": PREFIX,
           "NEXUS_HOST_HEARTBEAT_S": "0.5", "NEXUS_HOST_POLL_S": "0.2"}
    env.pop("NEXUS_STATSD", None)
    if statsd is not None:
        env["NEXUS_STATSD"] = f"127.0.0.1:{statsd}"
    return subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", *args], env=env, capture_output=True,
                          text=True, timeout=120)


def rows_of(ledger: str, run_id: str) -> list[dict]:
    engine = L.ledger_engine(ledger)
    try:
        return [r for r in L.history(engine, NS) if r["run_id"] == run_id]
    finally:
        engine.dispose()


def gauge(listener: StatsdListener, name: str) -> list[float]:
    return [float(line.split(":", 1)[1].split("|")[0]) for line in listener.lines
            if line.split(":", 1)[0] == f"{PREFIX}.{name}"]


def test_single_steps_record_their_events_their_stops_and_the_fence_gauge(tenant, tmp_path):  # noqa: F811
    engine, url = tenant
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    holder = "cli:records-test"
    with StatsdListener() as statsd:
        assert cli(url, ledger, "apply-schema", "-holder", holder, statsd=statsd.port).returncode == 0
        armed = cli(url, ledger, "arm-fence", "-namespace", NS, "-holder", holder, "-actor", "dana", statsd=statsd.port)
        assert armed.returncode == 0, armed.stderr
        # another holder's arm-fence is refused: its stop, with the reason the command printed, in its own run
        other = cli(url, ledger, "arm-fence", "-namespace", NS, "-holder", "cli:someone-else", statsd=statsd.port)
        assert other.returncode == 3
        for pack in ("pk-a", "pk-b"):  # the new host activates checkpointed packs only
            written = cli(url, ledger, "checkpoint", "-pack-install-id", pack, "-holder", holder, statsd=statsd.port)
            assert written.returncode == 0, written.stderr
        host = cli(url, ledger, "start-host", "-namespace", NS, "-holder", holder, "-json", "-host-command",
                   f"{sys.executable} -m nexus_cutover.cli.host --namespace {NS}", statsd=statsd.port)
        assert host.returncode == 0, host.stderr
        pid = json.loads(host.stdout.strip().splitlines()[-1])["host_pid"]
        try:
            deadline = time.monotonic() + 60
            while cli(url, ledger, "readiness", "-namespace", NS, "-holder", holder).returncode != 0:
                assert time.monotonic() < deadline, "the new host did not become ready"
                time.sleep(0.3)
            released = cli(url, ledger, "release-fence", "-namespace", NS, "-holder", holder, statsd=statsd.port)
        finally:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(pid, signal.SIGTERM)
        assert released.returncode == 0, released.stderr
        # a rerun by the holder whose release committed: its no-op success, never bad input
        again = cli(url, ledger, "release-fence", "-namespace", NS, "-holder", holder, statsd=statsd.port)
        assert again.returncode == 0, again.stderr
        assert "already_released" in again.stdout and "already released by you at" in again.stdout
        deadline = time.monotonic() + 5
        while time.monotonic() < deadline and len(gauge(statsd, "nexus.fence.armed_at")) < 3:
            time.sleep(0.1)
        armed_at = gauge(statsd, "nexus.fence.armed_at")
    mine = rows_of(ledger, holder)
    assert [r["kind"] for r in mine] == [L.FENCE_ARMED, L.CHECKPOINT, L.CHECKPOINT, L.HOST_STARTED,
                                          L.FENCE_RELEASED]  # a rerun: the same row
    assert mine[0]["holder"] == mine[-1]["holder"] and mine[0]["actor"] == "dana"
    assert sorted(r["pack"] for r in mine if r["kind"] == L.CHECKPOINT) == ["pk-a", "pk-b"]
    assert all(r["dag_id"] == "nexus-cutover" for r in mine)
    stop = rows_of(ledger, "cli:someone-else")
    assert [r["kind"] for r in stop] == [L.STOPPED] and stop[0]["step"] == "arm_fence"
    assert holder in stop[0]["reason"] and stop[0]["reason"].split(":")[0] in other.stderr
    # the gauge: the arming time while held, 0 once released (from the command line too), 0 again on the rerun
    assert armed_at[0] > 0 and armed_at[1:] == [0.0, 0.0], armed_at


def test_a_single_step_given_the_holder_on_another_version_stops_before_it_touches_the_tenant(tenant, tmp_path):  # noqa: F811
    engine, url = tenant
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    holder = "cli:pinned-holder"
    assert cli(url, ledger, "apply-schema").returncode == 0
    assert cli(url, ledger, "arm-fence", "-namespace", NS, "-holder", holder).returncode == 0
    with engine.begin() as conn:  # the fence as a release before this one armed it
        f = catalog.AdmissionFence
        reason = conn.execute(select(f.c.Reason).where(f.c.Namespace == NS)).scalar_one()
        conn.execute(update(f).where(f.c.Namespace == NS).values(Reason=reason.replace(RUNNING, "0.0.0+older")))
    pack = "pk-a"
    proc = cli(url, ledger, "checkpoint", "-pack-install-id", pack, "-holder", holder, "-json")
    assert proc.returncode == 3, proc.stderr
    out = json.loads(proc.stdout.strip().splitlines()[-1])
    assert "0.0.0+older" in out["error"] and RUNNING in out["error"] and "nothing was written" in out["error"]
    with engine.connect() as conn:
        assert conn.execute(select(catalog.ConnectorProjectionProtocol.c.PackInstallId)).all() == []
    stop = rows_of(ledger, holder)[-1]
    assert stop["kind"] == L.STOPPED and stop["step"] == "audit_and_checkpoint" and "0.0.0+older" in stop["reason"]
    # another holder is not pinned by this fence's version (it is refused by the fence itself, as before)
    released = cli(url, ledger, "release-fence", "-namespace", NS, "-holder", "cli:another")
    assert released.returncode == 3 and "0.0.0+older" not in released.stderr


def test_the_lifecycle_entrypoint_records_the_checkpoint_it_writes(tenant, tmp_path):  # noqa: F811
    engine, url = tenant
    ledger = f"sqlite:///{tmp_path / 'ledger.db'}"
    assert cli(url, ledger, "apply-schema").returncode == 0
    assert cli(url, ledger, "arm-fence", "-namespace", NS, "-holder", "cli:entrypoint-test").returncode == 0
    proc = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.lifecycle_entrypoint", "-pack-install-id", "pk-a",
                           "-actor", "erin", "-json"], capture_output=True, text=True, timeout=120,
                          env={**os.environ, "NEXUS_TENANT_DSN": url, "NEXUS_LEDGER_DSN": ledger})
    assert proc.returncode == 0, proc.stderr
    written = json.loads(proc.stdout.strip().splitlines()[-1])
    engine_l = L.ledger_engine(ledger)
    try:
        rows = [r for r in L.history(engine_l, NS) if r["dag_id"] == "connector-projection-cutover"]
    finally:
        engine_l.dispose()
    assert [(r["step"], r["kind"], r["pack"], r["cutoff"], r["actor"]) for r in rows] == [
        ("audit_and_checkpoint", L.CHECKPOINT, "pk-a", written["legacy_max_ordinal"], "erin")]
    assert rows[0]["holder"] == written["written_by"] == rows[0]["run_id"]


def test_a_command_tells_its_webhook_a_stop_with_its_reason_and_a_cut_over_with_its_cutoffs(tenant):  # noqa: F811
    """With only ``NEXUS_NOTIFY_WEBHOOK`` set, a refused step posts one FAILED notice naming the tenant, the step and
    the refusal; ``run`` on the fence its holder armed posts admission resumed with the pause it lasted, and one CUT
    OVER notice with each pack's cutoff and the admission pause it reported."""
    engine, url = tenant
    with SlackWebhookSink() as hook:
        env = {"NEXUS_NOTIFY_WEBHOOK": f"http://127.0.0.1:{hook.port}/notices", "NEXUS_LEDGER_DSN": "",
               "NEXUS_STATSD": ""}
        mine = steps_cli(url, "arm-fence", "-namespace", NS, "-holder", "cli:notices", env=env)
        assert mine.returncode == 0, mine.stderr
        assert hook.texts() == []  # a step that passed tells nobody
        other = steps_cli(url, "arm-fence", "-namespace", NS, "-holder", "cli:someone-else", env=env)
        assert other.returncode == 3, other.stderr
        host = f"{sys.executable} -m nexus_cutover.cli.host --namespace {NS}"
        run = steps_cli(url, "run", "-namespace", NS, "-holder", "cli:notices", *FAST, "--confirm-writers-stopped",
                        "-host-command", host, "-json", env=env)
        out = as_json(run)
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.killpg(out.get("host_pid"), signal.SIGTERM)
        assert run.returncode == 0, run.stderr[-3000:]
        texts = hook.texts()
    # no PAUSE AHEAD: the pause began at arm-fence, before run (a tenant already fenced gets no heads-up)
    assert hook.subjects() == [f"[nexus] FAILED: tenant {NS}, nexus-cutover.arm_fence",
                               f"[nexus] ADMISSION RESUMED: tenant {NS}, nexus-cutover.resume_admission",
                               f"[nexus] CUT OVER: tenant {NS}, nexus-cutover.run"], texts
    failed, resumed, cut_over = texts
    assert f"admission paused {out['admission_pause_s']:.1f} s (fence " in resumed
    assert "run: cli:someone-else" in failed and "cli:notices" in failed  # the refusal names the fence's holder
    assert "Read the command's output" in failed
    for c in out["checkpoints"]:
        assert f"{c['pack_install_id']} {c['legacy_max_ordinal']}" in cut_over
    assert f"admission paused {out['admission_pause_s']:.1f} s" in cut_over
    assert "run: cli:notices" in cut_over and url not in failed + cut_over


def test_a_run_that_arms_the_fence_tells_its_webhook_the_pause_ahead_first(tenant):  # noqa: F811
    """Issue 50, item 3: ``run`` on a tenant nobody fenced posts PAUSE AHEAD before it arms (with what the pause is
    expected to hold), then admission resumed, then the cut-over."""
    engine, url = tenant
    with SlackWebhookSink() as hook:
        env = {"NEXUS_NOTIFY_WEBHOOK": f"http://127.0.0.1:{hook.port}/notices", "NEXUS_LEDGER_DSN": "",
               "NEXUS_STATSD": ""}
        host = f"{sys.executable} -m nexus_cutover.cli.host --namespace {NS}"
        run = steps_cli(url, "run", "-namespace", NS, *FAST, "--confirm-writers-stopped", "-host-command", host,
                        "-json", env=env)
        out = as_json(run)
        with contextlib.suppress(ProcessLookupError, TypeError):
            os.killpg(out.get("host_pid"), signal.SIGTERM)
        assert run.returncode == 0, run.stderr[-3000:]
        texts = hook.texts()
    assert hook.subjects() == [f"[nexus] PAUSE AHEAD: tenant {NS}, nexus-cutover.wait_for_short_drain",
                               f"[nexus] ADMISSION RESUMED: tenant {NS}, nexus-cutover.resume_admission",
                               f"[nexus] CUT OVER: tenant {NS}, nexus-cutover.run"], texts
    assert "admission is paused in a few seconds (the fence is armed next) for no residual drain" in texts[0]

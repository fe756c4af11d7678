"""The cutover DAG on the production topology (scripts/stack.py): real processes, real signals.

* end to end for a MariaDB tenant with old work still draining (the drain sensor defers to a triggerer of the
  stack), the confirmation answered through the REST API, the reference host started by the run;
* the triggers import in the triggerers' environment;
* fault 1 of issue 13: SIGKILL of the Celery worker running ``audit_and_checkpoint``, after its write and
  while it waits on a pack lock before its write, then clear;
* fault 3: the scheduler and the api-server restarted while ``confirm_writers_stopped`` waits;
* fault 6: two runs for one tenant at once: exactly one proceeds.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys
import time

import pytest

from nexus_cutover.db import make_engine
from nexus_cutover.projection.digest import HistoryDigest
from nexus_cutover.projection.steps import verify_history
from nexus_sim.checks import live_ordinary_work, projection_owners_after_cutoff, receipt_outcomes
from nexus_sim.scenario.production import FUTURE_COLLISION
from nexus_sim.traffic import LiveTraffic
from scripts.demo import Child, stop_pid_if_ours
from scripts.demo_airflow import BIN

from .support import (
    CUTOVER_DAG,
    Run,
    build_demo_tenant,
    checkpoints,
    count_lines,
    cutover_conf,
    new_tenant,
    trigger_logs,
    wait_for,
)

pytestmark = pytest.mark.airflow  # a real distributed Airflow (mysql: set from mysql_server_url by tests/conftest.py)

REPO = pathlib.Path(__file__).resolve().parents[2]


def _stop_host(run: Run) -> None:
    started = run.xcom("start_new_host") or {}
    if started.get("pid"):
        stop_pid_if_ours(int(started["pid"]), "nexus")


def _assert_verified_end(run: Run) -> dict:
    final = run.xcom("final_old_writer_check")
    digest = run.xcom("history_digest")
    assert final["history_digest"]["verified"] is True, final
    assert final["history_digest"]["hash"] == digest["hash"], (final, digest)
    events = run.asset_events()
    assert len(events) == 1, events
    assert events[0]["extra"]["history_digest"] == final["history_digest"]
    assert events[0]["extra"]["cutoffs"] == final["cutoffs"]
    return final


def test_cutover_end_to_end_on_the_stack(stack, mysql_server_url):
    """The production-shaped demo tenant (utf8mb4, case-insensitive: ordinary work in every status, hostile lanes
    and receipt ids, 10,000 stopped registry rows, old work in flight) with live traffic throughout: ordinary work
    from the start, receipts from the release on."""
    built: dict = {}
    t = new_tenant(stack, mysql_server_url, "e2e", build=lambda ns: build_demo_tenant(ns, built=built))
    planted = built["planted"]
    engine = make_engine(t["dsn"])
    traffic = LiveTraffic(engine, planted, receipts_after_release=True, future_per_tick=2, interval_s=1.0).start()
    old = Child("old runtime", [sys.executable, str(REPO / "scripts" / "demo_old_runtime.py"), "--namespace", t["tenant"],
                                "--stop-after-fenced-drain"], {**stack.env, "NEXUS_TENANT_DSN": t["dsn"]},
                stack.logs / f"old-runtime-{t['tenant']}.log")
    run = Run(stack, cutover_conf(t["tenant"]))
    try:
        assert run.finish(400) == "success", run.watcher.seen
        assert not old.running()  # it stopped itself once the fence was armed and its work drained
        # the drain waited in a StatusPollTrigger run by one of the stack's triggerer jobs and fired from there:
        # read from the triggerers' own log files, not from a poll that may miss a short deferral
        triggerer_jobs = {r[0] for r in stack.metadata("SELECT id FROM job WHERE job_type = 'TriggererJob'")}
        logs = trigger_logs(stack, CUTOVER_DAG, run.run_id, "wait_for_drain")
        assert logs and set(logs) <= triggerer_jobs, (logs.keys(), triggerer_jobs)
        assert sum(count_lines(text, "Trigger fired event") for text in logs.values()) == 1, logs
        assert run.xcom("wait_for_drain")["state"] == "drained"
        final = _assert_verified_end(run)
        cps = checkpoints(t["dsn"])
        assert {p: v[0] for p, v in cps.items()} == final["cutoffs"] and all(len(v) == 1 for v in cps.values()), cps
        assert sorted(cps) == sorted(planted.active_packs)

        wait_for("traffic after the release", lambda: traffic.report.ticks_after_release >= 3, 60)
        report = traffic.stop()
        assert not report.errors and report.receipts_held > 0, report
        collisions = [(f.pack_install_id, f.source_lane, f.receipt_id) for f in report.collisions_stored]
        admissible = report.receipts + [(f.pack_install_id, f.source_lane, f.receipt_id)
                                        for f, outcome in report.future_sent
                                        if outcome == "stored" and f.kind != FUTURE_COLLISION]
        wait_for("every receipt sent after the release admitted by the new host",
                 lambda: all(receipt_outcomes(engine, admissible).values()), 120)
        assert collisions and set(receipt_outcomes(engine, collisions).values()) == {False}
        owners = projection_owners_after_cutoff(engine, final["cutoffs"])
        assert owners["not_exactly_one"] == [] and owners["checked"] >= len(admissible), owners
        held = live_ordinary_work(engine, built["scenario"].work_items)
        assert held and all(was == now for was, now in held.values()), held  # nothing waited for ordinary work
        digest = HistoryDigest.from_json(run.stack.xcom(CUTOVER_DAG, run.run_id, "history_digest", key="digest"))
        verification = verify_history(engine, digest, timeout_s=120)
        assert verification.ok, verification.summary()  # again, after more ordinary work and range work
    finally:
        traffic.stop()
        engine.dispose()
        old.stop()
        _stop_host(run)


def test_triggers_import_in_the_triggerers_environment(stack):
    """Each triggerer's own environment (outside any DAG bundle, from the plugins folder Airflow puts on
    sys.path) imports the trigger and every poller the DAGs hand it."""
    code = ("import airflow.configuration, airflow.settings; "
            "from nexus_airflow.triggers import StatusPollTrigger, import_poller; "
            "from nexus_airflow.sensors import POLLERS; "
            "[import_poller(path) for path in POLLERS.values()]; "
            "print(StatusPollTrigger('x', {}, 10).serialize()[0])")
    for name in ("triggerer-1", "triggerer-2"):
        comp = stack.components[name]
        assert comp.running(), name
        r = subprocess.run([str(BIN / "python"), "-c", code], env=comp.env, cwd="/", capture_output=True, text=True,
                           timeout=120)
        assert r.returncode == 0, f"{name}: {r.stderr[-3000:]}"
        assert r.stdout.strip().splitlines()[-1] == "nexus_airflow.triggers.StatusPollTrigger"


def test_each_celery_worker_imported_the_nexus_modules_before_it_forked(stack):
    """Each worker's main process ran the nexus preload (``plugins/airflow_local_settings.py`` on Celery's
    ``import_modules``) once it started, so its tasks inherit the modules (issue 36, item 4)."""
    from nexus_airflow.preload import preload_names

    for name in ("worker-1", "worker-2"):
        assert stack.components[name].running(), name
        log = (stack.logs / f"{name}.log").read_text(errors="replace")
        said = re.findall(r"nexus-cutover preload: (\d+) modules imported before the worker forks(, \d+ failed)?", log)
        assert said, log[-3000:]
        assert said[0] == (str(len(preload_names())), ""), said  # every module, none failed


def test_sigkill_worker_after_checkpoint_write_then_clear_converges(stack, mysql_server_url):
    t = new_tenant(stack, mysql_server_url, "kill", packs=["pk-kill"])
    gate = pathlib.Path(stack.extra_env["NEXUS_AIRFLOW_PAUSE_DIR"]) / "audit_and_checkpoint.after_write"
    reached = gate.with_name(gate.name + ".reached")
    gate.touch()
    run = Run(stack, cutover_conf(t["tenant"]))
    worker = None
    try:
        run.until("held after the checkpoint write", lambda *_: reached.exists(), 240)
        task_pid = int(reached.read_text())
        ti = run.ti("audit_and_checkpoint", 0)
        assert ti["state"] == "running" and ti["pid"] == task_pid, ti
        worker = stack.component_of(task_pid)
        assert worker in ("worker-1", "worker-2"), (task_pid, worker)
        written = checkpoints(t["dsn"])
        assert list(written) == ["pk-kill"] and len(written["pk-kill"]) == 1, written  # written, task not ended

        killed = stack.kill(worker)  # SIGKILL: the Celery worker, its pool processes, the task process
        assert task_pid in killed, (task_pid, killed)
        assert _zombie(task_pid) or not os.path.exists(f"/proc/{task_pid}"), f"task process {task_pid} survived"
        gate.unlink()
        # nobody heartbeats for the task any more: the scheduler fails it (retries=0), the run fails
        assert run.finish(240) == "failed"
        assert run.ti("audit_and_checkpoint", 0)["state"] == "failed"
        assert checkpoints(t["dsn"]) == written

        stack.components[worker].start()  # the machine comes back
        stack.wait_healthy(120)
        run.clear("audit_and_checkpoint")
        assert run.finish(300) == "success", run.watcher.seen
        after = run.xcom("audit_and_checkpoint", 0)
        assert after["outcome"] == "already_written", after
        assert checkpoints(t["dsn"]) == written  # one protocol row, the same cutoff
        assert after["legacy_max_ordinal"] == written["pk-kill"][0]
        final = _assert_verified_end(run)
        assert final["cutoffs"] == {"pk-kill": written["pk-kill"][0]}
    finally:
        gate.unlink(missing_ok=True)
        if worker and not stack.components[worker].running():
            stack.components[worker].start()
        _stop_host(run)


def _zombie(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


def test_scheduler_and_api_server_restart_while_confirmation_waits(stack, mysql_server_url):
    t = new_tenant(stack, mysql_server_url, "hitl", packs=["pk-a", "pk-b"])
    run = Run(stack, cutover_conf(t["tenant"]), confirm=False)
    try:
        run.until("waiting for the writer-stop confirmation",
                  lambda *_: any(d["task_instance"]["task_id"] == "confirm_writers_stopped"
                                 for d in stack.pending_hitl(CUTOVER_DAG, run.run_id)), 240)
        before = stack.pending_hitl(CUTOVER_DAG, run.run_id)
        pids = {n: stack.components[n].pid for n in ("scheduler", "api-server")}
        stack.restart("scheduler")
        stack.restart("api-server")
        assert all(stack.components[n].pid != pids[n] for n in pids)  # new processes
        time.sleep(5)  # let the new scheduler loop over the run at least once
        after = stack.pending_hitl(CUTOVER_DAG, run.run_id)
        assert [(d["task_instance"]["task_id"], d["subject"], d["options"]) for d in after] == \
            [(d["task_instance"]["task_id"], d["subject"], d["options"]) for d in before]
        assert run.ti("confirm_writers_stopped")["state"] == "awaiting_input"
        assert stack.dag_run(CUTOVER_DAG, run.run_id)["state"] == "running"
        run.confirm = True  # answered through PATCH .../hitlDetails
        assert run.finish(300) == "success", run.watcher.seen
        answer = run.xcom("confirm_writers_stopped")
        assert answer["chosen_options"] == ["Confirm: all old writers stopped"], answer
        final = _assert_verified_end(run)
        assert set(final["cutoffs"]) == {"pk-a", "pk-b"}
    finally:
        _stop_host(run)


def test_two_runs_for_one_tenant_at_once_exactly_one_proceeds(stack, mysql_server_url):
    """Fault 6: two runs triggered together for the same tenant, on two workers: one holds the fence, the other
    stops at arm_fence naming the holder, writing nothing; the holder completes."""
    t = new_tenant(stack, mysql_server_url, "twin", packs=["pk-twin"])
    runs = [Run(stack, cutover_conf(t["tenant"])), Run(stack, cutover_conf(t["tenant"]))]
    try:
        deadline = time.monotonic() + 240
        while True:
            arms = [r.ti("arm_fence")["state"] for r in runs]
            for r in runs:
                r.poll()
            if "failed" in arms and "success" in arms or time.monotonic() > deadline:
                break
            time.sleep(2)
        assert sorted(arms) == ["failed", "success"], arms
        loser, winner = (runs[0], runs[1]) if arms[0] == "failed" else (runs[1], runs[0])
        report = stack.xcom(CUTOVER_DAG, loser.run_id, "arm_fence", key="report")
        assert winner.run_id in str(report["held_by"]), report
        assert loser.finish(60) == "failed"
        assert winner.finish(300) == "success", winner.watcher.seen
        done = {ti["task_id"] for ti in stack.task_instances(CUTOVER_DAG, loser.run_id) if ti["state"] == "success"}
        assert done == {"resolve_packs", "apply_schema", "wait_for_short_drain"}, done  # the look before the fence writes nothing
        final = _assert_verified_end(winner)
        assert checkpoints(t["dsn"]) == {"pk-twin": [final["cutoffs"]["pk-twin"]]}
    finally:
        for r in runs:
            _stop_host(r)


def test_sigkill_worker_while_audit_waits_before_its_write_then_clear_converges(stack, mysql_server_url):
    """Fault 1, before the write: another lifecycle operator holds the pack's lock row, so the audit waits on it
    inside its transaction; the worker dies there: nothing is written (the server rolls the dead session back);
    after clear the rerun writes the one checkpoint."""
    from sqlalchemy import select, text
    from sqlalchemy.engine import make_url

    from nexus_cutover.catalog import Lock, pack_lock_name
    from nexus_cutover.db import make_engine
    from nexus_cutover.locks import insert_lock_row_if_absent

    t = new_tenant(stack, mysql_server_url, "wait", packs=["pk-wait"])
    run = Run(stack, cutover_conf(t["tenant"]), confirm=False)
    holder = make_engine(t["dsn"])
    admin = make_engine(make_url(mysql_server_url).set(database="mysql"))
    lock = None
    worker = None
    try:
        run.until("waiting for the writer-stop confirmation",
                  lambda *_: bool(stack.pending_hitl(CUTOVER_DAG, run.run_id)), 240)
        with holder.begin() as conn:
            insert_lock_row_if_absent(conn, pack_lock_name("pk-wait"))
        lock = holder.connect()
        lock.begin()
        assert lock.execute(select(Lock.c.LockName).where(Lock.c.LockName == pack_lock_name("pk-wait"))
                            .with_for_update()).first() is not None
        run.confirm = True

        def audit_waits_on_the_lock(_state, states) -> bool:
            if states.get("audit_and_checkpoint[0]") != "running":
                return False
            with admin.connect() as c:
                return c.execute(text("SELECT COUNT(*) FROM information_schema.INNODB_TRX "
                                      "WHERE trx_state = 'LOCK WAIT'")).scalar() > 0

        run.until("waiting on the pack lock in audit_and_checkpoint", audit_waits_on_the_lock, 180, every_s=1.0)
        ti = run.ti("audit_and_checkpoint", 0)
        worker = stack.component_of(int(ti["pid"]))
        assert worker in ("worker-1", "worker-2"), ti
        killed = stack.kill(worker)
        assert int(ti["pid"]) in killed
        lock.rollback()
        lock.close()
        lock = None
        assert run.finish(240) == "failed"
        assert run.ti("audit_and_checkpoint", 0)["state"] == "failed"
        assert checkpoints(t["dsn"]) == {}  # it died before its write

        stack.components[worker].start()
        stack.wait_healthy(120)
        run.clear("audit_and_checkpoint")
        assert run.finish(300) == "success", run.watcher.seen
        after = run.xcom("audit_and_checkpoint", 0)
        assert after["outcome"] == "written", after
        assert checkpoints(t["dsn"]) == {"pk-wait": [after["legacy_max_ordinal"]]}
        final = _assert_verified_end(run)
        assert final["cutoffs"] == {"pk-wait": after["legacy_max_ordinal"]}
    finally:
        if lock is not None:
            lock.rollback()
            lock.close()
        holder.dispose()
        admin.dispose()
        if worker and not stack.components[worker].running():
            stack.components[worker].start()
        _stop_host(run)

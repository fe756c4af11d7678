"""Faults 2, 4 and 5 of issue 13 on the production topology (scripts/stack.py): real processes, real signals.

* fault 2: SIGKILL of the triggerer holding the drain triggers of every waiting tenant; the other one takes them
  over, each drain completes once, its memory and poll rate are recorded;
* fault 4: the tenant's MariaDB restarted under a drain poll and under a Field History materialization (a second
  throwaway MariaDB of this module: the session's test server is shared);
* fault 5: SIGKILL of the Celery worker running ``stage_2_materialize`` inside a batch, then clear: the final
  table is identical to a clean run's.
"""

from __future__ import annotations

import collections
import pathlib
import time

import pytest

from nexus_cutover.polling import settled_after

from .support import (
    CUTOVER_DAG,
    FH_DAG,
    MariaDBServer,
    Run,
    checkpoints,
    clean_reference_table,
    complete_old_work,
    count_lines,
    cutover_conf,
    deferred_triggers,
    fh_conf,
    field_history_tenant,
    live_triggerer_jobs,
    new_tenant,
    pending_drain_tenant,
    run_states,
    table_of,
    task_rows,
    tree_rss_mb,
    trigger_logs,
    triggerer_jobs_of,
    wait_for,
)

pytestmark = pytest.mark.airflow

#: Tenants waiting at once in fault 2: the cutover DAG's ``max_active_runs`` (16) caps the runs of one DAG that
#: run at once, so no more than 16 tenants can wait in ``wait_for_drain`` together (issue 13 asks for 50).
#: Measured on 2 cores shared with other work: 16 parked in 166 s / 337 s, the whole test 6.3 / 11.7 min (the
#: second run under a heavier load; the bounds below allow for it).
WAITING_TENANTS = 16
POLL_INTERVAL_S = 10  # cutover_conf's
FIRED = "Trigger fired event"
POLLED = "old projection WorkItems remaining"  # every drain poll logs its counts here (NEXUS_TRIGGER_QUIET_LOG_S=0)
AFTER_DRAIN = ("history_digest", "audit_and_checkpoint", "start_new_host", "resume_admission",
               "final_old_writer_check")


def _all_deferred(stack, run_ids):
    states = run_states(stack, CUTOVER_DAG, run_ids)
    ended = {r: s for r, s in states.items() if s not in ("queued", "running")}
    assert not ended, f"runs ended before their drain waited: {ended}"
    held = deferred_triggers(stack, CUTOVER_DAG, "wait_for_drain", run_ids)
    return held if len(held) == len(run_ids) and all(job is not None for _, job in held.values()) else None


def _component_of_job(stack, job: int) -> str:
    """The triggerer component running triggerer job ``job`` (the one holding that job's trigger logs open)."""
    holders = [n for n in ("triggerer-1", "triggerer-2") if job in triggerer_jobs_of(stack, n)]
    assert len(holders) == 1, (job, {n: triggerer_jobs_of(stack, n) for n in ("triggerer-1", "triggerer-2")})
    return holders[0]


def _poll_lines(stack, run_ids, job: int) -> int:
    return sum(count_lines(trigger_logs(stack, CUTOVER_DAG, r, "wait_for_drain").get(job, ""), POLLED)
               for r in run_ids)


def _await_second_triggerer(stack, victim_job: int, timeout_s: float = 90.0) -> None:
    """Wait until a triggerer job other than ``victim_job`` heartbeats; else fail naming every triggerer's state.

    On a loaded machine a triggerer's supervisor can be busy past the 30 s the check allows (CI, 2026-12-03: the
    other triggerer was not live when every trigger had parked on one): the takeover needs it live, so wait for
    it, bounded, rather than fail on one look."""
    try:
        wait_for(f"a triggerer job other than {victim_job} heartbeating", lambda: live_triggerer_jobs(stack) - {victim_job},
                 timeout_s, every_s=2)
    except TimeoutError as exc:
        jobs = stack.metadata("SELECT id, state, hostname, extract(epoch FROM now() - latest_heartbeat) FROM job "
                              "WHERE job_type = 'TriggererJob' ORDER BY id")
        running = {n: stack.components[n].running() for n in ("triggerer-1", "triggerer-2")}
        pytest.fail(f"{exc}: triggerer jobs (id, state, host, heartbeat age s) {jobs}; processes running {running}")


def test_sigkill_triggerer_holding_waiting_drains_the_other_takes_over(stack, mysql_server_url):
    """Fault 2 with :data:`WAITING_TENANTS` tenants (the DAG's max_active_runs; see there): every tenant's run
    defers in ``wait_for_drain`` (its old work is still processing), the triggerer holding the most of their
    triggers is SIGKILLed, the other takes every one over; the old runtime (simulated) then completes the work;
    each drain fires once, succeeds once with ``drained``, the run reaches the confirmation and nothing after it
    ran; the survivor's memory and poll rate are printed and bounded. The runs are then rejected (nothing written
    beyond their fences) and the killed triggerer restarted."""
    stack.wait_healthy()  # both triggerers heartbeating: what the takeover needs (an earlier test may have loaded them)
    started = time.monotonic()
    tenants = [new_tenant(stack, mysql_server_url, "tk", build=pending_drain_tenant) for _ in range(WAITING_TENANTS)]
    # The drains must outlast the parking of all 16 (up to 600 s below): with the runbook's 300 s, the first tenants'
    # drains timed out on a loaded machine before the last one parked (armed tenants' tasks go first since issue 36).
    runs = {stack.trigger(CUTOVER_DAG, cutover_conf(t["tenant"], drain_timeout=1800))["dag_run_id"]: t for t in tenants}
    run_ids = list(runs)
    victim = None
    try:
        held = wait_for("every drain deferred to a triggerer", lambda: _all_deferred(stack, run_ids), 600, every_s=3)
        parked_s = time.monotonic() - started
        by_job = collections.Counter(job for _, job in held.values())
        victim_job = by_job.most_common(1)[0][0]
        victim = _component_of_job(stack, victim_job)
        survivor = "triggerer-2" if victim == "triggerer-1" else "triggerer-1"
        _await_second_triggerer(stack, victim_job)
        rss_before = tree_rss_mb(stack.components[survivor].pid)
        victim_rss = tree_rss_mb(stack.components[victim].pid)
        survivor_held = sum(n for job, n in by_job.items() if job != victim_job)

        killed_at = time.monotonic()
        stack.kill(victim)
        survivor_jobs = live_triggerer_jobs(stack) - {victim_job}

        def taken_over():
            now = deferred_triggers(stack, CUTOVER_DAG, "wait_for_drain", run_ids)
            return now if len(now) == len(run_ids) and {j for _, j in now.values()} <= survivor_jobs else None

        after = wait_for("every trigger held by the surviving triggerer", taken_over, 180, every_s=2)
        takeover_s = time.monotonic() - killed_at
        assert {tid for tid, _ in after.values()} == {tid for tid, _ in held.values()}  # the same trigger rows
        (survivor_job,) = {j for _, j in after.values()}
        wait_for("the survivor polling every tenant", lambda: all(
            count_lines(trigger_logs(stack, CUTOVER_DAG, r, "wait_for_drain").get(survivor_job, ""), POLLED)
            for r in run_ids), 3 * POLL_INTERVAL_S + 30, every_s=2)
        time.sleep(settled_after(POLL_INTERVAL_S))  # each trigger taken over starts its wait's quick first looks anew
        window_start, polls_start = time.monotonic(), _poll_lines(stack, run_ids, survivor_job)
        time.sleep(3 * POLL_INTERVAL_S)
        poll_rate = (_poll_lines(stack, run_ids, survivor_job) - polls_start) / (time.monotonic() - window_start)
        rss_after = tree_rss_mb(stack.components[survivor].pid)
        print(f"\nfault 2: {WAITING_TENANTS} tenants parked in {parked_s:.0f}s, {by_job[victim_job]} triggers on the "
              f"killed {victim} (job {victim_job}); taken over by {survivor} (job {survivor_job}) in {takeover_s:.0f}s; "
              f"survivor RSS {rss_before:.0f} MB before (holding {survivor_held}), {rss_after:.0f} MB after "
              f"({(rss_after - rss_before) / by_job[victim_job]:+.2f} MB per trigger taken over; the killed one held "
              f"{victim_rss:.0f} MB); poll rate {poll_rate:.2f} polls/s (one per tenant every {POLL_INTERVAL_S}s: "
              f"{WAITING_TENANTS / POLL_INTERVAL_S:.2f})")
        assert rss_after < 2048, (rss_before, rss_after)
        if survivor_held:  # its first trigger's imports and engine were paid before: the growth is per trigger
            assert (rss_after - rss_before) / by_job[victim_job] < 5.0, (rss_before, rss_after)
        else:  # a survivor that ran none pays that first use now: it ends near what the killed one used for them
            assert rss_after < 1.25 * victim_rss, (rss_before, rss_after, victim_rss)
        expected = WAITING_TENANTS / POLL_INTERVAL_S
        assert 0.5 * expected <= poll_rate <= 1.5 * expected, poll_rate

        for t in tenants:
            complete_old_work(t["dsn"], t["tenant"])

        def all_at_the_confirmation():
            rows = task_rows(stack, CUTOVER_DAG, run_ids)
            return all(r.get("confirm_writers_stopped", (None,))[0] == "awaiting_input" for r in rows.values()) and rows

        rows = wait_for("every run at the writer-stop confirmation", all_at_the_confirmation, 480, every_s=3)
        for run_id in run_ids:
            tis = rows[run_id]
            assert tis["wait_for_drain"] == ("success", 1) and tis["check_old_writers"] == ("success", 1), tis
            assert all(tis.get(k, (None,))[0] is None for k in AFTER_DRAIN), tis
            logs = trigger_logs(stack, CUTOVER_DAG, run_id, "wait_for_drain")
            # Fired once: the task state above (success on its first try) is the proof; the logs show no second fire.
            # A log line can be missing (a SIGKILLed triggerer's, or one not yet shipped), never one too many.
            assert sum(count_lines(text, FIRED) for text in logs.values()) <= 1, logs.keys()
            assert count_lines(logs.get(victim_job, ""), FIRED) == 0  # killed before the work completed
            assert stack.xcom(CUTOVER_DAG, run_id, "wait_for_drain")["state"] == "drained"
        history = stack.metadata("SELECT count(*) FROM task_instance_history WHERE dag_id = %s AND run_id = ANY(%s)",
                                 (CUTOVER_DAG, run_ids))
        assert history == [(0,)], history  # no task instance of these runs ran twice
    finally:
        _reject_all(stack, run_ids)
        if victim and not stack.components[victim].running():
            stack.restart(victim)
    for run_id, t in runs.items():
        assert checkpoints(t["dsn"]) == {}, run_id  # rejected: nothing written beyond the fences


def _reject_all(stack, run_ids) -> None:
    """End the runs cheaply: Reject each pending confirmation; fail the runs still before it (REST)."""
    for run_id in run_ids:
        pending = [d for d in stack.pending_hitl(CUTOVER_DAG, run_id)
                   if d["task_instance"]["task_id"] == "confirm_writers_stopped"]
        if pending:
            stack.answer_hitl(CUTOVER_DAG, run_id, "confirm_writers_stopped", "Reject")
        elif run_states(stack, CUTOVER_DAG, [run_id]).get(run_id) in ("queued", "running"):
            stack.request("PATCH", f"/api/v2/dags/{CUTOVER_DAG}/dagRuns/{run_id}", {"state": "failed"})
    wait_for("every run of the test ended", lambda: all(
        s in ("failed", "success") for s in run_states(stack, CUTOVER_DAG, run_ids).values()), 300, every_s=3)


# -- Field History: stage_2_materialize interrupted inside a batch --------------------------------------------------

FH_BATCH = 10  # 120 rows of field_history_tenant: 12 batches
HELD_BATCH = 4  # the worker dies holding this batch (read, not yet written); the three before it committed


def _hold_batch(stack, k: int):
    gate = pathlib.Path(stack.extra_env["NEXUS_AIRFLOW_PAUSE_DIR"]) / f"stage_2_materialize.batch_{k}"
    reached = gate.with_name(gate.name + ".reached")
    reached.unlink(missing_ok=True)
    gate.touch()
    return gate, reached


def _decided(table: dict[int, tuple]) -> int:
    return sum(1 for _fid, _seq, eligible in table.values() if eligible is not None)


def test_sigkill_worker_inside_a_materialization_batch_then_clear_gives_the_clean_table(stack, mysql_server_url):
    """Fault 5: the worker running ``stage_2_materialize`` is SIGKILLed inside batch :data:`HELD_BATCH`'s
    transaction (after its read, before its writes): the earlier batches stay committed, that one is rolled back by
    the server; the task ends failed; after clear the table equals a clean run's on a tenant of the same seed,
    row by row."""
    stack.wait_for_dag(FH_DAG)
    reference = clean_reference_table(mysql_server_url, FH_BATCH)
    t = new_tenant(stack, mysql_server_url, "fhk", build=field_history_tenant)
    gate, reached = _hold_batch(stack, HELD_BATCH)
    run = Run(stack, fh_conf(t["tenant"], FH_BATCH), dag_id=FH_DAG)
    worker = None
    try:
        run.until(f"held inside materialization batch {HELD_BATCH}", lambda *_: reached.exists(), 300)
        task_pid = int(reached.read_text())
        ti = run.ti("stage_2_materialize")
        assert ti["state"] == "running" and ti["pid"] == task_pid, ti
        worker = stack.component_of(task_pid)
        assert worker in ("worker-1", "worker-2"), (task_pid, worker)
        assert task_pid in stack.kill(worker)
        gate.unlink()
        assert run.finish(240) == "failed"
        assert run.ti("stage_2_materialize")["state"] == "failed"
        partial = table_of(t["dsn"])
        assert _decided(partial) == (HELD_BATCH - 1) * FH_BATCH, _decided(partial)  # the held batch rolled back
        assert all(partial[cid] == reference[cid] for cid, row in partial.items() if row[2] is not None)

        stack.components[worker].start()
        stack.wait_healthy(120)
        run.clear("stage_2_materialize")
        assert run.finish(300) == "success", run.watcher.seen
        assert table_of(t["dsn"]) == reference
        done = run.xcom("stage_2_materialize")
        assert done["counts"]["decided_rows"] == _decided(reference) - _decided(partial), done  # the rest, once
    finally:
        gate.unlink(missing_ok=True)
        if worker and not stack.components[worker].running():
            stack.components[worker].start()
            stack.wait_healthy(120)


# -- fault 4: the tenant's MariaDB restarted under a run -------------------------------------------------------------


@pytest.fixture(scope="module")
def own_mariadb(tmp_path_factory):
    """A second throwaway MariaDB for the tenants of fault 4, which restarts it (the session's server is shared)."""
    server = MariaDBServer(tmp_path_factory.mktemp("mariadb"))
    server.install()
    yield server
    server.stop()


def _restarted(server: MariaDBServer, down_s: float) -> None:
    server.stop()
    time.sleep(down_s)
    server.start()


def test_mariadb_restart_under_the_drain_polls_they_retry_and_the_drain_completes(stack, own_mariadb):
    """Fault 4, the drain: the tenant's MariaDB is down for two poll intervals while its drain trigger polls;
    the polls log the error and retry within the drain's deadline; once the server is back and the old runtime
    has completed the work, the drain succeeds once and the run reaches the confirmation."""
    t = new_tenant(stack, own_mariadb.url, "mdr", build=pending_drain_tenant)
    run = Run(stack, cutover_conf(t["tenant"]), confirm=False)
    try:
        wait_for("the drain polling from a triggerer", lambda: any(
            count_lines(text, POLLED) for text in trigger_logs(stack, CUTOVER_DAG, run.run_id, "wait_for_drain").values()),
            300, every_s=3)
        _restarted(own_mariadb, 2 * POLL_INTERVAL_S + 5)
        complete_old_work(t["dsn"], t["tenant"])
        run.until("at the writer-stop confirmation", lambda _s, st: st.get("confirm_writers_stopped") == "awaiting_input",
                  240)
        rows = task_rows(stack, CUTOVER_DAG, [run.run_id])[run.run_id]
        assert rows["wait_for_drain"] == ("success", 1), rows
        assert run.xcom("wait_for_drain")["state"] == "drained"
        logs = "".join(trigger_logs(stack, CUTOVER_DAG, run.run_id, "wait_for_drain").values())
        assert count_lines(logs, FIRED) == 1
        failed = count_lines(logs, "; retrying in")
        print(f"\nfault 4 (drain): {failed} failed poll(s) logged and retried while the tenant MariaDB was down")
        assert failed >= 1, logs[-3000:]  # the polls that met the stopped server: logged, then retried
    finally:
        if not own_mariadb.running():
            own_mariadb.start()
        _reject_all(stack, [run.run_id])


def test_mariadb_restart_under_materialization_then_clear_gives_the_clean_table(stack, mysql_server_url, own_mariadb):
    """Fault 4, materialization: the tenant's MariaDB stops while batch :data:`HELD_BATCH` is inside its
    transaction: the task fails (the committed batches stay, that one is rolled back); the server comes back on
    the same datadir and port; clear resumes and the table equals a clean run's on a tenant of the same seed."""
    stack.wait_for_dag(FH_DAG)
    reference = clean_reference_table(mysql_server_url, FH_BATCH)
    t = new_tenant(stack, own_mariadb.url, "fhr", build=field_history_tenant)
    gate, reached = _hold_batch(stack, HELD_BATCH)
    run = Run(stack, fh_conf(t["tenant"], FH_BATCH), dag_id=FH_DAG)
    try:
        run.until(f"held inside materialization batch {HELD_BATCH}", lambda *_: reached.exists(), 300)
        own_mariadb.stop()
        gate.unlink()  # the batch goes on to its writes on a connection whose server is gone
        assert run.finish(240) == "failed"
        assert run.ti("stage_2_materialize")["state"] == "failed"
        own_mariadb.start()
        partial = table_of(t["dsn"])
        assert _decided(partial) == (HELD_BATCH - 1) * FH_BATCH, _decided(partial)
        run.clear("stage_2_materialize")
        assert run.finish(300) == "success", run.watcher.seen
        assert table_of(t["dsn"]) == reference
    finally:
        gate.unlink(missing_ok=True)
        if not own_mariadb.running():
            own_mariadb.start()

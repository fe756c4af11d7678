"""The ``nexus.*`` metrics reach a real StatsD listener during a cutover DAG run (issue 27, "every figure a metric").

Airflow configures its metrics client once per process, from ``[metrics]`` as it reads it when the process starts.
So the run is a process of its own -- ``airflow dags test`` with ``AIRFLOW__METRICS__STATSD_*`` pointing at a UDP
socket bound here -- sharing this session's metadata DB (the person's answer comes through its REST API from
here) and the tenant database (the new host started by the deployer endpoint runs here).
"""

from __future__ import annotations

import contextlib
import datetime as dt
import json
import os
import subprocess
import sys
import threading
import time

from sqlalchemy import select

from nexus_airflow.declared import steps_of
from nexus_airflow.metrics import ALL
from nexus_cutover import catalog
from nexus_cutover.metrics import TENANT_METRICS
from nexus_cutover.projection.cutover_fence import cutover_fence_in_force
from nexus_sim.old_runtime import OldRuntimeSimulator, SimulatorConfig, StepReport
from nexus_sim.scenario import utcnow
from tests.dags.airflow_harness import HitlAnswerer, collect, next_logical_date
from tests.dags.cutover_support import DAG_ID, NS, Deployer, base_conf, drained_tenant
from tests.statsd_listener import StatsdListener
from tests.statsd_mapping import apply as apply_mapping
from tests.statsd_mapping import load as load_mapping

CONFIRM = "Confirm: all old writers stopped"
PREFIX = "airflow"  # the deployed [metrics] statsd_prefix, which the StatsD exporter's mapping matches
#: The steps that take _System_Lock rows (namespace lock; the checkpoint also the pack's).
LOCKED_STEPS = {"arm_fence", "audit_and_checkpoint", "resume_admission"}


def _metric_of(line: str):
    """The declared metric a StatsD line was sent for (the longest declared name its name starts with)."""
    name = line.split(":", 1)[0].split(".", 1)[1]  # without the prefix
    return max((m for m in ALL if name == m.name or name.startswith(m.name + ".")), key=lambda m: len(m.name))


def _buckets(mapping: list[dict], name: str) -> list[str]:
    """A histogram's ``le`` values in the exporter's mapping, ``+Inf`` included: one series each."""
    entry = next(e for e in mapping if e["name"] == name)
    return [str(b) for b in entry["histogram_options"]["buckets"]] + ["+Inf"]


def _run_in_own_process(conf: dict, logical_date: dt.datetime, port: int) -> subprocess.CompletedProcess:
    env = {**os.environ, "AIRFLOW__METRICS__STATSD_ON": "True", "AIRFLOW__METRICS__STATSD_HOST": "127.0.0.1",
           "AIRFLOW__METRICS__STATSD_PORT": str(port), "AIRFLOW__METRICS__STATSD_PREFIX": PREFIX}
    with open(os.environ.get("NEXUS_METRICS_RUN_LOG", os.devnull), "w") as log:
        return subprocess.run(
            [os.path.join(os.path.dirname(sys.executable), "airflow"), "dags", "test", DAG_ID, logical_date.isoformat(),
             "-c", json.dumps(conf)], env=env, stdout=log, stderr=subprocess.STDOUT, text=True, timeout=300)


def _run_times(logical_date: dt.datetime) -> tuple[str, float, dict[str, tuple[dt.datetime, dt.datetime]]]:
    """The run id, its duration (first task start to last task end) and each unmapped task's (start, end)."""
    from airflow.models.dagrun import DagRun
    from airflow.models.taskinstance import TaskInstance
    from airflow.utils.session import create_session

    with create_session() as session:
        run_id = session.scalar(select(DagRun.run_id).where(DagRun.dag_id == DAG_ID, DagRun.logical_date == logical_date))
        assert run_id is not None, "the airflow dags test process created no run"
        tis = session.execute(select(TaskInstance.task_id, TaskInstance.map_index, TaskInstance.start_date,
                                     TaskInstance.end_date)
                              .where(TaskInstance.dag_id == DAG_ID, TaskInstance.run_id == run_id)).all()
    spans = [(t.start_date, t.end_date) for t in tis if t.start_date and t.end_date]
    duration = (max(e for _, e in spans) - min(s for s, _ in spans)).total_seconds()
    return run_id, duration, {t.task_id: (t.start_date, t.end_date) for t in tis if t.map_index < 0}


def _fence_row_pause(engine) -> float:
    f = catalog.AdmissionFence
    with engine.connect() as conn:
        (armed, released), = conn.execute(select(f.c.ArmedAt, f.c.ReleasedAt).where(f.c.Namespace == NS)).all()
    return (released - armed).total_seconds()


def _live_old_work(sc) -> None:
    now = utcnow()
    for pack in sc.packs:
        for lane_id in ("lane-live", "lane-live-2"):
            lane = pack.lane(lane_id)
            lane.generation(2, status="completed")
            lane.generation(3, status="pending")
            lane.generation(1, status="retry", attempt=1, next_attempt_at=now)


class FencedSlowOldRuntime(OldRuntimeSimulator):
    """The old runtime, live (heartbeating) from the start, working only once the cutover fence is armed and then
    one WorkItem a second: the drain the run watches spans several of its polls. Stops itself once drained."""

    PACE_S = 1.0

    def step(self) -> StepReport:
        if cutover_fence_in_force(self.engine, NS) is None:
            self._heartbeat_if_due()
            return StepReport()
        time.sleep(self.PACE_S)
        return super().step()


@contextlib.contextmanager
def fenced_slow_old_runtime(engine):
    sim = FencedSlowOldRuntime(engine, NS, process_id="old-rt", config=SimulatorConfig(work_per_step=1))
    sim.register()  # live before the run's first look
    stop = threading.Event()
    runner = threading.Thread(target=sim.run, args=(stop,), kwargs={"poll_s": 0.1, "exit_when_drained": True},
                              daemon=True)
    runner.start()
    try:
        yield sim
    finally:
        stop.set()
        runner.join(timeout=30)


def test_a_statsd_listener_receives_every_figure_of_a_cutover_run(airflow_db, tenant, tenant_connection, tmp_path,
                                                                   monkeypatch):
    engine, conn_id = tenant
    run_log = tmp_path / "run.log"
    monkeypatch.setenv("NEXUS_METRICS_RUN_LOG", str(run_log))
    sc = drained_tenant(old_writers_stopped=True)
    _live_old_work(sc)  # old work drains while the run waits: the drain gauges move
    sc.write(engine)
    logical_date = next_logical_date()
    with StatsdListener() as statsd, Deployer(engine) as deployer, fenced_slow_old_runtime(engine), \
            HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}, timeout=600) as hitl:
        tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
        proc = _run_in_own_process(base_conf(conn_id), logical_date, statsd.port)
    assert proc.returncode == 0
    assert not hitl.errors, hitl.errors
    run_id, run_s, times = _run_times(logical_date)
    result = collect(DAG_ID, run_id)
    assert result.state == "success", result.task_states
    got = statsd.values(PREFIX)

    # every step that ran: its duration, fleet-wide by step (issue 49, item 5: no tenant in its name or tags); a
    # fused task's steps (the readiness wait and the release: issue 36, item 4) each their own
    ran = [t for t, s in result.task_states.items() if s == "success"]
    ran_steps = [step for t in ran for step in steps_of(DAG_ID, t.split("[")[0])]
    steps = set(ran_steps)
    assert {"verify_readiness", "resume_admission"} <= steps and "verify_readiness" not in result.task_states
    durations = {step: got.get((f"nexus.step.duration.{step}.success", "ms")) for step in steps}
    assert all(durations.values()), ({s: v for s, v in durations.items() if not v}, sorted(got)[:80])
    assert sum(len(v) for v in durations.values()) == len(ran_steps)  # one per step run (two mapped checkpoints)
    assert len(got[("nexus.step.duration", "ms")]) == len(ran_steps), sorted(k for k in got if "step.duration" in k[0])
    sections = [line.split("::group::", 1)[1].split()[0] for line in run_log.read_text().splitlines() if "::group::" in line]
    assert {"verify_readiness", "resume_admission"} <= set(sections), sections  # each its own log section
    assert all(0 < v <= run_s * 1000 for vs in durations.values() for v in vs), durations

    # the admission pause: once, as the fence row records it, the release step's XCom says the same
    pause_ms = got[(f"nexus.admission.pause.{NS}", "ms")]
    released = result.xcom("resume_admission")
    assert released["outcome"] == "released"
    assert len(pause_ms) == 1 and abs(pause_ms[0] - released["admission_pause_s"] * 1000) < 1, (pause_ms, released)
    assert abs(released["admission_pause_s"] - _fence_row_pause(engine)) < 1e-3
    # within the steps that armed and released it: at least the time between them, at most their whole span
    armed, released_step = times["arm_fence"], times["resume_admission"]
    shortest = (released_step[0] - armed[1]).total_seconds() * 1000
    longest = (released_step[1] - armed[0]).total_seconds() * 1000
    assert 0 < shortest <= pause_ms[0] <= longest <= run_s * 1000, (shortest, pause_ms, longest, run_s)

    # lock wait of every locked step, and of no other; never longer than the step
    locked = {step for step in steps if got.get((f"nexus.lock.wait.{step}", "ms"))}
    assert locked == LOCKED_STEPS, locked
    for step in LOCKED_STEPS:
        waits = got[(f"nexus.lock.wait.{step}", "ms")]
        assert all(0 <= w <= max(durations[step]) for w in waits), (step, waits, durations[step])

    # the drain as it went: work remaining at the first poll, none at the last, a rate measured in between
    remaining = got[(f"nexus.drain.remaining.{NS}", "g")]
    assert remaining[0] > 0 and remaining[-1] == 0, remaining
    rates = got[(f"nexus.drain.rate.{NS}", "g")]
    assert rates and rates[-1] > 0, rates

    # the digest's rows per second agree with its own summary
    digest = result.xcom("history_digest")
    rate = got[(f"nexus.digest.rows_per_second.{NS}", "g")]
    assert len(rate) == 1 and rate[0] > 0
    assert abs(rate[0] - sum(digest["rows"].values()) / digest["seconds"]) <= 0.01 * rate[0] + 1
    # the fence's arming time while held (the fence row's ArmedAt), 0 once released; the drain's ETA, 0 once drained
    armed_at = got[(f"nexus.fence.armed_at.{NS}", "g")]
    assert len(armed_at) == 2 and armed_at[1] == 0, armed_at
    armed_step = times["arm_fence"]
    assert armed_step[0].timestamp() - 1 <= armed_at[0] <= armed_step[1].timestamp() + 1, (armed_at, armed_step)
    etas = got[(f"nexus.drain.eta.{NS}", "g")]
    assert etas and etas[-1] == 0 and all(e >= 0 for e in etas), etas
    assert not any(name.startswith("nexus.step.failed") for name, _ in got)  # nothing failed

    # the StatsD exporter's mapping (deploy/statsd/nexus-mapping.yml) applied to the lines this run sent: every
    # per-tenant line is one Prometheus series with its tags as labels, named as the rules and the dashboard query it
    lines = [line for line in statsd.lines if line.startswith(f"{PREFIX}.nexus.")]
    mapping = load_mapping()
    exported = [(line, apply_mapping(mapping, line)) for line in lines]  # in order of arrival, repeats kept
    unmapped = [line for line, sample in exported if sample is None]
    assert {line.split(":")[0] for line in unmapped} <= {f"{PREFIX}.{m.name}" for m in ALL}, unmapped  # the bare names
    samples = [s for _, s in exported if s is not None]
    for line, sample in exported:  # a per-tenant metric's series carry the tenant, every other one is fleet-wide
        if sample is not None:
            tagged = _metric_of(line) in TENANT_METRICS
            assert (sample.labels.get("tenant") == NS) if tagged else ("tenant" not in sample.labels), (line, sample)
    # the series this tenant has in Prometheus: few, whatever the number of steps (issue 49, item 5: ~350 before)
    tenant_series = {(series, tuple(sorted(s.labels.items())), bucket) for s in samples if s.labels.get("tenant") == NS
                     for series in s.series for bucket in (_buckets(mapping, s.name) if series.endswith("_bucket") else [None])}
    assert len(tenant_series) <= 25, sorted(tenant_series)
    # the spool's pending count is this machine's own series (several workers would overwrite one gauge)
    from nexus_cutover.ledger_spool import HOST
    from nexus_cutover.metrics import name_safe

    assert all(s.labels == {"host": name_safe(HOST)} for s in samples if s.name == "nexus_ledger_pending"), samples
    by_name: dict[str, list] = {}
    for sample in samples:
        by_name.setdefault(sample.name, []).append(sample)
    assert {"nexus_step_duration_seconds", "nexus_admission_pause_seconds", "nexus_lock_wait_seconds",
            "nexus_drain_remaining", "nexus_drain_rate", "nexus_drain_eta", "nexus_fence_armed_at_seconds",
            "nexus_digest_rows_per_second"} <= set(by_name), sorted(by_name)
    assert {(s.labels["step"], s.labels["outcome"]) for s in by_name["nexus_step_duration_seconds"]} == \
        {(step, "success") for step in steps}
    assert all(s.kind == "histogram" for s in by_name["nexus_step_duration_seconds"])
    pause, = by_name["nexus_admission_pause_seconds"]
    assert abs(pause.value - released["admission_pause_s"]) < 1e-3  # the exporter observes ms timers in seconds
    assert [s.value for s in by_name["nexus_fence_armed_at_seconds"]] == armed_at
    assert [s.value for s in by_name["nexus_drain_remaining"]] == remaining
    assert {s.labels["step"] for s in by_name["nexus_lock_wait_seconds"]} == LOCKED_STEPS
    print(f"nexus.* over StatsD: run {run_s:.1f} s, admission pause {pause_ms[0] / 1000:.2f} s, lock waits (ms) "
          + ", ".join(f"{s} {max(got[(f'nexus.lock.wait.{s}', 'ms')]):.1f}" for s in sorted(LOCKED_STEPS))
          + f", {len(tenant_series)} series of the tenant"
          + f", drain remaining {remaining}, rates {[round(r, 1) for r in rates]}, digest {rate[0]:.0f} rows/s, "
          f"{len(statsd.lines)} StatsD lines")


def test_a_rejected_run_counts_its_stop_by_reason_and_the_next_run_keeps_the_fences_arming_time(
        airflow_db, tenant, tenant_connection):
    """A person's Reject fails the confirmation as a refusal (``nexus.step.failed`` ... ``refused``, the alert rules'
    and the dashboard's ``nexus_step_failed_total{reason="refused"}``) and leaves the fence armed: its arming time
    stays sent, not 0 (what ``NexusFencedTenantWaiting`` watches). The next run adopts the fence and sends the same
    arming time, then 0 at its release."""
    engine, conn_id = tenant
    drained_tenant().write(engine)
    mapping = load_mapping()
    with StatsdListener() as statsd, HitlAnswerer(DAG_ID, {"confirm_writers_stopped": "Reject"}, timeout=600) as hitl:
        rejected = _run_in_own_process(base_conf(conn_id), next_logical_date(), statsd.port)
    assert rejected.returncode != 0 and not hitl.errors, hitl.errors
    got = statsd.values(PREFIX)
    assert got[(f"nexus.step.failed.{NS}.confirm_writers_stopped.refused", "c")] == [1.0]
    assert [k for k in got if k[0].startswith("nexus.step.failed.")] == \
        [(f"nexus.step.failed.{NS}.confirm_writers_stopped.refused", "c")]
    failed = [s for s in (apply_mapping(mapping, line) for line in statsd.lines) if s and s.name == "nexus_step_failed_total"]
    assert [(s.kind, s.labels, s.value) for s in failed] == \
        [("counter", {"tenant": NS, "step": "confirm_writers_stopped", "reason": "refused"}, 1.0)]
    armed_at = got[(f"nexus.fence.armed_at.{NS}", "g")]
    assert len(armed_at) == 1 and armed_at[0] > 0, armed_at  # held after the run: never set back to 0

    with StatsdListener() as statsd, Deployer(engine) as deployer, \
            HitlAnswerer(DAG_ID, {"confirm_writers_stopped": CONFIRM}, timeout=600) as hitl:
        tenant_connection("nexus_deployer_test", raw_json=deployer.connection_json)
        later = _run_in_own_process(base_conf(conn_id), next_logical_date(), statsd.port)
    assert later.returncode == 0 and not hitl.errors, hitl.errors
    got = statsd.values(PREFIX)
    assert got[(f"nexus.fence.armed_at.{NS}", "g")] == [armed_at[0], 0.0]  # the pause counts from the first arming
    assert not any(name.startswith("nexus.step.failed") for name, _ in got)

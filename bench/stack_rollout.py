"""The parts ``rollout`` and ``faults`` of ``make bench-stack``: ``tenant_rollout`` on the stack against the CLI
floor (``nexus-cutover run`` per tenant at the same concurrency), and where each admission pause goes.

* Every writer-stop confirmation is answered over REST by :class:`Answerer`, logged in as :data:`APPROVER`: a user
  other than the one who triggered the rollout (the same person may not confirm), after a short grace; any other
  question is recorded, never answered.
* Each tenant's new host is stopped once its cutover run succeeded (only a process of ours: ``stop_pid_if_ours``).
* A rollout past ``--rollout-limit`` is ended (its runs marked failed), so that the CLI floor never runs beside it.
* The CLI floor runs on fresh copies of the tenants (a cutover is done once per tenant), with the same poll
  interval; whatever its runs left behind is ended by their marker (``NEXUS_BENCH_CLI``).
* Every list of the REST API is read page by page (it serves at most 100 a page).

Imports ``bench/stack_rollout_tenants.py`` and ``bench/stack_report.py``; imported by ``bench/bench_stack.py``
(which puts ``bench/``, the repository and ``plugins/`` on ``sys.path`` first).
"""

from __future__ import annotations

import contextlib
import copy
import datetime as dt
import json
import os
import re
import statistics
import subprocess
import sys
import time
import uuid
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path
from typing import Any

import benchlib
from stack_report import say
from stack_rollout_tenants import SLOW_OLD_WORKER, Heartbeat, audit_refusing_tenant, rollout_tenants, slow_drain_tenant

from nexus_airflow.metrics import pause_summary  # (the rollout summary's own median/p95)
from nexus_airflow.rollout import MAX_WAVES
from scripts.demo_airflow import ApiError
from scripts.stack_processes import pids_with_env, signal_all
from scripts.stack_topology import ProductionStack

ROLLOUT_DAG = "tenant_rollout"
CUTOVER_DAG = "connector_projection_cutover"
CONFIRM = "Confirm: all old writers stopped"


def rollout_conf() -> dict[str, Any]:
    """The shared per-tenant fields (tests/stack's: poll 10 s, the runbook's floor; the reference host)."""
    return {"host_controller": "command", "poll_interval": 10, "stale_heartbeat": 20, "drain_timeout": 300,
            "writers_stop_timeout": 120, "confirm_timeout": 900, "readiness_timeout": 120, "lock_timeout": 60}


APPROVER = "approver"  # a second user of the stack: the one who triggered a run may not confirm it


class Answerer:
    """Answers every pending question offering one of ``options`` (default: the cutover runs' writer-stop
    confirmation) over REST, logged in as :data:`APPROVER` (a person other than the one who triggered the
    rollout, as in the UI)."""

    def __init__(self, stack: ProductionStack, grace_s: float = 3.0, options: tuple[str, ...] = (CONFIRM,)):
        self.stack, self.grace, self.options = copy.copy(stack), grace_s, options
        body = stack.request("POST", "/auth/token", {"username": APPROVER, "password": stack_password(stack, APPROVER)},
                             auth=False)
        self.stack.token = body["access_token"]
        self.first_seen: dict[str, float] = {}
        self.answered: set[str] = set()
        self.other: list[str] = []

    def tick(self) -> None:
        for d in self.details():
            ti = d["task_instance"]
            key = f"{ti['dag_id']}/{ti['dag_run_id']}/{ti['task_id']}/{ti.get('map_index', -1)}"
            if d.get("response_received") or key in self.answered:
                continue
            option = next((o for o in self.options if o in d["options"]), None)
            if option is None:
                if key not in self.other:
                    self.other.append(key)
                    say(f"rollout: a question this bench does not answer: {key} {d['options']}")
                continue
            # a HITL answered within ~1 s of parking can be lost (apache/airflow#71172): a short grace
            if time.monotonic() - self.first_seen.setdefault(key, time.monotonic()) < self.grace:
                continue
            self.stack.answer_hitl(ti["dag_id"], ti["dag_run_id"], ti["task_id"], option, ti.get("map_index", -1))
            self.answered.add(key)

    def details(self) -> list[dict]:
        """Every HITL detail, page by page: the API serves at most 100 a page whatever ``limit`` says (a 300-tenant
        rollout's questions past the first 100 went unanswered and timed out when only the first page was read)."""
        return self.stack.paged("/api/v2/dags/~/dagRuns/~/hitlDetails", "hitl_details")

    def answer_waits(self) -> dict[str, float]:
        """Per cutover run, the seconds its writer-stop question waited for this answerer (asked -> answered:
        the grace and this loop's own latency, a person's time in a real rollout, not the product's)."""
        return {d["task_instance"]["dag_run_id"]: (_at(d["responded_at"]) - _at(d["created_at"])).total_seconds()
                for d in self.details()
                if d["task_instance"]["dag_id"] == CUTOVER_DAG and d.get("responded_at") and CONFIRM in d["options"]}


def stack_password(stack: ProductionStack, user: str) -> str:
    return json.loads((stack.home / "simple_auth_manager_passwords.json.generated").read_text())[user]


def stop_host(pid: int | None) -> None:
    from scripts.demo import stop_pid_if_ours

    if pid:
        stop_pid_if_ours(int(pid), "nexus")


def measure_rollout(stack: ProductionStack, args) -> dict[str, Any]:
    server = benchlib.server_url()
    tag = uuid.uuid4().hex[:4]
    names = [f"ro{tag}{i:03d}" for i in range(args.rollout_tenants)]
    t0 = time.monotonic()
    rollout_tenants(stack, server, names, connections=True)
    say(f"rollout: {len(names)} MariaDB tenants built in {time.monotonic() - t0:.0f}s")
    stack.wait_for_dag(ROLLOUT_DAG, 120)
    stack.wait_for_dag(CUTOVER_DAG, 120)
    wave_size = rollout_wave_size(len(names))
    out: dict[str, Any] = {"tenants": len(names), "parallel": 4, "wave_size": wave_size,
                           "poll_interval_s": rollout_conf()["poll_interval"]}
    out["airflow"] = airflow_rollout(stack, names, args.rollout_limit, wave_size)
    out.update(against_cli_floor(stack, server, out["airflow"], [f"cl{tag}{i:03d}" for i in range(args.rollout_tenants)],
                                 out["airflow"]["wall_s_per_tenant"]))
    if getattr(args, "rollout_lanes", None):
        out["lanes"] = compare_lanes(stack, server, args.rollout_lanes, args.lanes_tenants, args.rollout_limit)
    return out


def compare_lanes(stack: ProductionStack, server: str, lanes: list[int], tenants: int, limit_s: float) -> dict[str, Any]:
    """Issue 36's "16 lanes on 4 slots": the same rollout (``tenants`` fresh drained tenants, one wave as wide as the
    widest ``lanes``) once per ``max_parallel`` in ``lanes``, alternating; the admission pause's median (and less the
    answer's wait) of each, and its ratio to the first's."""
    wave = max(rollout_wave_size(tenants), max(lanes))
    out: dict[str, Any] = {"tenants": tenants, "wave_size": wave, "runs": {}}
    for n in lanes:
        tag = uuid.uuid4().hex[:4]
        names = [f"ln{tag}{i:03d}" for i in range(tenants)]
        rollout_tenants(stack, server, names, connections=True)
        got = airflow_rollout(stack, names, limit_s, wave, extra={"max_parallel": n})
        pause = (got.get("rollout_summary") or {}).get("admission_pause") or {}
        less = got.get("admission_pause_less_answer_wait") or {}
        out["runs"][str(n)] = {"state": got["state"], "succeeded": got["succeeded"], "pause_median_s": pause.get("median_s"),
                               "pause_p95_s": pause.get("p95_s"), "less_answer_wait_median_s": less.get("median_s"),
                               "wall_s": got["wall_s"], "pause_breakdown_median": got.get("pause_breakdown_median")}
        say(f"lanes: max_parallel {n}: {got['state']}, pause median {pause.get('median_s')} s")
    base = out["runs"][str(lanes[0])]["pause_median_s"]
    out["pause_median_vs_first"] = {k: round(r["pause_median_s"] / base, 2) if base and r["pause_median_s"] else None
                                    for k, r in out["runs"].items()}
    return out


def against_cli_floor(stack: ProductionStack, server: str, a: dict[str, Any], cli_names: list[str],
                      airflow_s_per_tenant: float | None, *, parallel: int = 4) -> dict[str, Any]:
    """The CLI floor over fresh drained tenants (``nexus-cutover run``, ``parallel`` at a time) and the Airflow
    rollout's figures over it: wall per tenant, the admission pause's median and p95 (with and without the
    answer's wait)."""
    dsns = rollout_tenants(stack, server, cli_names, connections=False)
    out: dict[str, Any] = {"cli_floor": cli_rollout(dsns, rollout_conf()["poll_interval"], parallel)}
    c = out["cli_floor"]
    if airflow_s_per_tenant and c["wall_s_per_tenant"]:
        out["airflow_over_cli_floor"] = round(airflow_s_per_tenant / c["wall_s_per_tenant"], 2)
    # The admission pause (fence armed -> released, the fence row's own times; the answer given at once in both)
    a_pause, c_pause = (a.get("rollout_summary") or {}).get("admission_pause"), c["admission_pause"]
    if a_pause and c_pause:
        for stat in ("median_s", "p95_s"):
            out[f"admission_pause_{stat[:-2]}_over_cli"] = round(a_pause[stat] / c_pause[stat], 2)
    # The same, less the seconds each question waited for its answer (the CLI's answer is a flag: no wait)
    less = a.get("admission_pause_less_answer_wait")
    if less and c_pause:
        for stat in ("median_s", "p95_s"):
            out[f"admission_pause_less_answer_wait_{stat[:-2]}_over_cli"] = round(less[stat] / c_pause[stat], 2)
    return out


def rollout_wave_size(tenants: int) -> int:
    """The form's default wave size (10), or the smallest that keeps the canary and the waves within the DAG's
    :data:`MAX_WAVES` (the form refuses more: 300 tenants need waves of 16)."""
    return max(10, -(-(tenants - 1) // (MAX_WAVES - 1)))


def measure_rollout_faults(stack: ProductionStack, args) -> dict[str, Any]:
    """Issue 27's bad input: a rollout where one tenant's database is unreachable, one refuses at the audit and
    one's drain times out (one per wave after the canary, ``max_failed`` 1 per wave, ``on_preflight_stop`` run:
    each starts and stops where it must). The others must succeed; the three are read back from the rollout's
    summary with their task and reason."""
    server = benchlib.server_url()
    tag = uuid.uuid4().hex[:4]
    names = [f"rf{tag}{i:03d}" for i in range(args.fault_tenants)]
    wave_size = max(2, rollout_wave_size(len(names))) if not args.quick else 2
    parallel = min(wave_size, 16)  # every slot busy: the DAG's max_active_runs, the CLI floor at the same concurrency
    unreachable, refusing, slow = names[1], names[1 + wave_size], names[1 + 2 * wave_size]
    builders = {refusing: audit_refusing_tenant, slow: slow_drain_tenant}
    t0 = time.monotonic()
    dsns = rollout_tenants(stack, server, names, connections=True, builders=builders, unreachable=(unreachable,))
    say(f"rollout with faults: {len(names)} MariaDB tenants built in {time.monotonic() - t0:.0f}s "
        f"(unreachable {unreachable}, audit refusal {refusing}, drain timeout {slow})")
    stack.wait_for_dag(ROLLOUT_DAG, 120)
    stack.wait_for_dag(CUTOVER_DAG, 120)
    heartbeat = Heartbeat(dsns[slow], SLOW_OLD_WORKER)
    heartbeat.start()
    drain_timeout = 60
    try:
        run = airflow_rollout(stack, names, args.rollout_limit, wave_size,
                              extra={"max_failed": 1, "on_preflight_stop": "run", "max_parallel": parallel},
                              cutover={"drain_timeout": drain_timeout})
    finally:
        heartbeat.halt.set()
    tenants = (run.get("rollout_summary") or {}).get("tenants") or {}
    expected = {unreachable: "resolve_packs", refusing: "audit_and_checkpoint", slow: "wait_for_drain"}
    named = {n: {k: tenants.get(n, {}).get(k) for k in ("state", "task", "reason")} for n in expected}
    others = [n for n in names if n not in expected]
    out = {"tenants": len(names), "wave_size": wave_size, "parallel": parallel, "max_failed": 1,
           "drain_timeout_s": drain_timeout,
           "faults": {"unreachable": unreachable, "audit_refusal": refusing, "drain_timeout": slow}, "named": named,
           "others_succeeded": sum(tenants.get(n, {}).get("state") == "success" for n in others),
           "others": len(others), "airflow": run}
    out["as_expected"] = (out["others_succeeded"] == len(others)
                          and all(named[n]["state"] == "failed" and named[n]["reason"]
                                  and re.fullmatch(rf"{task}(_\d+)?", str(named[n]["task"]))  # a mapped task: _<index>
                                  for n, task in expected.items()))
    if run["wall_s"] and out["others_succeeded"]:
        out["wall_s_per_succeeded_tenant"] = round(run["wall_s"] / out["others_succeeded"], 1)
    say(f"rollout with faults: {out['others_succeeded']}/{len(others)} others succeeded; named: {named}")
    out.update(against_cli_floor(stack, server, run, [f"cf{tag}{i:03d}" for i in range(len(others))],
                                 out.get("wall_s_per_succeeded_tenant"), parallel=parallel))
    return out


def airflow_rollout(stack: ProductionStack, names: list[str], limit_s: float, wave_size: int, *,
                    extra: dict[str, Any] | None = None, cutover: dict[str, Any] | None = None,
                    answerer: Answerer | None = None) -> dict[str, Any]:
    answerer = answerer or Answerer(stack)
    started = time.monotonic()
    rollout_run = stack.trigger(ROLLOUT_DAG, {"tenants": names, "wave_size": wave_size, **(extra or {}),
                                              "cutover_conf": {**rollout_conf(), **(cutover or {})}})["dag_run_id"]
    done: dict[str, dict] = {}
    state = "queued"
    while time.monotonic() - started < limit_s:
        answerer.tick()
        for run in cutover_runs(stack, rollout_run):
            if run["state"] in ("success", "failed") and run["dag_run_id"] not in done:
                done[run["dag_run_id"]] = run
                if run["state"] == "success":
                    stop_host((stack.xcom(CUTOVER_DAG, run["dag_run_id"], "start_new_host") or {}).get("pid"))
        state = stack.dag_run(ROLLOUT_DAG, rollout_run)["state"]
        if state in ("success", "failed"):
            break
        time.sleep(2)
    wall = time.monotonic() - started
    stopped = state not in ("success", "failed")
    if stopped:  # the limit: end it, so that the CLI floor does not run beside it
        for dag_id, run_id in [(ROLLOUT_DAG, rollout_run),
                               *((CUTOVER_DAG, r["dag_run_id"]) for r in cutover_runs(stack, rollout_run)
                                 if r["state"] not in ("success", "failed"))]:
            with contextlib.suppress(ApiError):
                stack.request("PATCH", f"/api/v2/dags/{dag_id}/dagRuns/{run_id}", {"state": "failed"})
    failed_tasks = sorted({t["task_id"] for t in stack.task_instances(ROLLOUT_DAG, rollout_run) if t.get("state") == "failed"})
    summary = stack.xcom(ROLLOUT_DAG, rollout_run, "summary", key="summary")
    per = [_seconds(r) for r in done.values() if r["state"] == "success"]
    ok = sum(1 for r in done.values() if r["state"] == "success")
    say(f"rollout (Airflow): {state} in {wall:.0f}s; {ok}/{len(names)} tenants succeeded")
    waits = answerer.answer_waits()
    pause_parts = [{**pause_breakdown(stack.task_instances(CUTOVER_DAG, r["dag_run_id"])),
                    "answer_wait_s": waits.get(r["dag_run_id"], 0.0)}
                   for r in done.values() if r["state"] == "success"]
    return {"state": state, "rollout_run_id": rollout_run, "stopped_at_limit_s": round(limit_s) if stopped else None,
            "wall_s": round(wall, 1), "succeeded": ok, "finished_runs": len(done),
            "wall_s_per_tenant": round(wall / len(names), 1) if ok == len(names) else None,
            "tenant_run_s_mean": round(sum(per) / len(per), 1) if per else None,
            "tenant_run_s_max": round(max(per), 1) if per else None,
            "confirmations_answered": len(answerer.answered), "unanswered_questions": answerer.other,
            "rollout_failed_tasks": failed_tasks, "rollout_summary": summary,
            "pause_breakdown_median": _median_breakdown(pause_parts) if pause_parts else None,
            "slot_held_after_task_end": slot_held_after_end(stack),
            "admission_pause_less_answer_wait": _pause_less_answer_wait(summary, done, waits)}


def slot_held_after_end(stack: ProductionStack, dag_id: str = CUTOVER_DAG) -> dict[str, Any] | None:
    """How long each task of ``dag_id`` kept its worker slot after it ended: from its log's last line to its
    supervisor's "Workload finished" line in the worker's log (the Celery task ends there and frees the slot).
    Airflow 3.3.2's supervisor can sleep up to ``[workers] min_heartbeat_interval`` after its process exited."""
    finished: dict[str, dt.datetime] = {}
    for log in (stack.root / "logs").glob("worker-*.log"):
        for line in log.read_text(errors="replace").splitlines():
            if m := re.match(r"(\S+?)Z? .*Workload finished .*workload_id=(\S+)", line):
                finished[m.group(2)] = dt.datetime.fromisoformat(m.group(1))
    held = []
    for path in (stack.home / "logs" / f"dag_id={dag_id}").rglob("attempt=*.log"):
        lines = [json.loads(x) for x in path.read_text(errors="replace").splitlines() if x.startswith("{")]
        ti_id = next((x["ti_id"] for x in lines if "ti_id" in x), None)
        if ti_id in finished and lines:
            held.append((finished[ti_id] - dt.datetime.fromisoformat(lines[-1]["timestamp"].rstrip("Z"))).total_seconds())
    held = [h for h in held if h >= 0]  # a parked HITL try's log goes on in its resumed try: not a slot held
    if not held:
        return None
    summary = pause_summary(held) or {}
    return {"tasks": summary.pop("tenants"), **summary, "over_2s": sum(1 for h in held if h > 2.0)}


def _pause_less_answer_wait(summary: dict | None, done: dict[str, dict], waits: dict[str, float]) -> dict | None:
    """Each succeeded tenant's admission pause (the rollout summary's, from the fence row) less the seconds its
    question waited for the answer: what the product itself adds to the pause."""
    tenants = (summary or {}).get("tenants") or {}
    values = [t["admission_pause_s"] - waits.get(t.get("run_id"), 0.0) for t in tenants.values()
              if t.get("admission_pause_s") is not None and t.get("run_id") in done]
    return pause_summary(values) if values else None


def _median_breakdown(parts: list[dict[str, Any]]) -> dict[str, Any]:
    """The median of each part of :func:`pause_breakdown` over the tenants, and of each task's seconds in it."""
    out: dict[str, Any] = {k: round(statistics.median(p[k] for p in parts), 1)
                           for k in ("window_s", "in_tasks_s", "queued_s", "between_s", "answer_wait_s")}
    names = sorted({n for p in parts for n in p["tasks_s"]})
    out["tasks_s"] = {n: round(statistics.median(p["tasks_s"].get(n, 0.0) for p in parts), 1) for n in names}
    return out


def _at(value: str | None) -> dt.datetime | None:
    return dt.datetime.fromisoformat(value.replace("Z", "+00:00")) if value else None


def pause_breakdown(tis: list[dict]) -> dict[str, float]:
    """Where one tenant's admission pause goes in Airflow: from ``arm_fence``'s end to ``resume_admission``'s start,
    the seconds inside tasks (start -> end, clipped to the window; a deferred wait counts inside its task), queued
    (queued -> first start: a worker taking it) and the rest (a task ended -> the next one queued: the scheduler's
    loop), from the task instances' own times."""
    end_of = {t["task_id"].rsplit(".", 1)[-1]: t for t in tis}
    lo, hi = _at(end_of["arm_fence"]["end_date"]), _at(end_of["resume_admission"]["start_date"])
    inside = queued = 0.0
    tasks: dict[str, float] = {}
    for t in tis:
        start, end, q = _at(t.get("start_date")), _at(t.get("end_date")), _at(t.get("queued_when"))
        if start and end and end > lo and start < hi:
            seconds = (min(end, hi) - max(start, lo)).total_seconds()
            inside += seconds
            name = t["task_id"].rsplit(".", 1)[-1]
            tasks[name] = tasks.get(name, 0.0) + seconds
        if q and start and q <= start and start > lo and q < hi:  # (a resumed deferral is queued after its start)
            queued += (min(start, hi) - max(q, lo)).total_seconds()
    window = (hi - lo).total_seconds()
    return {"window_s": window, "in_tasks_s": inside, "queued_s": queued, "between_s": window - inside - queued,
            "tasks_s": tasks}


def cutover_runs(stack: ProductionStack, rollout_run: str) -> list[dict]:
    runs = stack.paged(f"/api/v2/dags/{CUTOVER_DAG}/dagRuns", "dag_runs")  # every page: the API serves 100 a page
    return [r for r in runs if r["dag_run_id"].startswith(f"rollout__{rollout_run}__")]


def _seconds(run: dict) -> float:
    start, end = (dt.datetime.fromisoformat(run[k].replace("Z", "+00:00")) for k in ("start_date", "end_date"))
    return (end - start).total_seconds()


def cli_rollout(dsns: dict[str, str], poll_s: int, parallel: int = 4) -> dict[str, Any]:
    """``nexus-cutover run`` per tenant, ``parallel`` at a time, each tenant's host stopped when its run ends."""
    exe = str(Path(sys.executable).parent / "nexus-cutover")
    host = str(Path(sys.executable).parent / "nexus-host")
    marker = f"nexus-bench-cli-{uuid.uuid4().hex[:8]}"

    def one(item: tuple[str, str]) -> tuple[int, float, float | None]:
        name, dsn = item
        env = {**os.environ, "NEXUS_TENANT_DSN": dsn, "NEXUS_BENCH_CLI": f"{marker}-{name}"}
        t0 = time.monotonic()
        proc = subprocess.run([exe, "run", "-namespace", name, "--confirm-writers-stopped", "-json",
                               "-poll-interval", f"{poll_s}s", "-stale-heartbeat", "20s", "-drain-timeout", "300s",
                               "-writers-stop-timeout", "120s", "-readiness-timeout", "120s",
                               "-host-command", f"{host} --namespace {name}"],
                              env=env, capture_output=True, text=True, timeout=900, check=False)
        took = time.monotonic() - t0
        left = pids_with_env("NEXUS_BENCH_CLI", f"{marker}-{name}")
        signal_all(left, 15)
        if proc.returncode != 0:
            say(f"cli floor: {name} exited {proc.returncode}: {proc.stderr[-400:]}")
        return proc.returncode, took, _json_pause(proc.stdout)

    started = time.monotonic()
    with ThreadPoolExecutor(parallel) as pool:
        results = list(pool.map(one, dsns.items()))
    wall = time.monotonic() - started
    ok = sum(1 for code, _, _ in results if code == 0)
    say(f"rollout (CLI floor): {ok}/{len(dsns)} in {wall:.0f}s")
    return {"wall_s": round(wall, 1), "succeeded": ok,
            "wall_s_per_tenant": round(wall / len(dsns), 1) if ok == len(dsns) else None,
            "tenant_run_s_mean": round(sum(t for _, t, _ in results) / len(results), 1),
            "admission_pause": pause_summary(p for code, _, p in results if code == 0 and p is not None)}


def _json_pause(stdout: str) -> float | None:
    """The admission pause ``nexus-cutover run -json`` reports (its last JSON line), None without one."""
    for line in reversed(stdout.splitlines()):
        with contextlib.suppress(ValueError):
            found = json.loads(line)
            if isinstance(found, dict):
                value = found.get("admission_pause_s")
                return None if value is None else float(value)
    return None

"""``make demo``: the main job end to end on the embedded default, as a delivery engineer runs it.

1. seeds the demo tenant in a SQLite database (``scripts/demo_seed.py``): the production-shaped
   tenant of ``nexus_sim`` (ordinary work in every status beside the projection work, hostile lanes
   and receipt ids, 10,000 stopped registry rows, ...; ``--clean`` for the small clean one);
2. starts real Airflow (``airflow standalone`` on its own SQLite metadata DB), the
   old-protocol runtime, so there is live old work draining, and live traffic
   (``nexus_sim.traffic.LiveTraffic``): ordinary work keeps arriving (and completing) during the
   whole cutover, new receipts and the tenant's planned case-variant receipts from the release on;
3. creates the tenant's Airflow connection and triggers ``connector_projection_cutover``
   through the REST API, prints progress, stops the old runtime once the drain
   is done (step 3 of seed 000), prints the evidence of the writer-stop
   confirmation and answers it through the same REST API the UI uses, and waits
   for the cutoffs, the new host and the fence release;
4. runs ``field_history_eligibility`` for the same tenant through stage 3;
5. stops the traffic and proves, on the tenant as it is then: the history digest taken while
   fenced still verifies (ordinary rows and new range work changed after it), the live ordinary work
   planted before the cutover is still live with its Status (nothing waited for it), every projection
   Event above a cutoff lies in exactly one range generation (the server's join), every receipt the
   traffic sent after the release was admitted except collisions, which stay unconfirmed;
6. prints a summary and stops everything it started (Airflow, the old runtime,
   the new host started by the run), whatever happened.

State lives in ``.run/demo`` and is recreated on every run, so a second
``make demo`` starts from the same tenant. Exit 0 when both DAG runs succeeded and every proof of step 5 holds.
With ``--keep-up`` Airflow stays up after the run (the ``make airflow`` target
uses ``scripts/airflow_up.py`` instead).
"""

from __future__ import annotations

import argparse
import contextlib
import datetime as dt
import os
import pathlib
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from typing import Any

REPO = pathlib.Path(__file__).resolve().parents[1]
# the repository root, for scripts.*; the nexus packages are the installed (editable) distributions (make deps)
sys.path[:0] = [str(REPO)]

from scripts.demo_airflow import AirflowStack, ledger_file  # noqa: E402
from scripts.demo_seed import NEW_PRODUCER_VERSION, STAGE1_RELEASE, seed  # noqa: E402

CUTOVER_DAG = "connector_projection_cutover"
FIELD_HISTORY_DAG = "field_history_eligibility"
TENANT = "demo"
CONN_ID = f"nexus_tenant_{TENANT}"

CUTOVER_CONF = {
    "tenant": TENANT,
    "host_controller": "command",
    "poll_interval": 10,  # >= 10 s: apache/airflow#71172 (LocalExecutor race with very short pokes)
    "stale_heartbeat": 20,
    "drain_timeout": 600,
    "writers_stop_timeout": 300,
    "confirm_timeout": 600,
    "readiness_timeout": 300,
    "lock_timeout": 60,
}


def say(msg: str) -> None:
    print(f"[{dt.datetime.now().strftime('%H:%M:%S')}] {msg}", flush=True)


class Child:
    """A helper process of the demo (own session, log file), stopped by SIGTERM to its own pid."""

    def __init__(self, name: str, argv: list[str], env: dict[str, str], log: pathlib.Path):
        self.name = name
        self.log = log
        self.proc = subprocess.Popen(argv, env=env, stdout=open(log, "ab"), stderr=subprocess.STDOUT,  # noqa: SIM115
                                     stdin=subprocess.DEVNULL, start_new_session=True)

    def running(self) -> bool:
        return self.proc.poll() is None

    def stop(self, timeout_s: float = 20.0) -> None:
        if not self.running():
            return
        self.proc.send_signal(signal.SIGTERM)
        try:
            self.proc.wait(timeout_s)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait(5)


def stop_pid_if_ours(pid: int, must_contain: str, timeout_s: float = 20.0) -> bool:
    """SIGTERM ``pid`` if it is still the process we started (its command line names ``must_contain``)."""
    try:
        cmdline = pathlib.Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode()
    except OSError:
        return False
    if must_contain not in cmdline:
        return False
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGTERM)
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not pathlib.Path(f"/proc/{pid}").exists() or _zombie(pid):
            return True
        time.sleep(0.3)
    with contextlib.suppress(ProcessLookupError):
        os.kill(pid, signal.SIGKILL)
    return True


def _zombie(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] == "Z"
    except OSError:
        return True


class Watcher:
    """Follows one DAG run: prints task state changes, answers HITL steps after printing their evidence."""

    def __init__(self, stack: AirflowStack, dag_id: str, run_id: str, *, answer: Callable[[str, list[str]], str | None]):
        self.stack, self.dag_id, self.run_id = stack, dag_id, run_id
        self.answer = answer  # (task_id, options) -> the option to choose, or None to leave it to a person
        self.seen: dict[str, str] = {}
        self.hitl_first_seen: dict[str, float] = {}
        self.answered: set[str] = set()

    def poll(self) -> tuple[str, dict[str, str]]:
        tis = self.stack.task_instances(self.dag_id, self.run_id)
        states: dict[str, str] = {}
        for ti in sorted(tis, key=lambda t: (t.get("start_date") or "9", t["task_id"], t.get("map_index", -1))):
            key = ti["task_id"] + (f"[{ti['map_index']}]" if ti.get("map_index", -1) >= 0 else "")
            state = ti.get("state") or "none"
            states[key] = state
            if self.seen.get(key) != state and state != "none":
                say(f"  {self.dag_id}: {key:<28} {state}")
                self.seen[key] = state
        self._hitl()
        run = self.stack.dag_run(self.dag_id, self.run_id)
        return run["state"], states

    def _hitl(self) -> None:
        for d in self.stack.pending_hitl(self.dag_id, self.run_id):
            ti = d["task_instance"]
            key = f"{ti['task_id']}:{ti.get('map_index', -1)}"
            if key in self.answered:
                continue
            if key not in self.hitl_first_seen:
                self.hitl_first_seen[key] = time.monotonic()
                say(f"  HITL {ti['task_id']} is waiting for an answer: {d['subject']}")
                for line in (d.get("body") or "").splitlines():
                    print(f"      | {line}", flush=True)
                say(f"      options: {d['options']}")
            option = self.answer(ti["task_id"], list(d["options"]))
            if option is None:
                continue
            # a HITL answered within ~1 s of parking can be lost (apache/airflow#71172): give it a moment
            if time.monotonic() - self.hitl_first_seen[key] < 5:
                continue
            self.stack.answer_hitl(self.dag_id, self.run_id, ti["task_id"], option, ti.get("map_index", -1))
            self.answered.add(key)
            say(f"  answered {ti['task_id']} through PATCH .../hitlDetails: {option!r} (as the UI does)")

    def wait(self, timeout_s: float, on_tick=None) -> str:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            state, states = self.poll()
            if on_tick:
                on_tick(states)
            if state in ("success", "failed"):
                return state
            time.sleep(3)
        return "timed_out"


def drain_line(dsn: str) -> str:
    from nexus_cutover.db import make_engine
    from nexus_cutover.projection.drain import drain_report

    engine = make_engine(dsn)
    try:
        r = drain_report(engine, TENANT, deadline=dt.datetime.now(dt.UTC).replace(tzinfo=None) + dt.timedelta(minutes=10),
                         stale_heartbeat=dt.timedelta(seconds=20), sample_limit=5)
        return r.counts_text()
    finally:
        engine.dispose()


def tenant_summary(dsn: str) -> dict[str, Any]:
    """Read back what the runs left in the tenant DB (the same domain reads the status view uses)."""
    from nexus_cutover.tenant_status import read_tenant_state

    return read_tenant_state(dsn, TENANT)


def say_the_ledger(path: pathlib.Path) -> None:
    """The tenant's delivery-ledger record, as a reviewer reads it later: ``nexus-cutover report``, outside Airflow."""
    env = {**os.environ, "NEXUS_LEDGER_DSN": f"sqlite:///{path}"}
    done = subprocess.run([str(pathlib.Path(sys.executable).parent / "nexus-cutover"), "report", "-namespace", TENANT],
                          env=env, capture_output=True, text=True, timeout=120)
    lines = [line for line in done.stdout.splitlines() if line.strip()]
    say(f"6. the delivery ledger ({path}, kept outside Airflow's metadata): {len(lines)} events of tenant {TENANT!r}; "
        f"NEXUS_LEDGER_DSN=sqlite:///{path} nexus-cutover report -namespace {TENANT} prints them"
        + ("" if done.returncode == 0 else f" (report exited {done.returncode}: {done.stderr.strip()[:300]})"))
    for line in lines[:40]:
        say(f"   {line}")


def run_demo(state_dir: pathlib.Path, *, keep_up: bool = False, production: bool = True) -> int:
    started = time.monotonic()
    if state_dir.exists():
        shutil.rmtree(state_dir)
    state_dir.mkdir(parents=True)
    tenant_db = state_dir / f"tenant-{TENANT}.db"
    dsn = f"sqlite:///{tenant_db}"

    say(f"1. seeding the {'production-shaped' if production else 'clean'} demo tenant {TENANT!r} in {tenant_db}")
    info = seed(str(tenant_db), TENANT, production=production)
    say(f"   packs {info['packs']}: {info['events']} Events, {info['work_items']} WorkItems "
        f"({info['live_old_work']} old projection items still in flight, {info['ordinary_work']} ordinary), "
        f"{info['receipts']} receipts, {info['registry_rows']} registry rows, {info['audit_rows']} audit field changes "
        f"(built in {time.monotonic() - started:.1f}s)")

    stack = AirflowStack(state_dir / "airflow", parallelism=4)
    old_runtime: Child | None = None
    traffic = None
    host_pid: int | None = None
    child_env = {**os.environ, "NEXUS_TENANT_DSN": dsn, "PYTHONPATH": str(REPO)}
    try:
        say("2. starting Airflow (airflow standalone: scheduler, dag-processor, triggerer, api-server) ...")
        stack.start()
        say(f"   Airflow is up at {stack.base_url} (login admin / {stack.admin_password()}); "
            f"log {stack.log_path}")
        stack.wait_for_dag(CUTOVER_DAG)
        stack.put_connection(CONN_ID, "sqlite", host=str(tenant_db), description="demo tenant (embedded SQLite)")
        say(f"   Airflow connection {CONN_ID!r}: sqlite, host {tenant_db}")

        old_runtime = Child("old runtime", [sys.executable, str(REPO / "scripts" / "demo_old_runtime.py"),
                                            "--namespace", TENANT], child_env, state_dir / "old-runtime.log")
        say(f"   old-protocol runtime started (pid {old_runtime.proc.pid}): ingress writer + projection worker; "
            f"old work: {drain_line(dsn)}")
        if info["planted"] is not None:
            traffic = start_traffic(dsn, info["planted"])
            say(f"   live traffic started: ordinary work every {traffic.interval_s:g}s from now on; new receipts and "
                f"{len(traffic.future)} planned case-variant receipts once the release happened")

        say(f"3. triggering {CUTOVER_DAG} for tenant {TENANT!r} through POST /api/v2/dags/{CUTOVER_DAG}/dagRuns")
        run = stack.trigger(CUTOVER_DAG, CUTOVER_CONF)
        run_id = run["dag_run_id"]
        say(f"   run {run_id}")
        watcher = Watcher(stack, CUTOVER_DAG, run_id, answer=confirm_writers_stopped)
        last_drain = [""]

        def on_tick(states: dict[str, str]) -> None:
            nonlocal old_runtime
            if states.get("wait_for_drain") in ("running", "deferred", "up_for_reschedule", "queued", "scheduled"):
                line = drain_line(dsn)
                if line != last_drain[0]:
                    say(f"   drain: {line}")
                    last_drain[0] = line
            if states.get("wait_for_drain") == "success" and old_runtime and old_runtime.running():
                say("   drained. Step 3: stopping every old writer and worker (the fence stays armed) ...")
                old_runtime.stop()
                say("   old runtime stopped (its registry rows have StoppedAt)")

        outcome = watcher.wait(900, on_tick)
        start_host = stack.xcom(CUTOVER_DAG, run_id, "start_new_host") or {}
        host_pid = start_host.get("pid")
        if host_pid:
            say(f"   new host started by start_new_host: pid {host_pid}, log {start_host.get('log')}")
        if outcome != "success":
            say(f"   cutover run ended {outcome}: read the failed task's log in the UI ({stack.base_url}) "
                f"and its XCom 'report'")
            return 1
        say("   cutover run succeeded: cutoffs written, new host active, fence released")
        digest = stack.xcom(CUTOVER_DAG, run_id, "history_digest") or {}
        verified = (stack.xcom(CUTOVER_DAG, run_id, "final_old_writer_check") or {}).get("history_digest") or {}
        if digest.get("hash"):
            rows = ", ".join(f"{n} {name.removeprefix('_System_')}s" for name, n in digest["rows"].items())
            say(f"   history digest {digest['hash']} ({rows}, {sum(digest['chunks'].values())} chunks) taken after the "
                f"confirmation; " + ("verified at the end: no history row changed" if verified.get("verified")
                                    else "NOT verified"))
        if traffic is not None:
            r = traffic.report
            say(f"   live traffic so far: {len(r.ordinary)} ordinary WorkItems created, {len(r.ordinary_completed)} "
                f"completed; receipts held for {r.receipts_held} ticks, then {r.ticks_after_release} ticks after the "
                f"release before and after the final check")

        fh_outcome = "not run"
        try:
            stack.wait_for_dag(FIELD_HISTORY_DAG, timeout_s=30)
            fh_available = True
        except Exception:  # noqa: BLE001 - the DAG may be missing in this checkout
            fh_available = False
        if fh_available:
            say(f"4. Field History: stopped upgrade of the producers to {NEW_PRODUCER_VERSION} (the deployment's job)")
            for line in upgrade_producers(dsn):
                say(f"   {line}")
            say(f"   triggering {FIELD_HISTORY_DAG} for tenant {TENANT!r} through stage 3")
            fh_run = stack.trigger(FIELD_HISTORY_DAG, field_history_conf())
            fh_watch = Watcher(stack, FIELD_HISTORY_DAG, fh_run["dag_run_id"], answer=approve_first)
            fh_outcome = fh_watch.wait(600)
            for task_id in ("stage_1", "stage_2_producers", "stage_2_materialize"):
                report = stack.xcom(FIELD_HISTORY_DAG, fh_run["dag_run_id"], task_id) or {}
                if report.get("summary"):
                    say(f"   {task_id}: {report['summary']}")
            stage_3 = stack.xcom(FIELD_HISTORY_DAG, fh_run["dag_run_id"], "stage_3") or {}
            if stage_3.get("summary"):
                say(f"   stage 3: {stage_3['summary']}")
            for item in stage_3.get("removable") or []:
                say(f"   now removable: {item}")
        else:
            say(f"4. DAG {FIELD_HISTORY_DAG} is not in dags/: Field History step skipped")

        proofs_ok = True
        if traffic is not None:
            say("5. stopping the live traffic; what the tenant proves now")
            report = traffic.stop()
            traffic = None
            full_digest = stack.xcom(CUTOVER_DAG, run_id, "history_digest", key="digest")
            cutoffs = (stack.xcom(CUTOVER_DAG, run_id, "final_old_writer_check") or {}).get("cutoffs") or {}
            proofs = production_proofs(dsn, info, full_digest, cutoffs, report)
            for ok, line in proofs:
                say(f"   {'ok  ' if ok else 'FAIL'} {line}")
            proofs_ok = all(ok for ok, _ in proofs)

        say_the_ledger(ledger_file(stack.home))
        state = tenant_summary(dsn)
        print_summary(state, time.monotonic() - started)
        ok = fh_outcome == "success" and proofs_ok
        if fh_outcome != "success":
            say(f"   {FIELD_HISTORY_DAG} ended {fh_outcome}")
        if keep_up:
            say(f"Airflow stays up at {stack.base_url} (login admin / {stack.admin_password()}); Ctrl-C stops it")
            with contextlib.suppress(KeyboardInterrupt):
                while True:
                    time.sleep(3600)
        return 0 if ok else 1
    finally:
        say("7. stopping everything the demo started ...")
        if traffic is not None:
            traffic.stop()
        if old_runtime:
            old_runtime.stop()
        if host_pid:
            stop_pid_if_ours(int(host_pid), "nexus")
        stack.stop()
        say(f"   stopped (total {time.monotonic() - started:.0f}s)")


def start_traffic(dsn: str, planted):
    """Live traffic for the demo tenant (its own engine): ordinary work from now on, receipts from the release on."""
    from nexus_cutover.db import make_engine
    from nexus_sim.traffic import LiveTraffic

    return LiveTraffic(make_engine(dsn), planted, receipts_after_release=True, receipts_per_tick=1, future_per_tick=1,
                       ordinary_per_tick=1, complete_ordinary_per_tick=1, interval_s=2.0).start()


def production_proofs(dsn: str, info: dict[str, Any], digest_json: Any, cutoffs: dict[str, int],
                      report) -> list[tuple[bool, str]]:
    """Step 5 of the module docstring: (holds?, what) for each proof, read from the tenant after the traffic stopped."""
    from nexus_cutover.db import make_engine
    from nexus_cutover.projection import steps
    from nexus_cutover.projection.digest import HistoryDigest
    from nexus_sim.checks import live_ordinary_work, projection_owners_after_cutoff, receipt_outcomes
    from nexus_sim.scenario.production import FUTURE_COLLISION
    from nexus_sim.traffic import released

    planted = info["planted"]
    engine = make_engine(dsn)
    try:
        proofs: list[tuple[bool, str]] = []
        admissible = report.receipts + [(f.pack_install_id, f.source_lane, f.receipt_id) for f, outcome in
                                        report.future_sent if outcome == "stored" and f.kind != FUTURE_COLLISION]
        deadline = time.monotonic() + 120
        while not all(receipt_outcomes(engine, admissible).values()) and time.monotonic() < deadline:
            time.sleep(1)  # the new host admits what arrived last
        outcomes = receipt_outcomes(engine, admissible)
        collisions = receipt_outcomes(engine, [(f.pack_install_id, f.source_lane, f.receipt_id)
                                               for f in report.collisions_stored])
        proofs.append((bool(admissible) and all(outcomes.values()) and not any(collisions.values()),
                       f"the new host admitted all {len(admissible)} receipts sent after the release (hostile lanes, "
                       f"case-variant ids); {len(collisions)} collision(s) left unconfirmed for review"))
        verification = steps.verify_history(engine, HistoryDigest.from_json(digest_json), timeout_s=120)
        proofs.append((verification.ok, f"history digest verified again after the traffic "
                                        f"({len(report.ordinary)} ordinary WorkItems created, "
                                        f"{len(report.ordinary_completed)} completed): {verification.summary()}"))
        held = live_ordinary_work(engine, info["work_item_rows"])
        untouched = [w for w, (before, now) in held.items() if before == now]
        proofs.append((bool(held) and len(untouched) == len(held),
                       f"{len(untouched)} of {len(held)} live ordinary WorkItems planted before the cutover (blocked, "
                       f"retry due next week, processing) still live with their Status: nothing waited for them"))
        owners = projection_owners_after_cutoff(engine, cutoffs)
        proofs.append((bool(cutoffs) and not owners["not_exactly_one"],
                       f"{owners['checked']} projection Events above the cutoffs each in exactly one range generation "
                       f"(the server's join); {owners['ordinary_above_cutoff']} ordinary Events above them in none"))
        proofs.append((report.ticks_after_release > 0 and released(engine, TENANT, planted.active_packs),
                       f"traffic reached the tenant after the release in {report.ticks_after_release} ticks"))
        proofs.append((not report.errors, f"live traffic errors: {report.errors[:3] or 'none'}"))
        return proofs
    finally:
        engine.dispose()


def confirm_writers_stopped(task_id: str, options: list[str]) -> str | None:
    """The demo engineer confirms the writer stop (the old runtime was stopped by this script)."""
    return next((o for o in options if o.startswith("Confirm")), None) if task_id == "confirm_writers_stopped" else None


def approve_first(task_id: str, options: list[str]) -> str | None:
    """Field History confirmations: the first option is the proceed option."""
    return options[0] if options else None


def field_history_conf() -> dict[str, Any]:
    return {"tenant": TENANT, "target_stage": 3, "stage1_release": STAGE1_RELEASE,
            "producer_release": NEW_PRODUCER_VERSION, "poll_interval": 10}


def upgrade_producers(dsn: str) -> list[str]:
    """The stopped upgrade of seed 003 (:mod:`nexus_sim.upgrade`, the control ``make airflow`` names): the old
    Runtime API / outbox worker stop, the frozen new candidate starts at the new release."""
    from nexus_cutover.db import make_engine
    from nexus_sim.upgrade import upgrade_producers as upgrade

    engine = make_engine(dsn)
    try:
        return upgrade(engine, TENANT, NEW_PRODUCER_VERSION)
    finally:
        engine.dispose()


def print_summary(state: dict[str, Any], elapsed: float) -> None:
    print("\n==== nexus-cutover demo summary ====", flush=True)
    print(f"tenant:              {state['tenant']}")
    for pack in state["packs"]:
        cp = pack["checkpoint"]
        print(f"cutoff {pack['pack_install_id']:<13} LegacyMaxOrdinal={cp['legacy_max_ordinal'] if cp else 'none'}")
    hosts = [h for h in state["hosts"] if h["state"] == "live"]
    print(f"new host:            {', '.join(h['process_id'] for h in hosts) or 'none live'}"
          f"{' (activated)' if hosts and all(h.get('activated_at') for h in hosts) else ''}")
    print(f"fence:               {state['fence']['text']}")
    print(f"old work remaining:  {state['drain']['remaining']}")
    print(f"field history stage: {state['field_history']['stage_text']}")
    print(f"elapsed:             {elapsed:.0f}s", flush=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--state-dir", default=str(REPO / ".run" / "demo"))
    parser.add_argument("--keep-up", action="store_true", help="leave Airflow up after the run (Ctrl-C stops it)")
    parser.add_argument("--clean", action="store_true",
                        help="seed the small clean tenant (projection work only) instead of the production-shaped one")
    args = parser.parse_args()
    return run_demo(pathlib.Path(args.state_dir).resolve(), keep_up=args.keep_up, production=not args.clean)


if __name__ == "__main__":
    raise SystemExit(main())

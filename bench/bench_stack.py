"""Issue 13's scale figures on the real distributed Airflow stack (``make bench-stack``).

    bash scripts/with-mariadb.sh .venv/bin/python bench/bench_stack.py [--quick] [--only waiting rollout]

One stack of ``scripts/stack.py`` (PostgreSQL metadata, Redis, CeleryExecutor: scheduler, dag-processor,
api-server, two triggerers, two Celery workers; every process separate), started and stopped here, with a
dags folder of its own: the project's ``dags/*.py`` (copied) plus ``bench/stack_dags/``.

**waiting** -- ``--tenants`` tenants waiting in the cutover's drain trigger on one real triggerer process.
Each tenant is its own SQLite file with old projection work that stays pending (a live old worker, no one
draining it), reached through its own Airflow connection ``nexus_bench_t_<i>`` (``AIRFLOW_CONN_*``). The
bench DAG ``nexus_bench_waiting_tenants`` maps one ``start_from_trigger`` task over the tenants: the scheduler
defers every task instance straight to the triggerer (no worker), where the real ``StatusPollTrigger`` runs
the real ``DrainPoller``. triggerer-2 is stopped first, so triggerer-1 takes every trigger. Measured on that
process tree from /proc: RSS (and PSS) idle, then with every tenant waiting (per tenant: the difference / N),
CPU (utime+stime) over ``--window`` s per tenant-minute, the polls made (one line per poll in each trigger's
log, with ``--quiet-log-s 0``: the product logs a wait's change only) times the statements one poll sends
(counted by SQLite's trace callback on a copy, the same poller),
and the tenant-database files held open, sampled every 0.5 s (an open handle between polls would stay
visible; polls in flight are the only expected ones). Then triggerer-2 is started again, triggerer-1 is
SIGKILLed: the time until the survivor holds every trigger and until every tenant polled there, and the
survivor's memory and CPU after. No trigger may fire (every task instance stays deferred).

**rollout** -- ``--rollout-tenants`` MariaDB tenants (default 11: the canary and one wave of 10; 100 does not
fit the time on 2 cores) with small drained histories and no old writers, through ``tenant_rollout`` (form
fields ``tenants`` and ``cutover_conf`` only, its other fields at their defaults), each tenant's writer-stop
confirmation answered over REST by this script as a second user, each tenant's new host stopped once its run
succeeded; against the floor: the same steps for fresh copies of the same tenants by ``nexus-cutover run``,
4 at a time (the rollout's ``max_parallel``), same poll interval. Wall time per tenant = total wall / tenants.
The waiting run is ended first (its 1,000 triggers would fill the survivor's capacity).

**levers** -- issue 36 item 4's levers, each alone (``bench/stack_levers.py``): the workers restarted with
each lever's switch off or on, a ``tenant_rollout`` of ``--lever-tenants`` drained tenants per configuration,
``--lever-rounds`` interleaved rounds; the admission pause less the answer's wait per configuration.

**fleet** -- issue 36's production-shaped fleet (``bench/stack_fleet.py``): drained, draining, long-backlog and
never-draining tenants with ordinary work arriving, one ``per_wave`` rollout; each tenant's pause against what it
would be if it depended on nothing but that tenant.

**preflight** -- issue 27's ``preflight_vs_plan_loop`` (``bench/bench_preflight.py``: the fleet preflight over
``--preflight-tenants`` production-shaped MariaDB tenants against a loop of ``nexus-cutover plan`` at the same
concurrency, one run, interleaved rounds). Needs no Airflow process: measured before the stack starts, and a run
of ``--only preflight`` starts no stack.

Figures go under the key ``stack`` of bench/results.json (merged: other figures are kept).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import sys
import tempfile
import time
from pathlib import Path
from typing import Any

# The parts live beside this file, each importing none of those after it: stack_report.py (progress lines, the
# results file), stack_proc.py (/proc figures), stack_waiting.py (part waiting), stack_rollout_tenants.py and
# stack_rollout.py (parts rollout and faults), stack_fleet.py (part fleet), stack_levers.py (part levers);
# bench_preflight.py is part preflight.
BENCH = Path(__file__).resolve().parent
REPO = BENCH.parent
sys.path[:0] = [str(BENCH), str(REPO), str(REPO / "plugins")]
import benchlib  # noqa: E402
from bench_preflight import GOAL as PREFLIGHT_GOAL  # noqa: E402
from stack_fleet import measure_fleet  # noqa: E402
from stack_levers import measure_levers  # noqa: E402
from stack_report import save, say  # noqa: E402
from stack_rollout import APPROVER, measure_rollout, measure_rollout_faults  # noqa: E402
from stack_waiting import WAIT_DAG, measure_waiting, sqlite_tenants  # noqa: E402

from nexus_airflow.armed_slots import ARMED_POOL  # noqa: E402
from scripts.stack_topology import ProductionStack  # noqa: E402

GOALS = {"mb_per_waiting_tenant": 0.2, "cpu_ms_per_tenant_minute": 20.0, "idle_connections": 0,
         "preflight_vs_plan_loop": PREFLIGHT_GOAL}


def dags_folder(root: Path) -> Path:
    """The project's DAG files (copied) plus the bench-only DAG."""
    folder = root / "dags"
    folder.mkdir(parents=True)
    for src in [*sorted((REPO / "dags").glob("*.py")), *sorted((BENCH / "stack_dags").glob("*.py"))]:
        shutil.copyfile(src, folder / src.name)
    return folder


# --------------------------------------------------------------------------- main


def verdicts(waiting: dict) -> dict[str, Any]:
    out = {}
    for name in ("one_triggerer", "survivor"):
        r = waiting["one_triggerer"] if name == "one_triggerer" else waiting["failover"]["survivor"]
        out[name] = {
            "mb_per_waiting_tenant": r["mb_per_waiting_tenant"] <= GOALS["mb_per_waiting_tenant"],
            "cpu_ms_per_tenant_minute": r["cpu_ms_per_tenant_minute"] <= GOALS["cpu_ms_per_tenant_minute"],
            "idle_connections": r["idle_connections"] <= GOALS["idle_connections"],
        }
    return out


def run(args, save) -> dict[str, Any]:
    root = Path(tempfile.mkdtemp(prefix="nexus-bench-stack-"))
    results: dict[str, Any] = {"mode": "quick" if args.quick else "full", "measured_at": benchlib.now_utc(),
                               "cores": os.cpu_count(), "goals": GOALS}
    try:
        if "preflight" in args.only:
            from bench_preflight import measure as measure_preflight

            results["preflight"] = measure_preflight(args.preflight_tenants, args.preflight_concurrency,
                                                     1 if args.quick else 3)
            save(results)
            if not set(args.only) - {"preflight"}:
                return results
        tenants_dir, conns = sqlite_tenants(root, args.tenants) if "waiting" in args.only else (root, {})
        extra = {"AIRFLOW__CORE__DAGS_FOLDER": str(dags_folder(root)), "NEXUS_BENCH_WAITING_TENANTS": str(args.tenants),
                 "NEXUS_BENCH_POLL_INTERVAL_S": str(args.poll_interval),
                 "AIRFLOW__CORE__SIMPLE_AUTH_MANAGER_USERS": f"admin:admin,{APPROVER}:admin", **conns}
        if args.quiet_log_s is not None:
            extra["NEXUS_TRIGGER_QUIET_LOG_S"] = str(args.quiet_log_s)
        if args.armed_slots:  # issue 50, item 4: the workers' bound, and the pool of the pause's tasks
            extra["NEXUS_ARMED_SLOTS"] = str(args.armed_slots)
        results["armed_slots"] = args.armed_slots
        results["trigger_quiet_log_s"] = args.quiet_log_s  # None: the product's default
        stack = ProductionStack(root / "stack", extra_env=extra)
        t0 = time.monotonic()
        stack.start(timeout_s=300)
        results["stack_start_s"] = round(time.monotonic() - t0, 1)
        if args.armed_slots:
            stack.put("/api/v2/pools", ARMED_POOL, {"name": ARMED_POOL, "slots": args.armed_slots,
                                                    "description": "tenants' admission pauses", "include_deferred": False})
        say(f"stack up in {results['stack_start_s']}s (logs: {stack.logs})")
        try:
            stack.wait_for_dag(WAIT_DAG, 180)
            if "waiting" in args.only:
                results["waiting"] = {"measured_at": benchlib.now_utc(), **measure_waiting(stack, args, tenants_dir)}
                results["verdicts"] = verdicts(results["waiting"])
                save(results)  # kept should the rollout fail
            if "rollout" in args.only:
                results["rollout"] = {"measured_at": benchlib.now_utc(), **measure_rollout(stack, args)}
                save(results)
            if "faults" in args.only:
                results["rollout_faults"] = {"measured_at": benchlib.now_utc(), **measure_rollout_faults(stack, args)}
                save(results)
            if "levers" in args.only:
                results["levers"] = {"measured_at": benchlib.now_utc(), **measure_levers(stack, args)}
                save(results)
            if "fleet" in args.only:
                results["fleet"] = {"measured_at": benchlib.now_utc(), **measure_fleet(stack, args)}
        except BaseException:
            say("failed; stack logs:\n" + stack.log_tails(25))
            raise
        finally:
            stack.stop()
            if args.keep:
                shutil.copytree(stack.root, args.keep, dirs_exist_ok=True, ignore=shutil.ignore_patterns("*.db", "redis"))
                say(f"stack logs and task logs kept in {args.keep}")
            left = stack.leftovers()
            if left:
                raise RuntimeError(f"processes of the stack still alive after its stop: {left}")
    finally:
        shutil.rmtree(root, ignore_errors=True)
    return results


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (a few minutes)")
    parser.add_argument("--only", nargs="+", choices=("waiting", "rollout", "preflight", "faults", "levers", "fleet"),
                        default=["waiting", "rollout", "preflight", "faults", "levers", "fleet"])
    parser.add_argument("--preflight-tenants", type=int, help="preflight tenants (default 32, quick 6)")
    parser.add_argument("--preflight-concurrency", type=int, help="preflight concurrency (default 8, quick 3)")
    parser.add_argument("--tenants", type=int, help="waiting tenants (default 1000, quick 20)")
    parser.add_argument("--poll-interval", type=float, help="trigger poll interval, s (default 30, quick 5)")
    parser.add_argument("--window", type=float, help="measured window, s (default 90, quick 10)")
    parser.add_argument("--idle", type=float, help="idle baseline window, s (default 20, quick 5)")
    parser.add_argument("--quiet-log-s", type=float,
                        help="the triggerers' NEXUS_TRIGGER_QUIET_LOG_S (default: unset, the product's 300 s; 0 logs "
                             "every poll, as before the change-only log)")
    parser.add_argument("--ramp-limit", type=float, default=600.0)
    parser.add_argument("--rollout-tenants", type=int,
                        help="rollout tenants (default 11: the canary and one wave of 10, what fits ~15 minutes on "
                             "2 cores; issue 13 asks 100: --rollout-tenants 100 --rollout-limit 7200; quick 2)")
    parser.add_argument("--rollout-lanes", type=int, nargs="+",
                        help="part rollout: also the same drained rollout once per max_parallel given (e.g. 4 16: issue "
                        "36's 16 lanes on 4 slots vs 4), the first the baseline")
    parser.add_argument("--lanes-tenants", type=int, default=17, help="tenants of each --rollout-lanes rollout")
    parser.add_argument("--fault-tenants", type=int,
                        help="tenants of the rollout with three faults (--only faults; default 300, quick 8)")
    parser.add_argument("--levers", nargs="+", help="part levers' configurations (bench/stack_levers.py "
                        "CONFIGURATIONS), the first the baseline of the ratios (default: every one, neither first)")
    parser.add_argument("--lever-tenants", type=int, help="tenants per rollout of part levers (default 4, quick 2)")
    parser.add_argument("--lever-parallel", type=int, help="part levers: the rollouts' max_parallel, their wave as wide "
                        "(default: the form's 4); e.g. 16 with --lever-tenants 17: lanes queueing for the 4 task slots")
    parser.add_argument("--lever-rounds", type=int, help="rounds of part levers' four configurations (default 2, "
                        "quick 1)")
    parser.add_argument("--fleet-limit", type=float, default=2400.0,
                        help="part fleet: give its rollout up after, s (also its tenants' pre_arm_timeout)")
    parser.add_argument("--fleet-calm", action="store_true",
                        help="part fleet: also the fleet's drained tenants' rollout without the slow ones (issue 36: a "
                        "drained tenant's pause within 10%% of the same wave without its slow wave-mates)")
    parser.add_argument("--armed-slots", type=int, default=0,
                        help="[nexus] armed_slots of the stack's workers, and the pool nexus_armed of as many slots "
                        "(issue 50, item 4; default 0: no bound, the settings file's)")
    parser.add_argument("--keep", type=Path, help="copy the stack's process and task logs here before the cleanup")
    parser.add_argument("--rollout-limit", type=float, default=900.0, help="give the Airflow rollout up after, s")
    args = parser.parse_args()
    q = args.quick
    for name, full, quick in (("tenants", 1000, 20), ("poll_interval", 30.0, 5.0), ("window", 90.0, 10.0),
                              ("idle", 20.0, 5.0), ("rollout_tenants", 11, 2), ("preflight_tenants", 32, 6),
                              ("preflight_concurrency", 8, 3), ("fault_tenants", 300, 8),
                              ("lever_tenants", 4, 2), ("lever_rounds", 2, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if q else full)
    benchlib.server_url()
    key = "stack_quick" if q else "stack"  # a quick run never replaces the recorded full figures
    results = run(args, lambda partial: save(key, partial))
    save(key, results)
    print(json.dumps(results, indent=2, default=str))
    return 0


if __name__ == "__main__":
    sys.exit(main())

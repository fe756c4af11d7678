"""Issue 27's preflight figure: the fleet preflight against a shell loop of ``nexus-cutover plan``, same tenants.

    bash scripts/with-mariadb.sh .venv/bin/python bench/bench_preflight.py [--tenants 32] [--concurrency 8] [--rounds 3]

``--tenants`` production-shaped MariaDB tenants (``nexus_sim.scenario.production``: one active pack, hostile lanes
and receipt ids, 10,000 stopped registry rows), every third with old work in flight and live old writers (so
the verdicts mix proceed and wait), each in its own database. Measured in one run, interleaved round by round:

* **preflight**: :func:`nexus_cutover.projection.preflight.preflight` over every tenant, ``--concurrency`` at a
  time, each tenant reached as the rollout's ``preflight`` task reaches it: its Airflow connection
  ``nexus_tenant_<tenant>`` (here ``AIRFLOW_CONN_*`` in the environment) resolved by the task's own
  ``nexus_airflow.rollout_preflight`` opener, the lookups serialised under its lock (Airflow imported before
  anything is timed);
* **loop**: ``nexus-cutover plan -namespace <t> -json`` once per tenant, a new process each (what an engineer's
  shell loop runs), ``--concurrency`` at a time.

The figure ``preflight_vs_plan_loop`` is preflight wall time / loop wall time, per round; the recorded value is
the median of the rounds (goal <= 2; ``samples``: each round's). Each round also checks that both give every
tenant the same verdict (a figure of two different answers would mean nothing). ``make bench-stack`` runs this
as its part ``preflight`` (no Airflow process is needed); the figures go under ``stack.preflight`` of
bench/results.json (``stack_quick`` for ``--quick``), merged as the stack's other parts are.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import subprocess
import sys
import time
from concurrent.futures import ThreadPoolExecutor
from pathlib import Path

BENCH = Path(__file__).resolve().parent
sys.path[:0] = [str(BENCH), str(BENCH.parent), str(BENCH.parent / "plugins")]
os.environ.setdefault("AIRFLOW_HOME", os.path.join(os.environ.get("TMPDIR", "/tmp"), "nexus-bench-preflight-airflow"))
import benchlib  # noqa: E402
from stack_report import save  # noqa: E402  (the stack's figures: make bench-stack runs this as its part "preflight")

from nexus_cutover.db import make_engine  # noqa: E402
from nexus_cutover.projection import preflight as pf  # noqa: E402
from nexus_cutover.projection.dry_run import PlanOptions  # noqa: E402

GOAL = 2.0  # bench_stack.GOALS prints it with the stack's other goals
HOLDER = "bench-preflight"
SIZES = {"active_packs": 1, "plain_lanes": 2, "generations": 2, "greenfield_pack": False}


def build(urls: dict[str, str]) -> None:
    from nexus_sim.scenario.production import build_production_tenant

    def one(i_name: tuple[int, str]) -> None:
        i, name = i_name
        engine = make_engine(urls[name])
        try:
            waits = {"in_flight_generations": 1, "live_old_writers": True} if i % 3 == 2 else {}
            build_production_tenant(engine, namespace=name, seed=i, **SIZES, **waits)
        finally:
            engine.dispose()

    with ThreadPoolExecutor(2) as pool:
        list(pool.map(one, enumerate(urls)))


def options(tenant: str) -> PlanOptions:
    return PlanOptions(namespace=tenant, holder=HOLDER, stale_heartbeat_s=3600.0)


def connections(urls: dict[str, str]) -> None:
    """Each tenant's Airflow connection ``nexus_tenant_<tenant>`` in this process's environment (mysql)."""
    from sqlalchemy.engine import make_url

    for name, url in urls.items():
        u = make_url(url)
        os.environ[f"AIRFLOW_CONN_NEXUS_TENANT_{name.upper()}"] = json.dumps(
            {"conn_type": "mysql", "host": u.host, "port": u.port or 3306, "login": u.username,
             "password": u.password, "schema": u.database})


def run_preflight(urls: dict[str, str], concurrency: int) -> tuple[float, dict[str, str]]:
    import logging
    import threading

    from nexus_airflow.rollout_preflight import tenant_engine_of

    log, lock = logging.getLogger("bench.preflight"), threading.Lock()
    log.setLevel(logging.WARNING)  # the task logs each tenant's masked DSN: not the bench's output
    started = time.perf_counter()
    rows = pf.preflight(list(urls), lambda t: tenant_engine_of(t, log, lock), options, concurrency=concurrency)
    return time.perf_counter() - started, {r["tenant"]: r["plan_verdict"] for r in rows}


def run_loop(urls: dict[str, str], concurrency: int) -> tuple[float, dict[str, str]]:
    exe = str(Path(sys.executable).parent / "nexus-cutover")

    def one(name: str) -> str:
        proc = subprocess.run([exe, "plan", "-namespace", name, "-holder", HOLDER, "-stale-heartbeat", "3600s", "-json"],
                              env={**os.environ, "NEXUS_TENANT_DSN": urls[name]}, capture_output=True, text=True,
                              timeout=600, check=False)
        out = json.loads(proc.stdout.strip().splitlines()[-1])
        return out.get("verdict") or f"stop: {out.get('error')}"

    started = time.perf_counter()
    with ThreadPoolExecutor(concurrency) as pool:
        verdicts = dict(zip(urls, pool.map(one, urls), strict=True))
    return time.perf_counter() - started, verdicts


def measure(tenants: int, concurrency: int, rounds: int) -> dict:
    with contextlib.ExitStack() as stack:
        urls = {f"pf{i:04d}": stack.enter_context(benchlib.fresh_database("bench_pf")) for i in range(tenants)}
        t0 = time.perf_counter()
        build(urls)
        print(f"built {tenants} production-shaped tenants in {time.perf_counter() - t0:.0f}s", flush=True)
        connections(urls)
        import nexus_airflow.hooks  # noqa: F401 - Airflow's import, once, before anything is timed
        ratios, pre_s, loop_s = [], [], []
        for k in range(rounds):
            first, second = (run_preflight, run_loop) if k % 2 == 0 else (run_loop, run_preflight)
            a, b = first(urls, concurrency), second(urls, concurrency)
            (p, pv), (q, lv) = (a, b) if first is run_preflight else (b, a)
            if pv != lv:
                diff = {t: (pv[t], lv[t]) for t in urls if pv[t] != lv[t]}
                raise SystemExit(f"the preflight and the plan loop disagree: {diff}")
            ratios.append(p / q)
            pre_s.append(p)
            loop_s.append(q)
            print(f"round {k + 1}: preflight {p:.2f}s, plan loop {q:.2f}s, ratio {p / q:.3f}", flush=True)
        counts = pf.counts([{"verdict": v.split(":")[0]} for v in pv.values()])
    fig = benchlib.figure("preflight_vs_plan_loop", ratios)
    return {"preflight_vs_plan_loop": fig["preflight_vs_plan_loop"], "samples": fig["samples"]["preflight_vs_plan_loop"],
            "preflight_s": round(benchlib.median(pre_s), 2), "plan_loop_s": round(benchlib.median(loop_s), 2),
            "tenants": tenants, "concurrency": concurrency, "rounds": rounds, "verdicts": counts,
            "goal": f"<= {GOAL}", "met": benchlib.median(ratios) <= GOAL, "measured_at": benchlib.now_utc(),
            "cores": os.cpu_count(), "server": benchlib.server_version()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="6 tenants, 3 at a time, one round")
    parser.add_argument("--tenants", type=int)
    parser.add_argument("--concurrency", type=int)
    parser.add_argument("--rounds", type=int)
    args = parser.parse_args()
    for name, full, quick in (("tenants", 32, 6), ("concurrency", 8, 3), ("rounds", 3, 1)):
        if getattr(args, name) is None:
            setattr(args, name, quick if args.quick else full)
    benchlib.server_url()
    result = measure(args.tenants, args.concurrency, args.rounds)
    save("stack_quick" if args.quick else "stack", {"preflight": result})
    print(json.dumps(result, indent=2))
    return 0


if __name__ == "__main__":
    sys.exit(main())

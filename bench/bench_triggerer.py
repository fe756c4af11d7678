"""Fan-out: many tenants waiting for their drain at once on one triggerer process.

    bash scripts/with-mariadb.sh .venv/bin/python bench/bench_triggerer.py [--tenants 1000] [--poll-interval 30]

One draining tenant database (the walking workload plus live old work, see
bench_drain.py) and ``--tenants`` deferred ``wait_for_drain`` triggers -- the
cutover DAG's own :class:`nexus_airflow.triggers.StatusPollTrigger` with its
``DrainPoller``, each with its own Airflow connection id (``AIRFLOW_CONN_*``,
as a deployment exposes one connection per tenant) -- running concurrently in
one child process that does what the triggerer's ``TriggerRunner`` does per
trigger: import the class path, inflate it from its serialized kwargs, enter a
greenback portal and iterate ``run()`` as an asyncio task on one event loop
(blocking database calls go to the loop's default thread pool).

Measured in the child, in one run: resident memory with ``--baseline`` triggers
waiting and with all of them waiting (so one-time imports are not counted per
tenant), CPU seconds over a steady-state window of ``--window`` seconds, and on
the server the statements (``Questions``) and connections those pokes cause.
The window is cut into three consecutive thirds, the figures' three repetitions
(RSS at the end of each, CPU and statements within each; the figure is their
median, all kept under ``samples``). Bounded: the window ends, every trigger is cancelled (its engine disposed) and
the child exits; a hard timeout backs that up. No trigger may fire (the drain
stays ``draining``): a fired event fails the bench.
"""

from __future__ import annotations

import argparse
import asyncio
import json
import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

from sqlalchemy import text
from sqlalchemy.engine import make_url

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

PLUGINS = benchlib.BENCH.parent / "plugins"
TRIGGER = "nexus_airflow.triggers.StatusPollTrigger"
POLLER = "nexus_airflow.pollers.DrainPoller"
STALE_S = 86400.0


def conn_id(i: int) -> str:
    return f"nexus_bench_tenant_{i:05d}"


def rss_mb() -> float:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith("VmRSS:"):
            return int(line.split()[1]) / 1024
    raise RuntimeError("no VmRSS in /proc/self/status")


def cpu_s() -> float:
    t = os.times()
    return t.user + t.system


# --------------------------------------------------------------------------- child: the triggerer-like process


class ServerStatus:
    """Global status counters of the server, read over one connection of its own."""

    def __init__(self, url: str):
        from nexus_cutover.db import make_engine

        self.engine = make_engine(url)

    def read(self) -> dict[str, int]:
        with self.engine.connect() as conn:
            rows = conn.execute(text("SHOW GLOBAL STATUS WHERE Variable_name IN ('Questions', 'Threads_connected', 'Connections')")).all()
        return {name: int(value) for name, value in rows}

    def close(self) -> None:
        self.engine.dispose()


async def child_main(args) -> dict:
    import greenback
    from airflow.sdk.module_loading import import_string

    from nexus_airflow.pollers import deadline_in

    status = ServerStatus(os.environ["NEXUS_BENCH_STATUS_URL"])
    deadline = deadline_in(STALE_S)
    fired: list[dict] = []

    def make_trigger(i: int):
        trigger_cls = import_string(TRIGGER)
        kwargs = {"conn_id": conn_id(i), "namespace": args.namespace, "deadline": deadline, "stale_heartbeat_s": STALE_S}
        classpath, serialized = trigger_cls(POLLER, kwargs, args.poll_interval).serialize()
        return import_string(classpath)(**json.loads(json.dumps(serialized)))  # what the triggerer stores and inflates

    async def run_trigger(trigger) -> None:
        await greenback.ensure_portal()
        async for event in trigger.run():
            fired.append(event.payload)

    async def connected_at_least(n: int, limit_s: float) -> float:
        """Until ``n`` connections were opened since the start (pollers keep none open between polls)."""
        started = time.monotonic()
        while status.read()["Connections"] - base_opened < n:
            if time.monotonic() - started > limit_s:
                raise TimeoutError(f"only {status.read()['Connections'] - base_opened} of {n} connections after {limit_s} s")
            await asyncio.sleep(0.5)
        return time.monotonic() - started

    # queries one poke costs, measured once in isolation (the pollers module is imported here anyway)
    from nexus_airflow.pollers import DrainPoller

    # read before the probe connects: a probe connection the server has not yet reaped can then only make
    # the readiness count below arrive early, never keep it from arriving
    base_connections = status.read()["Threads_connected"]
    probe = await asyncio.to_thread(DrainPoller, conn_id(0), args.namespace, deadline, STALE_S)
    await asyncio.to_thread(probe.poll)
    before = status.read()["Questions"]
    probe_result = await asyncio.to_thread(probe.poll)
    queries_per_poke = status.read()["Questions"] - before - 1
    await asyncio.to_thread(probe.close)
    if probe_result["state"] != "waiting":
        raise RuntimeError(f"the bench tenant is not draining: {probe_result['message']}")
    base_opened = status.read()["Connections"]

    tasks = [asyncio.create_task(run_trigger(make_trigger(i))) for i in range(args.baseline)]
    await connected_at_least(args.baseline, 120)
    await asyncio.sleep(args.poll_interval + 1)
    rss_baseline = rss_mb()

    tasks += [asyncio.create_task(run_trigger(make_trigger(i))) for i in range(args.baseline, args.tenants)]
    ramp_s = await connected_at_least(args.tenants, args.ramp_limit)
    await asyncio.sleep(args.poll_interval + 1)  # every trigger is past its first poke: steady state
    s0, c0, t0 = status.read(), cpu_s(), time.monotonic()
    thirds = []  # the window in three consecutive parts: the figure's three repetitions
    for _ in range(3):
        a, ca, ta = status.read(), cpu_s(), time.monotonic()
        await asyncio.sleep(args.window / 3)
        b, cb, tb = status.read(), cpu_s(), time.monotonic()
        thirds.append({"rss_mb": rss_mb(), "cpu_ms_per_tenant_per_min": (cb - ca) / (tb - ta) * 60 * 1000 / args.tenants,
                       "server_queries_per_s": (b["Questions"] - a["Questions"] - 1) / (tb - ta)})
    s1, c1, t1 = status.read(), cpu_s(), time.monotonic()
    rss_full = rss_mb()
    threads = len(os.listdir("/proc/self/task"))
    for task in tasks:
        task.cancel()
    results = await asyncio.gather(*tasks, return_exceptions=True)
    errors = [repr(r) for r in results if isinstance(r, BaseException) and not isinstance(r, asyncio.CancelledError)]
    status.close()
    elapsed = t1 - t0
    queries = s1["Questions"] - s0["Questions"] - 1
    n_extra = args.tenants - args.baseline
    return {
        "tenants": args.tenants, "baseline_tenants": args.baseline, "poll_interval_s": args.poll_interval,
        "window_s": elapsed, "ramp_s": ramp_s,
        "rss_baseline_mb": rss_baseline, "rss_full_mb": rss_full,
        "mb_per_waiting_tenant": (rss_full - rss_baseline) / n_extra,
        "cpu_s": c1 - c0, "cpu_core_fraction": (c1 - c0) / elapsed,
        "cpu_ms_per_tenant_per_min": (c1 - c0) / elapsed * 60 * 1000 / args.tenants,
        "server_queries_per_s": queries / elapsed, "queries_per_poke": queries_per_poke,
        "pokes_per_s": queries / elapsed / max(1, queries_per_poke),
        "expected_pokes_per_s": args.tenants / args.poll_interval,
        "server_connections": s1["Threads_connected"] - base_connections, "threads": threads,
        "fired": fired[:5], "fired_count": len(fired), "errors": errors[:5],
        "thirds": [{**t, "mb_per_waiting_tenant": (t["rss_mb"] - rss_baseline) / n_extra} for t in thirds],
    }


# --------------------------------------------------------------------------- parent: the tenant database, the child


def measure(args) -> dict:
    import bench_drain
    import workload

    from nexus_cutover.db import make_engine

    admin = make_engine(make_url(benchlib.server_url()).set(database="mysql"))
    with admin.connect() as conn:
        old_max = int(conn.execute(text("SELECT @@GLOBAL.max_connections")).scalar_one())
    try:
        if old_max < args.tenants + 100:
            with admin.begin() as conn:  # one pooled connection per waiting tenant: that is part of what is measured
                conn.execute(text(f"SET GLOBAL max_connections = {int(args.tenants) + 200}"))
        with benchlib.fresh_database("bench_trig") as url:
            engine = make_engine(url)
            try:
                workload.build(engine, lanes=args.lanes, generations=args.generations, inputs=5)
                live = bench_drain.add_live_old_work(engine, lanes=args.lanes, generations=args.generations, inputs=5,
                                                     live_lanes=args.live_lanes)
            finally:
                engine.dispose()
            u = make_url(url)
            conn_json = json.dumps({"conn_type": "mysql", "host": u.host, "port": u.port, "login": u.username,
                                    "password": u.password, "schema": u.database})
            with tempfile.TemporaryDirectory(prefix="nexus-bench-triggerer-") as home:
                env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW")}
                env.update({"AIRFLOW_HOME": home, "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
                            "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
                            "NEXUS_BENCH_STATUS_URL": make_url(benchlib.server_url()).set(database="mysql")
                            .render_as_string(hide_password=False),
                            "PYTHONPATH": os.pathsep.join(filter(None, [str(PLUGINS), os.environ.get("PYTHONPATH")]))})
                env.update({f"AIRFLOW_CONN_{conn_id(i).upper()}": conn_json for i in range(args.tenants)})
                out_path = Path(home) / "result.json"
                cmd = [sys.executable, __file__, "--child", str(out_path), "--tenants", str(args.tenants),
                       "--baseline", str(args.baseline), "--poll-interval", str(args.poll_interval),
                       "--window", str(args.window), "--ramp-limit", str(args.ramp_limit)]
                limit = args.ramp_limit + 2 * args.poll_interval + args.window + 300
                with open(Path(home) / "triggerer.log", "w") as log:
                    proc = subprocess.run(cmd, env=env, stdout=log, stderr=subprocess.STDOUT, timeout=limit, check=False)
                if proc.returncode != 0:
                    tail = (Path(home) / "triggerer.log").read_text()[-3000:]
                    raise RuntimeError(f"the triggerer-like child failed ({proc.returncode}):\n{tail}")
                result = json.loads(out_path.read_text())
                result["log_lines"] = len((Path(home) / "triggerer.log").read_text().splitlines())
    finally:
        if old_max < args.tenants + 100:
            with admin.begin() as conn:
                conn.execute(text(f"SET GLOBAL max_connections = {old_max}"))
        admin.dispose()
    result["live_old_work"] = live
    if result["fired_count"] or result["errors"]:
        raise RuntimeError(f"triggers fired or failed while the drain was still draining: {result['fired']} {result['errors']}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tenants", type=int, default=1000)
    parser.add_argument("--baseline", type=int, default=20, help="triggers already waiting when the baseline RSS is taken")
    parser.add_argument("--poll-interval", type=float, default=30.0, help="the DAG's default poll_interval")
    parser.add_argument("--window", type=float, default=60.0, help="steady-state measurement window, seconds")
    parser.add_argument("--ramp-limit", type=float, default=300.0, help="give up if the triggers are not all connected by then")
    parser.add_argument("--lanes", type=int, default=400)
    parser.add_argument("--generations", type=int, default=10)
    parser.add_argument("--live-lanes", type=int, default=40)
    parser.add_argument("--namespace", default="bench", help=argparse.SUPPRESS)
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        result = asyncio.run(child_main(args))
        Path(args.child).write_text(json.dumps(result))
        return 0
    r = measure(args)
    print(f"{'tenants':>7} {'rss MB':>7} {'MB/tenant':>9} {'cpu core':>8} {'cpu ms/tenant/min':>17} {'queries/s':>9} "
          f"{'q/poke':>6} {'pokes/s':>7} {'conns':>5} {'threads':>7}")
    print(f"{r['tenants']:>7} {r['rss_full_mb']:>7.1f} {r['mb_per_waiting_tenant']:>9.3f} {r['cpu_core_fraction']:>8.3f} "
          f"{r['cpu_ms_per_tenant_per_min']:>17.2f} {r['server_queries_per_s']:>9.1f} {r['queries_per_poke']:>6} "
          f"{r['pokes_per_s']:>7.1f} {r['server_connections']:>5} {r['threads']:>7}")
    thirds = r["thirds"]  # the window's three parts: RSS at the end of each, CPU and queries within each
    benchlib.merge_results({
        **benchlib.figures(
            triggerer_mb_per_waiting_tenant=([t["mb_per_waiting_tenant"] for t in thirds], 4),
            triggerer_cpu_ms_per_tenant_per_min=[t["cpu_ms_per_tenant_per_min"] for t in thirds],
            triggerer_poke_queries_per_s=([t["server_queries_per_s"] for t in thirds], 2),
        ),
        "triggerer_run": r,
        "triggerer_measured_at": benchlib.now_utc(),
    })
    print(json.dumps({"triggerer_mb_per_waiting_tenant": benchlib.median(t["mb_per_waiting_tenant"] for t in thirds)}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""The admission pause of a tenant whose old backlog is still draining: armed at once vs once the drain is short.

    .venv/bin/python bench/bench_pre_arm.py [--backlog 240] [--rate 8] [--below 0 60]

A tenant (SQLite, embedded default) holds ``--backlog`` pending old projection
WorkItems; the simulated old runtime finishes ``--rate`` of them per second and
keeps heartbeating until drained (then stops, as an engineer stops it for the
cutover). For each ``--below`` value the same tenant is built afresh and
``nexus-cutover run`` runs it to the end (the confirmation by flag, the reference
host started by the run): with 0 the fence is armed at once, as before issue 36,
so the pause holds the whole drain; with a bound the run waits, admission open,
until the rest would drain within it. Printed per bound: the admission pause
(the fence row's ``ReleasedAt - ArmedAt``), the run's wall time, and the ratio
``pause_vs_armed_at_once`` (each bound's pause over bound 0's), all in one run.
"""

from __future__ import annotations

import argparse
import contextlib
import os
import random
import signal
import sys
import tempfile
import threading
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from nexus_cutover import catalog  # noqa: E402
from nexus_cutover.cli import cutover_steps as cli  # noqa: E402
from nexus_cutover.db import make_engine  # noqa: E402
from nexus_cutover.schema import create_legacy_schema  # noqa: E402
from nexus_sim.old_runtime import OldRuntimeSimulator  # noqa: E402
from nexus_sim.scenario import TenantScenario, drained_pack_history  # noqa: E402

NS = "acme"


def tenant(path: str, backlog: int):
    url = f"sqlite:///{path}"
    Path(path).touch()
    engine = make_engine(url)
    create_legacy_schema(engine)
    sc = TenantScenario(namespace=NS)
    rng = random.Random(5)
    for pack in ("pk-a", "pk-b"):
        drained_pack_history(sc.pack(pack), rng, lanes=2, generations=3)
    for role in catalog.OLD_WRITER_ROLES:
        if role != catalog.ROLE_PROJECTION_WORKER:
            sc.process(role, process_id=f"old-{role}", stopped=True)
    sc.write(engine)
    more = TenantScenario(namespace=NS, event_id_start=100_000, work_id_start=100_000)
    pack = more.pack("pk-c")
    for lane in range(backlog):
        pack.lane(f"backlog-{lane:04d}").generation(1, status="pending")
    more.write(engine)
    return engine, url


def one_run(backlog: int, rate: float, below: float) -> dict[str, float]:
    path = os.path.join(tempfile.mkdtemp(prefix="nexus-pre-arm-"), "tenant.db")
    engine, url = tenant(path, backlog)
    sim = OldRuntimeSimulator(engine, NS, process_id="old-rt", work_per_step=1, retry_delay_s=0.0)
    sim.register()
    done = threading.Event()

    def drain_at_rate() -> None:
        while not done.is_set():
            sim.step()
            if sim.drained():
                sim.stop()
                return
            done.wait(1.0 / rate)

    old = threading.Thread(target=drain_at_rate, daemon=True)
    os.environ.update({"NEXUS_TENANT_DSN": url, "NEXUS_HOST_HEARTBEAT_S": "0.5", "NEXUS_HOST_POLL_S": "0.2"})
    args = cli.build_parser().parse_args([
        "run", "-namespace", NS, "-poll-interval", "1s", "-stale-heartbeat", "5s", "-arm-when-drain-below",
        f"{below:g}" if below else "0", "--confirm-writers-stopped", "-json",
        "-host-command", f"{sys.executable} -m nexus_cutover.cli.host --namespace {NS}"])
    started = time.monotonic()
    old.start()
    out: dict = {}
    try:
        _code, out = cli.cmd_run(cli.Command(args, engine))
    finally:
        wall = time.monotonic() - started
        done.set()
        old.join(timeout=60)
        if out.get("host_pid"):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(out["host_pid"], signal.SIGTERM)
        engine.dispose()
    pre_arm = out.get("pre_arm") or {}
    return {"pause_s": out["admission_pause_s"], "wall_s": wall, "remaining_at_arming": pre_arm.get("remaining", 0)}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--backlog", type=int, default=240)
    ap.add_argument("--rate", type=float, default=8.0, help="old items finished per second")
    ap.add_argument("--below", type=float, nargs="+", default=[0.0, 60.0, 10.0])
    a = ap.parse_args()
    figures = {below: one_run(a.backlog, a.rate, below) for below in a.below}
    base = figures[a.below[0]]["pause_s"]
    print(f"backlog {a.backlog} old items finishing at {a.rate:g}/s (~{a.backlog / a.rate:.0f} s of drain)")
    for below, f in figures.items():
        print(f"arm_when_drain_below {below:>5g} s: admission pause {f['pause_s']:7.2f} s, run {f['wall_s']:6.1f} s, "
              f"{f['remaining_at_arming']} old items left at arming; pause_vs_armed_at_once {f['pause_s'] / base:.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())

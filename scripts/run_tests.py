"""``make test``'s runner: every test, in lanes that run side by side, then one summary.

The suites that mostly wait (real Airflow processes polling, deferring, sleeping for a deadline) run beside the
suites that compute, so the waits of one overlap the work of another on a 2-core machine. Each lane is one pytest
process on its own throwaway MariaDB (``scripts/with-mariadb.sh``): lanes never share a server, so a test that
reads server-wide state (``INNODB_TRX``, the process list) sees only its own lane. When ``NEXUS_TEST_MYSQL_URL``
is set (e.g. a real TiDB) every lane runs on that one server, so the lanes run one after the other instead.

Lanes (:func:`lanes`; three queues run at once, each runs its lanes in order):

* ``stack``: ``tests/stack``, the production topology of ``make stack`` (one stack for the whole lane), then
  ``rollout``: ``tenant_rollout`` on its ``airflow standalone`` (its time is set by the rollout's 30 s pokes);
* ``dags``: ``tests/dags``, the DAGs run in process (``dag.test()``), then ``tidb``: the TiDB-semantics pass
  (``NEXUS_TIDB_SEMANTICS=1``) over its suites;
* ``airflow``: the other suites that start an ``airflow standalone`` each (the browser tests, ``make demo``,
  the status view's API-server tests, the upgrade under a parked run, the wheel in a fresh venv and the whole install path
  from ``make dist`` to a real cutover over TLS), one after another, then ``main``: every other test under ``tests/``
  (anything not named by another lane lands here, so a new test file is never left out), then ``bench``: the
  ``make bench QUICK=1`` smoke test.

Each lane's output goes to its own log (``.run/test-logs/<lane>.log``), printed whole when the lane ends, so two
lanes' lines never interleave; while lanes run, a progress line every minute. ``NEXUS_DB_REQUIRED=1`` in every
lane (a skipped test fails). At the end: each lane's outcome, the whole run's wall time, its ten slowest tests
across every lane, and a closing ``N passed, N failed`` line. The exit code is non-zero when any lane failed.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import os
import pathlib
import shlex
import signal
import subprocess
import sys
import threading
import time
import xml.etree.ElementTree as ET

REPO = pathlib.Path(__file__).resolve().parents[1]
PYTHON = sys.executable

#: The lanes other than ``main``, by path; everything else under tests/ is the ``main`` lane.
STACK_PATHS = ["tests/stack"]
ROLLOUT_PATHS = ["tests/rollout/test_tenant_rollout.py"]
AIRFLOW_PATHS = [
    "tests/ui",
    "tests/demo/test_make_demo.py",
    "tests/status_view/test_status_view.py",
    "tests/status_view/test_fleet_scale.py",
    "tests/test_wheel_install.py",  # the wheel in a fresh venv, its own `airflow standalone`
    # make dist's outputs in a fresh venv, `airflow standalone` on PostgreSQL, a real cutover of a TLS tenant
    "tests/test_install_path.py",
    "tests/rollout/test_armed_slots_on_a_scheduler.py",  # tenants wider than the armed slots on a real scheduler
]
#: Two builds of the wheel, a venv of its own, an `airflow standalone` restarted on an upgrade (~5 min).
PINNING_PATHS = ["tests/pinning"]
DAGS_PATHS = ["tests/dags"]
BENCH_PATHS = ["tests/bench/test_bench_smoke.py"]  # make bench QUICK=1: minutes of computing on its own server
#: Two of the main lane's longest modules (78 s and 55 s on 2026-12-07), run in the first queue, the shortest.
MAIN2_PATHS = ["tests/projection/test_pre_arm_wait.py", "tests/projection/test_transaction_bounds.py"]


@dataclasses.dataclass
class Lane:
    name: str
    args: list[str]  # pytest arguments (paths, options)
    env: dict[str, str] = dataclasses.field(default_factory=dict)
    # filled in by the run
    log: pathlib.Path | None = None
    junit: pathlib.Path | None = None
    returncode: int | None = None
    started: float | None = None
    ended: float | None = None
    proc: subprocess.Popen | None = None


def lanes(pytest_args: list[str], tidb_suites: list[str], tidb_args: list[str]) -> list[list[Lane]]:
    """The queues of lanes: the queues run at once, each runs its lanes in order. Three lanes mostly wait on real
    Airflow processes (stack, rollout, airflow), four compute (tidb, bench, dags, main).

    Three queues, not one per lane: with six lanes in five queues (three Airflow deployments and two computing
    lanes at once) the shared 2-core machine was so oversubscribed (load 10-15) that every lane ran slower and
    bounded waits ran out (a REST call of make demo, a stack test's drain seen in no triggerer log)."""
    named = STACK_PATHS + PINNING_PATHS + ROLLOUT_PATHS + AIRFLOW_PATHS + DAGS_PATHS + BENCH_PATHS + MAIN2_PATHS
    # The in-process Airflow environment (tests/dags/airflow_harness.py) set up first in each lane, as it was for
    # every test when one pytest ran them all (tests/dags/conftest.py was collected before any module importing
    # airflow); it must be loaded before anything imports airflow, which a lane's modules may do in any order.
    # Not in the tidb lane, whose separate run never loaded it.
    first = ["--durations=15", "-p", "tests.dags.airflow_harness"]
    # Balanced by the lanes' times on this 2-core machine on 2026-12-07 (seconds): stack 601 + pinning 264 + tidb 430
    # + bench 89 | dags 946 + rollout 497 | airflow 698 + main 855 (bench moved to the first queue: it was the third's
    # last 89 s, the longest queue's); then main2 (133 s of main's) to the first queue: the third was again the
    # longest (airflow 682 + main 834 before the back-out's tests). Stack and rollout
    # (the two deployments of their own) in different queues; at the usual times rollout starts when dags ends,
    # after airflow: two deployments at once.
    return [
        [Lane("stack", [*first, *STACK_PATHS, *pytest_args]),
         Lane("pinning", [*first, *PINNING_PATHS, *pytest_args]),
         Lane("tidb", ["-q", "--durations=15", *tidb_suites, *tidb_args], env={"NEXUS_TIDB_SEMANTICS": "1"}),
         Lane("bench", [*first, *BENCH_PATHS, *pytest_args]),
         Lane("main2", [*first, *MAIN2_PATHS, *pytest_args])],
        [Lane("dags", [*first, *DAGS_PATHS, *pytest_args]),
         Lane("rollout", [*first, *ROLLOUT_PATHS, *pytest_args])],
        [Lane("airflow", [*first, *AIRFLOW_PATHS, *pytest_args]),
         Lane("main", [*first, "tests", *[f"--ignore={p}" for p in named], *pytest_args])],
    ]


def stamp() -> str:
    return time.strftime("%H:%M:%S")


def say(msg: str) -> None:
    print(f"[run-tests {stamp()}] {msg}", flush=True)


def start(lane: Lane, logs: pathlib.Path) -> None:
    lane.log, lane.junit = logs / f"{lane.name}.log", logs / f"{lane.name}.xml"
    lane.junit.unlink(missing_ok=True)
    argv = ["bash", str(REPO / "scripts" / "with-mariadb.sh"), PYTHON, "-m", "pytest", f"--junitxml={lane.junit}",
            *lane.args]
    env = {**os.environ, "NEXUS_DB_REQUIRED": "1", **lane.env}
    lane.started = time.monotonic()
    say(f"lane {lane.name} started: {shlex.join(argv[3:])}" + "".join(f" ({k}={v})" for k, v in lane.env.items()))
    with open(lane.log, "wb") as out:
        lane.proc = subprocess.Popen(argv, cwd=REPO, env=env, stdout=out, stderr=subprocess.STDOUT,
                                     stdin=subprocess.DEVNULL, start_new_session=True)


#: A lane still running after this long is hung (its slowest ran 20 min under load): it is stopped and fails, so
#: a hang is reported with its log instead of running into CI's 90-minute limit.
LANE_TIMEOUT_S = 40 * 60


def wait_or_stop(lane: Lane) -> int:
    """The lane's exit code; a lane past :data:`LANE_TIMEOUT_S` is stopped (its process group: TERM, then KILL)."""
    try:
        return lane.proc.wait(timeout=LANE_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        say(f"lane {lane.name} still running after {LANE_TIMEOUT_S}s: stopped as hung (see its log)")
        for sig, grace in ((signal.SIGTERM, 30), (signal.SIGKILL, 10)):
            with contextlib.suppress(ProcessLookupError):
                os.killpg(lane.proc.pid, sig)
            with contextlib.suppress(subprocess.TimeoutExpired):
                lane.proc.wait(timeout=grace)
                break
        with open(lane.log, "a") as out:
            out.write(f"\nlane {lane.name}: stopped after {LANE_TIMEOUT_S}s as hung\n")
        return 124


#: Set when the run is interrupted: no queue starts its next lane (checked and set under ``STARTING``).
STOPPING = threading.Event()
STARTING = threading.Lock()


def run_queue(queue: list[Lane], logs: pathlib.Path, printed: threading.Lock) -> None:
    for lane in queue:
        with STARTING:
            if STOPPING.is_set():
                return
            start(lane, logs)
        lane.returncode = wait_or_stop(lane)
        lane.ended = time.monotonic()
        with printed:  # one lane's whole output at a time
            print(f"\n{'=' * 30} lane {lane.name}: exit {lane.returncode}, {lane.ended - lane.started:.0f}s "
                  f"(log {lane.log}) {'=' * 30}", flush=True)
            sys.stdout.write(lane.log.read_text(errors="replace"))
            print(f"{'=' * 30} end of lane {lane.name} {'=' * 30}\n", flush=True)


def last_line(path: pathlib.Path | None) -> str:
    if path is None or not path.exists():
        return ""
    with open(path, "rb") as f:
        f.seek(max(0, path.stat().st_size - 4000))
        lines = [ln for ln in f.read().decode(errors="replace").splitlines() if ln.strip()]
    return lines[-1][-110:] if lines else ""


def node_id(classname: str, name: str) -> str:
    """pytest's node id back from JUnit's ``classname`` (dotted module path, then classes) and ``name``."""
    parts = [p for p in classname.split(".") if p]
    for i in range(len(parts), 0, -1):
        path = pathlib.Path(*parts[:i]).with_suffix(".py")
        if (REPO / path).exists():
            return "::".join([path.as_posix(), *parts[i:], name])
    return f"{classname}::{name}"


def why(tags: dict) -> str:
    """A failed or skipped case's reason in a few lines: its message and the traceback's last ``E`` lines, so the
    end of the output says why even where a CI page shows only the start and the end of a long log."""
    node = tags.get("failure", tags.get("error", tags.get("skipped")))
    if node is None:
        return ""
    errors = [ln for ln in (node.text or "").splitlines() if ln.startswith("E ")][-6:]
    where = [ln for ln in (node.text or "").splitlines() if ln.startswith(("tests/", "include/", "plugins/"))][-1:]
    lines = [(node.get("message") or "").splitlines()[0][:300] if node.get("message") else "", *errors, *where]
    return "\n".join(f"           {ln[:300]}" for ln in lines if ln.strip())


def results(lane: Lane) -> list[dict]:
    """Each test case of a lane: node id, seconds (setup + call + teardown), outcome."""
    if lane.junit is None or not lane.junit.exists():
        return []
    found = []
    for case in ET.parse(lane.junit).getroot().iter("testcase"):
        tags = {child.tag: child for child in case}
        xfailed = "skipped" in tags and (tags["skipped"].get("type") or "").endswith("xfail")
        outcome = ("failed" if "failure" in tags else "error" if "error" in tags
                   else "xfailed" if xfailed else "skipped" if "skipped" in tags else "passed")
        found.append({"lane": lane.name, "test": node_id(case.get("classname", ""), case.get("name", "")),
                      "seconds": float(case.get("time") or 0.0), "outcome": outcome, "why": why(tags)})
    return found


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pytest-args", default="", help="extra pytest arguments for every lane but tidb")
    parser.add_argument("--tidb-suites", default="", help="the TiDB-semantics pass's paths (the Makefile's TIDB_SUITES)")
    parser.add_argument("--tidb-args", default="", help="extra pytest arguments for the tidb lane")
    parser.add_argument("--since", type=float, default=None, help="epoch seconds the run started (make's start)")
    parser.add_argument("--logs", default=str(REPO / ".run" / "test-logs"))
    opts = parser.parse_args()
    started_epoch = opts.since or time.time()
    started = time.monotonic() - (time.time() - started_epoch)
    queues = lanes(shlex.split(opts.pytest_args), shlex.split(opts.tidb_suites), shlex.split(opts.tidb_args))
    if os.environ.get("NEXUS_TEST_MYSQL_URL", "").strip():
        say("NEXUS_TEST_MYSQL_URL is set: every lane uses that one server, so the lanes run one after another")
        queues = [[lane for queue in queues for lane in queue]]
    logs = pathlib.Path(opts.logs)
    logs.mkdir(parents=True, exist_ok=True)

    def _terminated(*_):
        raise KeyboardInterrupt  # SIGTERM (e.g. a CI timeout): stop the lanes as Ctrl-C does, none left behind

    signal.signal(signal.SIGTERM, _terminated)
    printed = threading.Lock()
    threads = [threading.Thread(target=run_queue, args=(q, logs, printed), daemon=True) for q in queues]
    all_lanes = [lane for q in queues for lane in q]
    try:
        for t in threads:
            t.start()
        next_progress = time.monotonic() + 60
        while any(t.is_alive() for t in threads):
            time.sleep(1)
            if time.monotonic() >= next_progress:
                next_progress += 60
                with printed:
                    for lane in all_lanes:
                        if lane.proc is not None and lane.returncode is None:
                            print(f"[run-tests {stamp()}]   {lane.name} ({time.monotonic() - lane.started:.0f}s): "
                                  f"{last_line(lane.log)}", flush=True)
    except KeyboardInterrupt:
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
        say("interrupted: stopping every lane (SIGINT to each pytest, which stops its servers and stacks)")
        with STARTING:
            STOPPING.set()
            for lane in all_lanes:
                if lane.proc is not None and lane.proc.poll() is None:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(lane.proc.pid, signal.SIGINT)
        for lane in all_lanes:
            if lane.proc is not None:
                try:
                    lane.proc.wait(120)
                except subprocess.TimeoutExpired:
                    with contextlib.suppress(ProcessLookupError):
                        os.killpg(lane.proc.pid, signal.SIGKILL)
        return 130

    cases = [c for lane in all_lanes for c in results(lane)]
    # pytest's 5 is "no test collected": fine for one lane when extra arguments (-k, a path) narrowed the run
    narrowed = bool(opts.pytest_args.strip() or opts.tidb_args.strip())
    failed_lanes = [lane.name for lane in all_lanes if lane.returncode != 0 and not (narrowed and lane.returncode == 5)]
    wall = time.monotonic() - started
    print("=" * 100)
    say(f"make test: wall time {wall / 60:.1f} min ({wall:.0f}s), from make's start; lanes:")
    for lane in all_lanes:
        mine = [c for c in cases if c["lane"] == lane.name]
        counts = {o: sum(1 for c in mine if c["outcome"] == o) for o in ("passed", "failed", "error", "skipped", "xfailed")}
        verdict = "ok" if lane.name not in failed_lanes else f"FAILED (exit {lane.returncode})"
        print(f"  {lane.name:<8} {verdict:<16} "
              f"{(lane.ended or 0) - (lane.started or 0):6.0f}s  {len(mine):5d} tests: "
              + ", ".join(f"{n} {o}" for o, n in counts.items() if n), flush=True)
    print("  the ten slowest tests (setup + call + teardown), across every lane:")
    for c in sorted(cases, key=lambda c: -c["seconds"])[:10]:
        print(f"  {c['seconds']:8.1f}s  {c['lane']:<8} {c['test']}")
    bad = [c for c in cases if c["outcome"] in ("failed", "error", "skipped")]
    for c in bad:
        print(f"  {c['outcome'].upper():<8} {c['lane']:<8} {c['test']}")
        if c["why"]:
            print(c["why"])
    passed = sum(1 for c in cases if c["outcome"] == "passed")
    failed = len(bad) + (1 if failed_lanes and not bad else 0)  # a lane that failed outside any test counts once
    if failed_lanes:
        say(f"FAILED lanes: {', '.join(failed_lanes)} (their output is above, each in one block)")
    if not cases:
        say("no test ran")
        return 1
    print(f"tests: {passed} passed, {failed} failed", flush=True)
    return 1 if failed_lanes else 0


if __name__ == "__main__":
    raise SystemExit(main())

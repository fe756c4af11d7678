"""Run every bench in one run on one MySQL-protocol server; write the figures and print them as a table.

    make bench            # full sizes (H in 10/100/1000, 400 lanes, 1,000 waiting tenants, ...)
    make bench QUICK=1    # small sizes, about a minute: the CI smoke test runs this
    bash scripts/with-mariadb.sh .venv/bin/python bench/run_all.py [--quick] [--out PATH] [--only STEP ...]

Each step is one bench script in a child process, in order, all against the
server named by ``NEXUS_TEST_MYSQL_URL`` (each in fresh databases of its own).
The children merge their figures into a scratch results file
(``NEXUS_BENCH_RESULTS``); this script then writes ``--out`` (default
``bench/results.json``) with exactly the figures of the issue as top-level keys,
each step's details, the machine (cores, server version, Python) and the mode.
Every figure is the median of its repetitions (three in a full run, made by
each script: interleaved thirds, rounds or child processes); the repetitions
are kept under ``samples`` (figure -> list). The table printed at the end has
figure, median, min-max, goal and verdict (met/missed, on the median); a full
run of every step also writes it into ``docs/performance.md`` between the
``<!-- bench-table:begin -->`` and ``<!-- bench-table:end -->`` markers, under
the run's date.
A figure a step did not produce is written as ``null`` with the reason under
``missing``, and the exit status is 1: a figure is never carried over from an
earlier run. Goals are printed next to the figures; they are not enforced here
(timings are never asserted in CI, only that every figure was produced).
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import signal
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

FIGURES = (
    "audit_vs_server_floor", "audit_peak_rss_mb", "audit_rss_growth_mb", "drain_poke_ratio", "payload_read_ratio",
    "admission_vs_insert", "materialize_vs_setbased", "dag_parse_s", "triggerer_mb_per_waiting_tenant",
    "digest_vs_server_floor", "digest_verify_vs_server_floor", "digest_peak_rss_mb", "digest_rss_growth_mb",
    "materialize_proof_ratio", "stage3_comparison_vs_compat_scan",
    "audit_growth_vs_floor_growth", "admission_concurrent_speedup", "admission_conflict_retries_per_batch",
    "preload_task_import_ratio",
)

#: (comparison, bound, unit) per figure; ``dag_parse_s`` is checked per DAG file.
GOALS = {
    "audit_vs_server_floor": ("<=", 0.5, "x floor"),
    "audit_peak_rss_mb": ("<=", 60.0, "MB"),
    "audit_rss_growth_mb": ("<=", 50.0, "MB"),
    "audit_growth_vs_floor_growth": ("<=", 1.0, "x floor growth"),
    "drain_poke_ratio": ("<=", 1.3, "x H=10"),
    "payload_read_ratio": ("<=", 1.3, "x H=10"),
    "admission_vs_insert": (">=", 0.7, "x INSERT"),
    "admission_concurrent_speedup": (">=", 2.0, "x one pack"),
    "admission_conflict_retries_per_batch": ("<=", 0.05, "per batch"),
    "materialize_vs_setbased": (">=", 0.8, "x UPDATE"),
    "dag_parse_s": ("<", 0.2, "s"),
    "triggerer_mb_per_waiting_tenant": (None, None, "MB"),
    "digest_vs_server_floor": ("<=", 1.5, "x floor"),
    "digest_verify_vs_server_floor": ("<=", 1.5, "x floor"),
    "digest_peak_rss_mb": ("<", 100.0, "MB"),
    "digest_rss_growth_mb": ("<=", 10.0, "MB"),
    "materialize_proof_ratio": ("<=", 1.25, "x unproven"),
    "stage3_comparison_vs_compat_scan": ("<=", 1.5, "x one scan"),
    # issue 36.4: a lever is kept only where it pays
    "preload_task_import_ratio": ("<", 1.0, "x no preload"),
}

#: Companion figures printed under a figure when a step provides them.
COMPANIONS = {
    "admission_vs_insert": ("admission_events_per_s",),
    "materialize_vs_setbased": ("materialize_rows_per_s",),
    "triggerer_mb_per_waiting_tenant": ("triggerer_cpu_ms_per_tenant_per_min", "triggerer_poke_queries_per_s"),
    "digest_vs_server_floor": ("digest_vs_one_statement_checksum", "digest_serial_vs_one_statement_checksum",
                               "digest_parallel_speedup"),
    "preload_task_import_ratio": ("no_preload_task_import_s", "preload_task_import_s", "preload_worker_start_s"),
}


@dataclass
class Step:
    name: str
    script: str
    figures: tuple[str, ...]
    full: list[str] = field(default_factory=list)
    quick: list[str] = field(default_factory=list)
    #: For a script that prints its figures instead of writing them: stdout -> figures.
    from_stdout: Callable[[str], dict] | None = None


def runtime_figures(stdout: str) -> dict:
    """bench_runtime.py --json prints one JSON document (payload read, admission, concurrent admission)."""
    lines = stdout.splitlines()
    start = max(i for i, line in enumerate(lines) if line.rstrip() == "{")  # json.dumps(indent=2) opens so
    end = max(i for i, line in enumerate(lines) if line.rstrip() == "}")
    doc = json.loads("\n".join(lines[start:end + 1]))
    p, a, c = doc["payload_read"], doc["admission"], doc["concurrent_admission"]
    return {"payload_read_ratio": p["ratio_large_over_small"], "admission_vs_insert": a["ratio_admission_over_plain"],
            "admission_events_per_s": a["admission_rows_per_s"], "admission_concurrent_speedup": c["speedup"],
            "admission_conflict_retries_per_batch": c["retries_per_batch"], "runtime_run": doc,
            "samples": {"payload_read_ratio": p["ratio_samples"], "admission_vs_insert": a["ratio_samples"],
                        "admission_concurrent_speedup": c["speedup_samples"],
                        "admission_conflict_retries_per_batch": c["retries_per_batch_samples"]}}


#: Keys of bench/results.json written by make bench-stack, kept when make bench rewrites the file.
STACK_KEYS = ("stack", "stack_quick")

STEPS = [
    Step("audit", "bench_audit.py", ("audit_vs_server_floor", "audit_peak_rss_mb", "audit_rss_growth_mb",
                                     "audit_growth_vs_floor_growth"),
         full=["--generations", "10", "1000", "5000"], quick=["--generations", "10", "25", "50", "--lanes", "40"]),
    Step("digest", "bench_digest.py", ("digest_vs_server_floor", "digest_verify_vs_server_floor", "digest_peak_rss_mb",
                                       "digest_rss_growth_mb"),
         # H=10 and the deepest make its figures; H=100 (an intermediate row only) is dropped for make bench's 15 minutes
         full=["--generations", "10", "1000"], quick=["--generations", "10", "50", "--lanes", "40"]),
    Step("drain", "bench_drain.py", ("drain_poke_ratio",),
         full=["--generations", "10", "1000"], quick=["--generations", "10", "50", "--lanes", "40", "--pokes", "15"]),
    Step("runtime", "bench_runtime.py", ("payload_read_ratio", "admission_vs_insert", "admission_concurrent_speedup",
                                         "admission_conflict_retries_per_batch"), full=["--json"],
         quick=["--json", "--large", "1000", "--concurrent-batches", "2"], from_stdout=runtime_figures),
    Step("materialize", "bench_materialize.py",
         ("materialize_vs_setbased", "materialize_proof_ratio", "stage3_comparison_vs_compat_scan"),
         # batches of 10,000 rows: the largest transaction the issue allows on TiDB (the CLI's default is 2,000)
         full=["--rows", "1000000", "--batch-size", "10000"], quick=["--rows", "40000"]),
    Step("dag_parse", "bench_dag_parse.py", ("dag_parse_s",), full=["--repeat", "3"], quick=["--repeat", "1"]),
    Step("preload", "bench_preload.py", ("preload_task_import_ratio",), full=["--tasks", "9"], quick=["--tasks", "3"]),
    Step("triggerer", "bench_triggerer.py", ("triggerer_mb_per_waiting_tenant",),
         full=["--tenants", "1000", "--poll-interval", "30", "--window", "60"],
         quick=["--tenants", "40", "--baseline", "10", "--poll-interval", "2", "--window", "4", "--lanes", "40"]),
]


def run_step(step: Step, quick: bool, scratch: Path, timeout: float) -> tuple[float, str | None]:
    """Run one bench script; its output goes to ours. Returns (seconds, failure reason or None)."""
    script = benchlib.BENCH / step.script
    if not script.exists():
        return 0.0, f"bench/{step.script} does not exist (yet)"
    cmd = [sys.executable, str(script), *(step.quick if quick else step.full)]
    env = dict(os.environ, NEXUS_BENCH_RESULTS=str(scratch))
    print(f"\n=== {step.name}: {' '.join(['bench/' + step.script, *cmd[2:]])}", flush=True)
    started = time.perf_counter()
    lines: list[str] = []
    try:
        with subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                              start_new_session=True) as proc:
            assert proc.stdout is not None
            killed = threading.Event()

            def kill() -> None:
                killed.set()
                os.killpg(proc.pid, signal.SIGKILL)  # the step's own process group: its children too

            watchdog = threading.Timer(timeout, kill)  # a silent, hung child is stopped too
            watchdog.start()
            try:
                for line in proc.stdout:
                    print(line, end="", flush=True)
                    lines.append(line)
                code = proc.wait()
            finally:
                watchdog.cancel()
            if killed.is_set():
                return time.perf_counter() - started, f"timed out after {timeout:.0f} s"
    except OSError as exc:
        return time.perf_counter() - started, f"could not start: {exc}"
    elapsed = time.perf_counter() - started
    if code != 0:
        return elapsed, f"exit status {code}: " + " | ".join(x.strip() for x in lines[-8:])
    if step.from_stdout:
        try:
            benchlib.merge_results_to(scratch, step.from_stdout("".join(lines)))
        except (ValueError, KeyError) as exc:
            return elapsed, f"could not read its figures from its output: {exc!r}"
    return elapsed, None


def is_number(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def valid(figure: str, value) -> bool:
    if figure == "dag_parse_s":
        return isinstance(value, dict) and bool(value) and all(is_number(v) for v in value.values())
    return is_number(value)


def verdict(figure: str, value) -> str:
    op, bound, _unit = GOALS[figure]
    if value is None:
        return "MISSING"
    if op is None:
        return "recorded"
    values = value.values() if isinstance(value, dict) else [value]
    ok = all(v <= bound if op == "<=" else v >= bound if op == ">=" else v < bound for v in values)
    return "met" if ok else "NOT MET"


def rows(results: dict) -> list[tuple[str, str, str, str, str]]:
    """One (figure, median, min-max of the repetitions, goal, verdict) per figure (per DAG file for ``dag_parse_s``)."""
    samples = results.get("samples", {})
    out = []
    for figure in FIGURES:
        value = results.get(figure)
        op, bound, unit = GOALS[figure]
        goal = f"{op} {bound:g} {unit}" if op else f"recorded ({unit})"
        named = sorted(value.items()) if isinstance(value, dict) else [(None, value)]
        for name, v in named:
            key = f"{figure}/{name}" if name else figure
            reps = samples.get(key) or ([v] if is_number(v) else [])
            spread = f"{min(reps):.4g}-{max(reps):.4g} (n={len(reps)})" if reps else "-"
            one = verdict(figure, v) if name is None else verdict(figure, {name: v})
            out.append((key, "-" if v is None else f"{v:.4g}", spread, goal, {"NOT MET": "missed"}.get(one, one)))
    return out


def table(results: dict) -> str:
    lines = [f"{'figure':<52} {'median':>9} {'min-max':>24} {'goal':>22}  verdict", "-" * 120]
    lines += [f"{f:<52} {m:>9} {r:>24} {g:>22}  {v}" for f, m, r, g, v in rows(results)]
    for figure in FIGURES:
        for extra in COMPANIONS.get(figure, ()):
            if is_number(results.get(extra)):
                v = results[extra]
                lines.append(f"  {figure} with {extra}: {v:,.0f}" if abs(v) >= 1000 else f"  {figure} with {extra}: {v:.4g}")
    for figure, reason in results.get("missing", {}).items():
        lines.append(f"missing {figure}: {reason}")
    return "\n".join(lines)


DOC_BEGIN, DOC_END = "<!-- bench-table:begin -->", "<!-- bench-table:end -->"


def doc_section(results: dict, commit: str) -> str:
    """The marked section of docs/performance.md for this run: its date, how it ran, and the figures as a Markdown table."""
    head = (f"### `make bench` of {results['measured_at']} (written by `bench/run_all.py`)\n\n"
            f"{results['mode']} run at `{commit}`, {results['total_seconds']:.0f} s in all on {results['machine']['cores']} cores, "
            f"{results['machine']['server_version']}; each figure the median of its repetitions (all in `bench/results.json` "
            "under `samples`), verdict on the median.\n\n"
            "| figure | median | min-max (repetitions) | goal | verdict |\n|---|---|---|---|---|\n")
    body = "".join(f"| `{f}` | {m} | {r} | {g} | {'**missed**' if v == 'missed' else v} |\n" for f, m, r, g, v in rows(results))
    missing = "".join(f"\nMissing `{f}`: {reason}\n" for f, reason in results.get("missing", {}).items())
    return f"{DOC_BEGIN}\n{head}{body}{missing}{DOC_END}"


def write_doc(path: Path, section: str) -> bool:
    """Replace the marked section of ``path`` with ``section``; False (nothing written) when the markers are absent."""
    text = path.read_text() if path.exists() else ""
    begin, end = text.find(DOC_BEGIN), text.find(DOC_END)
    if begin < 0 or end < begin:
        return False
    path.write_text(text[:begin] + section + text[end + len(DOC_END):])
    return True


def head_commit() -> str:
    proc = subprocess.run(["git", "rev-parse", "--short", "HEAD"], cwd=benchlib.BENCH, capture_output=True, text=True, check=False)
    return proc.stdout.strip() or "unknown"


def machine() -> dict:
    return {
        "cores": os.cpu_count(), "platform": platform.platform(), "python": platform.python_version(),
        "server_version": benchlib.server_version(),
    }


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--quick", action="store_true", help="small sizes (about a minute)")
    parser.add_argument("--out", type=Path, default=benchlib.DEFAULT_RESULTS)
    parser.add_argument("--only", nargs="+", choices=[s.name for s in STEPS], help="run only these steps")
    parser.add_argument("--doc", type=Path, default=benchlib.BENCH.parent / "docs" / "performance.md",
                        help="rewrite this file's bench-table section (full runs of every step only)")
    parser.add_argument("--step-timeout", type=float, default=None, help="seconds per step (default 3600, quick 600)")
    args = parser.parse_args()
    benchlib.server_url()  # fails early, naming the variable, when no server is given
    timeout = args.step_timeout or (600.0 if args.quick else 3600.0)
    steps = [s for s in STEPS if not args.only or s.name in args.only]
    started = time.perf_counter()
    with tempfile.TemporaryDirectory(prefix="nexus-bench-") as tmp:
        scratch = Path(tmp) / "results.json"
        durations, failures = {}, {}
        for step in steps:
            durations[step.name], failures[step.name] = run_step(step, args.quick, scratch, timeout)
        produced = json.loads(scratch.read_text()) if scratch.exists() else {}
    results = {"mode": "quick" if args.quick else "full", "measured_at": benchlib.now_utc(), "machine": machine(),
               "step_seconds": {k: round(v, 1) for k, v in durations.items()},
               "total_seconds": round(time.perf_counter() - started, 1)}
    results["details"] = {k: v for k, v in produced.items() if k not in FIGURES}
    missing = {}
    for step in steps:
        for figure in step.figures:
            value = produced.get(figure)
            if valid(figure, value):
                results[figure] = value
            else:
                results[figure] = None
                missing[figure] = failures[step.name] or f"bench/{step.script} did not write a numeric {figure!r}"
    for figure in FIGURES:
        results.setdefault(figure, None)
        if results[figure] is None and figure not in missing:
            missing[figure] = "step not run (--only)"
    for extra in (e for extras in COMPANIONS.values() for e in extras):
        if extra in produced:
            results[extra] = produced[extra]
    results["samples"] = {k: v for k, v in produced.get("samples", {}).items()}
    results["details"].pop("samples", None)
    results["missing"] = missing
    # make bench-stack's figures (bench/bench_stack.py) live in the same file and are not remeasured here: keep them
    previous = json.loads(args.out.read_text()) if args.out.exists() and args.out.stat().st_size else {}
    results.update({k: previous[k] for k in STACK_KEYS if k in previous})
    args.out.parent.mkdir(parents=True, exist_ok=True)
    args.out.write_text(json.dumps(results, indent=2, sort_keys=True, default=str) + "\n")
    print(f"\n=== results ({results['mode']}, {results['machine']['cores']} cores, {results['machine']['server_version']}, "
          f"{results['total_seconds']:.0f} s) -> {args.out}")
    print(table(results))
    if not args.quick and not args.only:
        written = write_doc(args.doc, doc_section(results, head_commit()))
        print(f"table written into {args.doc}" if written else f"{args.doc} has no {DOC_BEGIN} section: not written")
    return 1 if missing else 0


if __name__ == "__main__":
    sys.exit(main())

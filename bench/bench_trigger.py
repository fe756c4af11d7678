"""How long a person waits between Trigger and the cutover's first task (issue 51, item 10), on ``make airflow``'s stack.

    .venv/bin/python bench/bench_trigger.py [--runs 3]

Starts the demo's Airflow (``scripts.airflow_up.DemoAirflow``: ``airflow standalone``, the demo tenant on SQLite,
its old runtime draining), then triggers ``connector_projection_cutover`` dry (nothing written, so the runs can
follow each other) ``--runs`` times through the REST API the trigger dialog calls, and reads each run's own times:
the trigger call, trigger to the first task's start (the scheduler and the executor), the first task's duration
(its imports and its read of the tenant) and trigger to the first task's end. The first run pays the cold imports;
the figures are the medians over the runs after it (``trigger_to_first_task_s``, ``first_task_s``), with every
repetition in ``samples``. Not part of ``make bench``: it starts an Airflow of its own.

Then the same under load (``--load K``, default 6; issue 51, item 10 reported 20 s and 65 s "under load"): K dry runs
triggered back to back, then the measured one, ``--runs`` times; the demo's LocalExecutor has 4 slots
(``parallelism``), so the measured run's first task waits for theirs: ``loaded_trigger_call_s``,
``loaded_trigger_to_first_task_s``, ``loaded_first_task_s`` (medians, every repetition in ``samples``).
"""

from __future__ import annotations

import argparse
import datetime as dt
import sys
import tempfile
import time
from pathlib import Path

sys.path[:0] = [str(Path(__file__).resolve().parent), str(Path(__file__).resolve().parents[1])]
import benchlib  # noqa: E402

from scripts.airflow_up import DemoAirflow  # noqa: E402
from scripts.demo import CUTOVER_DAG, TENANT  # noqa: E402


def _at(text: str) -> dt.datetime:
    return dt.datetime.fromisoformat(text.replace("Z", "+00:00"))


def one_run(stack, load: int = 0) -> dict[str, float]:
    """One dry run: its trigger call and, from the run's and the first task's own times, where the wait went;
    ``load`` other dry runs triggered just before it (waited for after it)."""
    others = [stack.trigger(CUTOVER_DAG, {"tenant": TENANT, "dry_run": True})["dag_run_id"] for _ in range(load)]
    started = time.monotonic()
    run_id = stack.trigger(CUTOVER_DAG, {"tenant": TENANT, "dry_run": True})["dag_run_id"]
    call_s = time.monotonic() - started
    first = {}
    while time.monotonic() - started < 300 and first.get("state") not in ("success", "failed"):
        time.sleep(0.5)
        first = next((t for t in stack.task_instances(CUTOVER_DAG, run_id) if t["task_id"] == "resolve_packs"), {})
    queued = _at(stack.dag_run(CUTOVER_DAG, run_id)["queued_at"])
    for rid in [run_id, *others]:
        while stack.dag_run(CUTOVER_DAG, rid)["state"] not in ("success", "failed"):
            time.sleep(1)
    return {"trigger_call_s": call_s, "trigger_to_first_task_s": (_at(first["start_date"]) - queued).total_seconds(),
            "first_task_s": float(first["duration"]), "trigger_to_first_task_end_s": (_at(first["end_date"]) - queued).total_seconds()}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=3)
    parser.add_argument("--load", type=int, default=6, help="dry runs triggered just before each loaded measurement")
    args = parser.parse_args()
    demo = DemoAirflow(Path(tempfile.mkdtemp(prefix="bench-trigger-")), reseed=True)
    demo.start(timeout_s=600)
    try:
        demo.stack.wait_for_dag(CUTOVER_DAG)
        runs = [one_run(demo.stack) for _ in range(max(2, args.runs))]
        loaded = [one_run(demo.stack, load=args.load) for _ in range(args.runs)] if args.load else []
    finally:
        demo.stop()
    for i, r in enumerate(runs):
        print(f"run {i + 1}{' (cold)' if i == 0 else ''}: " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
    warm = runs[1:]
    for i, r in enumerate(loaded):
        print(f"loaded run {i + 1} (after {args.load} others): " + ", ".join(f"{k} {v:.2f}" for k, v in r.items()))
    figures = benchlib.figures(**{k: [r[k] for r in warm] for k in ("trigger_to_first_task_s", "first_task_s")},
                               first_task_cold_s=[runs[0]["first_task_s"]],
                               **{f"loaded_{k}": [r[k] for r in loaded] for k in
                                  ("trigger_call_s", "trigger_to_first_task_s", "first_task_s") if loaded})
    print(f"results: {benchlib.merge_results(figures)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

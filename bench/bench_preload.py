"""What a cutover task pays for our first imports in a Celery worker, with and without the nexus preload.

    .venv/bin/python bench/bench_preload.py [--tasks 9]

A Celery worker's main process imports Airflow, runs the ``import_modules`` handlers (Airflow's own preload,
and :func:`nexus_airflow.preload.preload` when ``plugins/airflow_local_settings.py`` connected it), freezes the
garbage collector and forks; each task process then parses its DAG file and its step imports what the step body
needs. This script does that in one run: two worker-like parents, one whose handlers include ours and one whose
do not (disconnected before the signal is sent), each forking ``--tasks`` task processes one after another,
interleaved. Each task process times what a cutover task does before its step's first statement that is ours:
the ``BundleDagBag`` of ``dags/connector_projection_cutover.py`` and the import of the step bodies and the MySQL
dialect. Reported: the medians (``preload_task_import_s``, ``no_preload_task_import_s``) and the median of the
ratios of each interleaved pair (``preload_task_import_ratio``); the worker start's own cost of the preload
beside them.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import subprocess
import sys
import tempfile
import textwrap
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
import benchlib  # noqa: E402

REPO = benchlib.BENCH.parent
DAG_FILE = REPO / "dags" / "connector_projection_cutover.py"

WORKER = textwrap.dedent(
    """
    import gc, json, os, sys, time
    import airflow.settings  # imports airflow_local_settings from the plugins folder (connects our preload)
    from celery.signals import import_modules
    from airflow.providers.celery.executors import celery_executor_utils  # Airflow's own preload handler
    preloaded = sys.argv[1] == "preload"
    if not preloaded:
        import_modules.disconnect(dispatch_uid="nexus_cutover.preload")
    started = time.perf_counter()
    celery_executor_utils.app.loader.import_default_modules()  # what a worker's main process does before it forks
    start_s = time.perf_counter() - started
    gc.unfreeze(); gc.freeze()  # Airflow's handler froze; the worker is ready: freeze what is loaded now
    dag_file, bundle, tasks = sys.argv[2], sys.argv[3], int(sys.argv[4])
    for _ in range(tasks):
        line = sys.stdin.readline()  # the driver interleaves the two workers' tasks
        if not line:
            break
        r, w = os.pipe()
        pid = os.fork()
        if pid == 0:  # the task process
            os.close(r)
            from airflow.dag_processing.dagbag import BundleDagBag
            t0 = time.perf_counter()
            bag = BundleDagBag(dag_folder=dag_file, bundle_path=bundle, bundle_name="dags-folder", load_op_links=False)
            import nexus_cutover.projection.steps  # noqa: F401  -- what a step body runs
            import sqlalchemy.dialects.mysql.pymysql  # noqa: F401  -- what its first statement loads
            took = time.perf_counter() - t0
            os.write(w, json.dumps({"s": took, "dags": sorted(bag.dags), "errors": bag.import_errors}).encode())
            os._exit(0)
        os.close(w)
        data = b""
        while chunk := os.read(r, 65536):
            data += chunk
        os.close(r)
        os.waitpid(pid, 0)
        print("NEXUS-BENCH " + json.dumps({"task": json.loads(data), "start_s": start_s}), flush=True)
    """
)


def _worker(kind: str, home: str, tasks: int) -> subprocess.Popen:
    env = dict(os.environ)
    env.pop("NEXUS_TEST_MYSQL_URL", None)
    env.update({
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAG_FILE.parent),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(REPO / "plugins"),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__CORE__EXECUTOR": "CeleryExecutor",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
    })
    return subprocess.Popen([sys.executable, "-c", WORKER, kind, str(DAG_FILE), str(DAG_FILE.parent), str(tasks)],
                            stdin=subprocess.PIPE, stdout=subprocess.PIPE, text=True, env=env)


def _next_figures(kind: str, worker: subprocess.Popen) -> dict:
    """The worker's next task figures (its other output, Airflow's log lines, skipped)."""
    while line := worker.stdout.readline():
        if line.startswith("NEXUS-BENCH "):
            return json.loads(line.removeprefix("NEXUS-BENCH "))
    raise RuntimeError(f"the {kind} worker ended early (exit {worker.wait()})")


def measure(tasks: int) -> dict:
    """``tasks`` task processes of each worker, interleaved; the figures and their samples."""
    samples: dict[str, list[float]] = {"preload": [], "no_preload": []}
    start: dict[str, float] = {}
    with tempfile.TemporaryDirectory(prefix="nexus-bench-preload-") as home:
        workers = {kind: _worker(kind, home, tasks) for kind in samples}
        try:
            for _ in range(tasks):
                for kind, worker in workers.items():
                    worker.stdin.write("go\n")
                    worker.stdin.flush()
                    got = _next_figures(kind, worker)
                    if got["task"]["errors"] or got["task"]["dags"] != ["connector_projection_cutover"]:
                        raise RuntimeError(f"{kind}: the DAG did not parse: {got['task']}")
                    samples[kind].append(got["task"]["s"])
                    start[kind] = got["start_s"]
        finally:
            for worker in workers.values():
                worker.stdin.close()
                worker.wait(timeout=60)
    ratios = [w / wo for w, wo in zip(samples["preload"], samples["no_preload"], strict=True)]
    return {"preload_task_import_s": round(statistics.median(samples["preload"]), 4),
            "no_preload_task_import_s": round(statistics.median(samples["no_preload"]), 4),
            "preload_task_import_ratio": round(statistics.median(ratios), 3),
            "preload_worker_start_s": round(start["preload"] - start["no_preload"], 3),
            "samples": {"preload_task_import_ratio": ratios, "preload_task_import_s": samples["preload"],
                        "no_preload_task_import_s": samples["no_preload"]}}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--tasks", type=int, default=9, help="task processes per worker (default 9)")
    args = parser.parse_args()
    figures = measure(args.tasks)
    print(f"a cutover task's first imports of ours: {figures['no_preload_task_import_s']:.3f} s without the preload, "
          f"{figures['preload_task_import_s']:.3f} s with it (x{figures['preload_task_import_ratio']}); "
          f"the worker's start pays {figures['preload_worker_start_s']:.2f} s once for it")
    benchlib.merge_results({**figures, "preload_measured_at": benchlib.now_utc()})
    print(json.dumps({k: v for k, v in figures.items() if k != "samples"}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Parse time of each DAG file beyond ``import airflow.sdk``, measured the way the dag-processor parses.

    .venv/bin/python bench/bench_dag_parse.py [--repeat 3]

The dag-processor parses every file in a fresh child process that has already
imported Airflow (``airflow.dag_processing.processor``, which imports the SDK
and the serializer), then builds a ``BundleDagBag`` on the one file and
serializes its DAGs. This script does the same, once per file and repeat, in a
fresh interpreter each time, with a throwaway ``AIRFLOW_HOME`` and every tenant
connection pointing nowhere (a parse must not touch a database). Reported per
file (``dag_parse_s``): the median time of the ``BundleDagBag`` step, i.e.
importing the file and its plugin modules and collecting its DAGs; the
serialization time is recorded beside it. Goal: under 0.2 s per file. The
child freezes the garbage collector after those imports, as the manager does
before it forks (``gc.freeze()`` in ``DagFileProcessorManager.before_run``):
otherwise the first full collection during a parse walks every object Airflow
imported, and the file that happens to trigger it is charged about 0.1 s.
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
DAGS = REPO / "dags"
PLUGINS = REPO / "plugins"

CHILD = textwrap.dedent(
    """
    import gc, json, sys, time
    import airflow.sdk  # noqa: F401  -- the SDK import (seconds) is not the DAG file's cost
    import airflow.dag_processing.processor  # noqa: F401  -- already imported in a real dag-processor child
    from airflow.dag_processing.dagbag import BundleDagBag
    from airflow.serialization.serialized_objects import DagSerialization
    gc.freeze()  # as DagFileProcessorManager.before_run does before it forks the parsing children
    path, bundle = sys.argv[1], sys.argv[2]
    before = set(sys.modules)
    started = time.perf_counter()
    bag = BundleDagBag(dag_folder=path, bundle_path=bundle, bundle_name="dags-folder", load_op_links=False)
    parsed = time.perf_counter()
    for dag in bag.dags.values():
        DagSerialization.to_dict(dag)
    serialized = time.perf_counter()
    print(json.dumps({"parse_s": parsed - started, "serialize_s": serialized - parsed, "dags": sorted(bag.dags),
                      "errors": bag.import_errors, "new_modules": len(set(sys.modules) - before),
                      "drivers": sorted(m for m in ("pymysql", "MySQLdb", "sqlite3") if m in set(sys.modules) - before)}))
    """
)


def parse_once(path: Path, home: str) -> dict:
    env = dict(os.environ)
    env.pop("NEXUS_TEST_MYSQL_URL", None)
    env.update({
        "AIRFLOW_HOME": home,
        "AIRFLOW__CORE__DAGS_FOLDER": str(DAGS),
        "AIRFLOW__CORE__PLUGINS_FOLDER": str(PLUGINS),
        "AIRFLOW__CORE__LOAD_EXAMPLES": "False",
        "AIRFLOW__DATABASE__SQL_ALCHEMY_CONN": f"sqlite:///{home}/airflow.db",
        "AIRFLOW_CONN_NEXUS_TENANT_DEFAULT": "mysql://u:p@192.0.2.1:1/nowhere",
        "PYTHONPATH": os.pathsep.join([str(PLUGINS), env.get("PYTHONPATH", "")]).rstrip(os.pathsep),
    })
    out = subprocess.run([sys.executable, "-c", CHILD, str(path), str(DAGS)], capture_output=True, text=True,
                         env=env, timeout=300, check=False)
    if out.returncode != 0:
        raise RuntimeError(f"parsing {path.name} failed:\n{out.stderr[-3000:]}")
    result = json.loads(out.stdout.strip().splitlines()[-1])
    if result["errors"] or not result["dags"]:
        raise RuntimeError(f"{path.name}: no DAG or import errors: {result['errors']}")
    return result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    parser.add_argument("--repeat", type=int, default=3)
    args = parser.parse_args()
    files = sorted(p for p in DAGS.glob("*.py") if not p.name.startswith("_"))
    per_file, details = {}, {}
    print(f"{'DAG file':<40} {'parse s':>8} {'serialize s':>11} {'modules':>7}  dags")
    with tempfile.TemporaryDirectory(prefix="nexus-bench-airflow-") as home:
        for path in files:
            runs = [parse_once(path, home) for _ in range(args.repeat)]
            parse = statistics.median(r["parse_s"] for r in runs)
            serialize = statistics.median(r["serialize_s"] for r in runs)
            per_file[path.name] = round(parse, 4)
            details[path.name] = {"parse_runs_s": [r["parse_s"] for r in runs], "serialize_s": serialize,
                                  "dags": runs[0]["dags"], "new_modules": runs[0]["new_modules"],
                                  "db_drivers_imported": runs[0]["drivers"]}
            print(f"{path.name:<40} {parse:>8.3f} {serialize:>11.3f} {runs[0]['new_modules']:>7}  "
                  f"{','.join(runs[0]['dags'])}", flush=True)
    samples = {f"dag_parse_s/{name}": d["parse_runs_s"] for name, d in details.items()}
    benchlib.merge_results({"dag_parse_s": per_file, "dag_parse_details": details, "dag_parse_measured_at": benchlib.now_utc(),
                            "samples": samples})
    print(json.dumps({"dag_parse_s": per_file}))
    return 0


if __name__ == "__main__":
    sys.exit(main())

"""Smoke test of ``make bench QUICK=1``: the orchestrator runs every bench and records every figure.

Speed is not asserted here (no timing assertions in CI); what is asserted is
that each figure of the issue was produced, as a number, in one run against
the test server -- so a bench script that breaks, or stops writing its
figure, fails CI. The results go to a temporary file: the recorded full
figures (bench/results.json) are left alone.
"""

from __future__ import annotations

import json
import math
import os
import subprocess
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(REPO / "bench"))
from run_all import FIGURES  # noqa: E402

ISSUE_FIGURES = {
    "audit_vs_server_floor", "audit_peak_rss_mb", "audit_rss_growth_mb", "drain_poke_ratio", "payload_read_ratio",
    "admission_vs_insert", "materialize_vs_setbased", "dag_parse_s", "triggerer_mb_per_waiting_tenant",
    "digest_vs_server_floor", "digest_verify_vs_server_floor", "digest_peak_rss_mb", "digest_rss_growth_mb",
    "materialize_proof_ratio", "stage3_comparison_vs_compat_scan",
    "audit_growth_vs_floor_growth", "admission_concurrent_speedup", "admission_conflict_retries_per_batch",
    "preload_task_import_ratio",
}


def _finite(value) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value)


def test_quick_bench_records_every_figure(request, mysql_server_url, tmp_path):
    request.node._nexus_uses_mysql = True
    assert set(FIGURES) == ISSUE_FIGURES
    out = tmp_path / "results.json"
    env = dict(os.environ, NEXUS_TEST_MYSQL_URL=mysql_server_url)
    env.pop("NEXUS_BENCH_RESULTS", None)
    proc = subprocess.run(
        [sys.executable, str(REPO / "bench" / "run_all.py"), "--quick", "--out", str(out)],
        cwd=REPO, env=env, capture_output=True, text=True, timeout=900, check=False,
    )
    assert out.exists(), proc.stdout[-4000:] + proc.stderr[-4000:]
    results = json.loads(out.read_text())
    assert results["missing"] == {}, (results["missing"], proc.stdout[-6000:])
    assert proc.returncode == 0, proc.stdout[-4000:] + proc.stderr[-4000:]
    assert results["mode"] == "quick"
    for figure in ISSUE_FIGURES - {"dag_parse_s"}:
        assert _finite(results[figure]), (figure, results[figure])
    dag_files = {p.name for p in (REPO / "dags").glob("*.py") if not p.name.startswith("_")}
    assert set(results["dag_parse_s"]) == dag_files
    assert all(_finite(v) for v in results["dag_parse_s"].values())
    samples = results["samples"]  # every figure's repetitions, its median the figure itself
    for figure in ISSUE_FIGURES - {"dag_parse_s"}:
        assert samples[figure] and all(_finite(v) for v in samples[figure]), (figure, samples.get(figure))
        assert min(samples[figure]) <= results[figure] <= max(samples[figure]), (figure, results[figure], samples[figure])
    for name in dag_files:
        assert samples[f"dag_parse_s/{name}"], name
    assert "median" in proc.stdout and "min-max" in proc.stdout
    assert results["machine"]["server_version"] and results["machine"]["cores"]
    assert "password" not in out.read_text().lower() and "nexus-test" not in proc.stdout + out.read_text()

"""What ``make bench-stack`` reports: its progress lines (:func:`say`) and its figures in bench/results.json (:func:`save`).

* The stack's figures live under one key of bench/results.json: ``stack``, or ``stack_quick`` for a ``--quick`` run
  (a quick run never replaces the recorded full figures). ``make bench`` (bench/run_all.py) keeps both keys.
* :func:`save` merges part by part (``waiting``, ``rollout``, ``preflight``, ...): a run of some parts (``--only``)
  keeps the recorded figures of the others, each with the date of the run that measured it (``measured_at``);
  every other key of the file is kept (:func:`benchlib.merge_results`).

Imported by ``bench/bench_stack.py`` and by ``bench/bench_preflight.py`` (which, run alone, records its figure as
the stack's part ``preflight``); it imports neither of them, so neither of the two imports the other to write.
Like ``benchlib`` it expects ``bench/`` on ``sys.path`` (each bench script puts it there).
"""

from __future__ import annotations

import json
import time
from typing import Any

import benchlib


def say(msg: str) -> None:
    print(f"[{time.strftime('%H:%M:%S')}] {msg}", flush=True)


#: Issue 50's figures, each a key of bench/results.json: where in the stack's figures it is read (part, field). A
#: figure no part of the run measured is left out (``pause_over_cli_automated`` and ``ledger_share_of_pause`` have no
#: part yet).
HEADLINE = {
    "pause_less_answer_over_cli_manual": ("rollout", "admission_pause_less_answer_wait_median_over_cli"),
    "wall_over_cli_floor": ("rollout", "airflow_over_cli_floor"),
    "wide_wave_over_calm": ("fleet", "drained_pause_vs_calm_wave"),
    "pause_over_own_residual_p95_s": ("fleet", "pause_over_own_p95_s"),
}


def headline(results: dict[str, Any]) -> dict[str, Any]:
    """Issue 50's figures measured in ``results`` (a run's, or the merged record), with the armed slots they were
    measured with (``armed_slots``: 0 is no bound)."""
    found = {name: results[part][field] for name, (part, field) in HEADLINE.items()
             if isinstance(results.get(part), dict) and results[part].get(field) is not None}
    return {**found, "armed_slots": results.get("armed_slots", 0)} if found else {}


def save(key: str, results: dict[str, Any]) -> None:
    """Merge part by part: a run of one part (``--only``) keeps the other part's recorded figures. A full run's issue
    50 figures (:func:`headline`) also go to the file's top level, under their own keys."""
    path = benchlib.results_path()
    recorded = (json.loads(path.read_text()) if path.exists() and path.stat().st_size else {}).get(key) or {}
    for part in ("waiting", "rollout", "preflight"):  # each part keeps the date of the run that measured it
        if isinstance(recorded.get(part), dict):
            recorded[part].setdefault("measured_at", recorded.get("measured_at"))
    merged = {**recorded, **results}
    top = headline(merged) if key == "stack" else {}
    benchlib.merge_results({key: {**merged, "headline": headline(merged)}, **top})

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


def save(key: str, results: dict[str, Any]) -> None:
    """Merge part by part: a run of one part (``--only``) keeps the other part's recorded figures."""
    path = benchlib.results_path()
    recorded = (json.loads(path.read_text()) if path.exists() and path.stat().st_size else {}).get(key) or {}
    for part in ("waiting", "rollout", "preflight"):  # each part keeps the date of the run that measured it
        if isinstance(recorded.get(part), dict):
            recorded[part].setdefault("measured_at", recorded.get("measured_at"))
    benchlib.merge_results({key: {**recorded, **results}})

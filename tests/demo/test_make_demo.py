"""``make demo`` end to end, twice in the same state directory: exit 0, the summary, no orphan process.

Runs ``scripts/demo.py`` exactly as the Makefile does (real ``airflow standalone``,
the old runtime, the new host started by the DAG), with ``--state-dir`` in a
temporary directory. After each run, no process may remain whose
``AIRFLOW_HOME`` is the demo's, nor the old runtime or the new host it reported.
"""

from __future__ import annotations

import os
import pathlib
import re
import subprocess
import sys

import pytest

pytestmark = pytest.mark.airflow  # scripts/demo.py runs a real `airflow standalone`

REPO = pathlib.Path(__file__).resolve().parents[2]


def _pids_with_home(home: str) -> list[int]:
    found = []
    for entry in os.listdir("/proc"):
        if not entry.isdigit() or int(entry) == os.getpid():
            continue
        try:
            env = pathlib.Path(f"/proc/{entry}/environ").read_bytes().split(b"\0")
            state = pathlib.Path(f"/proc/{entry}/stat").read_text().rsplit(")", 1)[1].split()[0]
        except OSError:
            continue
        if state != "Z" and f"AIRFLOW_HOME={home}".encode() in env:
            found.append(int(entry))
    return found


def _alive(pid: int) -> bool:
    try:
        return pathlib.Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def test_make_demo_twice(tmp_path):
    state = tmp_path / "demo"
    for attempt in (1, 2):
        proc = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--state-dir", str(state)],
                              capture_output=True, text=True, timeout=1200, cwd=REPO)
        out = proc.stdout
        assert proc.returncode == 0, f"run {attempt}:\n{out[-6000:]}\n{proc.stderr[-3000:]}"
        assert "answered confirm_writers_stopped through PATCH" in out
        assert re.search(r"cutoff pk-crm-sync\s+LegacyMaxOrdinal=\d+", out)
        assert re.search(r"cutoff pk-billing\s+LegacyMaxOrdinal=\d+", out)
        assert re.search(r"new host:\s+\S+ \(activated\)", out)
        assert "fence:               none in force" in out
        assert re.search(r"history digest [0-9a-f]{16} \(\d+ Events, \d+ WorkItems, \d+ chunks\) taken after the "
                         r"confirmation; verified at the end: no history row changed", out), out[-6000:]
        assert "field history stage: stage 3 done" in out
        pids = [int(p) for p in re.findall(r"old-protocol runtime started \(pid (\d+)\)", out)]
        pids += [int(p) for p in re.findall(r"new host started by start_new_host: pid (\d+)", out)]
        assert len(pids) == 2, out
        assert not [p for p in pids if _alive(p)], f"run {attempt} left {pids} running"
        assert _pids_with_home(str(state / "airflow")) == [], f"run {attempt} left Airflow processes"

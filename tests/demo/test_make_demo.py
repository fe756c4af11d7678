"""``make demo`` end to end, run once, in a state directory a previous run left behind.

Runs ``scripts/demo.py`` exactly as the Makefile does (real ``airflow standalone``, the old runtime, the new
host started by the DAG), with ``--state-dir`` in a temporary directory, once for this module (the
``demo_run`` fixture; the tests below read its output and what it left). Before it runs, the directory holds
what a previous ``make demo`` leaves there (an Airflow home with its metadata DB and generated passwords, the
demo tenant, the old runtime's log), each made so that a run reusing it would fail or show it: the run must
start over, as a second ``make demo`` does. After the run no process may remain whose ``AIRFLOW_HOME`` is the
demo's, nor the old runtime or the new host it reported.
"""

from __future__ import annotations

import json
import os
import pathlib
import re
import sqlite3
import subprocess
import sys

import pytest

from nexus_sim.scenario.production import FIRST_PACK, GREENFIELD_PACK, LONG_PACK
from scripts.demo_seed import seed

pytestmark = pytest.mark.airflow  # scripts/demo.py runs a real `airflow standalone`

REPO = pathlib.Path(__file__).resolve().parents[2]
PREVIOUS = "a previous make demo's"  # the marker planted in the previous run's files


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


def _leave_a_previous_run(state: pathlib.Path) -> None:
    """What a finished ``make demo`` leaves in its state directory, each piece unusable by the next run: an
    Airflow metadata DB that is not a database, a generated admin password that is not the one Airflow will
    accept, the demo tenant with a table no seed makes, and the old runtime's log (opened for append)."""
    home = state / "airflow"
    (home / "logs").mkdir(parents=True)
    (home / "airflow.db").write_bytes(f"{PREVIOUS} metadata DB, not SQLite\n".encode() * 64)
    (home / "simple_auth_manager_passwords.json.generated").write_text(json.dumps({"admin": "stale-password"}))
    (home / "standalone.log").write_text(f"{PREVIOUS} standalone log\n")
    tenant = state / "tenant-demo.db"
    seed(str(tenant), "demo")
    with sqlite3.connect(tenant) as db:
        db.execute("CREATE TABLE previous_run_marker (note TEXT)")
        db.execute("INSERT INTO previous_run_marker VALUES (?)", (PREVIOUS,))
    (state / "old-runtime.log").write_text(f"{PREVIOUS} old runtime log\n")


@pytest.fixture(scope="module")
def demo_run(tmp_path_factory) -> tuple[subprocess.CompletedProcess, pathlib.Path]:
    """``scripts/demo.py --state-dir <dir>``, once, over a previous run's leftovers: (its process, the dir)."""
    state = tmp_path_factory.mktemp("make-demo") / "demo"
    _leave_a_previous_run(state)
    proc = subprocess.run([sys.executable, str(REPO / "scripts" / "demo.py"), "--state-dir", str(state)],
                          capture_output=True, text=True, timeout=1200, cwd=REPO)
    return proc, state


def test_make_demo_exits_0_with_the_summary(demo_run):
    proc, _ = demo_run
    out = proc.stdout
    assert proc.returncode == 0, f"{out[-6000:]}\n{proc.stderr[-3000:]}"
    assert "answered confirm_writers_stopped through PATCH" in out
    cutoffs = dict(re.findall(r"^cutoff (\S+)\s+LegacyMaxOrdinal=(\d+)$", out, re.M))
    assert sorted(cutoffs) == sorted([FIRST_PACK, LONG_PACK, GREENFIELD_PACK]), out[-6000:]  # the production tenant
    assert int(cutoffs[FIRST_PACK]) > 0 and int(cutoffs[LONG_PACK]) > 0  # the greenfield one: what the old runtime admitted
    assert re.search(r"new host:\s+\S+ \(activated\)", out)
    assert "fence:               none in force" in out
    assert re.search(r"history digest [0-9a-f]{16} \(\d+ Events, \d+ WorkItems, \d+ chunks\) taken after the "
                     r"confirmation; verified at the end: no history row changed", out), out[-6000:]
    assert "field history stage: stage 3 done" in out
    # step 5: the proofs on the production-shaped tenant, with live traffic arriving after the release
    proofs = re.findall(r"^\[[\d:]+\]\s+(ok  |FAIL) (.*)$", out, re.M)
    assert len(proofs) == 6 and all(mark == "ok  " for mark, _ in proofs), proofs
    assert any("history digest verified again after the traffic" in line for _, line in proofs), proofs
    assert any("still live with their Status: nothing waited for them" in line for _, line in proofs), proofs
    assert re.search(r"the new host admitted all [1-9]\d* receipts sent after the release", out), out[-6000:]
    # the delivery ledger (the embedded default beside the demo's Airflow), read back by `nexus-cutover report`
    ledger = re.search(r"6\. the delivery ledger .*?: (\d+) events", out)
    assert ledger and int(ledger.group(1)) > 0, out[-6000:]
    for kind in ("fence_armed", "drain_done", "evidence_shown", "digest_taken", "host_started", "fence_released",
                 "digest_verified", "gate_passed"):
        assert re.search(rf"(connector_projection_cutover|field_history_eligibility) .*  {kind}\b", out), kind
    assert re.search(r"confirm_writers_stopped  answer  outcome=confirmed  actor=\S+", out), out[-6000:]
    assert len(re.findall(r"  checkpoint  .*pack=", out)) == 3, out[-6000:]  # each pack, its cutoff


def test_make_demo_leaves_no_process_running(demo_run):
    proc, state = demo_run
    out = proc.stdout
    pids = [int(p) for p in re.findall(r"old-protocol runtime started \(pid (\d+)\)", out)]
    pids += [int(p) for p in re.findall(r"new host started by start_new_host: pid (\d+)", out)]
    assert len(pids) == 2, out[-6000:]
    assert not [p for p in pids if _alive(p)], f"the demo left {pids} running"
    assert _pids_with_home(str(state / "airflow")) == [], "the demo left Airflow processes"


def test_make_demo_starts_over_in_a_used_state_dir(demo_run):
    """What a second ``make demo`` meets: the previous run's state directory. Nothing of it is reused."""
    proc, state = demo_run
    assert proc.returncode == 0, proc.stdout[-6000:]
    home = state / "airflow"
    assert (home / "airflow.db").read_bytes()[:16] == b"SQLite format 3\x00"  # a new metadata DB
    assert json.loads((home / "simple_auth_manager_passwords.json.generated").read_text())["admin"] != "stale-password"
    assert PREVIOUS not in (home / "standalone.log").read_text(errors="replace")
    with sqlite3.connect(state / "tenant-demo.db") as db:
        tables = {r[0] for r in db.execute("SELECT name FROM sqlite_master WHERE type = 'table'")}
    assert "previous_run_marker" not in tables and "_System_Event" in tables, sorted(tables)
    assert PREVIOUS not in (state / "old-runtime.log").read_text(errors="replace")

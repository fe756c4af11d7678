"""``field-history-eligibility`` as a delivery engineer runs it: exit codes, -json, flags, resumption after a kill."""

from __future__ import annotations

import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import threading

from sqlalchemy import insert, update

from nexus_cutover.db import make_engine
from nexus_cutover.schema import create_legacy_schema
from nexus_sim.scenario import TenantScenario

from .conftest import make_stage1
from .helpers import ELIGIBLE, Audit, audit_table, compat_set, mixed_history

PROGRAM = shutil.which("field-history-eligibility", path=os.path.dirname(sys.executable)) or "field-history-eligibility"


def cli_env(dsn):
    env = {k: v for k, v in os.environ.items() if k not in ("NEXUS_TENANT_DSN", "CONNECTOR_CUTOVER_DSN")}
    if dsn is not None:
        env["NEXUS_TENANT_DSN"] = dsn
    return env


def run_cli(dsn, *args, timeout=120):
    return subprocess.run([PROGRAM, *args], env=cli_env(dsn), capture_output=True, text=True, timeout=timeout)


def seeded(url):
    engine = make_engine(url)
    make_stage1(engine)
    mixed_history().write(engine)
    return engine


def test_status_json_then_materialize_then_status(tenant_url):
    engine = seeded(tenant_url)
    before = run_cli(tenant_url, "status", "-json")
    assert before.returncode == 0, before.stderr
    st = json.loads(before.stdout)
    assert (st["eligible_null_rows"], st["null_rows"], st["read_mode"]) == (11, 30, "compat")
    assert st["sequence_reservation_enabled"] is True and st["materializable_rows"] == 27

    mat = run_cli(tenant_url, "materialize", "-batch-size", "5", "-timeout", "5m", "-json")
    assert mat.returncode == 0, mat.stderr
    out = json.loads(mat.stdout)
    assert (out["outcome"], out["set_true"], out["set_false"], out["batches"], out["remaining"]) == ("materialized", 11, 16, 6, 0)
    assert "materialized 5/27 rows" in mat.stderr and "rows/s, ETA" in mat.stderr

    again = run_cli(tenant_url, "materialize", "--batch-size", "5", "--timeout", "30s", "--json")
    assert again.returncode == 0 and json.loads(again.stdout)["outcome"] == "unchanged"
    after = json.loads(run_cli(tenant_url, "status", "--json").stdout)
    assert (after["eligible_null_rows"], after["null_rows"]) == (0, 3)
    assert after["rows_by_value"] == {"true": 13, "false": 17, "null": 3}
    engine.dispose()


def test_status_text_lists_producers(tenant_url):
    engine = seeded(tenant_url)
    sc = TenantScenario()
    sc.process("runtime_api", version="4.12.0", process_id="api-1")
    sc.outbox_row(producer_version="4.11.0")
    sc.write(engine)
    res = run_cli(tenant_url, "status")
    assert res.returncode == 0
    assert "read mode: compat" in res.stdout and "process api-1: runtime_api 4.12.0" in res.stdout
    assert "outbox: 1 pending row(s) from producer 4.11.0" in res.stdout
    engine.dispose()


def test_the_cli_and_the_status_view_count_the_rows_the_same_way(tenant_url):
    """One count line (issue 23: the view said "15/165" and "150 to materialize" where the CLI said "167 total,
    152 NULL"): the CLI prints what the tenant state (the status view's source) carries, and its numbers add up."""
    from nexus_cutover.tenant_status import read_tenant_state

    engine = seeded(tenant_url)
    res = run_cli(tenant_url, "status")
    fh = read_tenant_state(engine, "ns")["field_history"]
    st = json.loads(run_cli(tenant_url, "status", "-json").stdout)
    assert f"rows: {fh['rows_text']}" in res.stdout.splitlines()
    by_value = st["rows_by_value"]
    assert fh["rows_text"].startswith(f"{st['total_rows']} rows: {by_value['true']} TRUE, {by_value['false']} FALSE, "
                                      f"{st['null_rows']} NULL ({st['eligible_null_rows']} eligible, "
                                      f"{st['materializable_rows']} materializable")
    assert st["total_rows"] == by_value["true"] + by_value["false"] + st["null_rows"]
    assert fh["decided_rows"] + fh["materializable_rows"] <= st["total_rows"]  # the view's bar: decided of decidable
    assert str(st["materializable_rows"]) not in fh["stage_text"]  # numbers live in the count line only
    engine.dispose()


def test_bad_input_exits_2(sqlite_url, tmp_path):
    assert run_cli(None, "status").returncode == 2  # no NEXUS_TENANT_DSN
    res = run_cli("postgresql://u:secret@h/db", "status", "-json")
    assert res.returncode == 2 and "secret" not in res.stdout + res.stderr
    assert json.loads(res.stdout)["exit_code"] == 2
    assert run_cli(f"sqlite:///{tmp_path / 'absent.db'}", "status").returncode == 2
    assert run_cli(sqlite_url, "frobnicate").returncode == 2  # usage
    assert run_cli(sqlite_url, "materialize", "-batch-size", "0").returncode == 2
    assert run_cli(sqlite_url, "materialize", "-batch-size", "50000").returncode == 2  # beyond a TiDB-safe transaction
    assert run_cli(sqlite_url, "materialize", "-timeout", "soon").returncode == 2
    engine = make_engine(sqlite_url)
    create_legacy_schema(engine)  # stage 1 not applied
    res = run_cli(sqlite_url, "materialize")
    assert res.returncode == 2 and "FieldHistoryEligible" in res.stderr
    engine.dispose()


def test_unreachable_server_exits_1():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    res = run_cli(f"mysql+pymysql://u:secret@127.0.0.1:{port}/tenant", "status", "-json")
    assert res.returncode == 1 and "secret" not in res.stdout + res.stderr
    assert json.loads(res.stdout)["outcome"] == "error"


def test_a_held_row_lock_times_out_with_exit_4_and_a_rerun_finishes(mysql_url):
    engine = seeded(mysql_url)
    holder = engine.connect()
    tx = holder.begin()
    holder.execute(update(Audit).where(Audit.c.ChangeId == 1).values({ELIGIBLE: True}))
    try:
        res = run_cli(mysql_url, "materialize", "-timeout", "2s", "-json")
    finally:
        tx.rollback()
        holder.close()
    assert res.returncode == 4, res.stderr
    assert "rerun materialize" in json.loads(res.stdout)["error"]
    assert run_cli(mysql_url, "materialize").returncode == 0
    assert not compat_set(engine) ^ {cid for cid, v in audit_table(engine).items() if v[2] is True}
    engine.dispose()


def big_tenant(url, rows=4000):
    engine = make_engine(url)
    make_stage1(engine)
    sc = TenantScenario()
    sc.field(1, intervals=[(100, 900), (1500, None)])
    sc.field(2, track_history=False)
    sc.write(engine)
    with engine.begin() as conn:
        conn.execute(
            insert(Audit),
            [
                {
                    "ChangeId": c,
                    "AuditId": c,
                    "ObjectName": "Contact",
                    "RecordId": "r",
                    "FieldId": 1 + c % 2,
                    "HistorySequence": c % 2000 or None,
                    "ProducerVersion": "4.11.0",
                    "CreatedAt": sc.tick(),
                }
                for c in range(1, rows + 1)
            ],
        )
    return engine


def test_killed_between_batches_then_rerun_gives_the_identical_table(tenant_url, tmp_path):
    reference_path = tmp_path / "reference.db"
    reference_path.touch()
    reference = big_tenant(f"sqlite:///{reference_path}")
    assert run_cli(f"sqlite:///{reference_path}", "materialize").returncode == 0
    engine = big_tenant(tenant_url)

    proc = subprocess.Popen([PROGRAM, "materialize", "-batch-size", "1"], env=cli_env(tenant_url), stderr=subprocess.PIPE, text=True)
    seen_first_batch = threading.Event()

    def watch():
        for line in proc.stderr:
            if "materialized 1/" in line:
                seen_first_batch.set()

    threading.Thread(target=watch, daemon=True).start()
    assert seen_first_batch.wait(60), "the CLI never reported its first batch"
    proc.send_signal(signal.SIGKILL)
    proc.wait(30)
    partial = audit_table(engine)
    decided = sum(1 for v in partial.values() if v[2] is not None)
    assert 0 < decided < 3998, "the kill must land between the first and the last batch"

    rerun = run_cli(tenant_url, "materialize", "-json")
    assert rerun.returncode == 0
    assert json.loads(rerun.stdout)["rows"] == 3998 - decided
    assert audit_table(engine) == audit_table(reference)
    engine.dispose()
    reference.dispose()

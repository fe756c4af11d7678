"""The delivery ledger's table on SQLite, MariaDB and PostgreSQL: INSERT only, idempotent, ordered by time and
declared sequence (never by its id), read on its index, and bad input writing nothing."""

from __future__ import annotations

import csv
import datetime as dt
import io
import json
import os
import subprocess
import sys
import threading

import pytest
from sqlalchemy import func, inspect, select, text

from nexus_cutover import ledger as L
from nexus_cutover.errors import BadInput
from tests.ledger_support import FORMULA_STARTS, assert_neutralised, hostile_events

T0 = dt.datetime(2026, 12, 5, 9, 0, 0, 123456, tzinfo=dt.UTC)


def ev(kind: str, seconds: float, *, step: str = "arm_fence", seq: int = 0, tenant: str = "acme", run: str = "r1",
       map_index: int = -1, try_number: int = 1, **fields) -> L.LedgerEvent:
    return L.LedgerEvent(tenant=tenant, dag_id="connector_projection_cutover", run_id=run, step=step, kind=kind,
                         recorded_at=T0 + dt.timedelta(seconds=seconds), seq=seq, map_index=map_index,
                         try_number=try_number, **fields)


def rows_in(engine) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(L.ledger_table)).scalar_one()


@pytest.fixture
def engine(ledger_url):
    engine = L.ledger_engine(ledger_url)
    yield engine
    engine.dispose()


def test_append_creates_the_table_writes_each_event_once_and_reads_it_back(engine):
    events = [ev(L.FENCE_ARMED, 0, holder="airflow:connector_projection_cutover:r1", outcome="armed",
                 detail={"fence_id": 7}),
              ev(L.CHECKPOINT, 5, step="audit_and_checkpoint", map_index=0, pack="pk-ä", cutoff=2**40, outcome="written"),
              ev(L.ANSWER, 3, step="confirm_writers_stopped", actor="ana", outcome="confirmed",
                 digest=L.digest_of({"checked_at": "x"}), reason="Ünïcode ✓ reason")]
    assert L.append(engine, events) == 3
    # a replay (a spool caught up after the events were written after all) and one new event: one more row
    assert L.append(engine, [*events, ev(L.FENCE_RELEASED, 9, step="resume_admission", outcome="released")]) == 1
    assert rows_in(engine) == 4
    got = L.history(engine, "acme")
    assert [r["kind"] for r in got] == [L.FENCE_ARMED, L.ANSWER, L.CHECKPOINT, L.FENCE_RELEASED]
    armed, answer, checkpoint, _ = got
    assert armed["holder"] == "airflow:connector_projection_cutover:r1" and armed["detail"] == {"fence_id": 7}
    assert answer["actor"] == "ana" and answer["reason"] == "Ünïcode ✓ reason"
    assert answer["digest"] == L.digest_of({"checked_at": "x"}) and answer["digest"].startswith("sha256:")
    assert checkpoint["pack"] == "pk-ä" and checkpoint["cutoff"] == 2**40 and checkpoint["map_index"] == 0
    assert armed["recorded_at"] == T0.isoformat()  # microseconds kept on every database
    assert L.history(engine, "other") == []


def test_order_is_the_time_then_the_declared_sequence_never_the_id(engine):
    # written in reverse, two events at the same instant: their declared seq decides
    same = 4.0
    events = [ev(L.DIGEST_VERIFIED, 10, step="final_old_writer_check", seq=1300),
              ev(L.FENCE_RELEASED, same, step="resume_admission", seq=1211),
              ev(L.HOST_STARTED, same, step="start_new_host", seq=1110),
              ev(L.FENCE_ARMED, 1, seq=400)]
    for e in events:  # one by one: each its own transaction, ids random
        L.append(engine, [e])
    assert [r["kind"] for r in L.history(engine, "acme")] == [L.FENCE_ARMED, L.HOST_STARTED, L.FENCE_RELEASED,
                                                               L.DIGEST_VERIFIED]
    ids = [r["event_id"] for r in L.history(engine, "acme")]
    assert len(set(ids)) == 4 and all(len(i) == 32 for i in ids)


def test_the_same_event_from_two_writers_at_once_is_one_row(engine):
    events = [ev(L.CHECKPOINT, i, step="audit_and_checkpoint", map_index=i, pack=f"pk-{i}") for i in range(30)]
    errors: list[BaseException] = []

    def write():
        try:
            L.append(engine, events)
        except BaseException as exc:  # noqa: BLE001 - surfaced below
            errors.append(exc)

    threads = [threading.Thread(target=write) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    assert not errors, errors
    assert rows_in(engine) == 30


def test_a_bad_event_writes_nothing_of_its_batch(engine):
    good = ev(L.FENCE_ARMED, 0)
    with pytest.raises(BadInput, match="unknown ledger event kind 'fence_painted'"):
        L.append(engine, [good, ev("fence_painted", 1)])
    with pytest.raises(BadInput, match="without tenant"):
        L.append(engine, [good, ev(L.STOPPED, 1, tenant="")])
    assert not inspect(engine).has_table(L.TABLE) or rows_in(engine) == 0
    with pytest.raises(BadInput, match="not a ledger event"):
        L.LedgerEvent.from_json({"kind": L.STOPPED})


def test_nothing_updates_or_deletes_a_row(engine):
    """The module writes only INSERTs: every statement it sends is a SELECT, an INSERT or the table's DDL."""
    from sqlalchemy import event

    seen: list[str] = []
    event.listen(engine, "before_cursor_execute", lambda *a: seen.append(a[2].lstrip().split()[0].upper()))
    L.append(engine, [ev(L.FENCE_ARMED, 0), ev(L.STOPPED, 1, step="wait_for_drain")])
    L.append(engine, [ev(L.FENCE_ARMED, 0)])
    L.history(engine, "acme")
    assert seen and set(seen) <= {"SELECT", "INSERT", "CREATE", "PRAGMA", "SHOW", "DESCRIBE", "BEGIN", "COMMIT"}, set(seen)


def test_the_report_read_is_on_the_index(engine):
    L.append(engine, [ev(L.FENCE_ARMED, i, run=f"r{i}", tenant=f"t{i % 7}") for i in range(200)])
    sql = (f"SELECT event_id FROM {L.TABLE} WHERE tenant = 't3' ORDER BY recorded_at, seq")
    with engine.connect() as conn:
        name = engine.dialect.name
        if name == "sqlite":
            plan = " ".join(str(r) for r in conn.execute(text(f"EXPLAIN QUERY PLAN {sql}")))
        elif name == "postgresql":
            conn.execute(text("SET enable_seqscan = off"))  # 200 rows: the planner's choice, not the index's absence
            plan = " ".join(str(r) for r in conn.execute(text(f"EXPLAIN {sql}")))
        else:
            plan = " ".join(str(dict(r._mapping)) for r in conn.execute(text(f"EXPLAIN {sql}")))
    assert "ix_nexus_delivery_ledger_tenant_order" in plan, plan


def test_csv_is_what_a_reviewer_keeps(engine):
    L.append(engine, [ev(L.STOPPED, 0, step="wait_for_drain", reason='stuck: "retry", not due,\nnext line',
                         detail={"error": "TaskStopped"}),
                      ev(L.CHECKPOINT, 1, step="audit_and_checkpoint", map_index=1, pack="pk-b", cutoff=42)])
    rows = list(csv.DictReader(io.StringIO(L.to_csv(L.history(engine, "acme")))))
    assert [r["kind"] for r in rows] == [L.STOPPED, L.CHECKPOINT]
    assert rows[0]["reason"] == 'stuck: "retry", not due,\nnext line'
    assert json.loads(rows[0]["detail"]) == {"error": "TaskStopped"}
    assert rows[1]["cutoff"] == "42" and rows[1]["pack"] == "pk-b"
    assert tuple(rows[0]) == L.COLUMNS


def test_csv_never_hands_a_spreadsheet_a_formula(engine):
    L.append(engine, [*hostile_events("acme", T0), ev(L.FENCE_ARMED, 99, holder="h1", reason="plain - text = fine")])
    history = L.history(engine, "acme")
    rows = list(csv.DictReader(io.StringIO(L.to_csv(history), newline="")))
    assert_neutralised(rows[:-1], "acme")
    assert rows[-1]["holder"] == "h1" and rows[-1]["reason"] == "plain - text = fine"  # only a first character counts
    # the ledger itself and the JSON report keep the text as it was written
    assert [r["reason"][0] for r in history[:-1]] == list(FORMULA_STARTS)


def test_nexus_cutover_report_prints_the_history_with_its_dsn_masked(ledger_url, engine, tmp_path):
    L.append(engine, [ev(L.FENCE_ARMED, 0, holder="h1", outcome="armed"),
                      ev(L.ANSWER, 2, step="confirm_writers_stopped", actor="ana", outcome="confirmed")])
    env = {**os.environ, L.DSN_ENV_LEDGER: ledger_url}
    env.pop("NEXUS_TENANT_DSN", None)  # the report needs no tenant database
    cli = [os.path.join(os.path.dirname(sys.executable), "nexus-cutover"), "report", "-namespace", "acme"]
    as_json = subprocess.run([*cli, "-json"], env=env, capture_output=True, text=True, timeout=60)
    assert as_json.returncode == 0, as_json.stderr
    out = json.loads(as_json.stdout)
    assert [e["kind"] for e in out["events"]] == [L.FENCE_ARMED, L.ANSWER] and out["events"][1]["actor"] == "ana"
    as_csv = subprocess.run([*cli, "-csv"], env=env, capture_output=True, text=True, timeout=60)
    assert as_csv.returncode == 0, as_csv.stderr
    assert [r["holder"] for r in csv.DictReader(io.StringIO(as_csv.stdout))] == ["h1", ""]
    # a reviewer's spreadsheet runs no cell of the command's CSV (read in binary: the \r start kept)
    L.append(engine, hostile_events("hostile", T0))
    hostile = subprocess.run([*cli[:-1], "hostile", "-csv"], env=env, capture_output=True, timeout=60)
    assert hostile.returncode == 0, hostile.stderr
    assert_neutralised(list(csv.DictReader(io.StringIO(hostile.stdout.decode("utf-8"), newline=""))), "hostile")
    as_text = subprocess.run(cli, env=env, capture_output=True, text=True, timeout=60)
    assert "fence_armed" in as_text.stdout and "actor=ana" in as_text.stdout
    password = L.ledger_url(ledger_url).password
    for proc in (as_json, as_csv, as_text):
        assert "report on " in proc.stderr
        if password:
            assert password not in proc.stderr + proc.stdout and "***" in proc.stderr


def test_a_ledger_that_is_down_is_a_clear_error_within_its_bound(postgres_url):
    """A server that does not answer: the command says so (exit 1) in seconds, its password never shown."""
    from tests.ledger_support import free_port

    url = L.ledger_url(postgres_url).set(port=free_port())
    env = {**os.environ, L.DSN_ENV_LEDGER: url.render_as_string(hide_password=False)}
    proc = subprocess.run([os.path.join(os.path.dirname(sys.executable), "nexus-cutover"), "report", "-namespace",
                           "acme", "-json"], env=env, capture_output=True, text=True, timeout=60)
    assert proc.returncode == 1, proc.stdout + proc.stderr
    assert "cannot read the ledger" in json.loads(proc.stdout)["error"]
    assert url.password not in proc.stdout + proc.stderr


def test_the_evidence_shown_is_kept_bounded_with_the_digest_of_the_whole_and_printed_under_its_row():
    """Issue 51, item 3: a reviewer a year later sees which writers were shown, not only a hash."""
    from nexus_cutover import events as E

    processes = [{"process_id": f"old-{i:04d}", "role": "ingress_writer", "binary_version": "4.11.0",
                  "state": "stopped", "last_heartbeat_at": "2026-12-01T10:00:00", "heartbeat_age_s": 9.5,
                  "stopped_at": "2026-12-01T10:00:01", "extra": "x" * 50} for i in range(2000)]
    shown = {"namespace": "acme", "checked_at": "2026-12-01T10:05:00", "live": [], "processes": processes}
    event = E.evidence_shown("confirm_writers_stopped", "Confirm", shown)
    kept = event.detail["evidence"]
    assert event.digest == E.digest_of(shown)  # of the whole, kept copy or not
    assert 0 < kept["rows_kept"] < kept["rows_total"] == 2000
    assert len(json.dumps(kept)) <= E.EVIDENCE_KEPT_CHARS
    assert kept["processes"][0] == {k: processes[0][k] for k in E.WRITER_COLUMNS}  # the columns a person read
    small = E.evidence_shown("confirm_writers_stopped", "Confirm", {**shown, "processes": processes[:3]})
    line = L.line_of({"recorded_at": "t", "dag_id": "d", "run_id": "r", "step": "confirm_writers_stopped",
                      "map_index": -1, "kind": L.EVIDENCE_SHOWN, "digest": small.digest, "detail": small.detail})
    assert "3 writer(s); none live" in line and all(f"old-000{i}  ingress_writer  4.11.0  stopped" in line for i in range(3))
    assert E.kept_evidence("a question's body")["text"] == "a question's body"

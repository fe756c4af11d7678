"""The status view's parts without an Airflow server: the tenant cache, the fleet listing, ETA, redaction, run steps.

Real SQLite tenant databases opened through real ``nexus_tenant_*`` connections
(``AIRFLOW_CONN_*`` environment variables); no metadata DB is needed here (the
runs' part answers {} without one, which the listing must survive).
"""

from __future__ import annotations

import threading

import pytest

from nexus_cutover import catalog
from nexus_cutover.db import make_engine
from nexus_sim.scenario import TenantScenario
from tests.dags.airflow_harness import connection_json
from tests.support import make_cutover_ready


def _tenant_file(tmp_path, name: str) -> str:
    path = tmp_path / f"{name}.db"
    path.touch()
    engine = make_engine(f"sqlite:///{path}")
    try:
        make_cutover_ready(engine)
    finally:
        engine.dispose()
    return f"sqlite:///{path}"


@pytest.fixture
def fleet(tmp_path, monkeypatch):
    """30 tenants on one cheap SQLite file (each its own namespace), 2 whose file is missing: conn ids, bad ones."""
    url = _tenant_file(tmp_path, "shared")
    missing = f"sqlite:///{tmp_path / 'missing.db'}"
    ids = [f"nexus_tenant_unit{i:03d}" for i in range(30)]
    bad = [ids[7], ids[19]]
    for conn_id in ids:
        monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection_json(missing if conn_id in bad else url))
    return ids, bad


class Clock:
    def __init__(self) -> None:
        self.now = 1_000_000.0

    def __call__(self) -> float:
        return self.now


class Tracking:
    """The real reader, counting how many reads run at once; reads wait while ``gate`` is clear."""

    def __init__(self) -> None:
        from nexus_status.tenants import read_tenant

        self.read, self.lock, self.running, self.peak = read_tenant, threading.Lock(), 0, 0
        self.gate = threading.Event()
        self.gate.set()

    def __call__(self, conn_id: str):
        assert self.gate.wait(60)
        with self.lock:
            self.running += 1
            self.peak = max(self.peak, self.running)
        try:
            return self.read(conn_id)
        finally:
            with self.lock:
                self.running -= 1


def test_each_tenant_read_once_per_interval_whatever_the_viewers(fleet):
    from nexus_status.tenants import StateCache

    ids, bad = fleet
    clock, reader = Clock(), Tracking()
    cache = StateCache(reader, interval_s=10.0, workers=3, clock=clock)
    try:
        viewers = [threading.Thread(target=cache.get, args=(ids,)) for _ in range(5)]
        for v in viewers:
            v.start()
        for v in viewers:
            v.join(60)
        assert cache.total_reads() == 30 and set(cache.reads.values()) == {1}  # five viewers, one read each
        assert 1 <= reader.peak <= 3  # bounded concurrency
        states = cache.get(ids)
        assert cache.total_reads() == 30  # still within the interval: from the cache
        assert {c for c, s in states.items() if s["phase"] == "unreadable"} == set(bad)
        assert all(states[c]["phase"] == "not started" for c in ids if c not in bad)
        assert "does not exist" in states[bad[0]]["error"]
        clock.now += 9.9
        cache.get(ids[:4])
        cache.settle()
        assert cache.total_reads() == 30
        clock.now += 0.2  # the interval has passed: served at once marked stale, re-read once in the background
        reader.gate.clear()  # the re-reads cannot finish until the gate opens: an answer now did not wait for them
        answers: list[dict] = []
        viewer = threading.Thread(target=lambda: answers.append(cache.get(ids[:4], wait_s=120)))
        viewer.start()
        viewer.join(20)
        assert answers and all({k: v for k, v in answers[0][c].items() if k != "stale"} == states[c] for c in ids[:4])
        assert all(answers[0][c]["stale"]["age_s"] == 10 for c in ids[:4])
        cache.get(ids[:4])
        reader.gate.set()
        cache.settle()
        assert cache.total_reads() == 34 and [cache.reads[c] for c in ids[:5]] == [2, 2, 2, 2, 1]
        after = cache.get(ids[:4])
        assert all(after[c] is not states[c] for c in ids[:4])  # the re-read state, not the old one
    finally:
        cache.close()


def test_a_row_is_fresh_or_says_plainly_that_it_is_stale_and_since_when(fleet):
    """Issue 34.5: the view opened minutes after its last read showed that read as the tenant's state."""
    from nexus_status.tenants import StateCache

    ids, _ = fleet
    clock, reader = Clock(), Tracking()
    cache = StateCache(reader, interval_s=3.0, workers=2, clock=clock)
    try:
        first = cache.get(ids[:2])
        assert all("stale" not in first[c] for c in ids[:2])
        clock.now += 265  # nobody looked for 265 s
        reader.gate.clear()  # the re-read cannot finish: the row cannot be fresh, so it says it is not
        stale = cache.get(ids[:2], fresh_wait_s=0.2)
        for c in ids[:2]:
            assert stale[c]["stale"]["age_s"] == 265
            assert stale[c]["stale"]["text"] == "stale: this row was read at 13:46:40 UTC (265 s ago); a new read is under way"
        reader.gate.set()  # the re-read can finish: the page's rows wait for it and are fresh
        fresh = cache.get(ids[:2], fresh_wait_s=60)
        assert all("stale" not in fresh[c] and fresh[c] is not first[c] for c in ids[:2])
        assert [cache.reads[c] for c in ids[:2]] == [2, 2]
    finally:
        reader.gate.set()
        cache.close()


def test_listing_accounts_for_every_tenant(fleet):
    from nexus_status.fleet import listing
    from nexus_status.tenants import StateCache

    ids, bad = fleet
    cache = StateCache(interval_s=3600.0, workers=2)
    try:
        seen = []
        first = listing(page=1, page_size=7, cache=cache, conn_ids=ids)
        assert first["pages"] == 5 and cache.total_reads() == 7  # only the page's tenants were read
        for page in range(1, 6):
            body = listing(page=page, page_size=7, cache=cache, conn_ids=ids)
            c = body["counts"]
            assert c["total"] == c["shown"] + c["filtered_out"] + c["other_pages"] == 30
            seen += [t["conn_id"] for t in body["tenants"]]
        assert seen == ids and cache.total_reads() == 30
        unreadable = listing(state="unreadable", page_size=50, cache=cache, conn_ids=ids)
        assert [t["conn_id"] for t in unreadable["tenants"]] == bad
        assert unreadable["counts"] == {"total": 30, "shown": 2, "filtered_out": 28, "other_pages": 0,
                                        "matching": 2, "unreadable": 2}
        started = listing(state="not started", page=2, page_size=20, cache=cache, conn_ids=ids)
        assert started["counts"] == {"total": 30, "shown": 8, "filtered_out": 2, "other_pages": 20,
                                     "matching": 28, "unreadable": 0}
        found = listing(search="UNIT01", cache=cache, conn_ids=ids)
        assert [t["tenant"] for t in found["tenants"]] == [f"unit01{i}" for i in range(10)]
        assert cache.total_reads() == 30  # the filters read nothing new within the interval
    finally:
        cache.close()


def test_eta_from_the_measured_rate():
    from nexus_status.history import RATE_WINDOW_S, drain_eta

    from nexus_airflow.pollers import eta_minutes, eta_text, measured_rate

    assert measured_rate([(0.0, 100)]) is None
    assert measured_rate([(0.0, 100), (60.0, 70)]) == pytest.approx(30.0)
    assert eta_minutes(70, 30.0) == 3 and eta_text(70, 30.0) == "30.0 items/min, ETA ~3 min"
    assert eta_minutes(0, None) == 0 and eta_text(0, None) == "drained"
    assert eta_minutes(5, -2.0) is None and "no progress measured: -2.0 items/min" in eta_text(5, -2.0)
    # the page's ETA: the last RATE_WINDOW_S of samples only (an early burst does not skew it)
    t0 = 10_000.0
    samples = [{"t": t0, "remaining": 1000}, {"t": t0 + 1, "remaining": 400},
               {"t": t0 + RATE_WINDOW_S + 1, "remaining": 400}, {"t": t0 + RATE_WINDOW_S + 121, "remaining": 380}]
    assert drain_eta(samples) == {"remaining": 380, "rate_per_min": 10.0, "eta_min": 38,
                                  "text": "10.0 items/min, ETA ~38 min"}


def test_drain_poller_logs_its_eta_each_poll(tmp_path, monkeypatch):
    from nexus_airflow.pollers import DrainPoller, deadline_in, eta_minutes, measured_rate

    url = _tenant_file(tmp_path, "poll")
    engine = make_engine(url)
    sc = TenantScenario(namespace="acme")
    lane = sc.pack("pk-a").lane("l")
    items = [lane.generation(1, status="pending")[1] for _ in range(4)]
    sc.write(engine)
    monkeypatch.setenv("AIRFLOW_CONN_NEXUS_TENANT_ETA", connection_json(url))
    poller = DrainPoller("nexus_tenant_eta", "acme", deadline_in(600), 600)
    try:
        one = poller.poll()
        assert one["remaining"] == 4 and one["message"].endswith("; ETA unknown (one sample so far)")
        with engine.begin() as conn:  # the old runtime (simulated) completes two items
            conn.execute(catalog.WorkItem.update().where(catalog.WorkItem.c.WorkId.in_(
                [items[0]["WorkId"], items[1]["WorkId"]])).values(Status="completed"))
        two = poller.poll()
        rate = measured_rate(list(poller.samples))
        assert two["remaining"] == 2 and rate > 0 and two["rate_per_min"] == rate
        assert two["eta_min"] == eta_minutes(2, rate) >= 1
        assert two["message"].endswith(f"; {rate:.1f} items/min, ETA ~{two['eta_min']} min")
        assert "-2 since last poll" in two["message"]
    finally:
        poller.close()
        engine.dispose()


def test_no_dsn_or_password_in_redacted_text():
    from nexus_status.app import redact_tree
    from nexus_status.redact import redact

    text = redact("OperationalError: mysql+pymysql://cutover:s3cret@db.internal:4000/t (password=hunter2, pwd: x1)")
    assert "s3cret" not in text and "db.internal" not in text and "hunter2" not in text and "x1" not in text
    assert text.startswith("OperationalError: [DSN hidden]")
    tree = redact_tree({"a": ["postgresql://l@ledger.internal/l", {"b": "ok /dags/x/runs/y"}], "n": 3})
    assert tree == {"a": ["[DSN hidden]", {"b": "ok /dags/x/runs/y"}], "n": 3}
    # a file database's URL names no host, user or password: a command showing it stays pasteable (issue 51, item 2)
    command = "NEXUS_TENANT_DSN=sqlite:////srv/run/tenant-demo.db python -m nexus_sim.upgrade --namespace demo"
    assert redact(command) == command
    for hidden in ("sqlite://u:pw@host/x.db", "sqlite+pysqlite://h/x", "mysql://h/db", "sqlite:///x.db?password=p"):
        assert "[DSN hidden]" in redact(hidden) or "***" in redact(hidden), hidden
        assert "pw" not in redact(hidden).replace("pwd", "") and "host" not in redact(hidden), hidden


def test_run_step_reason_and_next_action_from_the_one_source():
    from nexus_status.runs import summarize

    from nexus_cutover.projection.next_actions import next_action

    failed = summarize("connector_projection_cutover", "r/1", "failed",
                       [("audit_and_checkpoint", "failed"), ("start_new_host", "upstream_failed")],
                       {"message": "Refused: lock on mysql://u:pw@h/db", "findings": []})
    assert failed["task"] == "audit_and_checkpoint" and failed["reason"] == "Refused: lock on [DSN hidden]"
    assert failed["next_action"] == next_action("audit_and_checkpoint")
    assert failed["link"] == "/dags/connector_projection_cutover/runs/r%2F1"
    waiting = summarize("connector_projection_cutover", "r2", "running", [("confirm_writers_stopped", "awaiting_input")],
                        None)
    assert waiting["task_state"] == "awaiting_input" and waiting["next_action"] == next_action("confirm_writers_stopped")
    running = summarize("connector_projection_cutover", "r3", "running", [("wait_for_drain", "deferred")], None)
    assert running["next_action"] is None and "deferred" in running["reason"]
    nothing = summarize("connector_projection_cutover", "r4", "failed", [("history_digest", "failed")], None)
    assert nothing["reason"] == "no reason recorded: read the task log"


def test_a_fused_task_shows_the_step_it_is_at(tmp_path, monkeypatch):
    """Issue 36, item 4: the task resume_admission runs verify_readiness then resume_admission. Deferred, the view
    shows the readiness wait (explained from the tenant: no new host yet); failed, the step its stop names."""
    from nexus_status.runs import summarize, with_tenant_state

    from nexus_cutover.projection.next_actions import next_action

    dag = "connector_projection_cutover"
    waiting = summarize(dag, "r1", "running", [("resume_admission", "deferred")], None)
    assert waiting["task"] == "verify_readiness"
    state = _tenant_state(tmp_path, monkeypatch, "nohost", lambda sc: None)
    explained = with_tenant_state({"cutover": waiting}, state)["cutover"]
    assert explained["reason"].startswith("waiting for the new host (") and explained["next_action"].startswith("start or fix")
    stopped = summarize(dag, "r2", "failed", [("resume_admission", "failed")],
                        {"message": "the new host did not become ready. Next: check it.", "step": "verify_readiness"})
    assert stopped["task"] == "verify_readiness" and stopped["next_action"] == "check it."
    released = summarize(dag, "r3", "failed", [("resume_admission", "failed")], {"message": "held by another run"})
    assert released["task"] == "resume_admission" and released["next_action"] == next_action("resume_admission")
    running = summarize(dag, "r4", "running", [("resume_admission", "running")], None)
    assert running["task"] == "resume_admission"


def test_chart_points_thin_evenly_and_keep_both_ends():
    from nexus_status.fleet import chart_points

    samples = [{"t": float(i), "remaining": 1000 - i} for i in range(361)]
    thin = chart_points(samples, 120)
    assert len(thin) == 120 and thin[0] is samples[0] and thin[-1] is samples[-1]
    gaps = {b["t"] - a["t"] for a, b in zip(thin, thin[1:], strict=False)}
    assert gaps <= {3.0, 4.0}  # even: 360 / 119 steps of 3 or 4 samples
    assert chart_points(samples[:50], 120) == samples[:50]


def _tenant_state(tmp_path, monkeypatch, name: str, build) -> dict:
    """The real reader's state of a SQLite tenant ``name`` after ``build(scenario)``."""
    from nexus_status.tenants import read_tenant

    url = _tenant_file(tmp_path, name)
    sc = TenantScenario(namespace=name)
    build(sc)
    engine = make_engine(url)
    try:
        sc.write(engine)
    finally:
        engine.dispose()
    conn_id = f"nexus_tenant_{name}"
    monkeypatch.setenv(f"AIRFLOW_CONN_{conn_id.upper()}", connection_json(url))
    return read_tenant(conn_id)


def test_what_now_names_the_live_writers_while_check_old_writers_waits(tmp_path, monkeypatch):
    """Issue 34.7: the deferred step said only that its progress was in the task log."""
    from nexus_status.runs import summarize, with_tenant_state

    def build(sc):
        for i in (1, 2, 3):
            sc.process(catalog.ROLE_INGRESS_WRITER, process_id=f"old-ingress-{i}")

    state = _tenant_state(tmp_path, monkeypatch, "writers", build)
    run = summarize("connector_projection_cutover", "r1", "running", [("check_old_writers", "deferred")], None)
    assert "task log" in run["reason"] and run["next_action"] is None  # what the view said before
    explained = with_tenant_state({"cutover": run}, state)["cutover"]
    assert explained["reason"] == ("waiting for 3 live old writer(s) to be stopped (old-ingress-1, old-ingress-2, "
                                   "old-ingress-3), then a person's confirmation")
    assert explained["next_action"].startswith("stop every live old writer named (keep the fence)")
    assert with_tenant_state({"cutover": run}, {**state, "stale": {"age_s": 300}})["cutover"] == run  # no stale cause


def test_a_stuck_drain_names_its_causes_with_their_counts(tmp_path, monkeypatch):
    import datetime as dt

    from nexus_status import history
    from nexus_status.fleet import _row
    from nexus_status.runs import summarize, with_tenant_state

    def build(sc):
        lane = sc.pack("pk-a").lane("lane-1")
        for _ in range(2):
            lane.generation(1, status="processing", lease_owner="old-worker-gone",
                            lease_expires_at=sc.now - dt.timedelta(minutes=5))
        for _ in range(3):
            lane.generation(1, status="pending")

    state = _tenant_state(tmp_path, monkeypatch, "stuck", build)
    assert state["drain"]["state"] == "stuck"
    row = _row(state, {}, history)
    assert row["drain"]["blockers_text"] == ("stuck: 2 processing items whose lease expired (their worker is gone); "
                                             "3 pending items while no live old-protocol projection_worker heartbeats")
    run = summarize("connector_projection_cutover", "r1", "running", [("wait_for_drain", "deferred")], None)
    explained = with_tenant_state({"cutover": run}, state)["cutover"]
    assert explained["reason"] == ("the drain is stuck: 2 processing items whose lease expired (their worker is gone); "
                                   "3 pending items while no live old-protocol projection_worker heartbeats")
    assert "old runtime" in explained["next_action"]


def test_after_a_cutover_success_what_now_names_field_history(tmp_path, monkeypatch):
    from nexus_status.runs import summarize, with_tenant_state

    state = _tenant_state(tmp_path, monkeypatch, "done", lambda sc: None)
    run = summarize("connector_projection_cutover", "r1", "success", [], None)
    explained = with_tenant_state({"cutover": run}, state)["cutover"]
    assert explained["next_action"].startswith("trigger field_history_eligibility for this tenant (Field History: stage")
    stage = state["field_history"]["stage"]
    # what the next run needs, the producer upgrade included until stage 2 is done (issue 51, item 2)
    assert ("upgrade the producers" if stage == 0 else "upgrade every producer" if stage == 1
            else "target_stage 3") in explained["next_action"], explained["next_action"]
    with_fh = with_tenant_state({"cutover": run, "field_history": {"state": "running"}}, state)["cutover"]
    assert with_fh["next_action"] is None  # its own run says where it is


def test_the_chip_says_starting_while_a_run_has_not_paused_the_tenant_yet(tmp_path, monkeypatch):
    """Issue 51, item 9: a tenant whose cutover run waits for a short drain before arming is not "not started"."""
    from nexus_status import history
    from nexus_status.fleet import STARTING, _row
    from nexus_status.runs import summarize

    state = _tenant_state(tmp_path, monkeypatch, "early", lambda sc: sc.pack("pk-a").lane("lane-1").generation(1))
    assert state["phase"] == "not started"
    waiting = summarize("connector_projection_cutover", "r1", "running", [("wait_for_short_drain", "deferred")], None)
    row = _row(state, {"early": {"runs": {"cutover": waiting}}}, history)
    assert (row["phase"], row["chip"]) == ("not started", STARTING)  # the filter's word stays the database's
    failed = summarize("connector_projection_cutover", "r1", "failed", [("resolve_packs", "failed")], None)
    assert _row(state, {"early": {"runs": {"cutover": failed}}}, history)["chip"] == "not started"
    assert _row(state, {}, history)["chip"] == "not started"


def test_what_now_after_a_back_out_no_longer_says_retry_or_back_out(tmp_path, monkeypatch):
    """Issue 51, item 7: a rejected run whose fence was then backed out: What now? says it was released without a
    cutover, by whom, and what is left to do, instead of the rejected question's "retry, or back out"."""
    from nexus_status.runs import summarize, with_tenant_state
    from nexus_status.tenants import read_tenant

    from nexus_cutover.projection import back_out, cutover_fence

    run_id = "manual__2026-12-07T10:00:00+00:00"
    rejected = f"airflow:connector_projection_cutover:{run_id}"
    _tenant_state(tmp_path, monkeypatch, "backed", lambda sc: sc.pack("pk-a").lane("lane-1").generation(1))
    engine = make_engine(f"sqlite:///{tmp_path / 'backed.db'}")
    report = {"message": "cutover not performed: eng rejected it. Next: to try again, ... To back out instead: ..."}
    run = summarize("connector_projection_cutover", run_id, "failed", [("confirm_writers_stopped", "failed")], report)
    try:
        fence_id = cutover_fence.arm_fence(engine, "backed", armed_by=rejected, timeout_s=30).fence_id
        fenced = with_tenant_state({"cutover": run}, read_tenant("nexus_tenant_backed"))
        assert fenced["cutover"]["next_action"].startswith("to try again")  # still fenced: the stop's advice holds
        back_out.back_out(engine, "backed", fence_id, holder="airflow:connector_projection_back_out:bo-1",
                          holder_state=lambda _h: cutover_fence.HOLDER_FINISHED, timeout_s=30)
    finally:
        engine.dispose()
    state = read_tenant("nexus_tenant_backed")
    said = with_tenant_state({"cutover": run}, state)["cutover"]["next_action"]
    assert said.startswith(f"nothing for this run: the fence it left (fence {fence_id}) was released without a cutover")
    assert "airflow:connector_projection_back_out:bo-1" in said and "restart the old writers" in said
    assert state["phase"] == "not started"  # nothing was cut over


def test_a_field_history_run_that_stopped_short_of_stage_3_names_the_next_run(tmp_path, monkeypatch):
    """Issue 51, item 2: a run with target_stage 1 succeeds after stage 1; its What now? says the tenant is not done
    and what the next run needs (the producer upgrade, then target_stage 3), instead of looking finished."""
    from nexus_status.runs import summarize, with_tenant_state

    state = _tenant_state(tmp_path, monkeypatch, "fh", lambda sc: None)
    fh = {**state["field_history"], "stage": 1, "stage_text": "stage 1 done"}
    run = summarize("field_history_eligibility", "f1", "success", [], None)
    said = with_tenant_state({"field_history": run}, {**state, "field_history": fh})["field_history"]["next_action"]
    assert said.startswith("Field History is at stage 1 done, not done: trigger field_history_eligibility again")
    assert "upgrade every producer" in said and "target_stage 3" in said
    done = {**fh, "stage": 3, "stage_text": "stage 3 done"}
    assert with_tenant_state({"field_history": run}, {**state, "field_history": done})["field_history"] == run

"""The cutover's steps and the reference host on the production-shaped tenant, with live traffic (issues 24, 25).

What the builder's repro script (``scripts/production_breakages.py``, now removed) reproduced against main before
issues 24 and 25, as tests, on SQLite and on MariaDB tenants of the server's utf8mb4 default (case-insensitive,
PAD SPACE) and of ``utf8mb4_bin``:

* a live old writer behind 10,000 stopped registry rows is seen by the writer evidence and refuses readiness
  (it was invisible past the first 1,000 rows);
* every pack of the tenant is checkpointed beside ordinary work in every status, retention-trimmed ordinary Events
  and ordinary work that keeps arriving during the cutover (it was ``live_work`` / ``missing_owner``), and the
  drain never waits for ordinary work;
* the history digest taken while fenced verifies after the release although ordinary work kept arriving and
  completing, and the new host admitted new range work (it failed with "extra history row");
* ``nexus-host`` admits hostile receipts (case-variant lanes and ids, trailing spaces): every projection Event above
  the cutoff lies in exactly one range generation as the server's join sees it; a receipt the collation equates
  with an admitted one but whose bytes differ is a collision, named with both keys, left unconfirmed, while every
  other receipt of its pack is admitted (it was retried until "timed out waiting for lock").
"""

from __future__ import annotations

import datetime as dt
import os
import pathlib
import subprocess
import sys
import threading
import time

from nexus_cutover import catalog
from nexus_cutover.clock import utcnow
from nexus_cutover.db import make_engine
from nexus_cutover.projection import steps
from nexus_cutover.runtime.host import run_host
from nexus_cutover.schema import apply_steps, projection_steps
from nexus_sim.checks import live_ordinary_work, projection_owners_after_cutoff, receipt_outcomes
from nexus_sim.scenario.production import FUTURE_COLLISION, build_production_tenant
from nexus_sim.traffic import LiveTraffic

NS = "prod"
STALE = dt.timedelta(seconds=60)
REPO = pathlib.Path(__file__).resolve().parents[2]


def test_a_live_old_writer_behind_ten_thousand_stopped_rows_is_seen_and_refuses_readiness(collated_tenant_url):
    engine = make_engine(collated_tenant_url)
    try:
        planted = build_production_tenant(engine, namespace=NS, live_old_writers=True).planted
        assert planted.registry_stopped_rows == 10_000
        evidence = steps.writer_evidence(engine, NS, stale_heartbeat=STALE)
        assert sorted(p["process_id"] for p in evidence.live) == sorted(planted.live_processes)
        writers = sum(n for role, n in planted.registry_stopped_by_role.items() if role in catalog.OLD_WRITER_ROLES)
        assert not evidence.all_stopped_or_silent and evidence.stopped_total == writers > 5_000
        ready = steps.readiness(engine, NS, stale_heartbeat=STALE)
        assert not ready.ready and any(pid in " ".join(ready.reasons) for pid in planted.live_processes), ready.reasons
    finally:
        engine.dispose()


def _wait(what: str, cond, timeout_s: float = 60.0) -> None:
    deadline = time.monotonic() + timeout_s
    while not cond():
        assert time.monotonic() < deadline, f"not {what} within {timeout_s:.0f}s"
        time.sleep(0.2)


def test_the_cutover_with_traffic_throughout_then_the_host_on_hostile_receipts(collated_tenant_url):
    engine = make_engine(collated_tenant_url)
    stop = threading.Event()
    host = None
    try:
        tenant = build_production_tenant(engine, namespace=NS)
        p, sc = tenant.planted, tenant.scenario
        packs = p.active_packs
        traffic = LiveTraffic(engine, p, receipts_after_release=True, future_per_tick=3)

        apply_steps(engine, projection_steps(engine))
        fence = steps.actions.arm_fence(engine, NS, holder="prod-test", packs=packs, timeout_s=30)
        traffic.tick()  # ordinary work arrives while fenced (receipts are held for the new host)
        drain = steps.drain(engine, NS, deadline=dt.datetime.now(dt.UTC).replace(tzinfo=None) + STALE,
                            stale_heartbeat=STALE)
        assert drain.state == "drained", drain.counts_text()  # ordinary work in every status is not waited for
        assert steps.writer_evidence(engine, NS, stale_heartbeat=STALE).all_stopped_or_silent
        digest = steps.actions.history_digest(engine, NS, timeout_s=60)
        traffic.tick()
        results = {pack: steps.checkpoint(engine, pack, timeout_s=60, written_by="prod-test") for pack in packs}
        assert {pack: (r.outcome, r.findings) for pack, r in results.items()} == {pack: ("written", []) for pack in packs}
        cutoffs = {pack: r.legacy_max_ordinal for pack, r in results.items()}
        during = {o[0]: o[3] for o in traffic.report.ordinary}  # ordinary ordinals allocated during the cutover count
        assert all(cutoffs[pack] >= max(p.last_ordinal[pack], during.get(pack, 0)) for pack in packs)

        host = threading.Thread(target=run_host, args=(engine, NS), daemon=True, kwargs={
            "stop_event": stop, "heartbeat_s": 0.3, "poll_s": 0.1, "process_id": "prod-host"})
        host.start()
        _wait("ready", lambda: steps.readiness(engine, NS, stale_heartbeat=STALE).ready)
        released_at = utcnow()
        released = steps.release_fence(engine, NS, fence.fence_id, holder="prod-test", stale_heartbeat=STALE,
                                       timeout_s=30)
        assert released.outcome == "released"
        while traffic.future:  # every planned future receipt sent, with new receipts and ordinary work beside them
            traffic.tick()
        traffic.tick()
        report = traffic.report
        assert report.errors == [] and report.ticks_after_release >= 2 and report.receipts_held == 2
        collisions = [(f.pack_install_id, f.source_lane, f.receipt_id) for f in report.collisions_stored]
        admissible = report.receipts + [(f.pack_install_id, f.source_lane, f.receipt_id) for f, outcome in report.future_sent
                                        if outcome == "stored" and f.kind != FUTURE_COLLISION] + p.pending_receipts
        _wait("every admissible receipt confirmed",
              lambda: all(receipt_outcomes(engine, admissible).values()), timeout_s=120)
        stop.set()
        host.join(30)

        drained = subprocess.run(
            [sys.executable, "-m", "nexus_cutover.cli.host", "--namespace", NS, "--drain-and-exit"],
            env={**os.environ, "NEXUS_TENANT_DSN": collated_tenant_url, "NEXUS_HOST_POLL_S": "0.1",
                 "PYTHONPATH": str(REPO / "include")}, capture_output=True, text=True, timeout=180)
        if collisions:  # named with both keys, never retried until a lock timeout, left unconfirmed for review
            assert drained.returncode != 0 and "collision" in drained.stderr, drained.stderr[-2000:]
            assert "timed out waiting for lock" not in drained.stderr
            for key in collisions:
                assert repr(key[2]) in drained.stderr, (key, drained.stderr[-2000:])
            assert set(receipt_outcomes(engine, collisions).values()) == {False}
        else:
            assert drained.returncode == 0, drained.stderr[-2000:]
        assert collisions or p.collation["dialect"] == "sqlite"  # the MariaDB tenants send collisions

        owners = projection_owners_after_cutoff(engine, cutoffs)
        assert owners["not_exactly_one"] == [] and owners["checked"] >= len(admissible), owners
        after = [o for o in report.ordinary if o[3] > cutoffs[o[0]]]
        assert owners["ordinary_above_cutoff"] == len(after) > 0  # ordinary work the new runtime created: no generation
        held = live_ordinary_work(engine, sc.work_items)
        assert held and all(before == now for before, now in held.values()), held
        verification = steps.verify_history(engine, digest, timeout_s=60)
        assert verification.ok, verification.summary()
        assert report.ordinary_completed  # ordinary rows changed after the digest, as the contract allows
        assert steps.verify_no_old_writer(engine, NS, released_at=released_at) == []
    finally:
        stop.set()
        if host is not None:
            host.join(30)
        engine.dispose()

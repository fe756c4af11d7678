"""Greenfield pack activation (cutoff 0 in its own transaction) and a running host picking up a newly activated pack."""

from __future__ import annotations

import logging
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import func, select

from nexus_cutover import catalog
from nexus_cutover.catalog import ConnectorProjectionProtocol, IngressReceipt, WorkItem
from nexus_cutover.db import make_engine
from nexus_cutover.errors import BadInput, MissingSchema
from nexus_cutover.projection.audit import NOT_GREENFIELD
from nexus_cutover.projection.checkpoint import ALREADY_WRITTEN, REFUSED, WRITTEN
from nexus_cutover.projection.greenfield import activate_pack
from nexus_cutover.protocol_row import WrongProtocolVersion

from ..support import history_checksum
from .support import NS, PACK, range_tenant

NEW = "pk-2"


def _protocol_rows(engine):
    t = ConnectorProjectionProtocol
    with engine.connect() as conn:
        return conn.execute(select(t.c.PackInstallId, t.c.ProtocolVersion, t.c.LegacyMaxOrdinal, t.c.WrittenBy)).all()


def _count(engine, table, *where):
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(table).where(*where)).scalar()


# -- activate_pack -------------------------------------------------------------


def test_greenfield_pack_is_written_with_cutoff_zero(range_engine):
    range_tenant(range_engine, legacy_max=None, build=lambda sc: sc.receipt(PACK, "a", "rc-1"))  # a receipt is not history
    result = activate_pack(range_engine, PACK, timeout_s=30, written_by="tester")
    assert (result.outcome, result.legacy_max_ordinal, result.protocol_version, result.written_by) == (WRITTEN, 0, 1, "tester")
    assert result.ok and result.findings == [] and result.namespace == NS
    assert result.as_json()["outcome"] == "written" and result.as_json()["legacy_max_ordinal"] == 0
    assert [tuple(r) for r in _protocol_rows(range_engine)] == [(PACK, 1, 0, "tester")]
    assert _count(range_engine, IngressReceipt, IngressReceipt.c.MaterializedAt.is_not(None)) == 0


def test_existing_row_is_returned_unchanged(range_engine):
    range_tenant(range_engine, legacy_max=7)
    before = _protocol_rows(range_engine)
    result = activate_pack(range_engine, PACK, timeout_s=30, written_by="tester")
    assert (result.outcome, result.legacy_max_ordinal, result.written_by) == (ALREADY_WRITTEN, 7, "scenario")
    assert _protocol_rows(range_engine) == before
    again = activate_pack(range_engine, PACK, timeout_s=30, written_by="other")
    assert again.outcome == ALREADY_WRITTEN and _protocol_rows(range_engine) == before


def test_a_row_of_another_protocol_version_is_an_error(range_engine):
    range_tenant(range_engine, legacy_max=None, build=lambda sc: sc.protocol_row(PACK, 0, version=2))
    with pytest.raises(WrongProtocolVersion, match="ProtocolVersion 2"):
        activate_pack(range_engine, PACK, timeout_s=30, written_by="tester")
    assert [r.ProtocolVersion for r in _protocol_rows(range_engine)] == [2]


def _refusal(engine):
    before = history_checksum(engine)
    result = activate_pack(engine, PACK, timeout_s=30, written_by="tester")
    assert (result.outcome, result.legacy_max_ordinal, result.ok) == (REFUSED, None, False)
    assert _protocol_rows(engine) == [] and history_checksum(engine) == before
    [finding] = result.as_json()["findings"]
    assert finding["finding"] == NOT_GREENFIELD and "not greenfield" in finding["explanation"]
    assert "REFUSED" in result.summary()
    return result, finding


def test_refused_with_an_event_names_it_and_writes_nothing(range_engine):
    def build(sc):
        lane = sc.packs[0].lane("a")
        for _ in range(3):
            lane.event(status="pending")

    range_tenant(range_engine, legacy_max=None, build=build)
    result, finding = _refusal(range_engine)
    assert finding["event_ids"] == [1, 2, 3] and finding["work_ids"] == []
    assert (finding["event_count"], finding["work_item_count"]) == (3, 0)
    assert "3 Event(s), 0 WorkItem(s)" in result.findings[0].describe()


def test_refused_with_a_work_item_names_it_and_writes_nothing(range_engine):
    range_tenant(range_engine, legacy_max=None, build=lambda sc: sc.packs[0].lane("a").work_item(None, status="cancelled"))
    _result, finding = _refusal(range_engine)
    assert (finding["event_ids"], finding["work_ids"]) == ([], [1])
    assert (finding["event_count"], finding["work_item_count"]) == (0, 1)


def test_refusal_names_only_a_few_ids(range_engine):
    range_tenant(range_engine, legacy_max=None, build=lambda sc: sc.packs[0].lane("a").generation(8))
    _result, finding = _refusal(range_engine)
    assert len(finding["event_ids"]) == 5 and finding["work_ids"] == [1]
    assert (finding["event_count"], finding["work_item_count"]) == (8, 1)


def test_unknown_inactive_or_missing_pack_is_bad_input(range_engine):
    range_tenant(range_engine, legacy_max=None, build=lambda sc: sc.pack("pk-gone", status=catalog.PACK_UNINSTALLED))
    for pack, match in (("pk-nope", "unknown pack"), ("pk-gone", "not active"), ("", "required")):
        with pytest.raises(BadInput, match=match) as info:
            activate_pack(range_engine, pack, timeout_s=30, written_by="tester")
        assert info.value.exit_code == 2
    assert _protocol_rows(range_engine) == []


def test_missing_part_b_schema_is_missing_schema(legacy_engine):
    with pytest.raises(MissingSchema) as info:
        activate_pack(legacy_engine, PACK, timeout_s=30, written_by="tester")
    assert info.value.exit_code == 2


def test_four_concurrent_activations_write_one_row(range_engine, tenant_url):
    range_tenant(range_engine, legacy_max=None)

    def call(i):
        engine = make_engine(tenant_url)
        try:
            return activate_pack(engine, PACK, timeout_s=60, written_by=f"caller-{i}")
        finally:
            engine.dispose()

    with ThreadPoolExecutor(4) as pool:
        results = list(pool.map(call, range(4)))
    assert sorted(r.outcome for r in results) == [ALREADY_WRITTEN] * 3 + [WRITTEN]
    rows = _protocol_rows(range_engine)
    assert len(rows) == 1 and rows[0].LegacyMaxOrdinal == 0
    assert {r.written_by for r in results} == {rows[0].WrittenBy} and {r.legacy_max_ordinal for r in results} == {0}


# -- a running host picks up a newly activated pack ------------------------------

HEARTBEAT_S = 0.3


class Recorder:
    def __init__(self):
        self.seen: dict[str, list[str]] = {}

    def __call__(self, claimed, payloads):
        self.seen.setdefault(claimed.identity.pack_install_id, []).extend(p.receipt_id for p in payloads)


def _receipts(pack, *ids):
    def build(sc):
        for rid in ids:
            sc.receipt(pack, "a", rid)

    return build


def _unconfirmed(engine, pack):
    return _count(engine, IngressReceipt, IngressReceipt.c.PackInstallId == pack, IngressReceipt.c.ConfirmedAt.is_(None))


def _wait_for(condition, timeout_s=20.0):
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if condition():
            return True
        time.sleep(0.01)
    return condition()


def _running_host(engine):
    """The reference host ``h`` of NS in a thread (short heartbeat): (recorder, stop event, exit codes, thread)."""
    from nexus_cutover.runtime.host import run_host

    recorder, stop, codes = Recorder(), threading.Event(), []
    host = threading.Thread(
        target=lambda: codes.append(
            run_host(engine, NS, process_id="h", stop_event=stop, execute=recorder, heartbeat_s=HEARTBEAT_S, poll_s=0.02)
        )
    )
    host.start()
    return recorder, stop, codes, host


def _process(engine, pid):
    with engine.connect() as conn:
        return conn.execute(select(catalog.ProcessRegistry).where(catalog.ProcessRegistry.c.ProcessId == pid)).first()


def test_running_host_skips_a_new_pack_until_activated_then_serves_it_without_a_restart(range_engine, caplog, monkeypatch):
    from nexus_cutover.runtime import activation

    reads = []
    real = activation.pack_protocols
    monkeypatch.setattr(activation, "pack_protocols", lambda conn, ns: reads.append(time.monotonic()) or real(conn, ns))
    caplog.set_level(logging.INFO, logger="nexus_cutover.runtime")
    range_tenant(range_engine, build=_receipts(PACK, "rc-1", "rc-2"))
    recorder, stop, codes, host = _running_host(range_engine)
    try:
        assert _wait_for(lambda: _unconfirmed(range_engine, PACK) == 0 and recorder.seen.get(PACK) == ["rc-1", "rc-2"])
        activated_at = _process(range_engine, "h").ActivatedAt
        assert activated_at is not None

        range_tenant(range_engine, packs=(NEW,), legacy_max=None, build=_receipts(NEW, "new-1", "new-2"))
        time.sleep(3 * HEARTBEAT_S)  # three heartbeat periods: the host has seen the pack and skips it
        range_tenant(range_engine, packs=(), build=_receipts(PACK, "rc-3"))  # ... while serving the other pack
        assert _wait_for(lambda: _unconfirmed(range_engine, PACK) == 0 and "rc-3" in recorder.seen[PACK])
        materialized = IngressReceipt.c.MaterializedAt.is_not(None)
        assert _count(range_engine, IngressReceipt, IngressReceipt.c.PackInstallId == NEW, materialized) == 0
        assert _count(range_engine, WorkItem, WorkItem.c.PackInstallId == NEW) == 0 and NEW not in recorder.seen
        skipped = [r for r in caplog.records if "not serving it" in r.getMessage()]
        assert len(skipped) == 1 and NEW in skipped[0].getMessage() and "activate-pack" in skipped[0].getMessage()

        assert activate_pack(range_engine, NEW, timeout_s=30, written_by="tester").outcome == WRITTEN
        activated = time.monotonic()
        done = (WorkItem.c.PackInstallId == NEW, WorkItem.c.Status == "completed")
        assert _wait_for(lambda: _unconfirmed(range_engine, NEW) == 0 and _count(range_engine, WorkItem, *done) == 1)
        elapsed = time.monotonic() - activated
        assert elapsed < HEARTBEAT_S + 1.5, f"picked up after {elapsed:.2f}s, heartbeat {HEARTBEAT_S}s"
        assert sorted(recorder.seen[NEW]) == ["new-1", "new-2"]  # claimed, its whole payload set executed
        assert host.is_alive() and _process(range_engine, "h").ActivatedAt == activated_at  # no restart
        picked = [r for r in caplog.records if "now served" in r.getMessage()]
        assert [NEW in r.getMessage() for r in picked] == [True]
        assert len([r for r in caplog.records if "not serving it" in r.getMessage()]) == 1  # logged once, not per loop
        span = reads[-1] - reads[0] if reads else 0
        assert len(reads) <= span / HEARTBEAT_S + 2, f"{len(reads)} pack reads in {span:.2f}s"  # once per heartbeat
    finally:
        stop.set()
        host.join(30)
    assert codes == [0]


def test_worker_never_claims_work_of_a_pack_without_its_protocol_row(range_engine):
    from nexus_cutover.runtime.admission import admit_batch
    from nexus_cutover.runtime.worker import ProjectionWorker

    from .support import inp

    range_tenant(range_engine)
    worker = ProjectionWorker(range_engine, NS, "w")
    worker.start()

    def rogue(sc):  # range work written for a pack that has no protocol row (a new writer ran early)
        lane = sc.packs[0].lane("a")
        lane.work_item(lane.event(status="pending"), status="pending", input_start_ordinal=1)

    range_tenant(range_engine, packs=(NEW,), legacy_max=None, build=rogue)
    admit_batch(range_engine, PACK, [inp("a", "x-1")])
    claimed = worker.work_one()
    assert claimed is not None and claimed.identity.pack_install_id == PACK
    assert worker.work_one() is None
    assert [r.Status for r in _work(range_engine, NEW)] == ["pending"]


def _work(engine, pack):
    with engine.connect() as conn:
        return conn.execute(select(WorkItem.c.WorkId, WorkItem.c.Status).where(WorkItem.c.PackInstallId == pack)).all()


def test_served_claim_and_the_pack_read_are_index_reads(mysql_range_engine):
    """The served claim keeps the candidate range on ix_WorkItem_State and adds one protocol primary-key probe;
    the per-heartbeat pack read is a range on ix_PackInstall_Namespace plus a primary-key probe per pack."""
    from sqlalchemy import text

    from nexus_cutover.runtime.activation import pack_protocols, pack_protocols_query, protocol_in_force
    from nexus_cutover.runtime.claim import claim_candidates_query

    engine = mysql_range_engine

    def history(sc):
        for i in range(10):
            lane = sc.packs[0].lane(f"lane-{i:02d}")
            for g in range(20):
                ev = lane.event(status="processed")
                lane.work_item(ev, status="completed" if g < 19 else "pending", input_start_ordinal=ev["EnqueueOrdinal"])
        for n in range(30):
            sc.pack(f"pk-other-{n:02d}")

    range_tenant(engine, build=history)
    with engine.begin() as conn:
        for table in ("_System_WorkItem", "_System_PackInstall", "_System_ConnectorProjectionProtocol"):
            conn.execute(text(f"ANALYZE TABLE `{table}`"))

    def explain(query):
        sql = str(query.compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
        with engine.connect() as conn:
            return [dict(r._mapping) for r in conn.execute(text("EXPLAIN " + sql))]

    plan = explain(claim_candidates_query(NS).where(protocol_in_force(WorkItem.c.PackInstallId)))
    by_table = {r["table"]: r for r in plan}
    assert by_table["_System_WorkItem"]["key"] == "ix_WorkItem_State", plan
    protocol = by_table["_System_ConnectorProjectionProtocol"]
    assert protocol["key"] == "PRIMARY" and protocol["type"] == "eq_ref" and protocol["select_type"] == "DEPENDENT SUBQUERY", plan
    assert all(r["type"] != "ALL" for r in plan), plan
    with engine.connect() as conn:
        assert len(pack_protocols(conn, NS)) == 31
    read = explain(pack_protocols_query(NS))
    by_table = {r["table"]: r for r in read}
    assert by_table["_System_PackInstall"]["key"] == "ix_PackInstall_Namespace", read
    assert by_table["_System_PackInstall"]["type"] in ("range", "ref"), read
    assert by_table["_System_ConnectorProjectionProtocol"]["type"] == "eq_ref", read


def test_running_host_stops_serving_a_pack_uninstalled_under_it(range_engine, caplog):

    caplog.set_level(logging.INFO, logger="nexus_cutover.runtime")
    range_tenant(range_engine, packs=(PACK, NEW))
    recorder, stop, codes, host = _running_host(range_engine)
    try:
        assert _wait_for(lambda: getattr(_process(range_engine, "h"), "ActivatedAt", None) is not None)
        with range_engine.begin() as conn:
            conn.execute(catalog.PackInstall.update().where(catalog.PackInstall.c.PackInstallId == NEW).values(Status="uninstalled"))
        range_tenant(range_engine, packs=(), build=lambda sc: (sc.receipt(NEW, "a", "gone-1"), sc.receipt(PACK, "a", "rc-1")))
        assert _wait_for(lambda: _unconfirmed(range_engine, PACK) == 0 and recorder.seen.get(PACK) == ["rc-1"])
        time.sleep(2 * HEARTBEAT_S)
        assert host.is_alive() and _unconfirmed(range_engine, NEW) == 1 and NEW not in recorder.seen
        assert len([r for r in caplog.records if "no longer active" in r.getMessage()]) == 1
    finally:
        stop.set()
        host.join(30)
    assert codes == [0]

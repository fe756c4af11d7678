"""Replay Events share the receipt key space with source receipts (contract, "Projection identity and ordinals").

A replay Event's ReceiptId is made up by the runtime (``replay:<WorkId>:<ordinal>``) and lives under the same
``ux_Event_Receipt`` key as the receipts sources send. A source receipt equal to it, even byte for byte, is a
collision: never acknowledged as a duplicate of the replay (which holds none of its payload), named, durable and
unconfirmed, while the pack's other receipts are admitted. And a replay whose key a source already sent takes
another key instead of failing on the unique index or being read as the source's. On SQLite and on MariaDB tenants
of two collations; in the TiDB-semantics lane (tests/runtime).
"""

from __future__ import annotations

import datetime as dt
import json
import os
import subprocess
import sys

import pytest
from sqlalchemy import func, select

from nexus_cutover.catalog import Event, IngressReceipt
from nexus_cutover.runtime.admission import admit_batch
from nexus_cutover.runtime.claim import claim_work, complete
from nexus_cutover.runtime.errors import ReceiptCollision
from nexus_cutover.runtime.materializer import materialize
from nexus_cutover.runtime.model import Routing
from nexus_cutover.runtime.replay import replay

from .support import NS, PACK, all_events, assert_membership, inp, payload_receipts, range_tenant


def _replayed(engine) -> tuple[int, str]:
    """A completed generation of lane ``a`` replayed: (the replay's WorkId, the replay Event's ReceiptId)."""
    (first,) = admit_batch(engine, PACK, [inp("a", "r-1")]).created_work_ids
    assert complete(engine, claim_work(engine, first, "w"))
    result = replay(engine, first)
    (event,) = [e for e in all_events(engine) if e.EventId == result.event_id]
    assert event.ReplayOfWorkId == first and event.ReceiptId == f"replay:{first}:{result.ordinal}"
    return result.work_id, event.ReceiptId


def _receipt(engine, lane: str, receipt: str, payload: str) -> None:
    with engine.begin() as conn:
        conn.execute(IngressReceipt.insert().values(
            PackInstallId=PACK, SourceLane=lane, ReceiptId=receipt, EventKind="contact.changed", Payload=payload,
            ReceivedAt=dt.datetime(2026, 1, 1),
        ))


def _receipt_states(engine) -> dict[tuple[str, str], tuple[bool, bool]]:
    r = IngressReceipt
    with engine.connect() as conn:
        rows = conn.execute(select(r.c.SourceLane, r.c.ReceiptId, r.c.MaterializedAt, r.c.ConfirmedAt)).all()
    return {(x.SourceLane, x.ReceiptId): (x.MaterializedAt is not None, x.ConfirmedAt is not None) for x in rows}


def _events_with_payload(engine, payload: str) -> int:
    with engine.connect() as conn:
        return conn.execute(select(func.count()).select_from(Event).where(Event.c.Payload == payload)).scalar_one()


def test_a_source_receipt_equal_to_a_replays_id_is_a_collision_not_a_duplicate(collated_engine):
    range_tenant(collated_engine)
    replay_work, replay_receipt = _replayed(collated_engine)
    with pytest.raises(ReceiptCollision) as info:
        admit_batch(collated_engine, PACK, [inp("a", replay_receipt, payload='{"from": "the source"}')])
    (collision,) = info.value.collisions
    assert collision.replay_of_work_id is not None and collision.other_receipt == replay_receipt
    assert "replay" in str(info.value) and repr(replay_receipt) in str(info.value)
    assert _events_with_payload(collated_engine, '{"from": "the source"}') == 0
    assert payload_receipts(collated_engine, replay_work) == [replay_receipt]  # the replay holds only its own Event


def test_the_host_holds_a_receipt_equal_to_a_replays_id_unconfirmed_and_admits_the_packs_others(collated_engine):
    range_tenant(collated_engine)
    _, replay_receipt = _replayed(collated_engine)
    lost = json.dumps({"source": "a record whose id happens to be the replay's"})
    _receipt(collated_engine, "a", replay_receipt, lost)
    _receipt(collated_engine, "a", "r-2", '{"r": "r-2"}')
    _receipt(collated_engine, "b", "r-3", '{"r": "r-3"}')
    report = materialize(collated_engine, PACK, Routing())
    assert report.rejected_keys == {("a", replay_receipt)}
    (rejection,) = report.rejected
    assert rejection.kind == "collision" and "replay" in rejection.detail and repr(replay_receipt) in rejection.detail
    assert report.admitted == report.confirmed == 2
    states = _receipt_states(collated_engine)
    assert states[("a", replay_receipt)] == (False, False)  # durable and unconfirmed, for review
    assert states[("a", "r-2")] == states[("b", "r-3")] == (True, True)
    assert _events_with_payload(collated_engine, lost) == 0  # its payload admitted nowhere else
    again = materialize(collated_engine, PACK, Routing())  # offered again: still a collision, never acknowledged
    assert again.rejected_keys == {("a", replay_receipt)} and again.confirmed == 0
    assert _receipt_states(collated_engine)[("a", replay_receipt)] == (False, False)
    assert_membership(collated_engine)


@pytest.mark.parametrize("spelling", ["replay:{work}:3", "REPLAY:{work}:3"])
def test_a_replay_whose_key_a_source_already_sent_takes_its_own_key(collated_engine, equality, spelling):
    range_tenant(collated_engine)
    (first,) = admit_batch(collated_engine, PACK, [inp("a", "r-1")]).created_work_ids  # ordinal 1
    assert complete(collated_engine, claim_work(collated_engine, first, "w"))
    sent = spelling.format(work=first)  # the source sends, as ordinal 2, the key the replay at ordinal 3 makes up
    admit_batch(collated_engine, PACK, [inp("a", sent, payload='{"s": 1}')])
    result = replay(collated_engine, first)
    assert result.ordinal == 3
    made_up = {e.EventId: e for e in all_events(collated_engine)}[result.event_id].ReceiptId
    short = f"replay:{first}:3"
    assert made_up == (f"{short}:{result.event_id}" if equality.equal(sent, short) else short)
    assert _events_with_payload(collated_engine, '{"s": 1}') == 1  # the source's Event stands, untouched
    assert payload_receipts(collated_engine, result.work_id) == [made_up]
    assert_membership(collated_engine)


@pytest.mark.parametrize("backend", ["sqlite", "mysql"])
def test_nexus_host_names_the_replay_collision_and_admits_the_rest(request, backend):
    """Black-box: ``nexus-host --drain-and-exit`` over a receipt equal to a replay's id."""
    engine = request.getfixturevalue(f"{backend}_range_engine")
    range_tenant(engine)
    _, replay_receipt = _replayed(engine)
    _receipt(engine, "a", replay_receipt, '{"lost": true}')
    _receipt(engine, "b", "r-9", '{"r": "r-9"}')
    env = {**os.environ, "NEXUS_TENANT_DSN": engine.url.render_as_string(hide_password=False)}
    done = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.host", "--namespace", NS, "--drain-and-exit"],
                          env=env, capture_output=True, text=True, timeout=120)
    output = done.stdout + done.stderr
    assert done.returncode != 0, output  # a receipt left for review: not a clean drain
    assert repr(replay_receipt) in output and "replay" in output, output
    states = _receipt_states(engine)
    assert states[("a", replay_receipt)] == (False, False) and states[("b", "r-9")] == (True, True)
    assert _events_with_payload(engine, '{"lost": true}') == 0

"""Per-pack id shards: the EventIds and WorkIds a pack's admissions write come from its own range.

Two packs admitting at once used to read the same ``MAX()+1`` and collide on every
concurrent batch; each now allocates at the end of its own primary-key range, so
packs do not race, and a foreign writer inside a shard is stepped over.
"""

from __future__ import annotations

import datetime as dt
import logging
import threading

import pytest
from sqlalchemy import insert, select

from nexus_cutover.catalog import Event, WorkItem
from nexus_cutover.errors import CutoverError
from nexus_cutover.runtime.admission import admit_batch
from nexus_cutover.runtime.claim import claim_work, complete
from nexus_cutover.runtime.replay import replay
from nexus_cutover.runtime.tx import ID_SHARD_BITS, id_shard, next_ids_query

from .support import inp, range_tenant

PACKS = ("pk-east", "pk-west")


def _ids(engine, pack):
    with engine.connect() as conn:
        events = conn.execute(select(Event.c.EventId).where(Event.c.PackInstallId == pack)).scalars().all()
        works = conn.execute(select(WorkItem.c.WorkId).where(WorkItem.c.PackInstallId == pack)).scalars().all()
    return set(events), set(works)


def test_shards_are_stable_distinct_and_keep_ids_below_2_53():
    assert id_shard("pk-east") == id_shard("pk-east")
    assert id_shard("pk-east") != id_shard("pk-west")
    shards = {id_shard(f"pack-{i}") for i in range(2000)}
    assert min(shards) >= 1 and (max(shards) + 1) << ID_SHARD_BITS <= 2**53
    assert len(shards) > 1700  # spread over the 8191 shards, not clustered


def test_each_pack_writes_ids_of_its_own_shard_and_replay_too(range_engine):
    range_tenant(range_engine, packs=PACKS)
    for pack in PACKS:
        admit_batch(range_engine, pack, [inp("a", "1"), inp("b", "2")])
        (work_id, *_) = admit_batch(range_engine, pack, [inp("c", "3")]).created_work_ids
        assert complete(range_engine, claim_work(range_engine, work_id, "w"))
        replay(range_engine, work_id)
    for pack in PACKS:
        events, works = _ids(range_engine, pack)
        assert len(events) == 4 and len(works) == 4
        assert {i >> ID_SHARD_BITS for i in events | works} == {id_shard(pack)}, (pack, events, works)


def test_a_foreign_row_inside_a_shard_is_stepped_over(range_engine):
    """A writer outside the protocol took an id in the pack's shard: the next admission allocates above it."""
    range_tenant(range_engine, packs=PACKS)
    pack = PACKS[0]
    admit_batch(range_engine, pack, [inp("a", "1")])
    with range_engine.connect() as conn:
        next_event, _ = conn.execute(next_ids_query(pack)).one()
    with range_engine.begin() as conn:
        conn.execute(
            insert(Event).values(
                EventId=next_event + 5, Namespace="acme", PackInstallId=PACKS[1], EventKind="contact.changed", RouteVersion=1,
                FlowVersion="1.0.0", WorkType="connector.projection", SourceLane="z", EnqueueOrdinal=0, ReceiptId="foreign",
                Status="processed", Payload="{}", ReceivedAt=dt.datetime(2026, 1, 1),
            )
        )
    admitted = admit_batch(range_engine, pack, [inp("a", "2"), inp("a", "3")]).admitted
    assert [a.event_id for a in admitted] == [next_event + 6, next_event + 7]


def test_a_used_up_shard_is_a_clear_error_and_nothing_is_written(range_engine):
    range_tenant(range_engine, packs=PACKS)
    pack = PACKS[0]
    top = ((id_shard(pack) + 1) << ID_SHARD_BITS) - 1
    with range_engine.begin() as conn:  # a row at the very top of the pack's shard
        conn.execute(
            insert(Event).values(
                EventId=top, Namespace="acme", PackInstallId=PACKS[1], EventKind="contact.changed", RouteVersion=1,
                FlowVersion="1.0.0", WorkType="connector.projection", SourceLane="z", EnqueueOrdinal=0, ReceiptId="top",
                Status="processed", Payload="{}", ReceivedAt=dt.datetime(2026, 1, 1),
            )
        )
    with pytest.raises(CutoverError, match="used up its id shard .* nothing written"):
        admit_batch(range_engine, pack, [inp("a", "1")])
    assert _ids(range_engine, pack) == (set(), set())


class _Retries(logging.Handler):
    def __init__(self) -> None:
        super().__init__(logging.DEBUG)
        self.lines: list[str] = []

    def emit(self, record: logging.LogRecord) -> None:
        if record.getMessage().endswith("retrying"):
            self.lines.append(record.getMessage())


@pytest.mark.mysql
def test_two_packs_admitting_at_once_never_collide_on_an_id(mysql_range_engine):
    engine = mysql_range_engine
    range_tenant(engine, packs=PACKS)
    retries = _Retries()
    logger = logging.getLogger("nexus_cutover.tx")
    logger.addHandler(retries)
    previous = logger.level
    logger.setLevel(logging.DEBUG)
    start = threading.Barrier(len(PACKS))
    errors: list[BaseException] = []

    def run(pack: str) -> None:
        try:
            start.wait()
            for b in range(8):
                admit_batch(engine, pack, [inp(f"lane-{i % 5}", f"{b}-{i}") for i in range(50)])
        except BaseException as exc:  # noqa: BLE001 - reported by the assertion below
            errors.append(exc)

    threads = [threading.Thread(target=run, args=(p,)) for p in PACKS]
    try:
        for t in threads:
            t.start()
        for t in threads:
            t.join(120)
    finally:
        logger.removeHandler(retries)
        logger.setLevel(previous)
    assert not errors, errors
    assert not [line for line in retries.lines if "uplicate" in line], retries.lines
    for pack in PACKS:
        events, _ = _ids(engine, pack)
        assert len(events) == 8 * 50 and {i >> ID_SHARD_BITS for i in events} == {id_shard(pack)}

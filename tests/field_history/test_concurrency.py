"""Real concurrent sessions on MariaDB: a stamping producer during materialization is never overwritten."""

from __future__ import annotations

import random
import threading
import time

from sqlalchemy import insert, text, update

from nexus_cutover.field_history.materialize import materialize
from nexus_sim.scenario import TenantScenario

from .helpers import ELIGIBLE, Audit, audit_table

N = 3000
GAP = 10  # every 10th ChangeId is left free for the concurrent producer to fill


def build(engine) -> dict[int, bool]:
    """Field 1 tracked from 0 (rows become TRUE), field 2 never tracked (rows become FALSE)."""
    sc = TenantScenario()
    sc.field(1, intervals=[(0, None)])
    sc.field(2, track_history=False)
    sc.write(engine)
    rows, decided = [], {}
    for cid in range(1, N + 1):
        if cid % GAP == 0:
            continue
        fid = 1 if cid % 2 else 2
        decided[cid] = fid == 1
        rows.append(
            {
                "ChangeId": cid,
                "AuditId": cid,
                "ObjectName": "Contact",
                "RecordId": "r",
                "FieldId": fid,
                "HistorySequence": cid,
                "ProducerVersion": "4.11.0",
                "CreatedAt": sc.tick(),
            }
        )
    with engine.begin() as conn:
        conn.execute(insert(Audit), rows)
    return decided


def test_concurrent_stamps_and_inserts_are_never_overwritten(mysql_fh_engine):
    engine = mysql_fh_engine
    decided = build(engine)
    cursor = {"at": 0}
    done = threading.Event()
    progressed = threading.Event()
    stamped: dict[int, bool] = {}
    inserted: dict[int, bool] = {}
    errors: list[BaseException] = []

    def producer():
        rng = random.Random(5)
        free = [cid for cid in range(GAP, N + 1, GAP)]
        try:
            while not done.is_set():
                ahead = [c for c in decided if c > cursor["at"] + 1 and c not in stamped]
                if not ahead:
                    break
                cid = rng.choice(ahead[:200])
                with engine.begin() as conn:  # a stamp on a NULL row, the opposite of what the interval proves
                    n = conn.execute(
                        update(Audit).where(Audit.c.ChangeId == cid, Audit.c[ELIGIBLE].is_(None)).values({ELIGIBLE: not decided[cid]})
                    ).rowcount
                if n:
                    stamped[cid] = not decided[cid]
                if free:
                    gap = free.pop(0)
                    fid = 1 if gap % 3 else 2
                    with engine.begin() as conn:  # a new producer's row: stamped, with a sequence
                        conn.execute(
                            insert(Audit).values(
                                ChangeId=gap,
                                AuditId=gap,
                                ObjectName="Contact",
                                RecordId="r",
                                FieldId=fid,
                                HistorySequence=gap,
                                ProducerVersion="4.13.0",
                                CreatedAt=catalog_time(),
                                **{ELIGIBLE: fid != 1},
                            )
                        )
                    inserted[gap] = fid != 1
                progressed.set()
        except BaseException as exc:  # noqa: BLE001 - surfaced by the main thread
            errors.append(exc)
            progressed.set()

    def on_batch(progress):
        cursor["at"] = progress.cursor
        progressed.wait(timeout=2)  # let the producer act between batches: real interleaving
        progressed.clear()

    thread = threading.Thread(target=producer)
    thread.start()
    try:
        result = materialize(engine, batch_size=50, on_batch=on_batch, progress_every_s=3600)
    finally:
        done.set()
        thread.join(timeout=30)
    assert not errors, errors
    table = audit_table(engine)
    assert len(stamped) > 20 and len(inserted) > 20, "the producer must really have run concurrently"
    for cid, value in stamped.items():
        assert table[cid][2] is value, f"stamp on {cid} overwritten"
    for cid, value in inserted.items():
        assert table[cid][2] is value, f"inserted row {cid} overwritten"
    for cid, value in decided.items():
        if cid not in stamped:
            assert table[cid][2] is value
    assert result.rows == len(decided) - len(stamped)


def test_materializer_waits_for_an_uncommitted_stamp_and_keeps_it(mysql_fh_engine):
    engine = mysql_fh_engine
    build(engine)
    target = 51  # field 1: materialization would set TRUE
    holder = engine.connect()
    tx = holder.begin()
    holder.execute(update(Audit).where(Audit.c.ChangeId == target).values({ELIGIBLE: False}))
    outcome = {}
    thread = threading.Thread(target=lambda: outcome.update(result=materialize(engine, batch_size=100, progress_every_s=3600)), daemon=True)
    try:
        thread.start()
        # the first batch (ChangeId 1..111) must block on the producer's row lock, not skip or overwrite it
        waited = wait_for_lock_wait(engine)
    finally:
        tx.commit()
        holder.close()
        thread.join(timeout=60)
    assert waited, "materialization must wait for the producer's open transaction"
    assert audit_table(engine)[target][2] is False
    assert outcome["result"].remaining == 0


def catalog_time():
    return TenantScenario().tick()


def wait_for_lock_wait(engine, timeout_s: float = 30.0) -> bool:
    """True once some transaction of the server waits for a row lock."""
    stop = time.monotonic() + timeout_s
    with engine.connect() as conn:
        while time.monotonic() < stop:
            states = conn.execute(text("SELECT trx_state FROM information_schema.INNODB_TRX")).scalars().all()
            conn.rollback()
            if "LOCK WAIT" in states:
                return True
            time.sleep(0.25)  # INNODB_TRX is a cache refreshed only after 100 ms without readers
    return False

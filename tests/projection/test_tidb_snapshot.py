"""Lifecycle reads after a lock wait must see what the previous lock holder committed.

TiDB fixes a REPEATABLE READ transaction's snapshot at its first statement,
before any lock wait; InnoDB takes it at the first consistent read, after the
wait. So on plain MariaDB these tests pass even when the product reads at
REPEATABLE READ; under NEXUS_TIDB_SEMANTICS=1 (tests/tidb_semantics.py, which
gives MariaDB TiDB's snapshot) they pass only when every read that must see the
previous holder's commit runs at READ COMMITTED or is a locking read.

The lock waits are real: a writer holds the ``_System_Lock`` row, and the test
goes on only once the product's transaction is provably waiting for it
(information_schema.INNODB_TRX), so MySQL-protocol only where row locks matter.
"""

from __future__ import annotations

import random
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import insert, select, text, update
from sqlalchemy.engine import make_url

from nexus_cutover import catalog
from nexus_cutover.admission_fences import fence_in_force
from nexus_cutover.catalog import namespace_lock_name, pack_lock_name
from nexus_cutover.db import is_sqlite, make_engine
from nexus_cutover.errors import Refused
from nexus_cutover.projection.checkpoint import REFUSED, run_checkpoint
from nexus_cutover.projection.cutover_fence import arm_fence
from nexus_sim.scenario import TenantScenario, drained_pack_history, utcnow
from tests import tidb_semantics
from tests.support import make_cutover_ready

NS, PACK = "acme", "pk-1"


def create_lock_rows(engine, *names):
    with engine.begin() as conn:
        present = set(conn.execute(select(catalog.Lock.c.LockName)).scalars())
        for name in names:
            if name not in present:
                conn.execute(insert(catalog.Lock).values(LockName=name))


def lock_row(conn, name):
    return conn.execute(select(catalog.Lock.c.LockName).where(catalog.Lock.c.LockName == name).with_for_update()).one()


def while_waiting(pool, fns, observer, *, database, lock_name, release):
    """Start ``fns`` in ``pool``; once all of them wait for ``lock_name`` (or, on SQLite, after a pause),
    call ``release()``; return their results (a failure of one of them is raised as it is)."""
    futures = [pool.submit(fn) for fn in fns]
    try:
        if observer is None:  # SQLite has no row locks to observe: the outcome does not depend on the timing
            time.sleep(0.5)
        else:
            tidb_semantics.wait_for_lock_waits(
                observer, count=len(fns), database=database, query_like=lock_name,
                alive=lambda: not any(f.done() for f in futures),
            )
    except AssertionError:
        for f in futures:
            if f.done():
                f.result()  # the product's own error explains more than "it did not wait"
        raise
    finally:
        release()
    return [f.result(timeout=60) for f in futures]


# -- the checkpoint ---------------------------------------------------------------------


def test_checkpoint_sees_live_work_committed_while_it_waited_for_the_pack_lock(mysql_url):
    """A writer holding the pack lock commits new live work while the checkpoint waits for that lock:
    the audit must see it (``live_work``), and nothing may be written."""
    database = make_url(mysql_url).database
    engine, writer_engine = make_engine(mysql_url), make_engine(mysql_url)
    observer = make_engine(mysql_url, execution_options={tidb_semantics.OPTION: False})
    writer = None
    try:
        make_cutover_ready(engine)
        sc = TenantScenario(namespace=NS)
        pack = sc.pack(PACK)
        drained_pack_history(pack, random.Random(11), lanes=2, generations=3)  # an old, completed history
        sc.fence()  # the non-expiring namespace-wide fence the checkpoint requires: '*', ExpiresAt/ReleasedAt NULL
        sc.write(engine)
        create_lock_rows(engine, namespace_lock_name(NS), pack_lock_name(PACK))
        lane = pack.lane("lane-000")
        new_event = lane.event(status="pending")
        new_work = lane.work_item(new_event, status="pending")  # legacy: InputStartOrdinal NULL

        writer = writer_engine.connect()
        writer.begin()
        lock_row(writer, pack_lock_name(PACK))
        writer.execute(insert(catalog.Event).values(**new_event))
        writer.execute(insert(catalog.WorkItem).values(**new_work))
        writer.execute(
            update(catalog.EnqueueOrdinal)
            .where(catalog.EnqueueOrdinal.c.PackInstallId == PACK)
            .values(LastOrdinal=new_event["EnqueueOrdinal"])
        )

        def checkpoint():
            return run_checkpoint(engine, PACK, timeout_s=30, written_by="test")

        def commit_writer():
            try:  # the waiting checkpoint already holds the namespace lock
                with observer.connect() as probe, probe.begin(), pytest.raises(sa_exc.OperationalError):
                    probe.execute(text("SELECT LockName FROM _System_Lock WHERE LockName = :n FOR UPDATE NOWAIT"),
                                  {"n": namespace_lock_name(NS)})
            finally:
                writer.commit()
                writer.close()

        with ThreadPoolExecutor(1) as pool:
            (result,) = while_waiting(pool, [checkpoint], observer, database=database, lock_name=pack_lock_name(PACK),
                                      release=commit_writer)

        with observer.connect() as conn:
            protocol_rows = conn.execute(select(catalog.ConnectorProjectionProtocol)).all()
        live = [f for f in result.findings if f.finding == "live_work"]
        assert result.outcome == REFUSED and protocol_rows == [], (
            f"the checkpoint did not see the live work committed while it waited for the pack lock "
            f"(outcome {result.outcome!r}, findings {[f.as_json() for f in result.findings]}, "
            f"protocol rows {protocol_rows}): its audit read a snapshot older than the lock grant"
        )
        assert result.legacy_max_ordinal is None
        assert [new_work["WorkId"]] == [w for f in live for w in f.work_ids]
    finally:
        if writer is not None and not writer.closed:  # never leave a lock (or the database's metadata lock) behind
            writer.close()
        for eng in (engine, writer_engine, observer):
            eng.dispose()


# -- the fence ----------------------------------------------------------------------------


@pytest.mark.parametrize("runs", [("run-a", "run-a"), ("run-a", "run-b")], ids=["same-run", "two-runs"])
def test_two_arm_fence_calls_queued_behind_the_namespace_lock_leave_one_fence(tenant_url, runs):
    """Two arm_fence calls start while a third session holds the namespace lock; once it commits,
    exactly one fence is in force. The second call sees the first one's fence: by the same run it
    reuses it; by another run it reuses it or is refused (one cutover per tenant), writing nothing."""
    engine = make_engine(tenant_url)
    observer = holder = None
    try:
        make_cutover_ready(engine)
        sc = TenantScenario(namespace=NS)
        drained_pack_history(sc.pack(PACK), random.Random(12), lanes=1, generations=2)
        sc.write(engine)
        create_lock_rows(engine, namespace_lock_name(NS))
        database = None
        if not is_sqlite(engine):
            database = make_url(tenant_url).database
            observer = make_engine(tenant_url, execution_options={tidb_semantics.OPTION: False})

        holder = engine.connect()
        if is_sqlite(holder):
            holder = holder.execution_options(sqlite_begin="IMMEDIATE")
        holder.begin()
        lock_row(holder, namespace_lock_name(NS))

        def arm(run):
            def call():
                try:
                    return arm_fence(engine, NS, armed_by=run, timeout_s=30, packs=[PACK])
                except Refused as exc:
                    return exc
            return call

        def release():
            holder.commit()
            holder.close()

        with ThreadPoolExecutor(2) as pool:
            results = while_waiting(pool, [arm(r) for r in runs], observer, database=database,
                                    lock_name=namespace_lock_name(NS), release=release)

        with engine.connect() as conn:
            in_force = conn.execute(
                select(catalog.AdmissionFence.c.FenceId, catalog.AdmissionFence.c.ArmedBy)
                .where(catalog.AdmissionFence.c.Namespace == NS, fence_in_force(utcnow()))
            ).all()
        described = [r.as_json() if hasattr(r, "as_json") else repr(r) for r in results]
        assert len(in_force) == 1, f"{len(in_force)} fences in force after two queued arm_fence calls: {described}"
        (fence_id, armed_by), = in_force
        armed = [r for r in results if getattr(r, "outcome", None) == "armed"]
        assert [(r.fence_id, runs[results.index(r)]) for r in armed] == [(fence_id, armed_by)], described
        (other,) = [r for r in results if r not in armed]
        if isinstance(other, Refused):
            assert runs[0] != runs[1] and armed_by in str(other), described
        else:
            assert (other.outcome, other.fence_id) == ("reused", fence_id), described
    finally:
        if holder is not None and not holder.closed:
            holder.close()
        engine.dispose()
        if observer is not None:
            observer.dispose()

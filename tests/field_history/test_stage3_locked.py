"""Stage 3 checks and switches in one locked transaction: what a previous lock holder committed is seen (MariaDB)."""

from __future__ import annotations

import concurrent.futures
import time

from sqlalchemy import select, text
from sqlalchemy.engine import make_url

from nexus_cutover import catalog, tx
from nexus_cutover.db import Deadline, make_engine
from nexus_cutover.field_history import gates
from nexus_sim.scenario import TenantScenario

from .helpers import upgraded_outbox_row

RELEASE = "4.13.0"


def _wait_until_blocked(engine, database: str, lock: str, *, alive, timeout_s: float = 20.0) -> None:
    """Until a session of ``database`` has been running the locking read of ``lock`` for a while.

    A transaction waiting for its *first* row lock is not listed in INNODB_TRX
    (it is not read-write yet), so the statement is watched in PROCESSLIST: a
    primary-key read that stays there is waiting for the row.
    """
    sql = text(
        "SELECT ID FROM information_schema.PROCESSLIST WHERE DB = :db AND INFO LIKE :q AND INFO LIKE '%FOR UPDATE%'"
    )
    deadline = time.monotonic() + timeout_s
    seen_since = None
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as conn:
        while time.monotonic() < deadline:
            assert alive(), "stage_3 ended before it waited for the lock"
            waiting = conn.execute(sql, {"db": database, "q": f"%{lock}%"}).first() is not None
            seen_since = (seen_since or time.monotonic()) if waiting else None
            if seen_since is not None and time.monotonic() - seen_since >= 0.3:
                return
            time.sleep(0.05)
    raise AssertionError(f"no session waited for lock {lock!r} within {timeout_s:g}s")


def _settings(engine) -> dict[str, str]:
    s = catalog.RuntimeSetting
    with engine.connect() as conn:
        return dict(conn.execute(select(s.c.Name, s.c.Value)).all())


def _locked_tenant(engine) -> str:
    """Namespace acme, field 1 tracked from sequence 10, one stamped row, an upgraded runtime API; its lock row."""
    sc = TenantScenario(namespace="acme")
    sc.field(1, intervals=[(10, None)])
    sc.audit_change(1, history_sequence=20, eligible=True, producer_version="4.13.0")
    sc.process(catalog.ROLE_RUNTIME_API, version="4.13.0", process_id="api-1")
    sc.write(engine)
    lock = catalog.namespace_lock_name("acme")
    tx.ensure_lock_rows(engine, [lock], Deadline(10))
    return lock


def _stage_3_while_the_lock_is_held(engine, mysql_url, lock: str, change) -> gates.GateReport:
    """Stage 3 run while another session holds the namespace lock and writes ``change(conn)``; that session commits
    once stage 3 waits for the lock. Stage 3's report."""
    holder_engine = make_engine(mysql_url)
    try:
        with holder_engine.connect() as holder, concurrent.futures.ThreadPoolExecutor(1) as pool:
            holder.begin()
            holder.execute(select(catalog.Lock.c.LockName).where(catalog.Lock.c.LockName == lock).with_for_update()).one()
            change(holder)
            future = pool.submit(
                gates.stage_3, engine, producer_release=RELEASE, updated_by="test", namespace="acme", deadline=Deadline(30)
            )
            _wait_until_blocked(engine, make_url(mysql_url).database, lock, alive=lambda: not future.done())
            holder.commit()
            return future.result(timeout=60)
    finally:
        holder_engine.dispose()


def test_an_eligible_null_row_committed_while_stage_3_waits_for_the_lock_refuses_the_switch(mysql_fh_engine, mysql_url):
    engine = mysql_fh_engine
    lock = _locked_tenant(engine)

    def late_legacy_row(holder) -> None:
        late = TenantScenario(namespace="acme")
        late.change_ids = iter([500])
        row = late.audit_change(1, history_sequence=30, producer_version="4.11.0")  # a late legacy row: eligible NULL
        holder.execute(catalog.AuditFieldChange.insert().values(**row))

    report = _stage_3_while_the_lock_is_held(engine, mysql_url, lock, late_legacy_row)
    assert not report.passed and report.counts["eligible_null_rows"] == 1, report.render()
    assert "reads not switched" in report.summary
    assert _settings(engine) == {"FieldHistorySequenceReservationEnabled": "false"}  # reservation off, reads not switched


def test_an_outbox_row_failed_while_stage_3_waits_for_the_lock_refuses_it(mysql_fh_engine, mysql_url):
    """An upgraded producer's outbox row is pending; the namespace lock's holder marks it failed and commits while stage 3
    waits for that lock: stage 3's preconditions, read after the wait, see it and refuse, naming it (nothing switched)."""
    engine = mysql_fh_engine
    lock = _locked_tenant(engine)
    upgraded_outbox_row(engine, 70, 700)
    outbox = catalog.AuditOutbox
    report = _stage_3_while_the_lock_is_held(
        engine, mysql_url, lock, lambda holder: holder.execute(outbox.update().where(outbox.c.OutboxId == 70).values(Status="failed")))
    assert not report.passed and {"finding": "outbox_failed", "outbox_id": 70} in report.findings, report.render()
    assert report.summary.startswith("refused, nothing switched: 1 outbox row(s) failed (OutboxId 70)")
    assert _settings(engine) == {}  # refused before reservation was turned off

"""Every check-then-act of the cutover with a conflicting commit between its check and its act.

The fence release (readiness, the fence row), the adoption of a fence, greenfield activation and the checkpoint's
fence precondition each check a condition and then write, in one locked transaction. Here another session tries
to commit a change that breaks the condition at the exact point between the check and the act (the product's
``between_check_and_act`` seam: a barrier, not a sleep). That session waits for no lock (``innodb_lock_wait_timeout
= 0``; SQLite's shortest busy timeout), so one of two things happens, and each test asserts the right consequence:

* the change could not commit (the product holds the row, or SQLite's write lock): the act happens, and the change
  never landed in between;
* the change committed (nothing of ours blocks it: a new registry row, a new override): the act must not happen --
  the product re-checks after its write and rolls back, writing nothing, with a refusal naming the change.

A test fails if the act happened after a committed conflicting change. On MariaDB and SQLite, and under
``NEXUS_TIDB_SEMANTICS=1`` (snapshots fixed at BEGIN) on MariaDB.
"""

from __future__ import annotations

import datetime as dt

import pytest
from sqlalchemy import exc as sa_exc
from sqlalchemy import insert, select, update

from nexus_cutover import catalog
from nexus_cutover.db import is_sqlite, make_engine
from nexus_cutover.projection import audit, cutover_fence, steps
from nexus_cutover.projection.checkpoint import REFUSED, WRITTEN, run_checkpoint
from nexus_cutover.projection.greenfield import activate_pack
from nexus_sim.scenario import TenantScenario, utcnow

NS, PACK = "acme", "pk-1"
STALE = dt.timedelta(seconds=60)
COMMITTED, BLOCKED = "committed", "blocked"


class Conflict:
    """A seam that, when the product reaches it, commits ``change(conn)`` in another session, waiting for no lock."""

    def __init__(self, url: str, change):
        self.url, self.change = url, change
        self.outcome: str | None = None

    def __call__(self, _product_conn) -> None:
        assert self.outcome is None, "the seam ran twice: the product retried its transaction"
        other = make_engine(self.url, connect_timeout=0.1)  # SQLite: a 0.1 s busy timeout, the shortest it takes
        try:
            with other.connect() as conn:
                if not is_sqlite(conn):  # on the raw connection: no SQLAlchemy autobegin
                    cursor = conn.connection.dbapi_connection.cursor()
                    cursor.execute("SET SESSION innodb_lock_wait_timeout = 0")
                    cursor.close()
                try:
                    with conn.begin():
                        self.change(conn)
                    self.outcome = COMMITTED
                except sa_exc.OperationalError as exc:
                    if "lock" not in str(exc).lower():  # a lock wait timeout (1205), or SQLite's "database is locked"
                        raise
                    self.outcome = BLOCKED
        finally:
            other.dispose()


#: What a conflicting change meets on the MySQL protocol (on SQLite the product's write lock blocks every one): rows
#: the product decides on are read FOR UPDATE, so a change to them waits (and here, waiting for nothing, fails);
#: a new row, or a row the product does not lock, commits, and the product's re-check after its write must see it.
LOCKED_ON_MYSQL = {
    "the fence is adopted by hand", "the fence is released by hand", "another adopter takes it by hand",
    "the old holder releases it by hand", "the fence it relied on is released while an old writer is live",
}


def expected_outcome(engine, conflict: str) -> str:
    return BLOCKED if is_sqlite(engine) or conflict in LOCKED_ON_MYSQL else COMMITTED


def url_of(engine) -> str:
    return engine.url.render_as_string(hide_password=False)


def fence_of(engine, fence_id: int) -> dict:
    with engine.connect() as conn:
        return dict(conn.execute(select(catalog.AdmissionFence).where(catalog.AdmissionFence.c.FenceId == fence_id)).one()._mapping)


def protocol_rows(engine) -> list:
    with engine.connect() as conn:
        return conn.execute(select(catalog.ConnectorProjectionProtocol)).all()


def process_row(process_id: str, role: str, protocol: int = catalog.PROTOCOL_OLD, **kw) -> dict:
    now = utcnow()
    return {"ProcessId": process_id, "Namespace": NS, "Role": role, "BinaryVersion": "4.11.0",
            "ProjectionProtocol": protocol, "StartedAt": now, "LastHeartbeatAt": now, "ActivatedAt": None,
            "StoppedAt": None, **kw}


# -- the fence release: readiness and the fence row -----------------------------------------------------------


def ready_tenant(engine) -> int:
    """A checkpointed tenant with an activated live host and its cutover fence held by ``eng``: ready to release."""
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK).lane("a").generation(1)
    sc.protocol_row(PACK, 1)
    sc.process(catalog.ROLE_INTEGRATION_HOST, protocol=catalog.PROTOCOL_RANGES, process_id="host-1", activated=True)
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id="old-writer", stopped=True)
    sc.write(engine)
    return cutover_fence.arm_fence(engine, NS, armed_by="eng", timeout_s=30).fence_id


RELEASE_CONFLICTS = {
    # an old writer comes back (a new registry row: nothing of ours can block it)
    "an old writer registers": lambda conn: conn.execute(insert(catalog.ProcessRegistry).values(
        **process_row("old-writer-2 Ä", catalog.ROLE_INGRESS_WRITER))),
    # an old writer restarts under its old id (re-registration of a stopped row)
    "a stopped old writer restarts": lambda conn: conn.execute(update(catalog.ProcessRegistry).where(
        catalog.ProcessRegistry.c.ProcessId == "old-writer").values(StoppedAt=None, LastHeartbeatAt=utcnow())),
    # the only ready host stops
    "the new host stops": lambda conn: conn.execute(update(catalog.ProcessRegistry).where(
        catalog.ProcessRegistry.c.ProcessId == "host-1").values(StoppedAt=utcnow())),
    # another holder takes the fence over by hand
    "the fence is adopted by hand": lambda conn: conn.execute(update(catalog.AdmissionFence).values(ArmedBy="someone-else")),
    # the fence is released by hand
    "the fence is released by hand": lambda conn: conn.execute(update(catalog.AdmissionFence).values(
        ReleasedAt=utcnow(), ReleasedBy="l2-by-hand")),
}


@pytest.mark.parametrize("conflict", list(RELEASE_CONFLICTS))
def test_the_fence_release_never_releases_after_a_conflicting_commit(engine, conflict):
    fence_id = ready_tenant(engine)
    seam = Conflict(url_of(engine), RELEASE_CONFLICTS[conflict])
    try:
        result = steps.release_fence(engine, NS, fence_id, holder="eng", stale_heartbeat=STALE, timeout_s=30,
                                     between_check_and_act=seam)
    except (steps.NotReady, cutover_fence.FenceChanged) as refused:
        result = refused
    row = fence_of(engine, fence_id)
    assert seam.outcome == expected_outcome(engine, conflict)
    if seam.outcome == COMMITTED:
        assert not isinstance(result, cutover_fence.FenceResult), f"released after {conflict!r} committed between check and act"
        assert row["ReleasedBy"] != "eng"
    else:  # the fence row (or SQLite's write lock) was held: the change could not land in between
        assert (result.outcome, row["ReleasedBy"]) == ("released", "eng"), (conflict, result)


def test_a_conflict_the_locks_cannot_block_is_seen_after_the_write_and_named(engine):
    """On the MySQL protocol a new registry row is not blocked by any lock of ours: the re-check names it."""
    fence_id = ready_tenant(engine)
    seam = Conflict(url_of(engine), RELEASE_CONFLICTS["an old writer registers"])
    if is_sqlite(engine):  # the whole database is locked: the row cannot land, the release goes on
        assert steps.release_fence(engine, NS, fence_id, holder="eng", stale_heartbeat=STALE, timeout_s=30,
                                   between_check_and_act=seam).outcome == "released"
        assert seam.outcome == BLOCKED
        return
    with pytest.raises(steps.NotReady, match="old-writer-2 Ä"):
        steps.release_fence(engine, NS, fence_id, holder="eng", stale_heartbeat=STALE, timeout_s=30,
                            between_check_and_act=seam)
    assert seam.outcome == COMMITTED and fence_of(engine, fence_id)["ReleasedAt"] is None


# -- adoption of a fence ------------------------------------------------------------------------------------


ADOPT_CONFLICTS = {
    "another adopter takes it by hand": lambda conn: conn.execute(update(catalog.AdmissionFence).values(ArmedBy="third")),
    "the old holder releases it by hand": lambda conn: conn.execute(update(catalog.AdmissionFence).values(
        ReleasedAt=utcnow(), ReleasedBy="run-1")),
    "a second cutover fence is armed by hand": lambda conn: conn.execute(insert(catalog.AdmissionFence).values(
        Namespace=NS, Scope="*", Reason="by hand", ArmedBy="hand", ArmedAt=utcnow())),
}


@pytest.mark.parametrize("conflict", list(ADOPT_CONFLICTS))
def test_an_adoption_never_happens_after_a_conflicting_commit(engine, conflict):
    TenantScenario(namespace=NS).pack(PACK)
    first = cutover_fence.arm_fence(engine, NS, armed_by="run-1", timeout_s=30)
    seam = Conflict(url_of(engine), ADOPT_CONFLICTS[conflict])
    try:
        result = cutover_fence.arm_fence(engine, NS, armed_by="run-2", timeout_s=30, holder_state=lambda h: cutover_fence.HOLDER_FINISHED,
                                         between_check_and_act=seam)
    except (cutover_fence.FenceChanged, cutover_fence.SeveralCutoverFences) as refused:
        result = refused
    row = fence_of(engine, first.fence_id)
    assert seam.outcome == expected_outcome(engine, conflict)
    if seam.outcome == COMMITTED:
        assert not isinstance(result, cutover_fence.FenceResult), f"adopted after {conflict!r} committed between check and act"
        assert row["ArmedBy"] != "run-2"
    else:
        assert (result.outcome, row["ArmedBy"], row["ReleasedAt"]) == ("adopted", "run-2", None), (conflict, result)


# -- greenfield activation ------------------------------------------------------------------------------------


def greenfield(engine, *, fenced: bool = False, old_writer: str = "old-writer") -> None:
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK)
    sc.process(catalog.ROLE_INGRESS_WRITER, process_id=old_writer, stopped=True)
    sc.write(engine)
    if fenced:
        cutover_fence.arm_fence(engine, NS, armed_by="eng", timeout_s=30)


ACTIVATION_CONFLICTS = {
    "an old ingress writer registers": (False, lambda conn: conn.execute(insert(catalog.ProcessRegistry).values(
        **process_row("Old-Writer-2 ", catalog.ROLE_INGRESS_WRITER)))),
    "an old projection worker restarts": (False, lambda conn: conn.execute(update(catalog.ProcessRegistry).where(
        catalog.ProcessRegistry.c.ProcessId == "old-writer").values(StoppedAt=None, LastHeartbeatAt=utcnow(),
                                                                     Role=catalog.ROLE_PROJECTION_WORKER))),
    "an Event of the pack is written": (False, lambda conn: conn.execute(insert(catalog.Event).values(
        **TenantScenario(namespace=NS, event_id_start=900).pack(PACK).lane("a").event()))),
    "the fence it relied on is released while an old writer is live": (True, lambda conn: (
        conn.execute(insert(catalog.ProcessRegistry).values(**process_row("old-live", catalog.ROLE_RECEIPT_MATERIALIZER))),
        conn.execute(update(catalog.AdmissionFence).values(ReleasedAt=utcnow(), ReleasedBy="l2-by-hand")))),
}


#: The two paths that write a greenfield pack's cutoff 0, under one rule (contract, "Audit"), and the findings each
#: may refuse with when a conflicting commit lands between its check and its act.
CUTOFF_0_WRITERS = {
    "activate-pack": (lambda engine, seam: activate_pack(engine, PACK, timeout_s=30, written_by="eng", stale_heartbeat=STALE,
                                                         between_check_and_act=seam),
                      {audit.OLD_RUNTIME_LIVE, audit.NOT_GREENFIELD}),
    "connector-projection-cutover": (lambda engine, seam: run_checkpoint(engine, PACK, timeout_s=30, written_by="eng",
                                                                          stale_heartbeat=STALE, between_check_and_act=seam),
                                     {audit.OLD_RUNTIME_LIVE, audit.FENCE_NOT_IN_FORCE}),
}


@pytest.mark.parametrize("writer", list(CUTOFF_0_WRITERS))
@pytest.mark.parametrize("conflict", list(ACTIVATION_CONFLICTS))
def test_cutoff_0_is_never_written_after_a_conflicting_commit(engine, conflict, writer):
    """Greenfield activation, and the lifecycle entrypoint on a greenfield pack (it writes the same row): an old
    runtime going live, an Event written, or the fence it relied on going away between check and act rolls the
    write back."""
    fenced, change = ACTIVATION_CONFLICTS[conflict]
    write, findings = CUTOFF_0_WRITERS[writer]
    greenfield(engine, fenced=fenced)
    seam = Conflict(url_of(engine), change)
    result = write(engine, seam)
    assert seam.outcome == expected_outcome(engine, conflict)
    if seam.outcome == COMMITTED:
        assert result.outcome == REFUSED and protocol_rows(engine) == [], f"{writer} wrote after {conflict!r} committed"
        assert {f.finding for f in result.findings} <= findings
    else:
        assert result.outcome == WRITTEN and len(protocol_rows(engine)) == 1, (conflict, result.as_json())
        assert result.legacy_max_ordinal == 0


# -- the checkpoint's fence precondition ------------------------------------------------------------------------


def fenced_history(engine) -> int:
    sc = TenantScenario(namespace=NS)
    sc.pack(PACK).lane("a").generation(2)
    sc.write(engine)
    return cutover_fence.arm_fence(engine, NS, armed_by="eng", timeout_s=30).fence_id


CHECKPOINT_CONFLICTS = {
    "an override is created": lambda conn: conn.execute(insert(catalog.AdmissionFenceOverride).values(
        FenceId=conn.execute(select(catalog.AdmissionFence.c.FenceId)).scalar(), Scope="lane-vip Ä", CreatedBy="l2",
        CreatedAt=utcnow())),
    "the fence is released by hand": lambda conn: conn.execute(update(catalog.AdmissionFence).values(
        ReleasedAt=utcnow(), ReleasedBy="l2-by-hand")),
    "a second cutover fence is armed by hand": lambda conn: conn.execute(insert(catalog.AdmissionFence).values(
        Namespace=NS, Scope="*", Reason="by hand", ArmedBy="hand", ArmedAt=utcnow())),
}


@pytest.mark.parametrize("conflict", list(CHECKPOINT_CONFLICTS))
def test_the_checkpoint_never_writes_after_its_fence_precondition_broke(engine, conflict):
    fenced_history(engine)
    seam = Conflict(url_of(engine), CHECKPOINT_CONFLICTS[conflict])
    result = run_checkpoint(engine, PACK, timeout_s=30, written_by="eng", between_check_and_act=seam)
    assert seam.outcome == expected_outcome(engine, conflict)
    if seam.outcome == COMMITTED:
        assert result.outcome == REFUSED and protocol_rows(engine) == [], f"checkpoint written after {conflict!r}"
        assert {f.finding for f in result.findings} <= {audit.FENCE_OVERRIDE_ACTIVE, audit.FENCE_NOT_IN_FORCE,
                                                        audit.SEVERAL_CUTOVER_FENCES}
    else:
        assert result.outcome == WRITTEN and len(protocol_rows(engine)) == 1, (conflict, result.as_json())


def test_an_override_created_between_check_and_write_is_named_and_nothing_written(engine):
    fenced_history(engine)
    seam = Conflict(url_of(engine), CHECKPOINT_CONFLICTS["an override is created"])
    result = run_checkpoint(engine, PACK, timeout_s=30, written_by="eng", between_check_and_act=seam)
    if is_sqlite(engine):
        assert seam.outcome == BLOCKED and result.outcome == WRITTEN
        return
    assert seam.outcome == COMMITTED and result.outcome == REFUSED
    ((finding, overrides),) = [(f.finding, f.override_ids) for f in result.findings]
    assert finding == audit.FENCE_OVERRIDE_ACTIVE and len(overrides) == 1 and protocol_rows(engine) == []


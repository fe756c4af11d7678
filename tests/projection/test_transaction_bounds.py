"""Transactions that do not grow with the tenant (issue 33, item 7): the shapes measured on tenants of realistic size.

TiDB bounds a transaction (5,000 statements, tests/tidb_semantics.py), and a locked transaction that runs long holds
every other operator of the tenant. Each test builds one shape in bounded multi-row batches (TenantScenario.write:
one short transaction per 1,000 rows, inside the caps), then runs the product on it while counting the statements of
every transaction it opens (:class:`Transactions`), and asserts each stays far inside the cap, whatever the lane:

* ``plan`` and the refusing checkpoint of a pack of 20,000 lanes still draining (one pending WorkItem each): the
  refusal (``live_work``) is pack-wide, decided before the per-identity audit, so that audit is not run;
* the checkpoint of a drained pack whose 3,000 lanes end in a failed WorkItem above a completed one: every lane is
  walked down below its top and probed, a chunk of lanes per statement;
* ``status`` (the status view's read) and the standing behind ``plan`` and the rollout, of a namespace of 3,000
  checkpointed packs, each with range work above its cutoff: a statement per chunk of packs, never per pack.

Under NEXUS_TIDB_SEMANTICS=1 the harness checks the same transactions against TiDB's caps as well.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator

import pytest
from sqlalchemy import Engine, event, text

from nexus_cutover import above_cutoff, batched, catalog
from nexus_cutover.db import make_engine
from nexus_cutover.identity import ProjectionIdentity
from nexus_cutover.projection import audit
from nexus_cutover.projection.checkpoint import REFUSED, WRITTEN, run_checkpoint
from nexus_cutover.projection.dry_run import PlanOptions, plan
from nexus_cutover.standing import read_standing
from nexus_cutover.tenant_status import read_tenant_state
from nexus_sim.scenario import TenantScenario
from tests.support import make_cutover_ready, mysql_database

pytestmark = pytest.mark.mysql

NS = "acme"
#: Each transaction of the product stays well inside TiDB's cap (tests/tidb_semantics.py: 5,000), at these sizes.
BOUND = 500
DRAINING_LANES = 20_000
FAILED_TOP_LANES = 3_000
PACKS = 3_000


class Transactions:
    """The statement count of every transaction an engine runs while :func:`counting` (the harness's own count)."""

    def __init__(self) -> None:
        self.counts: list[int] = []
        self._open: dict[int, int] = {}

    def begin(self, conn) -> None:
        self._open[id(conn)] = 0

    def statement(self, conn, *_args) -> None:
        if id(conn) in self._open:
            self._open[id(conn)] += 1

    def end(self, conn) -> None:
        if id(conn) in self._open:
            self.counts.append(self._open.pop(id(conn)))

    @property
    def largest(self) -> int:
        return max(self.counts, default=0)


@contextlib.contextmanager
def counting(engine: Engine) -> Iterator[Transactions]:
    seen = Transactions()
    listeners = [("begin", seen.begin), ("before_cursor_execute", seen.statement), ("commit", seen.end), ("rollback", seen.end)]
    for name, fn in listeners:
        event.listen(engine, name, fn)
    try:
        yield seen
    finally:
        for name, fn in listeners:
            event.remove(engine, name, fn)


@pytest.fixture(autouse=True)
def _on_mysql(request):
    request.node._nexus_uses_mysql = True  # counted in the terminal summary (tests/conftest.py)


@contextlib.contextmanager
def tenant(mysql_server_url: str, sc: TenantScenario) -> Iterator[Engine]:
    with mysql_database(mysql_server_url) as url:
        engine = make_engine(url)
        try:
            make_cutover_ready(engine)
            sc.write(engine)
            yield engine
        finally:
            engine.dispose()


@pytest.fixture(scope="module")
def draining(mysql_server_url):
    """One pack of 20,000 lanes, each a completed generation then a pending one (old work still draining); on the last
    lane, an Event no WorkItem reaches (``missing_owner``, a per-identity finding the audit of the drained pack names)."""
    sc = TenantScenario(namespace=NS)
    pack = sc.pack("pk-drain")
    live = []
    for n in range(DRAINING_LANES):
        lane = pack.lane(f"lane-{n:05d}")
        lane.generation(1)
        live.append(lane.generation(1, status="pending")[1]["WorkId"])
    lane.event(status="pending")
    with tenant(mysql_server_url, sc) as engine:
        yield engine, live


def test_plan_of_a_pack_still_draining_20000_lanes_stays_in_bounds(draining):
    engine, live = draining
    with counting(engine) as seen:
        out = plan(engine, PlanOptions(namespace=NS, holder="op-1"))
    assert out["drain"]["counts"]["pending"] == DRAINING_LANES
    [check] = out["checkpoints"]
    assert check["outcome"] == REFUSED
    assert [f["finding"] for f in check["findings"]] == [audit.LIVE_WORK] * DRAINING_LANES
    assert sorted(w for f in check["findings"] for w in f["work_ids"]) == live
    assert seen.largest <= BOUND, sorted(seen.counts)[-5:]


def test_a_checkpoint_refusing_20000_draining_lanes_refuses_before_the_per_lane_audit(draining):
    """The refusal is pack-wide (``live_work``): decided before the per-identity audit, which is not run (the
    orphan on the last lane is named by the run after the drain)."""
    engine, live = draining
    from tests.support import fence_pack_namespace

    fence_pack_namespace(engine, "pk-drain")
    with counting(engine) as seen:
        result = run_checkpoint(engine, "pk-drain", timeout_s=120, written_by="test")
    assert result.outcome == REFUSED and result.legacy_max_ordinal is None
    assert {f.finding for f in result.findings} == {audit.LIVE_WORK}
    assert sorted(w for f in result.findings for w in f.work_ids) == live
    assert seen.largest <= BOUND, sorted(seen.counts)[-5:]


def test_the_checkpoint_of_3000_lanes_ending_in_a_failed_work_item_stays_in_bounds(mysql_server_url):
    """Every lane's top is failed (it selected its Event, a direct input), a completed generation below it: each lane
    is walked down below its top and its inputs above B(I) probed; the checkpoint is written."""
    sc = TenantScenario(namespace=NS)
    pack = sc.pack("pk-failed")
    for n in range(FAILED_TOP_LANES):
        lane = pack.lane(f"lane-{n:04d}")
        lane.generation(2)
        lane.generation(1, status="failed")
    sc.fence()
    with tenant(mysql_server_url, sc) as engine, counting(engine) as seen:
        result = run_checkpoint(engine, "pk-failed", timeout_s=120, written_by="test")
    assert (result.outcome, result.findings) == (WRITTEN, []), [f.describe() for f in result.findings[:3]]
    assert result.legacy_max_ordinal == 3 * FAILED_TOP_LANES
    assert seen.largest <= BOUND, sorted(seen.counts)[-5:]


def test_the_checkpoint_of_3000_failed_top_lanes_still_names_every_input_beyond_the_boundary(mysql_server_url):
    """The same shape where each failed top coalesced two inputs (the first has no direct task): every lane's
    coalesced input is ``beyond_completed_boundary``, one finding per lane, each naming its Event."""
    sc = TenantScenario(namespace=NS)
    pack = sc.pack("pk-beyond")
    beyond = []
    for n in range(FAILED_TOP_LANES):
        lane = pack.lane(f"lane-{n:04d}")
        lane.generation(1)
        events, _ = lane.generation(2, status="failed")
        beyond.append(events[0]["EventId"])
    sc.fence()
    with tenant(mysql_server_url, sc) as engine, counting(engine) as seen:
        result = run_checkpoint(engine, "pk-beyond", timeout_s=120, written_by="test")
    assert result.outcome == REFUSED
    assert {f.finding for f in result.findings} == {audit.BEYOND_COMPLETED_BOUNDARY}
    assert sorted(e for f in result.findings for e in f.event_ids) == beyond
    assert len(result.findings) == FAILED_TOP_LANES
    assert seen.largest <= BOUND, sorted(seen.counts)[-5:]


def test_the_checkpoint_of_lanes_spelling_the_work_type_otherwise_asks_the_server_once_per_spelling(mysql_server_url):
    """1,000 drained lanes whose Events spell the work type ``CONNECTOR.PROJECTION`` (a projection input where the
    collation folds case, as the test server's default does): the server is asked once for the spelling, not once
    per lane, and the audit of those lanes still runs (each lane's coalesced input above nothing is owned)."""
    sc = TenantScenario(namespace=NS)
    pack = sc.pack("pk-spelled")
    for n in range(1_000):
        pack.lane(f"lane-{n:04d}", work_type="CONNECTOR.PROJECTION").generation(2)
    orphan = pack.lane("lane-0999", work_type="CONNECTOR.PROJECTION").event()
    sc.fence()
    with tenant(mysql_server_url, sc) as engine, counting(engine) as seen:
        result = run_checkpoint(engine, "pk-spelled", timeout_s=120, written_by="test")
    assert [(f.finding, f.event_ids) for f in result.findings] == [(audit.MISSING_OWNER, [orphan["EventId"]])]
    assert seen.largest <= BOUND, sorted(seen.counts)[-5:]


def test_status_and_the_standing_of_3000_checkpointed_packs_stay_in_bounds(mysql_server_url):
    """3,000 active packs, each checkpointed with range work above its cutoff (the new runtime's own, not old work
    above it) and a receipt: ``status`` and the standing read every pack in a statement per chunk of packs."""
    sc = TenantScenario(namespace=NS)
    for n in range(PACKS):
        pack = sc.pack(f"pk-{n:04d}")
        lane = pack.lane("a")
        lane.generation(1)
        sc.protocol_row(pack.pack_install_id, pack.last_ordinal)
        ranged = lane.event()
        lane.work_item(ranged, status="completed", input_start_ordinal=ranged["EnqueueOrdinal"])
        sc.receipt(pack.pack_install_id, "a", f"r-{n}")
    with tenant(mysql_server_url, sc) as engine, counting(engine) as seen:
        state = read_tenant_state(engine, NS)
        standing = read_standing(engine, NS)
        planned = plan(engine, PlanOptions(namespace=NS, holder="op-1"))  # the fence's look: one statement, not 3,000
    assert planned["verdict"].startswith("done: already cut over"), planned["verdict"]
    assert "packs_error" not in state, state["packs_error"]
    assert len(state["packs"]) == PACKS and all(p["checkpoint"] and p["old_work_above_cutoff"] is None for p in state["packs"])
    assert state["receipts"] == {"total": PACKS, "materialized": 0}
    assert (standing.packs, standing.checkpointed, standing.above_cutoff) == (PACKS, PACKS, [])
    assert seen.largest <= BOUND, sorted(seen.counts)[-5:]



def _explain(engine, template, members):
    """EXPLAIN of the batched read of ``members`` (as :func:`nexus_cutover.batched.rows_by_key` runs it)."""
    union = batched._union(template, tuple(shape for shape, _ in members))
    values = {f"{name}_{k}": value for k, (_, v) in enumerate(members) for name, value in v.items()}
    sql = str(union.params(values).compile(dialect=engine.dialect, compile_kwargs={"literal_binds": True}))
    with engine.connect() as conn:
        conn.execute(text("ANALYZE TABLE _System_Event, _System_WorkItem"))
        return [dict(r._mapping) for r in conn.execute(text("EXPLAIN " + sql))]


def test_each_member_of_a_batched_read_is_its_own_index_read(draining):
    """EXPLAIN on MariaDB: in the UNION ALL of a batched read, every member reads its index as the lone read does
    (tests/projection/test_audit_plans.py, tests/runtime/test_old_work_above_cutoff.py)."""
    engine, _ = draining
    a, b = (ProjectionIdentity("pk-drain", "contact.changed", 1, "1.0.0", catalog.PROJECTION_WORK_TYPE, f"lane-{n:05d}")
            for n in (3, 4))
    at = batched.identity_values
    reach = [(None, {**at(a), "cutoff": 1, "reach": 9}), (None, {**at(b), "cutoff": 1, "reach": 9})]
    cases = [
        ("walk down", audit._walk_down_member, [((False, 4), at(a)), ((True, 32), {**at(b), "lane": 9, "work": 7})],
         {"_System_WorkItem": "ix_WorkItem_ProjectionOrder"}),
        ("indirect inputs", audit._indirect_events_member,
         [((False, 50), {**at(a), "above": audit.BELOW_EVERY_ORDINAL}), ((True, 50), {**at(b), "above": 1, "ordinal": 2, "event": 5})],
         {"_System_Event": "ix_Event_SourceLane", "_System_WorkItem": "ix_WorkItem_Selected"}),
        ("identity tops", above_cutoff._tops_member, [(None, {"pack": "pk-drain", "cutoff": 9}), (None, {"pack": "pk-x", "cutoff": 1})],
         {"_System_WorkItem": "ix_WorkItem_ProjectionOrder"}),
        ("old work above a cutoff", above_cutoff._old_work_member, [(None, {**at(a), "cutoff": 1}), (None, {**at(b), "cutoff": 1})],
         {"_System_WorkItem": "ix_WorkItem_ProjectionOrder"}),
        ("reached Events, counted", above_cutoff._reached_count_member, reach, {"_System_Event": "ix_Event_SourceLane"}),
        ("reached Events, named", above_cutoff._reached_sample_member, reach, {"_System_Event": "ix_Event_SourceLane"}),
    ]
    for what, template, members, keys in cases:
        plan_rows = _explain(engine, template, members)
        reads = [r for r in plan_rows if r["table"] in keys]
        assert len(reads) >= len(members) * len(keys), (what, plan_rows)
        assert all(r["key"] == keys[r["table"]] and r["type"] != "ALL" for r in reads), (what, plan_rows)


def test_a_batched_read_is_built_in_a_few_sizes_only():
    """Full chunks, then the rest in powers of two: each size is one compiled statement an engine keeps."""
    assert [len(c) for c in batched.chunks(range(237))] == [100, 100, 32, 4, 1]
    assert [len(c) for c in batched.chunks(range(64), 31)] == [31, 31, 2]
    assert list(batched.chunks([])) == []

"""The audit against a brute-force reading of the contract's audit table, over random tenants (differential).

Each example is a random tenant (Hypothesis): two packs on the same lanes, Events with gaps, ties and pre-ordinal
(0) history, old-protocol WorkItems in every status (some deleted by retention, some at the same LaneOrdinal, some
directly selecting an Event, some spelled in another case or with trailing spaces than their Events), a few
range-protocol WorkItems, and, in one variant, ordinary work beside it. :func:`oracle` reads the contract's table
("Audit (cutover step 4)", "Ordinary work", "Projection identity and ordinals") literally, row by row, in Python,
with the tenant's collation written out for the ASCII text drawn here (:data:`FOLD`), and nothing of the product.
The product's :func:`~nexus_cutover.projection.audit.audit_pack` must agree exactly: the same findings naming the
same Events and WorkItems, grouped the same way (one finding per refusal and identity *as the collation equates
identities*: rows spelled ``Lane-B`` and ``lane-b  `` of one identity are one finding, never two), and the same
``LegacyMaxOrdinal``.

Runs on SQLite (exact bytes), on MariaDB's default collation (case folded, trailing spaces ignored) and on a binary
PAD SPACE one (trailing spaces ignored), 150 tenants each.
"""

from __future__ import annotations

import datetime as dt
import itertools
import string
from collections import defaultdict

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from sqlalchemy import insert

from nexus_cutover import catalog, tx
from nexus_cutover.db import Deadline, make_engine
from nexus_cutover.projection.audit import audit_pack
from tests import collations, tidb_semantics
from tests.support import make_cutover_ready

NS = "acme"
#: The contract: "Projection inputs are the Events whose WorkType is a projection work type (the project's catalog
#: names them, in one place; today ``connector.projection``)".
PROJECTION_WORK_TYPES = getattr(catalog, "PROJECTION_WORK_TYPES", ("connector.projection",))
PROJECTION = PROJECTION_WORK_TYPES[0]
ORDINARY = "ordinary.sync"
LIVE = set(catalog.WORK_LIVE_STATUSES)
TERMINAL = set(catalog.WORK_TERMINAL_STATUSES)
STATUSES = sorted(LIVE | TERMINAL)
EVENT_STATUSES = ("pending", "processing", "processed", "skipped", "failed")
T0 = dt.datetime(2026, 1, 1)

#: Equality of the ASCII text drawn here under each collation, written out (the oracle asks the server nothing).
FOLD = {
    "sqlite": lambda s: s,
    collations.DEFAULT: lambda s: s.rstrip(" ").lower(),
    collations.PAD_SPACE_BIN: lambda s: s.rstrip(" "),
}
KIND_BASES = ("contact.changed", "Deal.Updated")
LANE_BASES = ("a", "Lane-B", "c9")
_tenants = itertools.count(1)


# -- random tenants --------------------------------------------------------------------------------


def _spelling(base: str) -> st.SearchStrategy[str]:
    """``base`` as written, or in another case, or with trailing spaces (what a collation may equate)."""
    return st.tuples(st.sampled_from(("same", "upper", "lower", "swap")), st.integers(0, 2)).map(
        lambda t: {"same": base, "upper": base.upper(), "lower": base.lower(), "swap": base.swapcase()}[t[0]] + " " * t[1]
    )


@st.composite
def tenants(draw, *, ordinary: bool):
    """Rows of one tenant: ``{"events": [...], "work": [...]}`` for packs ``P`` (audited) and ``Q`` (same lanes)."""
    n = next(_tenants)
    packs = (f"dp-{n}", f"dq-{n}")
    classes = draw(st.lists(st.tuples(st.sampled_from(KIND_BASES), st.sampled_from(LANE_BASES)), min_size=1, max_size=3, unique=True))
    event_ids, work_ids = itertools.count(n * 1000), itertools.count(n * 1000)
    events, work = [], []
    for pack in packs:
        ordinal = 0
        mine = []
        for _ in range(draw(st.integers(0, 10))):
            kind, lane = draw(st.sampled_from(classes))
            is_ordinary = ordinary and draw(st.integers(0, 3)) == 0
            if draw(st.integers(0, 5)) == 0:
                value = 0  # admitted before ordinals existed
            else:
                ordinal += draw(st.integers(1, 2))  # gaps: retention, or another work type's ordinals
                value = ordinal
            ev = {
                "EventId": next(event_ids), "Namespace": NS, "PackInstallId": pack, "EventKind": draw(_spelling(kind)),
                "RouteVersion": 1, "FlowVersion": "1.0.0", "WorkType": ORDINARY if is_ordinary else PROJECTION,
                "SourceLane": draw(_spelling(lane)), "EnqueueOrdinal": value, "ReceiptId": "", "ReplayOfWorkId": None,
                "Status": draw(st.sampled_from(EVENT_STATUSES)), "Payload": "{}", "ReceivedAt": T0,
            }
            ev["ReceiptId"] = f"r{ev['EventId']}"
            mine.append((ev, kind, lane))
            events.append(ev)
            if is_ordinary and draw(st.integers(0, 3)) > 0:  # its one ordinary WorkItem (or retention took it)
                work.append(_work(next(work_ids), None, ev["EventId"], ORDINARY, draw(st.sampled_from(STATUSES)), None, None, None))
        for _ in range(draw(st.integers(0, 8))):
            kind, lane = draw(st.sampled_from(classes))
            mates = [ev for ev, k, ln in mine if (k, ln) == (kind, lane) and ev["WorkType"] == PROJECTION]
            selected = draw(st.sampled_from(mates)) if mates and draw(st.booleans()) else None
            lane_ordinal = selected["EnqueueOrdinal"] if selected else draw(st.integers(0, ordinal + 2))
            native = draw(st.integers(0, 9)) == 0
            identity = (pack, draw(_spelling(kind)), draw(_spelling(lane)))
            work.append(
                _work(next(work_ids), identity, selected["EventId"] if selected else None, PROJECTION, draw(st.sampled_from(STATUSES)),
                      lane_ordinal, lane_ordinal if native else None, "projection")
            )
    return {"pack": packs[0], "events": events, "work": work}


def _work(work_id, identity, selected, work_type, status, lane_ordinal, input_start, work_class):
    pack, kind, lane = identity or (None, None, None)
    return {
        "WorkId": work_id, "Namespace": NS, "WorkClass": work_class or catalog.WORK_CLASS_ORDINARY, "PackInstallId": pack,
        "EventKind": kind, "RouteVersion": 1 if identity else None, "FlowVersion": "1.0.0" if identity else None,
        "WorkType": work_type, "SourceLane": lane, "SelectedEventId": selected, "LaneOrdinal": lane_ordinal,
        "ReplayOfWorkId": None, "Attempt": 0, "Status": status, "BlockedOn": None, "NextAttemptAt": None, "LeaseOwner": None,
        "LeaseExpiresAt": None, "CreatedAt": T0, "UpdatedAt": T0, "InputStartOrdinal": input_start,
    }


# -- the contract, read literally -----------------------------------------------------------------------


COLUMNS = ("PackInstallId", "EventKind", "RouteVersion", "FlowVersion", "WorkType", "SourceLane")


def folded(row, fold) -> tuple:
    """The identity of ``row`` (a dict, or a ProjectionIdentity) as the collation compares it."""
    values = [row[c] for c in COLUMNS] if isinstance(row, dict) else list(row)
    return tuple(fold(v) if isinstance(v, str) else v for v in values)


def oracle_groups(tenant: dict, fold) -> dict[tuple[str, tuple], set[tuple[str, int]]]:
    """The oracle's findings grouped as the contract names them: ``{(finding, folded identity): {(kind, id)}}``
    (every finding drawn here is about one identity: the identity of the Event or WorkItem it names)."""
    rows = {("event", e["EventId"]): e for e in tenant["events"]} | {("work", w["WorkId"]): w for w in tenant["work"]}
    groups: dict[tuple[str, tuple], set[tuple[str, int]]] = defaultdict(set)
    for finding, kind, row_id in oracle(tenant, fold)[0]:
        groups[(finding, folded(rows[(kind, row_id)], fold))].add((kind, row_id))
    return dict(groups)


def oracle(tenant: dict, fold) -> tuple[set[tuple[str, str, int]], int]:
    """``({(finding, "event"|"work", id)}, LegacyMaxOrdinal)`` of the contract's audit table for the tenant's pack."""
    pack = tenant["pack"]

    def ident(row):
        return folded(row, fold)

    events = [e for e in tenant["events"] if e["PackInstallId"] == pack]
    inputs = [e for e in events if e["WorkType"] in PROJECTION_WORK_TYPES]
    projection_work = [w for w in tenant["work"] if w["WorkClass"] == catalog.WORK_CLASS_PROJECTION]
    found: set[tuple[str, str, int]] = set()
    for w in projection_work:
        if w["PackInstallId"] == pack and w["Status"] in LIVE:
            found.add(("live_work", "work", w["WorkId"]))
        if w["PackInstallId"] == pack and w["InputStartOrdinal"] is not None:  # no protocol row exists here
            found.add(("native_work_before_checkpoint", "work", w["WorkId"]))
    ordinals = defaultdict(set)
    for e in inputs:
        ordinals[ident(e)].add(e["EnqueueOrdinal"])
    for e in inputs:
        if any(w["SelectedEventId"] == e["EventId"] for w in tenant["work"]):
            continue  # direct input: permitted (a live direct task is live_work, pack-wide)
        i, o = ident(e), e["EnqueueOrdinal"]
        if 0 in ordinals[i] and any(x > 0 for x in ordinals[i]):
            found.add(("mixed_history_indirect", "event", e["EventId"]))
            continue
        of_i = [w for w in projection_work if w["LaneOrdinal"] is not None and ident(w) == i]
        completed = [w["LaneOrdinal"] for w in of_i if w["Status"] == catalog.WORK_COMPLETED]
        boundary = max(completed) if completed else None
        if boundary is not None and o <= boundary:
            continue  # completed coalesced input
        if any(w["Status"] in TERMINAL and w["LaneOrdinal"] >= o for w in of_i):
            found.add(("beyond_completed_boundary", "event", e["EventId"]))
        elif not any(w["LaneOrdinal"] >= o for w in of_i):
            found.add(("missing_owner", "event", e["EventId"]))
    return found, max((e["EnqueueOrdinal"] for e in events), default=0)


def product(engine, pack: str, fold) -> tuple[set[tuple[str, str, int]], int, list[tuple[tuple[str, tuple], set]]]:
    """The audit's findings as rows, its ``LegacyMaxOrdinal``, and its findings as groups (one per Finding, keyed
    by refusal and the folded identity it names; a key appearing twice is an identity split in two)."""
    report = tx.read(engine, lambda conn: audit_pack(conn, pack, NS, Deadline(60)), what="auditing")
    found = set()
    groups = []
    for f in report.findings:
        rows = {("event", e) for e in f.event_ids} | {("work", w) for w in f.work_ids}
        found |= {(f.finding, kind, row_id) for kind, row_id in rows}
        groups.append(((f.finding, folded(f.identity, fold) if f.identity else None), rows))
    return found, report.legacy_max_ordinal, groups


# -- the test --------------------------------------------------------------------------------------


BACKENDS = ([] if tidb_semantics.enabled_by_env() else [pytest.param("sqlite", id="sqlite")]) + [
    pytest.param(c, id=c, marks=pytest.mark.mysql) for c in collations.COLLATIONS
]


@pytest.fixture(params=BACKENDS)
def audit_engine(request, tmp_path):
    backend = request.param
    if backend == "sqlite":
        (tmp_path / "tenant.db").touch()
        engine = make_engine(f"sqlite:///{tmp_path / 'tenant.db'}")
        make_cutover_ready(engine)
        yield backend, engine
        engine.dispose()
        return
    request.node._nexus_uses_mysql = True
    with collations.collated_database(request.getfixturevalue("mysql_server_url"), backend) as url:
        engine = make_engine(url)
        make_cutover_ready(engine)
        yield backend, engine
        engine.dispose()


def _write(engine, tenant):
    with engine.begin() as conn:
        for pack in {e["PackInstallId"] for e in tenant["events"]} | {tenant["pack"]}:
            conn.execute(insert(catalog.PackInstall).values(PackInstallId=pack, Namespace=NS, PackName="p", Status="active",
                                                            InstalledAt=T0))
        if tenant["events"]:
            conn.execute(insert(catalog.Event), tenant["events"])
        if tenant["work"]:
            conn.execute(insert(catalog.WorkItem), tenant["work"])


def _differential(audit_engine, ordinary: bool):
    backend, engine = audit_engine
    fold = FOLD[backend]

    @settings(max_examples=150, deadline=None, derandomize=True, suppress_health_check=list(HealthCheck))
    @given(tenants(ordinary=ordinary))
    def check(tenant):
        _write(engine, tenant)
        expected, expected_max = oracle(tenant, fold)
        found, legacy_max, groups = product(engine, tenant["pack"], fold)
        assert (sorted(found), legacy_max) == (sorted(expected), expected_max), {
            "only the audit": sorted(found - expected),
            "only the contract": sorted(expected - found),
        }
        keys = [key for key, _ in groups]
        assert len(keys) == len(set(keys)), f"one identity reported as several findings: {sorted(map(str, keys))}"
        assert dict(groups) == oracle_groups(tenant, fold)

    check()


def test_the_audit_agrees_with_the_contract_on_random_projection_tenants(audit_engine):
    _differential(audit_engine, ordinary=False)


def test_the_audit_agrees_with_the_contract_on_random_tenants_with_ordinary_work(audit_engine):
    _differential(audit_engine, ordinary=True)


def test_the_oracle_reads_the_table_row_by_row():
    """The oracle itself, on a hand-made tenant whose findings are worked out in the docstring of each row."""
    ev = lambda i, o, lane="a", wt=PROJECTION: {  # noqa: E731
        "EventId": i, "PackInstallId": "P", "EventKind": "k", "RouteVersion": 1, "FlowVersion": "1.0.0", "WorkType": wt,
        "SourceLane": lane, "EnqueueOrdinal": o,
    }
    wk = lambda i, lo, status, sel=None, lane="a", start=None: _work(i, ("P", "k", lane), sel, PROJECTION, status, lo, start,  # noqa: E731
                                                                     "projection")
    tenant = {
        "pack": "P",
        "events": [ev(1, 1), ev(2, 2), ev(3, 3), ev(4, 4, "A "), ev(5, 0, "m"), ev(6, 1, "m"), ev(7, 9, "z", ORDINARY)],
        "work": [
            wk(10, 2, "completed"), wk(11, 4, "failed"), wk(12, 1, "pending", lane="m", sel=6), wk(13, 9, "cancelled", lane="q", start=9)
        ],
    }
    # 1, 2: coalesced at or below B=2; 3, 4: above B, reached by failed work (4 is lane 'A ' = 'a' folded);
    # 5: mixed 0/positive, indirect; 6: direct; 7: ordinary, never audited; 12 live; 13 native.
    found, legacy_max = oracle(tenant, FOLD[collations.DEFAULT])
    assert found == {
        ("beyond_completed_boundary", "event", 3), ("beyond_completed_boundary", "event", 4), ("mixed_history_indirect", "event", 5),
        ("live_work", "work", 12), ("native_work_before_checkpoint", "work", 13),
    }
    assert legacy_max == 9  # the greatest ordinal of every Event of the pack, ordinary ones included
    exact, _ = oracle(tenant, FOLD["sqlite"])
    assert ("missing_owner", "event", 4) in exact and ("beyond_completed_boundary", "event", 4) not in exact
    # grouped: 3 (lane 'a') and 4 (lane 'A ') are one identity folded, so one finding names both; exact, two
    lane_a = ("P", "k", 1, "1.0.0", PROJECTION, "a")
    assert oracle_groups(tenant, FOLD[collations.DEFAULT])[("beyond_completed_boundary", ("p",) + lane_a[1:])] == {
        ("event", 3), ("event", 4)}
    exact_groups = oracle_groups(tenant, FOLD["sqlite"])
    assert exact_groups[("beyond_completed_boundary", lane_a)] == {("event", 3)}
    assert exact_groups[("missing_owner", lane_a[:5] + ("A ",))] == {("event", 4)}
    assert set(string.ascii_letters) >= {c for base in LANE_BASES + KIND_BASES for c in base if c.isalpha()}


def test_a_completed_top_spelled_otherwise_is_the_boundary_without_a_walk_down(audit_engine, monkeypatch):
    """Events on lane ``Lane-B``, their completed generation's WorkItem spelled ``lane-b  ``: where the collation
    equates the spellings, the top row read once is B(I) (no walk down the identity, no finding); where it does
    not (SQLite), the Events have no owner and are named, under their own spelling."""
    from nexus_cutover.projection import audit

    backend, engine = audit_engine
    fold = FOLD[backend]
    ev = {"EventId": 1, "Namespace": NS, "PackInstallId": "dp-top", "EventKind": "k", "RouteVersion": 1, "FlowVersion": "1.0.0",
          "WorkType": PROJECTION, "SourceLane": "Lane-B", "EnqueueOrdinal": 1, "ReceiptId": "r1", "ReplayOfWorkId": None,
          "Status": "processed", "Payload": "{}", "ReceivedAt": T0}
    tenant = {"pack": "dp-top", "events": [ev, {**ev, "EventId": 2, "EnqueueOrdinal": 2, "ReceiptId": "r2"}],
              "work": [_work(1, ("dp-top", "k", "lane-b  "), None, PROJECTION, "completed", 2, None, "projection")]}
    _write(engine, tenant)
    walks = []
    real_walk = audit._walk_down
    monkeypatch.setattr(audit, "_walk_down", lambda conn, idents, deadline: walks.extend(idents) or real_walk(conn, idents, deadline))
    found, _, groups = product(engine, "dp-top", fold)
    equated = fold("Lane-B") == fold("lane-b  ")
    assert walks == ([] if equated else [audit.identity.ProjectionIdentity("dp-top", "k", 1, "1.0.0", PROJECTION, "Lane-B")])
    assert found == (set() if equated else {("missing_owner", "event", 1), ("missing_owner", "event", 2)})
    assert dict(groups) == oracle_groups(tenant, fold)

"""Generations of one projection identity, on ``ix_WorkItem_ProjectionOrder``.

A generation is a projection WorkItem with a persisted input range
``[InputStartOrdinal, LaneOrdinal]`` over the Events of its identity.

Invariants (seed 000, "Ownership and invariant"):

* ``InputStartOrdinal`` is written once, when the generation is created, and
  never changed. ``LaneOrdinal`` (with ``SelectedEventId``) moves up only while
  the generation is unclaimed and attempt zero (``Status = 'pending' AND
  Attempt = 0``); the conditional UPDATE re-checks that against the latest
  committed row, so a claim that committed first wins and the inputs go to a
  successor instead.
* Only the latest generation of an identity (greatest ``LaneOrdinal``) can be
  extended, and new ordinals are above every existing one, so ranges of one
  identity never overlap and leave no admitted input outside a range.
* Every lookup here is an equality prefix on the six identity columns plus a
  bound on ``LaneOrdinal`` with ``LIMIT 1``: one index row, whatever the number
  of retained generations.
"""

from __future__ import annotations

import datetime as dt
import functools
from dataclasses import dataclass

from sqlalchemy import Connection, Select, Update, and_, bindparam, case, insert, literal, or_, select, union_all, update

from .. import catalog
from ..catalog import WorkItem
from ..identity import ProjectionIdentity, matches


@dataclass(frozen=True)
class Generation:
    work_id: int
    status: str
    attempt: int
    input_start_ordinal: int | None
    lane_ordinal: int
    selected_event_id: int | None

    @property
    def extendable(self) -> bool:
        """Unclaimed, attempt zero and a range generation: may absorb later inputs."""
        return self.status == "pending" and self.attempt == 0 and self.input_start_ordinal is not None

    def contains(self, ordinal: int) -> bool:
        return self.input_start_ordinal is not None and self.input_start_ordinal <= ordinal <= self.lane_ordinal


_UNION_CHUNK = 50

_COLUMNS = (
    WorkItem.c.WorkId,
    WorkItem.c.Status,
    WorkItem.c.Attempt,
    WorkItem.c.InputStartOrdinal,
    WorkItem.c.LaneOrdinal,
    WorkItem.c.SelectedEventId,
)


def latest_generation_query(identity: ProjectionIdentity) -> Select:
    """The generation with the greatest ``LaneOrdinal`` of ``identity`` (the one admission may extend)."""
    return (
        select(*_COLUMNS)
        .where(matches(WorkItem, identity), WorkItem.c.LaneOrdinal.is_not(None))
        .order_by(WorkItem.c.LaneOrdinal.desc())
        .limit(1)
    )


def covering_generation_query(identity: ProjectionIdentity, ordinal: int) -> Select:
    """The first generation of ``identity`` whose upper bound is at or above ``ordinal``.

    Ranges never overlap, so this is the only generation that can contain ``ordinal``.
    """
    return (
        select(*_COLUMNS)
        .where(matches(WorkItem, identity), WorkItem.c.LaneOrdinal >= ordinal)
        .order_by(WorkItem.c.LaneOrdinal.asc())
        .limit(1)
    )


def previous_generation_query(identity: ProjectionIdentity, lane_ordinal: int) -> Select:
    """The generation of ``identity`` just below ``lane_ordinal`` (per-identity execution order)."""
    return (
        select(*_COLUMNS)
        .where(matches(WorkItem, identity), WorkItem.c.LaneOrdinal < lane_ordinal)
        .order_by(WorkItem.c.LaneOrdinal.desc())
        .limit(1)
    )


def _one(conn: Connection, query: Select) -> Generation | None:
    row = conn.execute(query).first()
    return Generation(*row) if row is not None else None


def latest_generations(conn: Connection, identities: list[ProjectionIdentity]) -> dict[ProjectionIdentity, Generation]:
    """The latest generation of each identity, in one statement (a UNION ALL of ``LIMIT 1`` index reads).

    Runs under the pack lock at READ COMMITTED (:mod:`.tx`), so it sees every
    generation the previous lock holder committed.
    """
    found: dict[ProjectionIdentity, Generation] = {}
    for start in range(0, len(identities), _UNION_CHUNK):
        chunk = identities[start : start + _UNION_CHUNK]
        params = {f"i{k}_{p}": value for k, ident in enumerate(chunk) for p, value in enumerate(ident)}
        for row in conn.execute(_latest_union(len(chunk)), params):
            found[chunk[row[0]]] = Generation(*row[1:])
    return found


@functools.lru_cache(maxsize=_UNION_CHUNK)
def _latest_union(n: int) -> Select:
    """The statement of :func:`latest_generations_query` for ``n`` identities, with bound parameters.

    Built once per ``n`` (constructing the union is costly); parameters ``i<k>_<part>``.
    """
    slots = [ProjectionIdentity(*(bindparam(f"i{k}_{p}") for p in range(6))) for k in range(n)]
    return latest_generations_query(slots)


def latest_generations_query(identities: list[ProjectionIdentity]) -> Select:
    """``(k, generation columns)`` of the latest generation of ``identities[k]``, for each k that has one."""
    parts = [select(literal(k).label("k"), *latest_generation_query(ident).subquery().c) for k, ident in enumerate(identities)]
    return parts[0] if len(parts) == 1 else union_all(*parts)


def covering_generation(conn: Connection, identity: ProjectionIdentity, ordinal: int) -> Generation | None:
    """The generation whose range contains ``ordinal``, or None (no durable coverage)."""
    gen = _one(conn, covering_generation_query(identity, ordinal))
    return gen if gen is not None and gen.contains(ordinal) else None


def previous_generation(conn: Connection, identity: ProjectionIdentity, lane_ordinal: int) -> Generation | None:
    return _one(conn, previous_generation_query(identity, lane_ordinal))


def extend_many(conn: Connection, moves: list[tuple[Generation, int, int]], now: dt.datetime) -> set[int]:
    """Extend several generations (``(gen, lane_ordinal, selected_event_id)``) in one UPDATE.

    Each row is re-checked (pending, attempt zero, unchanged upper bound) against
    the latest committed version; returns the WorkIds actually extended. When a
    claim won a race for some of them, the moved rows are read back to tell which.
    """
    if not moves:
        return set()
    if len(moves) == 1:
        gen, lane_ordinal, event_id = moves[0]
        return {gen.work_id} if try_extend(conn, gen, lane_ordinal, event_id, now) else set()
    ids = [g.work_id for g, _, _ in moves]
    params = {"now": now}
    for k, (gen, lane_ordinal, event_id) in enumerate(moves):
        params.update({f"w{k}": gen.work_id, f"was{k}": gen.lane_ordinal, f"lo{k}": lane_ordinal, f"ev{k}": event_id})
    stmt = _extend_statement(len(moves))
    if conn.execute(stmt, params).rowcount == len(moves):
        return set(ids)
    target = {g.work_id: lo for g, lo, _ in moves}
    rows = conn.execute(select(WorkItem.c.WorkId, WorkItem.c.LaneOrdinal).where(WorkItem.c.WorkId.in_(ids)))
    return {r.WorkId for r in rows if r.LaneOrdinal == target[r.WorkId]}


@functools.lru_cache(maxsize=64)
def _extend_statement(n: int) -> Update:
    """The UPDATE of :func:`extend_many` for ``n`` generations, with bound parameters (built once per ``n``).

    Parameters ``w<k>`` (WorkId), ``was<k>`` (its ``LaneOrdinal`` as read), ``lo<k>`` / ``ev<k>`` (the new upper
    bound and selected Event), ``now``.
    """
    c = WorkItem.c

    def param(name: str, column):  # typed like its column, as a literal value would be (SQLite's DateTime format)
        return bindparam(name, type_=column.type)

    work_id = [param(f"w{k}", c.WorkId) for k in range(n)]
    return (
        update(WorkItem)
        .where(
            c.WorkId.in_(work_id),
            c.Status == "pending",
            c.Attempt == 0,
            c.InputStartOrdinal.is_not(None),
            or_(*(and_(c.WorkId == work_id[k], c.LaneOrdinal == param(f"was{k}", c.LaneOrdinal)) for k in range(n))),
        )
        .values(
            LaneOrdinal=case(*((c.WorkId == work_id[k], param(f"lo{k}", c.LaneOrdinal)) for k in range(n))),
            SelectedEventId=case(*((c.WorkId == work_id[k], param(f"ev{k}", c.SelectedEventId)) for k in range(n))),
            UpdatedAt=param("now", c.UpdatedAt),
        )
    )


def try_extend(conn: Connection, gen: Generation, lane_ordinal: int, selected_event_id: int, now: dt.datetime) -> bool:
    """Move ``gen``'s upper bound to ``lane_ordinal`` if it is still unclaimed and attempt zero."""
    result = conn.execute(
        update(WorkItem)
        .where(
            WorkItem.c.WorkId == gen.work_id,
            WorkItem.c.Status == "pending",
            WorkItem.c.Attempt == 0,
            WorkItem.c.InputStartOrdinal.is_not(None),
            WorkItem.c.LaneOrdinal == gen.lane_ordinal,
        )
        .values(LaneOrdinal=lane_ordinal, SelectedEventId=selected_event_id, UpdatedAt=now)
    )
    return result.rowcount == 1


def create_generations(conn: Connection, rows: list[dict]) -> None:
    """Insert several new queued generations (rows built by :func:`generation_row`) in one statement."""
    if rows:
        conn.execute(insert(WorkItem), rows)


def generation_row(
    *,
    work_id: int,
    namespace: str,
    identity: ProjectionIdentity,
    input_start_ordinal: int,
    lane_ordinal: int,
    selected_event_id: int,
    now: dt.datetime,
    replay_of_work_id: int | None = None,
) -> dict:
    """A new queued generation ``[input_start_ordinal, lane_ordinal]`` (pending, attempt zero)."""
    return {
        "WorkId": work_id,
        "Namespace": namespace,
        "WorkClass": catalog.WORK_CLASS_PROJECTION,
        **identity.as_values(),
        "SelectedEventId": selected_event_id,
        "LaneOrdinal": lane_ordinal,
        "InputStartOrdinal": input_start_ordinal,
        "ReplayOfWorkId": replay_of_work_id,
        "Attempt": 0,
        "Status": "pending",
        "CreatedAt": now,
        "UpdatedAt": now,
    }


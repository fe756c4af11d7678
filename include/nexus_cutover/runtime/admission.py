"""Fresh ingress: :func:`admit_batch` (seed 000, "Ownership and invariant").

Invariants:

* One pack transaction per batch (:func:`~.tx.run_in_pack_transaction`): the
  pack lock serializes fresh ingress and explicit replay; the protocol row is
  read once per batch; every Event is committed together with its WorkItem change.
* Identity equality is the server's: the batch's inputs are grouped by
  :func:`~nexus_cutover.identity.identity_keys`, so inputs whose identities the
  tenant's collation equates (``Lane-A`` / ``lane-a`` on a case-insensitive
  collation, ``a`` / ``a `` on a PAD SPACE one) extend or create one generation,
  and an admitted input belongs to exactly one generation as the server's own
  join sees it. Each Event keeps the bytes it came with.
* Duplicates (receipt already admitted byte for byte, or repeated inside the
  batch) change no membership and create no work (:mod:`.duplicates`). A batch
  holding a receipt that cannot be admitted for a reason retrying will not
  remove fails whole, nothing written, naming each such receipt
  (:class:`~.errors.InadmissibleReceipts`): a post-cutoff duplicate without
  coverage (``MissingCoverage``), a key that collides with another receipt's
  (``ReceiptCollision``), an empty or over-long value (``InvalidReceipts``).
  None of them is retried.
* Receipts admitted before are found by the Event INSERT itself (optimistic:
  most batches hold none, and ``ux_Event_Receipt`` checks every row anyway).
  When it fails on a key, its whole transaction is rolled back (nothing of the
  batch is committed) and the batch runs again in a new one that probes the
  receipts first, so the result is the one a probe first gives. A transaction
  the policy retries (a deadlock, or an id race on a primary key) probes first
  too. A receipt-key duplicate in a probing attempt is not retried.
* Fresh inputs get consecutive new ordinals above ``LegacyMaxOrdinal`` and
  ``_System_EnqueueOrdinal.LastOrdinal``, in batch order. Per affected identity,
  the batch either extends the latest generation (only if unclaimed, attempt
  zero) or creates one successor whose ``InputStartOrdinal`` is the batch's
  minimum ordinal for that identity; either way ``LaneOrdinal`` and
  ``SelectedEventId`` become the batch's last input of the identity.
* Work is per affected identity (one ``LIMIT 1`` index read, one UPDATE or
  INSERT), never per retained generation. At most :data:`MAX_BATCH` inputs
  per transaction.

``in_transaction(conn, result)``, if given, runs inside the same transaction
after the Events and WorkItems are written (the receipt materializer sets
``MaterializedAt`` there).
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Sequence
from typing import Any

from sqlalchemy import Connection, Engine, insert
from sqlalchemy.exc import IntegrityError

from ..catalog import Event
from ..clock import utcnow
from ..db import Deadline, is_primary_key_duplicate
from ..errors import BadInput, CutoverError
from ..identity import ProjectionIdentity, identity_keys
from .duplicates import COVERED, sort_receipts, verify_duplicates
from .errors import InvalidReceipts, ReceiptCollision, Rejection
from .generations import create_generations, extend_many, generation_row, latest_generations
from .model import AdmissionResult, Admitted, Duplicate, Input
from .packs import PackContext, pack_context
from .tx import allocate_event_and_work_ids, allocate_ordinals, run_in_pack_transaction

MAX_BATCH = 2000

InTransaction = Callable[[Connection, AdmissionResult], None]


def admit_batch(
    engine: Engine,
    pack_install_id: str,
    inputs: Sequence[Input],
    *,
    deadline: Deadline | None = None,
    in_transaction: InTransaction | None = None,
) -> AdmissionResult:
    """Admit ``inputs`` of one pack in one committed transaction (a duplicate costs a rolled-back one first); see the module invariants."""
    if len(inputs) > MAX_BATCH:
        raise BadInput(f"an admission batch holds at most {MAX_BATCH} inputs, got {len(inputs)}: split it")
    invalid = invalid_inputs(inputs)
    if invalid:
        raise InvalidReceipts(pack_install_id, invalid)

    probe_next = False  # the first attempt inserts optimistically; every later one probes first

    def body(conn: Connection) -> AdmissionResult:
        nonlocal probe_next
        probe_first, probe_next = probe_next, True
        result = _admit(conn, pack_install_id, inputs, probe_first=probe_first)
        if in_transaction is not None:
            in_transaction(conn, result)
        return result

    def run() -> AdmissionResult:
        return run_in_pack_transaction(engine, pack_install_id, body, what=f"admitting into pack {pack_install_id!r}", deadline=deadline)

    try:
        return run()
    except _AdmittedBefore:
        return run()


class _AdmittedBefore(Exception):
    """The optimistic Event INSERT hit a key that exists: its transaction is rolled back and the batch runs again, probing first."""


_LIMITED = ("SourceLane", "ReceiptId", "EventKind", "FlowVersion", "WorkType")


def invalid_inputs(inputs: Sequence[Input]) -> list[Rejection]:
    """Inputs no admission can take: an empty lane or receipt id, a value longer than its ``_System_Event`` column."""
    limits = {name: Event.c[name].type.length for name in _LIMITED}
    found: list[Rejection] = []
    checked_routes: dict[tuple[str, str, str], str | None] = {}
    for item in inputs:
        lane, receipt = item.source_lane, item.receipt_id
        why = None
        if not lane or not receipt:
            why = "every input needs a non-empty source lane and receipt id"
        elif len(lane) > limits["SourceLane"] or len(receipt) > limits["ReceiptId"]:
            why = f"a source lane or receipt id longer than {limits['SourceLane']}/{limits['ReceiptId']} characters"
        else:
            route = (item.event_kind, item.flow_version, item.work_type)
            if route not in checked_routes:
                too_long = [n for n, v in zip(("EventKind", "FlowVersion", "WorkType"), route, strict=True) if len(v) > limits[n]]
                checked_routes[route] = f"{', '.join(too_long)} longer than its column" if too_long else None
            why = checked_routes[route]
        if why:
            found.append(InvalidReceipts.rejection(lane, receipt, why))
    return found


#: The batch's new Event rows grouped by identity, each group in batch (so ordinal) order.
ByIdentity = dict[ProjectionIdentity, list[dict[str, Any]]]


def _admit(conn: Connection, pack_install_id: str, inputs: Sequence[Input], *, probe_first: bool) -> AdmissionResult:
    ctx = pack_context(conn, pack_install_id)
    pack_install_id = ctx.pack_install_id  # the stored spelling: ids, ordinals and Events use it
    result = AdmissionResult(pack_install_id)
    fresh, repeated = _sort_out(conn, ctx, inputs, result, probe=probe_first)
    if not fresh:
        return result
    now = utcnow()
    first_ordinal = allocate_ordinals(conn, pack_install_id, ctx.protocol.legacy_max_ordinal, len(fresh))
    first_event_id, next_work_id = allocate_event_and_work_ids(conn, pack_install_id, len(fresh), len(fresh))
    try:
        by_identity = _insert_events(conn, ctx, fresh, first_ordinal, first_event_id, now)
    except IntegrityError as exc:
        if not probe_first:
            # Most likely a receipt admitted before. A driver may have sent the rows in several statements, some of
            # which succeeded, so the whole transaction is rolled back, not this statement alone.
            raise _AdmittedBefore() from exc
        if is_primary_key_duplicate(exc):
            raise  # an id race: the policy retries the transaction
        raise CutoverError(
            f"admitting into pack {pack_install_id!r}: the receipt key check found no collision, yet the server refused "
            f"an Event on a key ({str(getattr(exc, 'orig', exc)).splitlines()[0]}); nothing written, not retried"
        ) from exc
    _write_generations(conn, ctx, by_identity, next_work_id, now, result)
    _cover_repeated(repeated, result)
    return result


def _sort_out(
    conn: Connection, ctx: PackContext, inputs: Sequence[Input], result: AdmissionResult, *, probe: bool
) -> tuple[list[Input], list[Input]]:
    """``(fresh, repeated)`` in batch order; with ``probe``, receipts admitted before go to ``result.duplicates``.

    Those are verified (:func:`~.duplicates.verify_duplicates`: a post-cutoff one
    without coverage raises ``MissingCoverage``); a collision raises
    ``ReceiptCollision``; a receipt repeated inside the batch byte for byte is
    fresh the first time, ``repeated`` after. Without ``probe`` every receipt's
    first occurrence is fresh (the optimistic INSERT's unique key finds the rest,
    collisions included).
    """
    verified: dict[tuple[str, str], Duplicate] = {}
    if probe:
        existing, collisions = sort_receipts(conn, ctx.pack_install_id, inputs)
        if collisions:
            raise ReceiptCollision(ctx.pack_install_id, collisions)
        verified = {(d.source_lane, d.receipt_id): d for d in verify_duplicates(conn, ctx.protocol, existing)}
    fresh: list[Input] = []
    repeated: list[Input] = []
    seen: set[tuple[str, str]] = set()
    for item in inputs:
        key = (item.source_lane, item.receipt_id)
        if key in verified:
            result.duplicates.append(verified[key])
        elif key in seen:
            repeated.append(item)
        else:
            fresh.append(item)
            seen.add(key)
    return fresh, repeated


def _insert_events(
    conn: Connection, ctx: PackContext, fresh: list[Input], first_ordinal: int, first_event_id: int, now: dt.datetime
) -> ByIdentity:
    """Insert one pending Event per fresh input (consecutive ordinals and EventIds, in batch order), in one statement.

    Groups by the server's identity equality: each group is keyed by its first input's identity.
    """
    rows: list[dict[str, Any]] = []
    by_identity: ByIdentity = {}
    identity_values: dict[ProjectionIdentity, dict[str, Any]] = {}  # a batch has few identities and many inputs
    identities = [item.identity(ctx.pack_install_id) for item in fresh]
    keys = identity_keys(conn, identities)
    group_of: dict[tuple, ProjectionIdentity] = {}
    for offset, (item, identity) in enumerate(zip(fresh, identities, strict=True)):
        if identity not in identity_values:
            identity_values[identity] = identity.as_values()
        group = group_of.setdefault(keys[identity], identity)
        row = {
            "EventId": first_event_id + offset,
            "Namespace": ctx.namespace,
            **identity_values[identity],
            "EnqueueOrdinal": first_ordinal + offset,
            "ReceiptId": item.receipt_id,
            "ReplayOfWorkId": None,
            "Status": "pending",
            "Payload": item.payload,
            "ReceivedAt": item.received_at or now,
        }
        rows.append(row)
        by_identity.setdefault(group, []).append(row)
    conn.execute(insert(Event), rows)
    return by_identity


def _write_generations(
    conn: Connection, ctx: PackContext, by_identity: ByIdentity, next_work_id: int, now: dt.datetime, result: AdmissionResult
) -> None:
    """Per affected identity: extend its latest generation if extendable, else create one successor (one UPDATE, one INSERT).

    Either way ``LaneOrdinal`` and ``SelectedEventId`` become the identity's last
    input of the batch; a successor starts at its first. Every input is recorded
    in ``result.admitted`` with the generation that covers it.
    """
    latest = latest_generations(conn, list(by_identity))
    moves = [
        (latest[identity], members[-1]["EnqueueOrdinal"], members[-1]["EventId"])
        for identity, members in by_identity.items()
        if identity in latest and latest[identity].extendable
    ]
    extended = extend_many(conn, moves, now)
    new_rows = []
    for identity, members in by_identity.items():
        gen = latest.get(identity)
        if gen is not None and gen.work_id in extended:
            work_id = gen.work_id
            result.extended_work_ids.append(work_id)
        else:
            work_id = next_work_id
            next_work_id += 1
            new_rows.append(
                generation_row(
                    work_id=work_id,
                    namespace=ctx.namespace,
                    identity=identity,
                    input_start_ordinal=members[0]["EnqueueOrdinal"],
                    lane_ordinal=members[-1]["EnqueueOrdinal"],
                    selected_event_id=members[-1]["EventId"],
                    now=now,
                )
            )
            result.created_work_ids.append(work_id)
        for row in members:
            result.admitted.append(Admitted(row["SourceLane"], row["ReceiptId"], row["EventId"], row["EnqueueOrdinal"], work_id))
    create_generations(conn, new_rows)


def _cover_repeated(repeated: list[Input], result: AdmissionResult) -> None:
    """A receipt repeated inside the batch is a ``covered`` duplicate of its first occurrence's generation."""
    by_key = {(a.source_lane, a.receipt_id): a for a in result.admitted}
    for item in repeated:
        a = by_key[(item.source_lane, item.receipt_id)]
        result.duplicates.append(Duplicate(a.source_lane, a.receipt_id, a.event_id, a.ordinal, COVERED, a.work_id))

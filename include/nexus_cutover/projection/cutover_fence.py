"""The namespace-wide admission fence of the cutover (steps 1 and 5), and who holds it.

Invariants (seed 000, "Existing-data cutover"; contract, ``_System_AdmissionFence`` and "One cutover per tenant
at a time"):

* The cutover fence is one non-expiring (``ExpiresAt IS NULL``) fence with
  ``Scope = '*'`` on the namespace (:func:`~nexus_cutover.admission_fences.is_cutover_fence`).
  Arming reuses the one already in force, so reruns converge on one fence.
  More than one cutover fence in force is a refusal naming every one of them
  (:class:`SeveralCutoverFences`), for arming, releasing and the checkpoint's
  precondition alike: which one holds the tenant is then not clear.
* The fence records its holder in ``ArmedBy``; holders are unique (every run
  and every command-line invocation its own) at any length: ``ArmedBy`` and
  ``ReleasedBy`` hold :func:`~nexus_cutover.holders.stored_holder`'s spelling,
  never a cut name, and holders are compared byte for byte in Python, never by
  the column's collation. Arming again as the same holder reuses it. Another holder's fence is adopted only when that holder is
  provably finished (``holder_state`` says :data:`HOLDER_FINISHED`: an Airflow
  run in a final state) or the person names it (``adopt``): a fence armed by
  hand or by a CLI invocation, whose state nobody here can read
  (:data:`HOLDER_UNKNOWN`), is never adopted silently. A holder still at work
  (:data:`HOLDER_ACTIVE`) is never adopted, named or not. Otherwise
  :class:`FenceHeld`, naming the holder and how to take over, and nothing is
  written. An adoption rewrites ``ArmedBy`` and records in ``Reason`` from whom
  and how.
* ``Reason`` records the product version of the code that armed the fence, or adopted it
  (:func:`~nexus_cutover.code_version.fence_reason`): a run on another version takes the tenant over only by
  adopting the fence, and the fence then says so; the same holder on another version does not reuse it
  (:func:`~nexus_cutover.code_version.check_reuse`, under the lock: nothing written).
* A rerun after the cutover completed does not fence the tenant again: when the
  tenant is cut over (:mod:`nexus_cutover.standing`: every pack of the run has
  its protocol row, no cutover fence is in force, no old work above a cutoff),
  arming reports ``not_needed`` with the last released cutover fence; when only
  old work above a cutoff stands in the way it refuses (:class:`OldWorkAboveCutoff`):
  that needs a separately reviewed recovery decision, not another fence.
* Arming refuses while any override of a fence in force in the namespace is
  active (``RevokedAt IS NULL`` and not expired); it lists them and revokes
  nothing. A refusal writes nothing.
* Releasing sets ``ReleasedAt``/``ReleasedBy`` on the cutover fence its caller
  holds, only: a fence another holder holds is :class:`FenceHeld`; a fence
  already released by this holder is a no-op success, one released by another
  holder is :class:`ReleasedByAnother` (not a success). Nothing here deletes a row.
* The admission pause of a released cutover fence is ``ReleasedAt - ArmedAt`` of its own row
  (:func:`admission_pause_s`), read back in the releasing transaction; never derived from ids.
* No call out of the process under the lock: what is known of the holder of
  the fence in force (``holder_state``: for the DAG, a call into Airflow) is
  asked after a read-only look and before the locked transaction, and passed
  into it as a value (:class:`HolderLook`). The locked transaction re-reads the
  fence; if it is not the one looked at (another fence, another holder: a run
  that armed or adopted it meanwhile), it rolls back, writing nothing, and the
  decision looks again (at most :data:`LOOKS` times, then :class:`FenceChanged`).
* Check where it is relied on: every decision is re-read and every write made
  in one transaction of the policy (:func:`nexus_cutover.tx.run`: READ
  COMMITTED) holding the namespace lifecycle lock, inside a bounded
  :class:`~nexus_cutover.db.Deadline`. The fence rows it decides on are read
  with ``SELECT ... FOR UPDATE`` (a session changing them by hand waits for the
  commit), every write is conditional on what was read (a row count other than
  one refuses, rolling back), and a release re-checks its precondition
  (readiness) after its write. ``between_check_and_act`` is a test seam only.
  A dry run only reads: it takes no lock and creates no lock row.
"""

from __future__ import annotations

import datetime as dt
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, insert, select, update

from .. import catalog, tx
from ..above_cutoff import namespace_above_cutoff
from ..admission_fences import cutover_fences, fences_in_force, is_cutover_fence, override_active, row_as_json
from ..catalog import AdmissionFence, AdmissionFenceOverride, ConnectorProjectionProtocol
from ..clock import utc_text, utcnow
from ..code_version import check_reuse, fence_reason
from ..db import Deadline
from ..errors import BadInput, Refused
from ..holders import airflow_run_link, airflow_run_named, same_holder, stored_holder
from ..locks import lifecycle_lock_names
from ..protocol_row import active_protocol_rows
from ..schema import has_table
from ..standing import is_cut_over

FENCE_REASON = "connector projection range cutover"


def the_cutover_fence(namespace: str, fences: list[dict[str, Any]]) -> dict[str, Any] | None:
    """The one cutover fence among ``fences`` in force, None when there is none; :class:`SeveralCutoverFences` else."""
    found = cutover_fences(fences)
    if len(found) > 1:
        raise SeveralCutoverFences(namespace, found)
    return found[0] if found else None


def active_overrides(conn: Connection, namespace: str, now: dt.datetime) -> list[dict[str, Any]]:
    """Active overrides of fences in force in the namespace (read only; nothing is revoked)."""
    fence_ids = [f["FenceId"] for f in fences_in_force(conn, namespace, now)]
    if not fence_ids:
        return []
    o = AdmissionFenceOverride
    rows = conn.execute(
        select(o)
        .where(
            o.c.FenceId.in_(fence_ids),
            override_active(now),
        )
        .order_by(o.c.OverrideId)
    ).all()
    return [row_as_json(r) for r in rows]


#: What is known of the holder named in a fence's ``ArmedBy`` (:data:`HolderState`).
HOLDER_ACTIVE = "active"  # at work (an Airflow run queued, running, deferred or waiting for a person), or unreadable
HOLDER_FINISHED = "finished"  # provably finished: an Airflow run in a final state
HOLDER_UNKNOWN = "unknown"  # nothing here can tell: a CLI invocation, a fence armed by hand
#: ``holder -> HOLDER_ACTIVE | HOLDER_FINISHED | HOLDER_UNKNOWN``.
HolderState = Callable[[str], str]
#: A test seam called inside the locked transaction after every check and before the write (no product caller).
Seam = Callable[[Connection], None]

#: How to take over a fence, by default (the DAG and the CLI say it their way): ``{holder}`` is filled in.
TAKE_OVER = ("if {holder} is finished (a run that failed or was rejected, a command that ended), take its fence "
             "over by naming it: nexus-cutover run (or arm-fence) -adopt '{holder}', or adopt = {holder} in the "
             "cutover DAG's form")


def unknown_holders(_holder: str) -> str:
    """A caller that can tell nothing of other holders (the CLI): every one :data:`HOLDER_UNKNOWN`."""
    return HOLDER_UNKNOWN


class FenceHeld(Refused):
    """Another holder holds the namespace's cutover fence and may not be adopted: this caller writes nothing."""

    def __init__(self, namespace: str, fence: dict[str, Any], caller: str, *, state: str = HOLDER_ACTIVE,
                 take_over: str = TAKE_OVER, releasing: bool = False):
        self.fence = fence
        self.holder = fence["ArmedBy"]
        self.report = {"held_by": self.holder, "fence": fence}
        self.state = state
        run = airflow_run_named(self.holder)
        if releasing:
            why = "not by this caller: a run releases only the fence it armed or adopted"
            next_step = (f"Next: release it as its holder (-holder '{self.holder}'); or, "
                         + take_over.format(holder=self.holder))
        elif run is not None and state == HOLDER_UNKNOWN:  # an Airflow run this caller cannot ask about (the CLI)
            dag_id, run_id = run
            named = f"run {run_id} of DAG {dag_id}" if run_id else f"a run of DAG {dag_id} (its id too long to show)"
            link = airflow_run_link(dag_id, run_id)
            why = (f"an Airflow run ({named}{', ' + link if link else ''}) whose state this command cannot read: it "
                   "holds the tenant while it is queued, running, deferred or waiting for a person")
            next_step = ("Next: let that run finish (or fail) in Airflow; then, if it left the fence armed, trigger the "
                         "cutover again in Airflow (a finished run's fence is adopted by itself), or "
                         + take_over.format(holder=self.holder))
        elif state == HOLDER_ACTIVE:
            why = "which has not finished"
            next_step = "Next: let it finish (or fail), then run again: a finished run's fence is adopted"
        else:
            why = ("whose state cannot be read here: a fence armed by hand or by a command-line invocation is not "
                   "adopted silently")
            next_step = "Next: " + take_over.format(holder=self.holder)
        super().__init__(
            f"namespace {namespace!r} is held by {self.holder!r} (cutover fence {fence['FenceId']} armed "
            f"{utc_text(fence['ArmedAt'])}), {why}: one cutover per tenant at a time. Nothing was written by {caller!r}. "
            f"{next_step}."
        )


class SeveralCutoverFences(Refused):
    """More than one cutover fence is in force in the namespace: which one holds it is not clear; nothing written."""

    def __init__(self, namespace: str, fences: list[dict[str, Any]]):
        self.fences = fences
        self.report = {"cutover_fences": fences}
        listed = "; ".join(f"FenceId={f['FenceId']} ArmedBy={f['ArmedBy']!r} ArmedAt={utc_text(f['ArmedAt'])}" for f in fences)
        super().__init__(
            f"namespace {namespace!r} has {len(fences)} cutover fences in force (non-expiring '*'): {listed}. One "
            "cutover per tenant: which of them holds the tenant is not clear, so nothing was written. Next: find out "
            "who armed each; have L2 release all but the one of the cutover in progress (this tool releases none "
            "of them on a guess), then run again."
        )


class ReleasedByAnother(Refused):
    """The fence was already released, by another holder: not a success for this caller."""

    def __init__(self, namespace: str, fence: dict[str, Any], caller: str):
        self.fence = fence
        super().__init__(
            f"cutover fence {fence['FenceId']} of namespace {namespace!r} was already released by "
            f"{fence['ReleasedBy'] or '(nobody recorded)'!r} at {utc_text(fence['ReleasedAt'])}, not by {caller!r}: admission "
            "resumed without this run. "
            "Next: find out who released it and why, and check the tenant (nexus-cutover status / verify) before "
            "treating the cutover as done."
        )


class FenceChanged(Refused):
    """The fence row changed under the lock between this transaction's check and its write, or between the look at
    its holder and the locked transaction: nothing written."""

    def __init__(self, namespace: str, fence_id: int | None, what: str, *, why: str | None = None):
        which = f"cutover fence {fence_id}" if fence_id is not None else "the cutover fence"
        why = why or "another session wrote it without the namespace lock"
        super().__init__(
            f"{which} of namespace {namespace!r} changed while it was being {what} ({why}): nothing was written. "
            "Next: look at the fence (nexus-cutover status), then run again."
        )


class ActiveOverrides(Refused):
    """Arming refused: overrides would let sources through the fence."""

    def __init__(self, namespace: str, overrides: list[dict[str, Any]]):
        self.overrides = overrides
        self.report = {"active_overrides": overrides}
        listed = "; ".join(
            f"OverrideId={o['OverrideId']} FenceId={o['FenceId']} Scope={o['Scope']!r} CreatedBy={o['CreatedBy']!r}"
            for o in overrides
        )
        super().__init__(
            f"namespace {namespace!r} has {len(overrides)} active admission fence override(s): {listed}. "
            "The cutover needs a namespace-wide fence with no active overrides; it revokes nothing. "
            "Have the L2 delivery owner revoke or let them expire, then rerun arm_fence."
        )


class OldWorkAboveCutoff(Refused):
    """Arming refused: every pack is checkpointed and no cutover fence is in force, but a pack holds old-protocol
    work above its cutoff, so the tenant is not cut over (:mod:`nexus_cutover.standing`) and fencing it again
    changes nothing."""

    def __init__(self, namespace: str, above: list[Any]):
        self.above = [a.as_json() for a in above]
        self.report = {"old_work_above_cutoff": self.above}
        super().__init__(
            f"namespace {namespace!r} is not cut over: " + "; ".join(a.describe() for a in above)
            + ". Nothing was armed; a rerun changes nothing until that decision is made."
        )


@dataclass
class FenceResult:
    """What arming/releasing did (``outcome``) and on which fence."""

    namespace: str
    #: armed | reused | adopted | not_needed | would_arm | would_reuse | would_adopt
    #: | released | already_released | would_release
    outcome: str
    fence_id: int | None
    other_fences_in_force: list[dict[str, Any]] = field(default_factory=list)
    previous_holder: str | None = None
    holder: str | None = None
    #: The fence row's own ``ArmedAt`` (once armed, adopted, kept or released: when the admission pause began) and
    #: ``ReleasedAt`` (once released: ``released``, ``already_released``).
    armed_at: str | None = None
    released_at: str | None = None

    @property
    def admission_pause_s(self) -> float | None:
        """Seconds nothing new was admitted for the tenant (:func:`admission_pause_s`); None before the release."""
        return admission_pause_s({"ArmedAt": self.armed_at, "ReleasedAt": self.released_at})

    def as_json(self) -> dict[str, Any]:
        return {
            "namespace": self.namespace,
            "outcome": self.outcome,
            "fence_id": self.fence_id,
            "holder": self.holder,
            "previous_holder": self.previous_holder,
            "other_fences_in_force": self.other_fences_in_force,
            "armed_at": self.armed_at,
            "released_at": self.released_at,
            "admission_pause_s": self.admission_pause_s,
        }

    @classmethod
    def from_json(cls, raw: dict[str, Any]) -> FenceResult:
        """The result :meth:`as_json` serialized (what another task reads back)."""
        return cls(raw["namespace"], raw["outcome"], raw.get("fence_id"), list(raw.get("other_fences_in_force") or []),
                   raw.get("previous_holder"), raw.get("holder"))

    @property
    def not_needed(self) -> bool:
        """Every pack already checkpointed and no cutover fence in force: nothing was (or would be) fenced."""
        return self.outcome == "not_needed"

    @property
    def planned(self) -> bool:
        """A dry run's fence that a real run would arm or adopt (none is in force for this run yet)."""
        return self.outcome in ("would_arm", "would_adopt")


def _as_datetime(value: Any) -> dt.datetime | None:
    if value is None or isinstance(value, dt.datetime):
        return value
    return dt.datetime.fromisoformat(str(value))


def admission_pause_s(fence: dict[str, Any]) -> float | None:
    """The admission pause of a cutover fence row: ``ReleasedAt - ArmedAt`` in seconds (None while in force).

    Both are the row's own columns (microseconds on MySQL-protocol servers), written in the arming and the
    releasing transaction by :func:`~nexus_cutover.clock.utcnow` of the process that wrote each. An adoption
    keeps ``ArmedAt``: the pause runs from the first arming, when admission stopped, whoever releases.
    """
    armed, released = _as_datetime(fence.get("ArmedAt")), _as_datetime(fence.get("ReleasedAt"))
    if armed is None or released is None:
        return None
    return round((released - armed).total_seconds(), 6)


def arm_fence(
    engine: Engine,
    namespace: str,
    *,
    armed_by: str,
    timeout_s: float,
    dry_run: bool = False,
    reason: str | None = None,
    packs: Iterable[str] = (),
    holder_state: HolderState = unknown_holders,
    adopt: str | None = None,
    take_over: str = TAKE_OVER,
    between_check_and_act: Seam | None = None,
) -> FenceResult:
    """Arm, reuse or adopt the namespace's non-expiring ``*`` fence as holder ``armed_by`` (module invariants).

    Refuses with :class:`ActiveOverrides` if any override is active, :class:`SeveralCutoverFences` if more than
    one cutover fence is in force, and :class:`FenceHeld` if another holder holds the fence and may not be adopted
    (``holder_state`` / ``adopt``; ``take_over`` says how, ``{holder}`` filled in). ``packs``: the run's packs;
    when all are already checkpointed and no cutover fence is in force, nothing is armed (``not_needed``).
    ``reason``: the fence's ``Reason``, armed or adopted (default: :data:`FENCE_REASON` and the version of the code
    running, :func:`~nexus_cutover.code_version.fence_reason`).
    """
    packs = sorted(set(packs))
    reason = fence_reason(FENCE_REASON) if reason is None else reason
    deadline = Deadline(timeout_s)
    me = stored_holder(armed_by)
    for look in range(1, LOOKS + 1):
        decide = _Holders(me, look_at_holder(engine, namespace, me, holder_state, deadline), adopt, take_over)
        try:
            if dry_run:  # read only: not even the lock rows are created
                return tx.read(
                    engine, lambda conn, decide=decide: _arm(conn, namespace, decide, reason, packs, dry_run=True, seam=None),
                    what="checking the admission fence", deadline=deadline,
                )
            return tx.run(
                engine,
                lambda conn, decide=decide: _arm(conn, namespace, decide, reason, packs, dry_run=False,
                                                 seam=between_check_and_act),
                what="arming the admission fence", deadline=deadline, locks=lifecycle_lock_names(namespace),
            )
        except FenceMovedSinceTheLook as moved:  # rolled back, nothing written: look again, with no lock held
            if look == LOOKS:
                raise moved.refusal from None
    raise AssertionError("unreachable")


#: How often a fence decision looks at the holder again when the fence moved between its look and its lock (another
#: run armed or adopted it meanwhile: the next look names that run, usually FenceHeld); then FenceChanged.
LOOKS = 3


class FenceMovedSinceTheLook(Exception):
    """Raised inside the locked transaction (rolling it back) when the fence in force is not the one whose holder was
    looked at; :func:`arm_fence` looks again, at most :data:`LOOKS` times, then raises ``refusal``."""

    def __init__(self, refusal: FenceChanged):
        super().__init__(str(refusal))
        self.refusal = refusal


def held_by_another(
    bind: Engine | Connection, namespace: str, *, holder: str, holder_state: HolderState = unknown_holders,
    adopt: str | None = None, take_over: str = TAKE_OVER,
) -> None:
    """Read only, no lock: refuse at once (:class:`FenceHeld`, :class:`SeveralCutoverFences`) what :func:`arm_fence`
    would refuse for holder ``holder`` because of another holder; return when this holder may go on.

    What a run calls before its first write (the additive schema), so a held tenant is refused before anything is
    written; :func:`arm_fence` decides again under the lock, where it acts.
    """
    me = stored_holder(holder)
    look = look_at_holder(bind, namespace, me, holder_state)
    if look.fence is not None:
        _Holders(me, look, adopt, take_over)(namespace, look.fence)


@dataclass(frozen=True)
class HolderLook:
    """The cutover fence in force at a read-only look before any lock (None: none), and what ``holder_state`` said
    of its holder (None when there is no fence or it is the caller's own): the value a locked decision uses instead
    of calling out of the process under the lock (module invariants)."""

    fence: dict[str, Any] | None
    state: str | None

    def is_of(self, fence: dict[str, Any]) -> bool:
        """Whether ``fence`` (read under the lock) is the one looked at, with the same holder."""
        return self.fence is not None and (fence["FenceId"], fence["ArmedBy"]) == (self.fence["FenceId"], self.fence["ArmedBy"])


def look_at_holder(bind: Engine | Connection, namespace: str, me: str, holder_state: HolderState,
                   deadline: Deadline | None = None) -> HolderLook:
    """Read the cutover fence in force (one read transaction, no lock), then, with no transaction open, ask
    ``holder_state`` about its holder unless it is ``me`` (a stored spelling). :class:`SeveralCutoverFences` at once."""
    with tx.reading(bind, f"reading the fences of namespace {namespace!r}", deadline=deadline) as conn:
        existing = the_cutover_fence(namespace, fences_in_force(conn, namespace, utcnow()))
    if existing is None or existing["ArmedBy"] == me:
        return HolderLook(existing, None)
    return HolderLook(existing, holder_state(existing["ArmedBy"]))


class _Holders:
    """Who may take which fence: reuse by the same holder, adoption of a finished or named one, else FenceHeld.

    ``me`` is a stored spelling (:func:`~nexus_cutover.holders.stored_holder`); ``look`` what was learnt of the
    fence's holder before the lock. Every comparison is Python's, byte for byte."""

    def __init__(self, me: str, look: HolderLook, adopt: str | None, take_over: str):
        self.me, self.look, self.adopt, self.take_over = me, look, adopt, take_over

    def __call__(self, namespace: str, fence: dict[str, Any]) -> str | None:
        """None: the fence is this holder's (reuse); else how it may be adopted. Raises FenceHeld otherwise, and
        :class:`FenceMovedSinceTheLook` (the caller looks again) when the fence is not the one whose holder was
        looked at."""
        holder = fence["ArmedBy"]
        if holder == self.me:
            return None
        if not self.look.is_of(fence):
            raise FenceMovedSinceTheLook(FenceChanged(namespace, fence["FenceId"], "taken", why=(
                f"it is held by {holder!r}, which kept changing between this run's look at its holder and the "
                f"namespace lock ({LOOKS} looks)")))
        state = self.look.state
        if state == HOLDER_FINISHED:
            return "its run finished"
        if state == HOLDER_UNKNOWN and same_holder(holder, self.adopt):
            return f"named by {self.me}"
        raise FenceHeld(namespace, fence, self.me, state=state, take_over=self.take_over)


def _all_checkpointed(conn: Connection, namespace: str, packs: list[str]) -> bool:
    """Whether every pack of the run has its protocol row: one statement for the namespace's active packs (never a
    statement per pack inside the locked transaction: a namespace may hold thousands)."""
    if not packs or not has_table(conn, ConnectorProjectionProtocol.name):
        return False
    have = active_protocol_rows(conn, namespace)
    return all(p in have for p in packs)


def last_released_cutover_fence(conn: Connection, namespace: str) -> dict[str, Any] | None:
    row = conn.execute(
        select(AdmissionFence)
        .where(
            AdmissionFence.c.Namespace == namespace,
            AdmissionFence.c.ReleasedAt.isnot(None),
            AdmissionFence.c.Scope == catalog.FENCE_SCOPE_ALL,
            AdmissionFence.c.ExpiresAt.is_(None),
        )
        # the latest release by time; the id only breaks ties (ids are not ordered across TiDB servers)
        .order_by(AdmissionFence.c.ReleasedAt.desc(), AdmissionFence.c.FenceId.desc())
        .limit(1)
    ).first()
    return None if row is None else row_as_json(row)


def _one_row(conn: Connection, stmt, namespace: str, fence_id: int, what: str) -> None:
    """Run the conditional write ``stmt``; :class:`FenceChanged` (rolling back) unless it changed exactly one row."""
    if conn.execute(stmt).rowcount != 1:
        raise FenceChanged(namespace, fence_id, what)


def _arm(
    conn: Connection, namespace: str, decide: _Holders, reason: str, packs: list[str], *, dry_run: bool,
    seam: Seam | None,
) -> FenceResult:
    now = utcnow()
    overrides = active_overrides(conn, namespace, now)
    if overrides:
        raise ActiveOverrides(namespace, overrides)
    fences = fences_in_force(conn, namespace, now, for_update=not dry_run)
    existing = the_cutover_fence(namespace, fences)
    others = [f for f in fences if existing is None or f["FenceId"] != existing["FenceId"]]
    if existing is not None:
        fence_id = existing["FenceId"]
        how = decide(namespace, existing)
        if how is None:
            check_reuse("arm_fence", existing, reason, go_on=f"go on as a new holder: {decide.take_over.format(holder=decide.me)}")
            return FenceResult(namespace, "would_reuse" if dry_run else "reused", fence_id, others, holder=decide.me,
                               armed_at=existing["ArmedAt"])
        previous = existing["ArmedBy"]
        if dry_run:
            return FenceResult(namespace, "would_adopt", fence_id, others, previous_holder=previous, holder=decide.me)
        if seam is not None:
            seam(conn)
        record = f"{reason}; adopted from {previous} ({how})"[:255]
        _one_row(conn, update(AdmissionFence)
                 .where(AdmissionFence.c.FenceId == fence_id, AdmissionFence.c.ArmedBy == previous,
                        AdmissionFence.c.ReleasedAt.is_(None))
                 .values(ArmedBy=decide.me, Reason=record), namespace, fence_id, "adopted")
        _still_one_cutover_fence(conn, namespace, now)
        return FenceResult(namespace, "adopted", fence_id, others, previous_holder=previous, holder=decide.me,
                           armed_at=existing["ArmedAt"])
    if _all_checkpointed(conn, namespace, packs):  # and no cutover fence in force: cut over, unless old work is above a cutoff
        above = [a for a in namespace_above_cutoff(conn, namespace) if a.pack_install_id in packs]
        if not is_cut_over(packs=len(packs), checkpointed=len(packs), cutover_fences=0, above_cutoff=len(above)):
            raise OldWorkAboveCutoff(namespace, above)
        last = last_released_cutover_fence(conn, namespace)
        return FenceResult(namespace, "not_needed", last["FenceId"] if last else None, others)
    if dry_run:
        return FenceResult(namespace, "would_arm", None, others, holder=decide.me)
    if seam is not None:
        seam(conn)
    result = conn.execute(
        insert(AdmissionFence).values(
            Namespace=namespace,
            Scope=catalog.FENCE_SCOPE_ALL,
            Reason=reason[:255],
            ArmedBy=decide.me,
            ArmedAt=now,
            ExpiresAt=None,
            ReleasedAt=None,
            ReleasedBy=None,
        )
    )
    fence_id = int(result.inserted_primary_key[0])
    _still_one_cutover_fence(conn, namespace, now)
    return FenceResult(namespace, "armed", fence_id, others, holder=decide.me, armed_at=now.isoformat())


def _still_one_cutover_fence(conn: Connection, namespace: str, now: dt.datetime) -> None:
    """After a write: another session may have armed a cutover fence by hand (no lock of ours stops an INSERT)
    since the read; then :class:`SeveralCutoverFences`, rolling this transaction back."""
    the_cutover_fence(namespace, fences_in_force(conn, namespace, now))


def fence_row(conn: Connection, fence_id: int, *, for_update: bool = False) -> dict[str, Any] | None:
    stmt = select(AdmissionFence).where(AdmissionFence.c.FenceId == fence_id)
    row = conn.execute(stmt.with_for_update() if for_update else stmt).first()
    return None if row is None else row_as_json(row)


def release_fence(
    engine: Engine,
    namespace: str,
    fence_id: int,
    *,
    released_by: str,
    timeout_s: float,
    dry_run: bool = False,
    precondition: Callable[[Connection], None] | None = None,
    between_check_and_act: Seam | None = None,
) -> FenceResult:
    """Release the cutover fence ``fence_id`` (set ReleasedAt) as its holder ``released_by``.

    Already released by this holder is a no-op success; released by another holder is :class:`ReleasedByAnother`;
    a fence another holder holds is :class:`FenceHeld` (a run releases only the fence it armed or adopted); more
    than one cutover fence in force is :class:`SeveralCutoverFences`. ``precondition(conn)`` runs inside the same
    locked transaction just before the release and again just after its write, refusing by raising (the
    caller's switch condition, e.g. readiness): what committed in between is seen, and the release rolled back.
    """
    deadline = Deadline(timeout_s)
    if dry_run:
        return tx.read(
            engine, lambda conn: _release(conn, namespace, fence_id, released_by, None, dry_run=True, seam=None),
            what="checking the admission fence", deadline=deadline,
        )
    return tx.run(
        engine,
        lambda conn: _release(conn, namespace, fence_id, released_by, precondition, dry_run=False, seam=between_check_and_act),
        what="releasing the admission fence", deadline=deadline, locks=lifecycle_lock_names(namespace),
    )


def _release(
    conn: Connection, namespace: str, fence_id: int, released_by: str, precondition: Callable[[Connection], None] | None,
    *, dry_run: bool, seam: Seam | None,
) -> FenceResult:
    now = utcnow()
    me = stored_holder(released_by)
    fence = fence_row(conn, fence_id, for_update=not dry_run)
    if fence is None or fence["Namespace"] != namespace:
        raise BadInput(f"admission fence {fence_id} does not exist in namespace {namespace!r}")
    if not is_cutover_fence(fence["Scope"], fence["ExpiresAt"]):
        raise BadInput(f"admission fence {fence_id} is not a non-expiring '*' cutover fence; it is left as is")
    in_force = fences_in_force(conn, namespace, now, for_update=not dry_run)
    others = [f for f in in_force if f["FenceId"] != fence_id]
    if fence["ReleasedAt"] is not None:
        if fence["ReleasedBy"] != me:
            raise ReleasedByAnother(namespace, fence, me)
        return FenceResult(namespace, "already_released", fence_id, others, holder=me, armed_at=fence["ArmedAt"],
                           released_at=fence["ReleasedAt"])
    the_cutover_fence(namespace, in_force)
    if fence["ArmedBy"] != me:
        raise FenceHeld(namespace, fence, me, state=HOLDER_UNKNOWN, releasing=True)
    if dry_run:
        return FenceResult(namespace, "would_release", fence_id, others, holder=me)
    if precondition is not None:
        precondition(conn)
    if seam is not None:
        seam(conn)
    _one_row(conn, update(AdmissionFence)
             .where(AdmissionFence.c.FenceId == fence_id, AdmissionFence.c.ArmedBy == me,
                    AdmissionFence.c.ReleasedAt.is_(None))
             .values(ReleasedAt=now, ReleasedBy=me), namespace, fence_id, "released")
    if precondition is not None:
        precondition(conn)  # after the write: what committed since the first check is seen, and rolls it back
    written = fence_row(conn, fence_id)  # the pause as the row records it, read back in the releasing transaction
    return FenceResult(namespace, "released", fence_id, others, holder=me, armed_at=written["ArmedAt"],
                       released_at=written["ReleasedAt"])


def cutover_fence_in_force(bind: Engine | Connection, namespace: str) -> dict[str, Any] | None:
    """The namespace's non-expiring ``*`` fence in force, if any; :class:`SeveralCutoverFences` when there are more."""
    with tx.reading(bind, f"reading the fences of namespace {namespace!r}") as conn:
        return the_cutover_fence(namespace, fences_in_force(conn, namespace, utcnow()))

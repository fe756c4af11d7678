"""The projection worker: claim -> load the full payload set -> execute -> complete.

Invariants:

* The activation gate runs in :meth:`ProjectionWorker.start`, for the
  process-wide host and for a standalone worker alike; :meth:`work_one`
  refuses (``NotActivated``) until it passed. There is no way around it.
* After the gate, the worker claims only generations of packs that have a
  version-1 protocol row, tested in the candidate SQL itself
  (:func:`~.activation.protocol_in_force`, one primary-key probe per candidate):
  a pack installed after the gate is never claimed from before its row exists,
  and is claimed from as soon as it does, without a restart.
* The worker passes the WorkId remembered at claim to the range reader and
  hands ``execute`` exactly that generation's payloads, in ordinal order.
  The default ``execute`` records nothing.
* An exception from ``execute`` schedules a retry (``Attempt`` + 1) until
  ``max_attempts``, then fails the generation. Missing membership fails it at
  once and is logged as an error: it is never completed on a partial payload set.
"""

from __future__ import annotations

import logging
from collections.abc import Callable

from sqlalchemy import Engine

from .. import tx
from ..catalog import WorkItem
from .activation import ActivationVerdict, protocol_in_force, require_activation
from .claim import DEFAULT_LEASE_S, claim_candidates_query, claim_first, complete, retry_or_fail
from .errors import MissingMembership, NotActivated
from .model import ClaimedWork, Payload
from .payload import load_payloads

log = logging.getLogger(__name__)

Execute = Callable[[ClaimedWork, list[Payload]], None]


def record_nothing(claimed: ClaimedWork, payloads: list[Payload]) -> None:
    """The default projection: the payload set was loaded; nothing is recorded."""


def claim_served(engine: Engine, namespace: str, owner: str, *, lease_s: float = DEFAULT_LEASE_S) -> ClaimedWork | None:
    """:func:`~.claim.claim_next` restricted to packs with a version-1 protocol row; None when nothing is ready."""
    query = claim_candidates_query(namespace).where(protocol_in_force(WorkItem.c.PackInstallId))
    with tx.reading(engine, f"listing claimable work of namespace {namespace!r}") as conn:
        candidates = [row.WorkId for row in conn.execute(query)]
    return claim_first(engine, candidates, owner, lease_s=lease_s)


class ProjectionWorker:
    def __init__(
        self,
        engine: Engine,
        namespace: str,
        owner: str,
        *,
        execute: Execute | None = None,
        lease_s: float = DEFAULT_LEASE_S,
        retry_in_s: float = 2.0,
        max_attempts: int = 5,
    ):
        self.engine = engine
        self.namespace = namespace
        self.owner = owner
        self.execute = execute or record_nothing
        self.lease_s = lease_s
        self.retry_in_s = retry_in_s
        self.max_attempts = max_attempts
        self.verdict: ActivationVerdict | None = None

    def start(self) -> ActivationVerdict:
        """Run the activation gate; raises :class:`NotActivated` (exit 3) when it refuses."""
        self.verdict = require_activation(self.engine, self.namespace)
        return self.verdict

    def work_one(self) -> ClaimedWork | None:
        """Claim and process one ready generation; None when there is none."""
        if self.verdict is None or not self.verdict.ok:
            raise NotActivated(["the worker has not passed the activation gate: call start() first"])
        claimed = claim_served(self.engine, self.namespace, self.owner, lease_s=self.lease_s)
        if claimed is None:
            return None
        try:
            with tx.reading(self.engine, f"loading the payloads of WorkItem {claimed.work_id}") as conn:
                payloads = load_payloads(conn, claimed.work_id)
        except MissingMembership as exc:
            log.error("WorkItem %s failed: %s", claimed.work_id, exc)
            retry_or_fail(self.engine, claimed, permanent=True)
            return claimed
        try:
            self.execute(claimed, payloads)
        except Exception as exc:  # noqa: BLE001 - any projection failure is retried, then failed
            status = retry_or_fail(self.engine, claimed, retry_in_s=self.retry_in_s, max_attempts=self.max_attempts)
            log.warning("WorkItem %s execution failed (%s): now %s", claimed.work_id, exc, status)
            return claimed
        if not complete(self.engine, claimed):
            log.warning("WorkItem %s: lease lost before completion", claimed.work_id)
        return claimed

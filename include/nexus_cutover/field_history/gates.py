"""The three stage gates of seed 003: check the evidence, act only when it holds, report either way.

Each gate returns a :class:`GateReport`; it never raises for a failed check
(callers decide: the DAG stops the run with the rendered report). A gate that
already passed is re-verified from the database, not redone: stage 1's DDL is
skipped when the column exists, stage 2's materialization finds nothing left,
stage 3 does not rewrite switches already at their final values.

What it holds: stages 1 and 2. Stage 3 and ``stage3 -check`` are :mod:`.stage3_gate`, the report every gate
returns :mod:`.gate_report`; both are re-exported here, so this module stays the gates' one door
(``from .gates import ...``).

Invariants:

* Stage 1 adds only ``FieldHistoryEligible`` (idempotent additive DDL).
* No gate UPDATEs or DELETEs an outbox row, a process row, or anything of
  ``_System_Event`` / ``_System_WorkItem``; stage 2 writes only NULL eligibility
  values (through :mod:`.materialize`), stage 3 only the two runtime switches.
* Deployed = not stopped (see :mod:`.inventory`); versions compare numerically.
* Stage 2 reports the digest of the decisions its run made (``decided_rows``,
  ``decided_digest``: this run's rows only); a batch whose read-equivalence
  proof broke stops it with the differing rows as findings.
* Stage 3 (:mod:`.stage3_gate`) switches reads only on an equal whole-table read
  comparison made under the switch's locks; ``stage3 -check`` gives the verdict
  and exit code stage 3 would give.
"""

from __future__ import annotations

from dataclasses import dataclass

from sqlalchemy import Connection, Engine, func, select

from .. import catalog, tx
from ..db import Deadline, translate_errors
from ..errors import ReadEquivalenceBroken
from ..schema import apply_steps, field_history_steps
from . import provenance
from .gate_report import EXAMPLES, GateReport, lagging_findings
from .inventory import (
    DEFAULT_HEARTBEAT_WINDOW_S,
    OUTBOX_FAILED,
    OUTBOX_OPEN,
    live_outbox_workers,
    outbox_counts,
    outbox_examples,
    pre_cutover_outbox,
)
from .materialize import DEFAULT_BATCH_SIZE, Seam, materialize
from .prerequisites import require_eligibility_column, require_tables
from .stage3_gate import (  # noqa: F401 - re-exported: importers know these as the gates'
    CHECK_PREFIX,
    FAILED_OUTBOX_NEXT,
    REMOVABLE_MACHINERY,
    Stage3Check,
    stage_3,
    stage_3_check,
)
from .status import row_counts
from .versions import older_than, parse_version

Audit = catalog.AuditFieldChange
STAGE_1_ROLES = (catalog.ROLE_RUNTIME_API, catalog.ROLE_AUDIT_OUTBOX_WORKER)
STAGE_2_ROLES = (catalog.ROLE_RUNTIME_API, catalog.ROLE_SERVICE_MANAGER)


# -- stage 1 ----------------------------------------------------------------


def stage_1(engine: Engine, *, stage1_release: str, namespace: str | None = None) -> GateReport:
    """The nullable column exists (added if absent) and every runtime_api / audit_outbox_worker runs the stage-1 release."""
    parse_version(stage1_release)
    with translate_errors("checking Field History stage 1"):
        require_tables(engine)
        created = apply_steps(engine, field_history_steps(engine))  # a concurrent identical DDL is tolerated
        with tx.reading(engine, "reading the stage-1 processes") as conn:
            findings = lagging_findings(conn, STAGE_1_ROLES, stage1_release, namespace)
    actions = [f"added column {label}" for label in created]
    counts = {"lagging_processes": len(findings)}
    if findings:
        return GateReport(
            1,
            False,
            f"{len(findings)} runtime_api/audit_outbox_worker process(es) run a release older than {stage1_release}: "
            "upgrade them (or mark them stopped if they are gone) and run again",
            findings,
            counts,
            actions,
        )
    return GateReport(
        1,
        True,
        f"column present; every runtime_api and audit_outbox_worker runs >= {stage1_release}",
        [],
        counts,
        actions,
        already_done=not created,
    )


# -- stage 2 ----------------------------------------------------------------


def unstamped_by_new_producers(conn: Connection, producer_release: str) -> tuple[int, list[dict]]:
    """Unstamped rows (:func:`.provenance.unstamped_row`) whose ProducerVersion is at or above the release: (count, examples)."""
    by_version = conn.execute(
        select(Audit.c.ProducerVersion, func.count()).where(provenance.unstamped_row()).group_by(Audit.c.ProducerVersion)
    ).all()
    versions = sorted(v for v, _ in by_version if not older_than(v, producer_release))
    if not versions:
        return 0, []
    total = sum(n for v, n in by_version if v in versions)
    rows = conn.execute(
        select(Audit.c.ChangeId, Audit.c.FieldId, Audit.c.ProducerVersion, Audit.c.HistorySequence)
        .where(provenance.unstamped_row(), Audit.c.ProducerVersion.in_(versions))
        .order_by(Audit.c.ChangeId)
        .limit(EXAMPLES)
    ).all()
    return total, [{"change_id": c, "field_id": f, "producer_version": v, "history_sequence": s} for c, f, v, s in rows]


def stage_2_producers(engine: Engine, *, producer_release: str, namespace: str | None = None) -> GateReport:
    """Every runtime_api / service_manager runs the producer-cutover release, and no such producer left a NULL."""
    parse_version(producer_release)
    with translate_errors("checking Field History stage 2 producers"):
        require_eligibility_column(engine)

    def evidence(conn: Connection) -> tuple[list[dict], int, list[dict]]:
        return (lagging_findings(conn, STAGE_2_ROLES, producer_release, namespace), *unstamped_by_new_producers(conn, producer_release))

    findings, unstamped, examples = tx.read(engine, evidence, what="checking Field History stage 2 producers")
    findings += [{"finding": "unstamped_row", **e} for e in examples]
    counts = {"lagging_processes": sum(f["finding"] == "lagging_process" for f in findings), "unstamped_rows": unstamped}
    problems = []
    if counts["lagging_processes"]:
        problems.append(
            f"{counts['lagging_processes']} runtime_api/service_manager process(es) run a release older than "
            f"{producer_release}: upgrade them"
        )
    if unstamped:
        problems.append(
            f"{unstamped} row(s) of a resolved field (in _System_Field) written by producers at or above "
            f"{producer_release} are NULL without a HistorySequence: a producer is not stamping "
            "FieldHistoryEligible; fix it before materializing"
        )
    if problems:
        return GateReport(2, False, "; ".join(problems), findings, counts)
    return GateReport(2, True, f"every runtime_api and service_manager runs >= {producer_release} and stamps", [], counts)


@dataclass
class DrainState:
    """Pre-cutover Audit V2 outbox work (ProducerVersion older than the release)."""

    open_rows: dict[str, int]
    failed_rows: int
    live_workers: int
    examples: list[dict]

    @property
    def remaining(self) -> int:
        return sum(self.open_rows.values())

    @property
    def drained(self) -> bool:
        return self.remaining == 0 and self.failed_rows == 0

    @property
    def stuck_reasons(self) -> list[str]:
        reasons = []
        if self.failed_rows:
            reasons.append(
                f"{self.failed_rows} pre-cutover outbox row(s) failed: undelivered audit work that cannot finish on "
                "its own; redeliver them through the outbox worker (this tool never changes their status)"
            )
        if self.remaining and not self.live_workers:
            reasons.append(f"{self.remaining} pre-cutover outbox row(s) pending/processing while no audit_outbox_worker heartbeats")
        return reasons

    def as_json(self) -> dict:
        return {
            "remaining": self.remaining,
            "open_rows": self.open_rows,
            "failed_rows": self.failed_rows,
            "live_workers": self.live_workers,
            "drained": self.drained,
            "stuck": self.stuck_reasons,
            "examples": self.examples,
        }


def outbox_drain_state(
    engine: Engine,
    *,
    producer_release: str,
    namespace: str | None = None,
    heartbeat_window_s: float = DEFAULT_HEARTBEAT_WINDOW_S,
) -> DrainState:
    """Read-only: how much pre-cutover outbox work is left, and whether it can still progress."""
    parse_version(producer_release)
    with translate_errors("reading the Audit V2 outbox drain"):
        require_tables(engine)

    def state(conn: Connection) -> DrainState:
        counts = outbox_counts(conn)
        open_rows: dict[str, int] = {}
        for c in pre_cutover_outbox(counts, producer_release, OUTBOX_OPEN):
            open_rows[c.status] = open_rows.get(c.status, 0) + c.rows
        failed = sum(c.rows for c in pre_cutover_outbox(counts, producer_release, (OUTBOX_FAILED,)))
        workers = live_outbox_workers(conn, namespace, heartbeat_window_s)
        examples = outbox_examples(conn, producer_release, OUTBOX_OPEN + (OUTBOX_FAILED,), EXAMPLES)
        return DrainState(open_rows, failed, len(workers), examples)

    return tx.read(engine, state, what="reading the Audit V2 outbox drain")


def stage_2_materialize(
    engine: Engine,
    *,
    batch_size: int = DEFAULT_BATCH_SIZE,
    deadline: Deadline | None = None,
    between_read_and_write: Seam | None = None,
) -> GateReport:
    """Materialize legacy rows; passes when no eligible NULL row with a FieldId is left.

    A broken read-equivalence proof stops the gate: the batch rolled back, the
    earlier ones kept, each differing row a finding. ``between_read_and_write``
    is :func:`.materialize.materialize`'s test seam (no product caller passes it).
    """
    try:
        result = materialize(engine, batch_size=batch_size, deadline=deadline, between_read_and_write=between_read_and_write)
    except ReadEquivalenceBroken as exc:
        return _broken_report(engine, exc)
    with tx.reading(engine, "counting after materialization") as conn:
        counts = row_counts(conn)
    report_counts = {
        "set_true": result.set_true,
        "set_false": result.set_false,
        "batches": result.batches,
        "decided_rows": result.decided_rows,
        "decided_digest": result.decided_digest,
    }
    report_counts.update({k: v for k, v in counts.as_json().items() if k != "rows_by_value"})
    actions = [f"materialized {result.rows} row(s): {result.set_true} TRUE, {result.set_false} FALSE"] if result.rows else []
    if counts.materializable_rows:
        return GateReport(
            2,
            False,
            f"{counts.materializable_rows} materializable row(s) appeared during the run (a pre-cutover producer "
            "still writes?); run again once every producer is upgraded",
            [],
            report_counts,
            actions,
        )
    return GateReport(2, True, "legacy rows materialized", [], report_counts, actions, already_done=not result.rows)


def _broken_report(engine: Engine, exc: ReadEquivalenceBroken) -> GateReport:
    with tx.reading(engine, "counting after materialization") as conn:
        counts = row_counts(conn)
    report_counts = {"batches": exc.batches, "decided_rows": exc.decided_rows, "decided_digest": exc.decided_digest}
    report_counts.update({k: v for k, v in counts.as_json().items() if k != "rows_by_value"})
    findings = [{"finding": "read_equivalence_broken", **row} for row in exc.rows]
    actions = [f"materialized {exc.decided_rows} row(s) in {exc.batches} batch(es) before the broken one"] if exc.decided_rows else []
    return GateReport(2, False, str(exc), findings, report_counts, actions)

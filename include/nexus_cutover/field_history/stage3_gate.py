"""Stage 3 of seed 003 (the read switch), and ``stage3 -check``, which says what stage 3 would do now.

Split out of :mod:`.gates`, which re-exports every name here (importers may keep ``from .gates import ...``);
stages 1 and 2 are there, the report every gate returns in :mod:`.gate_report`. The switch's own steps, locks and
waits are :mod:`.switch`; this module holds the rules and the words of the verdicts.

Invariants:

* Stage 3 writes only the two runtime switches, never an outbox row, a process row, or anything of
  ``_System_Event`` / ``_System_WorkItem``.
* Stage 3 turns sequence reservation off, waits for the mutations that saw it on
  and the outbox rows they left (:mod:`.switch`), then switches only on an equal
  whole-table read comparison (:func:`.status.compare_readers`) made inside the
  switch's locked transaction, and reports that comparison either way. A failed
  outbox row (any producer version) refuses it, named, with a ``Next:``.
* A stage 3 that already passed is re-verified from the database, not redone: it
  does not rewrite switches already at their final values.
* ``stage3 -check`` (:func:`stage_3_check`) calls the switch's own rule functions
  in the switch's order: its verdict and exit code are the ones stage 3 would give.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

from sqlalchemy import Connection, Engine

from .. import catalog, tx
from ..db import Deadline, translate_errors
from ..locks import lifecycle_lock_names
from . import switch
from .gate_report import EXAMPLES, GateReport, lagging_findings
from .inventory import (
    DEFAULT_HEARTBEAT_WINDOW_S,
    OUTBOX_OPEN,
    PRODUCER_ROLES,
    outbox_counts,
    outbox_examples,
    pre_cutover_outbox,
)
from .prerequisites import require_eligibility_column
from .settings import FINAL_VALUES, read_settings_for_update
from .status import ReadComparison, compare_readers
from .versions import parse_version

#: What stage 3 makes removable (seed 003, "Cutover" stage 3 and "Compatibility-only sequence contract").
REMOVABLE_MACHINERY = (
    "_System_FieldHistoryTrackingInterval intervals and the strict sequence/interval predicate",
    "_System_FieldHistorySequence rows and metadata-transition sequence allocation",
    "Flow.AtomicHistoryPrelocks history prelocks (Flow.AtomicParentPrelocks stays)",
    "typed late-discovery abort, root replay plan and retry/replay of history reservations",
    "the NEXUSCRM_FIELD_HISTORY_SEQUENCE_RESERVATION_ENABLED emergency breaker",
    "the NULL fallback branch of the compatibility reader",
)


def stage_3(
    engine: Engine,
    *,
    producer_release: str,
    updated_by: str,
    namespace: str | None = None,
    deadline: Deadline | None = None,
    poll_s: float = switch.DEFAULT_POLL_S,
    hooks: switch.Hooks | None = None,
    chunk_rows: int = switch.DEFAULT_CHUNK_ROWS,
) -> GateReport:
    """Every producer upgraded, no pre-cutover outbox work, no failed outbox row; reservation off; then, settled, an
    equal read comparison and the switch to boolean-only reads (:mod:`.switch`: safe against producers that keep writing).

    The preconditions are checked in one transaction of the policy (READ COMMITTED,
    holding the namespace lock when ``namespace`` is given), which then turns
    sequence reservation off; the comparison and the read-mode switch are one later
    transaction, after the barrier and the outbox it waits for, with every check it
    relies on made under its locks. The read comparison covers the whole table in
    keyset chunks (:func:`.status.compare_readers`): equal exactly when no row's read
    result would flip; the rows that would flip (exactly the eligible NULL rows) are
    findings. A failed outbox row (any producer version) refuses wherever it is seen,
    naming it, with what to do next (the summary's ``Next:``). A refusal before the
    preconditions hold switches nothing; a later one leaves reservation off (reported)
    and reads unswitched. ``hooks`` are test seams.
    A deadline passed while settling raises :class:`~nexus_cutover.errors.LockTimeout`.
    """
    parse_version(producer_release)
    deadline = deadline or Deadline(60.0)
    with translate_errors("checking Field History stage 3"):
        require_eligibility_column(engine)
    locks = lifecycle_lock_names(namespace) if namespace else ()
    first = tx.run(
        engine,
        lambda conn: _stage_3_preconditions(conn, producer_release, updated_by, namespace),
        what="checking Field History stage 3 and turning sequence reservation off",
        deadline=deadline,
        locks=locks,
        retry=switch.RETRY,
    )
    if isinstance(first, GateReport):
        return first
    actions = first
    hooks = hooks or switch.Hooks()
    if hooks.after_reservation_off is not None:
        hooks.after_reservation_off()
    outcome, barriers = switch.compare_and_switch(
        engine, namespace, updated_by, deadline, poll_s=poll_s, hooks=hooks, chunk_rows=chunk_rows
    )
    return _stage_3_report(outcome, barriers, actions)


#: What to do about failed outbox rows (the refusal's ``Next:``): stage 3 never changes an outbox row's status.
FAILED_OUTBOX_NEXT = (
    "redeliver them through the outbox worker, or retire them by a separately reviewed decision (stage 3 never "
    "changes an outbox row's status), then run stage 3 again"
)


def _failed_outbox(ids: list[int]) -> tuple[list[dict], str]:
    """The findings and the problem of failed outbox rows (contract: outbox work is settled only with none failed)."""
    problem = (
        f"{len(ids)} outbox row(s) failed ({switch.named_ids(ids)}): a failed row can be redelivered, and an upgraded "
        "producer's row then writes its NULL rows after the switch, where the boolean-only reader never returns them"
    )
    return [{"finding": "outbox_failed", "outbox_id": i} for i in ids[:EXAMPLES]], problem


def _summary(prefix: str, problems: list[str], next_steps: list[str]) -> str:
    """``prefix`` and the problems, then one ``Next:`` with what to do (last: a reader splits the next action off there)."""
    text = prefix + "; ".join(problems)
    return text + (". Next: " + "; ".join(next_steps) + "." if next_steps else "")


def _stage_3_problems(
    conn: Connection, producer_release: str | None, namespace: str | None
) -> tuple[list[dict], dict, list[str], list[str]]:
    """Step 1's rules: (findings, counts, problems, next steps). Without a release (``-check`` alone) only the rule
    that needs none: no failed outbox row."""
    findings: list[dict] = []
    outbox: list = []
    if producer_release is not None:
        findings = lagging_findings(conn, PRODUCER_ROLES, producer_release, namespace)
        outbox = pre_cutover_outbox(outbox_counts(conn), producer_release, OUTBOX_OPEN)
        examples = outbox_examples(conn, producer_release, OUTBOX_OPEN, EXAMPLES) if outbox else []
        findings += [{"finding": "pre_cutover_outbox", **e} for e in examples]
    failed = switch.failed_outbox_ids(conn)
    counts = {
        "lagging_processes": sum(f["finding"] == "lagging_process" for f in findings),
        "pre_cutover_outbox_rows": sum(c.rows for c in outbox),
        "failed_outbox_rows": len(failed),
    }
    problems, next_steps = [], []
    if counts["lagging_processes"]:
        problems.append(f"{counts['lagging_processes']} deployed producer(s) older than {producer_release}")
    if counts["pre_cutover_outbox_rows"]:
        problems.append(f"{counts['pre_cutover_outbox_rows']} pre-cutover outbox row(s) not delivered")
    if failed:
        failed_findings, problem = _failed_outbox(failed)
        findings += failed_findings
        problems.append(problem)
        next_steps.append(FAILED_OUTBOX_NEXT)
    return findings, counts, problems, next_steps


def _flip_problems(comparison) -> list[str]:
    problems = []
    if comparison.compat_only:
        problems.append(f"{comparison.compat_only} eligible NULL row(s) would stop being read: run stage 2 materialization")
    if comparison.boolean_only:
        problems.append(f"{comparison.boolean_only} row(s) only the boolean-only reader would accept")
    return problems


def _preconditions_report(
    found: tuple[list[dict], dict, list[str], list[str]], settings, comparison_of: Callable[[], ReadComparison]
) -> GateReport | None:
    """Step 1's verdict on its rules (``found``, from :func:`_stage_3_problems`): a refusal, or the report of a tenant
    already final; None when stage 3 goes on (turns reservation off). ``comparison_of`` is read only then."""
    findings, counts, problems, next_steps = found
    if not (problems or settings.final):
        return None
    comparison = comparison_of()
    findings = findings + [{"finding": "read_flip", **d} for d in comparison.differences]
    counts = {**counts, "eligible_null_rows": comparison.compat_only}
    problems = problems + _flip_problems(comparison)
    evidence = comparison.as_json()
    if problems:
        prefix = "switches already final, but " if settings.final else "refused, nothing switched: "
        return GateReport(3, False, _summary(prefix, problems, next_steps), findings, counts, comparison=evidence)
    return GateReport(
        3,
        True,
        "already boolean_only with sequence reservation off; preconditions still hold",
        [],
        counts,
        already_done=True,
        removable=list(REMOVABLE_MACHINERY),
        comparison=evidence,
    )


def _stage_3_preconditions(conn: Connection, producer_release: str, updated_by: str, namespace: str | None) -> GateReport | list[str]:
    """Step 1 of :mod:`.switch`: a refusal or an already final tenant as a report; else the actions taken."""
    found = _stage_3_problems(conn, producer_release, namespace)
    report = _preconditions_report(found, read_settings_for_update(conn), lambda: compare_readers(conn))
    if report is not None:
        return report
    turned_off = switch.reservation_off_in(conn, updated_by)
    return [f"set {catalog.SETTING_SEQUENCE_RESERVATION} = false"] if turned_off else []


def _switch_problems(outcome: switch.SwitchOutcome) -> tuple[list[dict], list[str], list[str]]:
    """What refused the switch (steps 3 and 4): (findings, problems, next steps)."""
    comparison = outcome.comparison
    findings = [{"finding": "read_flip", **d} for d in comparison.differences]
    problems, next_steps = [], []
    if outcome.reservation_on:
        problems.append(
            f"{catalog.SETTING_SEQUENCE_RESERVATION} was turned on again while stage 3 ran: producers may write eligible "
            "NULL rows again; leave it off and rerun"
        )
    if outcome.outbox_failed:
        failed_findings, problem = _failed_outbox(outcome.outbox_failed)
        findings += failed_findings
        problems.append(problem)
        next_steps.append(FAILED_OUTBOX_NEXT)
    if outcome.outbox_reopened:
        problems.append(
            f"{len(outcome.outbox_reopened)} outbox row(s) the barrier waited for are open again "
            f"({switch.named_ids(outcome.outbox_reopened)}): rerun"
        )
    if outcome.fields_at_risk:
        findings += [{"finding": "field_without_sequence_row", "field_id": f} for f in outcome.fields_at_risk[:EXAMPLES]]
        problems.append(
            f"{len(outcome.fields_at_risk)} field(s) have an interval proving their first sequence but no sequence row: "
            "a first reservation, which no lock can hold back, would be an eligible NULL row; stage 3 cannot prove "
            "none is in flight (fields " + ", ".join(map(str, outcome.fields_at_risk[:EXAMPLES])) + ")"
        )
    if outcome.sequences_moved:
        problems.append(f"sequence reservations committed while stage 3 compared (fields {outcome.sequences_moved[:EXAMPLES]})")
    problems += _flip_problems(comparison)
    return findings, problems, next_steps


def _stage_3_report(outcome: switch.SwitchOutcome, barriers: int, actions: list[str]) -> GateReport:
    comparison = outcome.comparison
    counts = {
        "lagging_processes": 0,
        "pre_cutover_outbox_rows": 0,
        "failed_outbox_rows": len(outcome.outbox_failed),
        "eligible_null_rows": comparison.compat_only,
        "barriers": barriers,
    }
    evidence = comparison.as_json() if comparison.chunks or outcome.switched else {}
    if outcome.switched:
        actions = actions + [f"set {name} = {FINAL_VALUES[name]}" for name in outcome.changed]
        return GateReport(
            3,
            True,
            "switched to boolean-only reads; sequence reservation disabled",
            [],
            counts,
            actions,
            already_done=not actions,
            removable=list(REMOVABLE_MACHINERY),
            comparison=evidence,
        )
    findings, problems, next_steps = _switch_problems(outcome)
    reservation = "sequence reservation is off and stays off" if not outcome.reservation_on else "sequence reservation is on"
    return GateReport(
        3,
        False,
        _summary(f"refused, reads not switched ({reservation}): ", problems, next_steps),
        findings,
        counts,
        actions,
        comparison=evidence,
    )


# -- stage 3 -check ----------------------------------------------------------

CHECK_PREFIX = "nothing switched (-check): "


@dataclass
class Stage3Check:
    """``stage3 -check``: what stage 3 would do now, by the switch's own rules (:func:`stage_3_check`).

    ``would`` is ``switch``, ``wait`` (outbox rows a live worker delivers: stage 3 waits, then decides on what their
    delivery left), ``time out`` (outbox rows and no live outbox worker), ``refuse`` or ``already done``;
    ``exit_code`` is the one stage 3 would exit with (0, 0, 4, 3, 0), ``report`` the report it would give.
    """

    would: str
    exit_code: int
    summary: str
    preview: switch.Preview
    report: GateReport | None = None

    def as_json(self) -> dict:
        return {
            "would": self.would,
            "exit_code": self.exit_code,
            "passed": self.exit_code == 0,
            "summary": self.summary,
            **self.preview.as_json(),
            "findings": self.report.findings if self.report else [],
            "counts": self.report.counts if self.report else {},
        }

    def lines(self) -> list[str]:
        out = self.preview.lines()
        for f in self.report.findings if self.report else []:
            out.append(f"  finding {f['finding']}: " + ", ".join(f"{k}={v}" for k, v in f.items() if k != "finding"))
        return out + [self.summary]


def stage_3_check(
    engine: Engine,
    *,
    producer_release: str | None = None,
    namespace: str | None = None,
    heartbeat_window_s: float = DEFAULT_HEARTBEAT_WINDOW_S,
) -> Stage3Check:
    """What :func:`stage_3` would do now, in one read-only transaction, switching nothing: its step-1 rules
    (:func:`_preconditions_report`; without ``producer_release`` only those needing none), then its wait for the open
    outbox rows (:class:`.switch.OutboxWait`: no live worker, it would time out), then its step-4 rules
    (:func:`.switch.switch_checks` without a barrier). The same functions the switch calls, in the switch's order: the
    first that stops it decides the verdict, the exit code and the reason."""
    if producer_release is not None:
        parse_version(producer_release)
    with translate_errors("checking Field History stage 3"):
        require_eligibility_column(engine)

    def body(conn: Connection):
        return switch.preview_in(conn, namespace, heartbeat_window_s), _stage_3_problems(conn, producer_release, namespace)

    found, problems = tx.read(engine, body, what="checking Field History stage 3 (-check)")
    unchecked = "" if producer_release else " (producers and pre-cutover outbox work not checked: no -producer-release)"
    first = _preconditions_report(problems, found.settings, lambda: found.comparison)
    if first is not None and first.passed:
        return Stage3Check("already done", 0, CHECK_PREFIX + "stage 3 would find " + first.summary + unchecked, found, first)
    if first is not None:
        return Stage3Check("refuse", 3, CHECK_PREFIX + "stage 3 would refuse (exit 3): " + first.summary, found, first)
    if found.wait.times_out:
        return Stage3Check(
            "time out", 4,
            CHECK_PREFIX + f"would wait: {found.wait.reason()}: the switch would time out (exit 4), reads not switched"
            + unchecked,
            found,
        )
    if found.checks.blocked:
        report = _stage_3_report(found.checks, 0, [])
        return Stage3Check("refuse", 3, CHECK_PREFIX + "stage 3 would refuse (exit 3): " + report.summary, found, report)
    if found.wait.open_ids:
        return Stage3Check(
            "wait", 0,
            CHECK_PREFIX + f"would wait: {found.wait.reason()}; then stage 3 compares again and switches only if their "
            "delivery left no eligible NULL row" + unchecked,
            found,
        )
    return Stage3Check("switch", 0, CHECK_PREFIX + "stage 3 would switch: no row's read result would flip, no outbox "
                       "row open or failed" + unchecked, found)

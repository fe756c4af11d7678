"""Field History's declared steps, one body each: the door the DAG and ``field-history-eligibility`` go through.

:data:`~nexus_cutover.field_history.transition.FIELD_HISTORY` declares the
gates and their order; each step's ``calls`` names its body here, a function
``(FieldHistoryRun) -> StepResult``: the gate of :mod:`.gates` it runs, its
report (``value``: the JSON every caller sees), the declared verdict on it and
the lines a person reads. The DAG (``nexus_airflow.field_history``, one task
per step, a sensor waiting on the outbox drain) and the stage commands
(``field-history-eligibility stage1|stage2|stage3``: the steps of one stage,
the outbox drain looked at once) are loops over the declaration that run these.

Invariants: a gate checks before it acts and acts only when every check holds;
a body never switches anything a failed check forbids (the gates' own rules,
:mod:`.gates`). Nothing here changes history.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

from sqlalchemy import Engine

from .. import events as E
from ..db import Deadline, tls_line
from ..events import Event
from ..transition import Outcome, StepResult
from ..tx import connection_tls
from ..watch import WAITING, Watch
from . import gates
from .gates import stage_3_check
from .materialize import DEFAULT_BATCH_SIZE, MAX_BATCH_SIZE, materialize
from .prerequisites import next_stage_action
from .status import FieldHistoryStatus, read_status, render_comparison
from .transition import FIELD_HISTORY

#: The door: what the command line and the Airflow adapter use of Field History (the declaration is
#: :mod:`.transition`; tests/test_architecture.py fails on an import of anything else behind it).
__all__ = ["DEFAULT_BATCH_SIZE", "FIELD_HISTORY", "FieldHistoryRun", "FieldHistoryStatus", "MAX_BATCH_SIZE",
           "StepResult", "materialize", "next_stage_action", "read_status", "run_step", "stage_3_check"]


def _quiet(_line: str) -> None:
    return None


@dataclass
class FieldHistoryRun:
    """What a run of Field History's gates knows: the tenant database, the releases, the bounds, who switches."""

    engine: Engine
    namespace: str | None = None
    stage1_release: str = ""
    producer_release: str = ""
    batch_size: int = gates.DEFAULT_BATCH_SIZE
    materialize_timeout_s: float = 300.0
    switch_timeout_s: float = 300.0
    heartbeat_window_s: float = gates.DEFAULT_HEARTBEAT_WINDOW_S
    #: Who writes the read switch (``UpdatedBy``): the DAG's run, or the command line.
    updated_by: str = ""
    say: Callable[[str], None] = _quiet
    #: The materialization's seam between a batch's read and its write (the fault tests' pause; None: none).
    between_read_and_write: Any = None


def run_step(name: str, run: FieldHistoryRun) -> StepResult:
    """Run the body of the declared Field History step ``name``."""
    return FIELD_HISTORY[name].function()(run)


def _gate(name: str, report) -> StepResult:
    """A gate's report as its step's result: judged by the declared verdict on its JSON form."""
    value = report.as_json()
    return StepResult(value, FIELD_HISTORY[name].verdict(value), domain=report,
                      message=None if report.passed else f"{name}: {report.summary}")


def stage_1(run: FieldHistoryRun) -> StepResult:
    """The nullable column (added if absent), and every runtime_api / audit_outbox_worker on the stage-1 release.
    As a DAG run's first step it reports the TLS its tenant connection uses (:func:`nexus_cutover.tx.connection_tls`):
    a line and the result keyed ``tls`` (XCom); the stage commands report it themselves (their ``tls`` field)."""

    result = _gate("stage_1", gates.stage_1(run.engine, stage1_release=run.stage1_release, namespace=run.namespace))
    tenant_tls = connection_tls(run.engine)
    run.say(tls_line(tenant_tls))
    result.keyed["tls"] = tenant_tls
    return result


def stage_2_producers(run: FieldHistoryRun) -> StepResult:
    """Every producer on the producer-cutover release, and none of them left a NULL (read only)."""
    return _gate("stage_2_producers", gates.stage_2_producers(run.engine, producer_release=run.producer_release,
                                                              namespace=run.namespace))


def stage_2_drain_outbox(run: FieldHistoryRun) -> StepResult:
    """One look at the pre-cutover Audit V2 outbox work: drained, stuck (a stop) or still being delivered."""
    state = gates.outbox_drain_state(run.engine, producer_release=run.producer_release, namespace=run.namespace,
                                     heartbeat_window_s=run.heartbeat_window_s)
    value = state.as_json()
    return StepResult(value, FIELD_HISTORY["stage_2_drain_outbox"].verdict(value), domain=state)


def stage_2_materialize(run: FieldHistoryRun) -> StepResult:
    """The legacy rows decided, in batches, each read-equivalent (resumable, deterministic)."""
    return _gate("stage_2_materialize", gates.stage_2_materialize(
        run.engine, batch_size=run.batch_size, deadline=Deadline(run.materialize_timeout_s),
        between_read_and_write=run.between_read_and_write))


def stage_3(run: FieldHistoryRun) -> StepResult:
    """The read switch, under the settings row's lock, only while every switch rule holds (with the whole-table
    read comparison in its report)."""

    report = gates.stage_3(run.engine, producer_release=run.producer_release, updated_by=run.updated_by,
                           namespace=run.namespace, deadline=Deadline(run.switch_timeout_s))
    if report.comparison:
        run.say(render_comparison(report.comparison))
    return _gate("stage_3", report)


def events(step: str, r: dict) -> list[Event]:
    """A gate passed (or found already done): its stage, the actions it took and its counts."""
    if not r.get("passed"):
        return []
    return [Event(E.GATE_PASSED, step, outcome=f"stage {r.get('stage')} passed" + (" (already done)" if r.get("already_done") else ""),
                  reason=r.get("summary"),
                  detail={"stage": r.get("stage"), "actions": r.get("actions") or [], "counts": r.get("counts") or {}})]


class OutboxWatch(Watch):
    """Stage 2's wait on the pre-cutover Audit V2 outbox: ``drained``, ``stuck`` (failed rows, no live worker),
    ``timed_out`` at the deadline, else waiting (with the rows still open and how many were delivered since the
    watch's first look)."""

    done = "drained"

    def __init__(self, engine, namespace: str, step: str, deadline, *, stale_heartbeat_s: float,
                 producer_release: str, initial_remaining: int | None = None, record=None) -> None:
        super().__init__(engine, namespace, step, deadline, record=record)
        self.run = FieldHistoryRun(engine, namespace=namespace, producer_release=producer_release,
                                   heartbeat_window_s=float(stale_heartbeat_s))
        self.initial = initial_remaining

    def poll(self) -> dict[str, Any]:
        looked = self.last = run_step(self.step, self.run)
        state, report, verdict = looked.domain, looked.value, looked.verdict
        if self.initial is None:
            self.initial = state.remaining
        progress = f"{state.remaining} pre-cutover outbox row(s) open {state.open_rows}"
        if self.initial:
            progress += f", {self.initial - state.remaining} of {self.initial} delivered since start"
        if verdict.proceeds:
            return {"state": self.done, "message": "pre-cutover outbox work drained", "report": report}
        if verdict.outcome is Outcome.STOP:
            return {"state": "stuck", "message": progress + "; stuck: " + "; ".join(state.stuck_reasons), "report": report}
        if self.expired():
            return {"state": "timed_out", "message": progress + "; drain_timeout reached", "report": report}
        return {"state": WAITING, "message": progress + f"; {state.live_workers} live worker(s)",
                "remaining": state.remaining, "report": report}

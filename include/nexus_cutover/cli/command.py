"""What every ``nexus-cutover`` command shares: one invocation (:class:`Command`), how it stops, how it is recorded.

Invariants: a stop is :class:`Stopped` (exit 3) or :class:`TimedOut` (exit 4) with its report (the ``-json``);
every command that runs a declared step records it through the invocation's recorder
(:mod:`nexus_cutover.cli.recording`), so the command line leaves the ledger rows and the figures a DAG's run leaves.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from collections.abc import Callable
from typing import Any

from sqlalchemy import Engine

from ..code_version import check_reuse, fence_reason
from ..errors import BadInput, LockTimeout, Refused
from ..holders import same_holder
from ..metrics import failure_reason
from ..projection import steps
from ..projection.transition import CUTOVER
from ..recording import NOT_RECORDING, Recorder, timed
from ..transition import Outcome, Transition
from .recording import command_recorder

PROGRAM = "nexus-cutover"
EXIT_OK, EXIT_REFUSED, EXIT_TIMEOUT = 0, 3, 4


class Stopped(Refused):
    """A step stopped the command and reported why (exit 3); ``report`` is its JSON."""

    def __init__(self, message: str, report: dict[str, Any] | None = None):
        self.report = report or {}
        super().__init__(message)


class TimedOut(LockTimeout):
    """A wait ran out (exit 4); ``report`` is the last look."""

    def __init__(self, message: str, report: dict[str, Any] | None = None):
        self.report = report or {}
        super().__init__(message)


class Command:
    """One invocation: parsed args, an engine, what it prints, and where what it does is recorded (``recorder``:
    the delivery ledger and the metrics when configured, nothing otherwise; set by ``main`` once the tenant is
    known)."""

    def __init__(self, args: argparse.Namespace, engine: Engine, recorder: Recorder = NOT_RECORDING):
        self.args = args
        self.engine = engine
        self.stale = dt.timedelta(seconds=args.stale_heartbeat)
        self.recorder = recorder
        #: The step's result as its records read it, when the command's ``-json`` says more (``digest``, ``verify``).
        self.value: Any = None

    def say(self, text: str) -> None:
        if not self.args.json:
            print(text, flush=True)


#: How a person takes over a fence from the command line (FenceHeld's "Next:"); ``{holder}`` is filled in.
CLI_TAKE_OVER = ("if {holder} is finished (an Airflow run that failed or was rejected, a command that ended or was "
                 "killed) and you know it, take its fence over by naming it: rerun this command with -adopt '{holder}' "
                 "(arm-fence and run take it; the fence then records you as its holder)")


def save_digest(digest, path: str) -> None:
    """Keep the full history digest (JSON) at ``path`` for a later ``verify -expect``."""
    try:
        with open(path, "w", encoding="utf-8") as fh:
            json.dump(digest.as_json(), fh)
    except OSError as exc:
        raise BadInput(f"cannot write the digest to {path}: {exc.strerror}") from exc


def _verdict(step, value: Any):
    """The step's declared verdict on a command's result (None when the result is not the step's JSON form)."""
    try:
        return step.verdict(value) if isinstance(value, dict) and value else None
    except (KeyError, TypeError, ValueError):
        return None


#: How a person goes on with the new product version when a command stops on the pin of the fence it holds.
CLI_GO_ON = ("adopt the fence from a new holder on this version (arm-fence or run -adopt '<the old holder>', then "
             "the later steps with the new -holder): it takes over what the old holder left and checks every step again")


def _pinned(c: Command, step: str, tenant: str | None) -> None:
    """A command given the ``-holder`` of the tenant's cutover fence runs only on the product version that armed
    it, as ``run`` reuses its fence only on that version (:func:`nexus_cutover.code_version.check_reuse`): it stops
    before it touches the tenant otherwise, naming both versions. A fence another holder holds is not this
    command's pin (the step refuses it by itself where it must)."""
    if not tenant:
        return
    try:
        fence = steps.cutover_fence_in_force(c.engine, tenant)
    except steps.SeveralCutoverFences:
        return  # the step itself refuses that, naming them
    if fence is not None and same_holder(fence.get("ArmedBy"), c.args.holder):
        check_reuse(step, fence, fence_reason("cutover"), go_on=CLI_GO_ON)


def recorded(c: Command, fn: Callable[[Command], tuple[int, dict[str, Any]]], *,
             loop: Transition | None = None) -> tuple[int, dict[str, Any]]:
    """Run the command ``fn``, recorded as the declared step it runs (its events when it did it, ``stopped`` with
    the reason when it refused, stopped or failed: the rows and figures a DAG's task of that step leaves); a command
    that runs the declared steps of ``loop`` (``run``: the cutover's, ``back-out``: the back-out's) gets the recorder
    and records each of its steps itself; a command that runs no step (``plan``, ``status``, ``report``) records
    nothing."""
    step = CUTOVER.for_command(c.args.command)
    tenant = getattr(c.args, "namespace", None)
    if tenant is None and getattr(c.args, "pack_install_id", None):
        tenant = steps.pack_namespace(c.engine, c.args.pack_install_id)
    if step is None and loop is None:
        return fn(c)
    c.recorder = command_recorder(c.args, program=PROGRAM, tenant=tenant, transition=loop or CUTOVER)
    if step is None:
        return fn(c)
    with timed(c.recorder, step.name, failure_of=failure_reason):
        _pinned(c, step.name, tenant)
    with timed(c.recorder, step.name, failure_of=failure_reason) as clock:
        try:
            code, result = fn(c)
        except (Stopped, TimedOut) as exc:
            looked = _verdict(step, exc.report)
            if looked is not None and looked.outcome is Outcome.WAIT:
                clock.settled = True  # one look at a wait that goes on (drain without --wait): not a stop
            raise
        value = result if c.value is None else c.value
        verdict = _verdict(step, value) if code != EXIT_OK else None
        if code == EXIT_OK:
            clock.passed(value)
        elif verdict is not None and verdict.outcome is Outcome.WAIT:
            clock.settled = True  # a wait's look that is not there yet (readiness): recorded when it passes
        else:  # a refused checkpoint: its stop, as the DAG's task stops
            clock.stopped(verdict.reason if verdict is not None and verdict.reason else f"{c.args.command}: exit {code}",
                          failure=failure_reason(SystemExit(code)))
    return code, result

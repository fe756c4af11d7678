"""What every ``nexus-cutover`` command shares: one invocation (:class:`Command`), how it stops, its recorder.

Invariants: a stop is :class:`Stopped` (exit 3) or :class:`TimedOut` (exit 4) with its report (the ``-json``);
every command that runs a declared step records it through the invocation's recorder
(:mod:`nexus_cutover.cli.recording`), so the command line leaves the ledger rows and the figures a DAG's run leaves.
"""

from __future__ import annotations

import argparse
import datetime as dt
import json
from typing import Any

from sqlalchemy import Engine

from ..errors import BadInput, LockTimeout, Refused
from ..recording import NOT_RECORDING, Recorder

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



"""Plumbing shared by the project's command-line entrypoints.

* Flags are accepted Go-style with one dash (``-timeout 5m``) and with two
  (``--timeout 5m``), as the contract requires.
* Durations are Go-style (``90s``, ``5m``, ``1h30m``, ``1.5s``) or bare seconds, positive and at most
  :data:`MAX_DURATION_S`; times (``-since``) are ISO 8601, read as UTC. A value a flag cannot use is a usage
  error naming the flag (exit 2) before anything connects, never a Python error later.
* :func:`run_command` maps every error to the contract's exit codes and prints
  one line to stderr (never a DSN or password: the secrets of the DSN variables
  are hidden in it, :func:`nexus_cutover.db.hide_dsn_secrets`); usage errors exit 2.
"""

from __future__ import annotations

import argparse
import datetime as dt
import getpass
import json
import logging
import os
import re
import secrets
import signal
import socket
import sys
import threading
from collections.abc import Callable
from typing import Any

from .. import catalog, settings
from ..db import DSN_ENV_CUTOVER, hide_dsn_secrets
from ..errors import BadInput, CutoverError

_DURATION_PART = re.compile(r"(\d+(?:\.\d+)?)(ms|s|m|h)")
_UNIT_SECONDS = {"ms": 0.001, "s": 1.0, "m": 60.0, "h": 3600.0}

#: The longest duration a flag takes: 365 days (8760h). Every duration ends up in a clock or a server setting with a
#: ceiling: MariaDB's ``max_statement_time`` (at most 31536000 s), ``innodb_lock_wait_timeout`` (about 34 years),
#: a thread wait (``threading.TIMEOUT_MAX``) and ``now +/- duration`` as a datetime (year 1 to 9999).
MAX_DURATION_S = 365 * 24 * 3600.0


def parse_duration(text: str) -> float:
    """Seconds in ``text``: ``"5m"``, ``"1h30m"``, ``"2.5s"``, ``"300"``, positive and at most
    :data:`MAX_DURATION_S`; ValueError otherwise."""
    text = text.strip()
    if re.fullmatch(r"\d+(?:\.\d+)?", text):
        seconds = float(text)
    else:
        pos, seconds = 0, 0.0
        for match in _DURATION_PART.finditer(text):
            if match.start() != pos:
                break
            seconds += float(match.group(1)) * _UNIT_SECONDS[match.group(2)]
            pos = match.end()
        if pos != len(text) or not text:
            raise ValueError(f"invalid duration {text!r}: use e.g. 30s, 5m, 1h30m")
    if seconds <= 0:
        raise ValueError(f"invalid duration {text!r}: must be positive")
    if not seconds <= MAX_DURATION_S:
        raise ValueError(f"invalid duration {text!r}: at most 8760h (365 days)")
    return seconds


def duration_arg(text: str) -> float:
    try:
        return parse_duration(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(str(exc)) from exc


def duration_or_zero_arg(text: str) -> float:
    """An argparse type: a duration as :func:`duration_arg` reads it, or ``0`` (a bound that is off)."""
    return 0.0 if text.strip() in ("0", "0s") else duration_arg(text)


def utc_time_arg(text: str) -> dt.datetime:
    """An argparse type: an ISO 8601 time (``2026-12-04T01:30:00``, ``2026-12-04``, ``...+02:00``, ``...Z``) as a
    naive UTC datetime (the database's clock); a time without an offset is UTC. Else an error naming the form."""
    try:
        value = dt.datetime.fromisoformat(text.strip())
        return value.astimezone(dt.UTC).replace(tzinfo=None) if value.tzinfo is not None else value
    except (ValueError, OverflowError) as exc:  # OverflowError: an offset that moves it out of years 1 to 9999
        raise argparse.ArgumentTypeError(
            f"invalid time {text!r}: use ISO 8601 UTC, e.g. 2026-12-04T01:30:00 (or with an offset, +02:00)"
        ) from exc


def _int_arg(text: str) -> int:
    try:
        return int(text)
    except ValueError as exc:
        raise argparse.ArgumentTypeError(f"invalid integer {text!r}") from exc


def positive_int_arg(text: str) -> int:
    value = _int_arg(text)
    if value <= 0:
        raise argparse.ArgumentTypeError(f"must be positive, got {value}")
    return value


def bounded_int_arg(lowest: int, highest: int) -> Callable[[str], int]:
    """An argparse type: an integer from ``lowest`` to ``highest``, else an error naming the range."""
    def parse(text: str) -> int:
        value = _int_arg(text)
        if not lowest <= value <= highest:
            raise argparse.ArgumentTypeError(f"must be from {lowest} to {highest}, got {value}")
        return value
    return parse


def bounded_text_arg(longest: int) -> Callable[[str], str]:
    """An argparse type: text of at most ``longest`` characters (the catalog column it is stored in), else an error
    naming the limit; a longer value would fail as a database error (exit 1) on the first write."""
    def parse(text: str) -> str:
        if len(text) > longest:
            raise argparse.ArgumentTypeError(f"at most {longest} characters, got {len(text)}")
        return text
    return parse


def namespace_arg(text: str) -> str:
    """An argparse type for ``-namespace``: at most as long as the catalog's Namespace columns."""
    return bounded_text_arg(catalog.ProcessRegistry.c.Namespace.type.length)(text)


def flag(parser: argparse.ArgumentParser, name: str, **kwargs: Any) -> None:
    """Declare ``-name`` and ``--name`` as one option."""
    parser.add_argument(f"-{name}", f"--{name}", dest=name.replace("-", "_"), **kwargs)


def default_holder(program: str = "cli") -> str:
    """``program:user@host:pid<pid>:<UTC time>.<random>`` (at most 128 characters): who holds a fence, or wrote a
    checkpoint, unless told otherwise (``-holder``).

    Unique per invocation (contract, "One cutover per tenant at a time": two invocations never share one): the
    process id and the time to the microsecond, and a few random hex digits for hosts that share a name and a
    pid (containers). ``user`` is ``unknown`` where there is no login name (some containers). The tail is kept
    when a long user or host name is cut, so the holder stays unique.
    """
    try:
        user = getpass.getuser()
    except Exception:  # noqa: BLE001 - no login name in some containers
        user = "unknown"
    stamp = dt.datetime.now(dt.UTC).strftime("%Y%m%dT%H%M%S.%fZ")
    tail = f":pid{os.getpid()}:{stamp}.{secrets.token_hex(2)}"
    return f"{program}:{user}@{socket.gethostname()}"[: 128 - len(tail)] + tail


def stop_on_signals(stop: threading.Event, signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT)) -> None:
    """Set ``stop`` when one of ``signals`` arrives, from a short thread, never inside the handler itself.

    A signal handler runs in the main thread between two bytecodes, possibly while that thread is inside
    ``stop.wait()`` holding the event's (non-reentrant) condition lock: ``stop.set()`` there waits for that lock
    forever and the process never stops (the likely cause of a SIGTERMed host that did not stop within 30 s in one
    ``make test`` run). A thread takes the lock once the main thread lets go of it.
    """

    def _on_signal(_signum, _frame) -> None:
        threading.Thread(target=stop.set, name="stop-on-signal", daemon=True).start()

    for sig in signals:
        signal.signal(sig, _on_signal)


def print_json(obj: Any) -> None:
    sys.stdout.write(json.dumps(obj, sort_keys=True, default=str) + "\n")
    sys.stdout.flush()


def configure_logging(verbose: bool = False) -> None:
    logging.basicConfig(
        level=logging.DEBUG if verbose else logging.INFO,
        format="%(asctime)s %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def run_command(
    body: Callable[[], int], *, program: str, json_errors: bool = False, json_fields: dict[str, Any] | None = None
) -> int:
    """Run ``body``; contract errors become their exit codes with one stderr line.

    With ``json_errors`` the error is also one JSON object on stdout (``json_fields`` merged in).
    """
    try:
        return body()
    except CutoverError as exc:
        _report_error(program, exc, exc.exit_code, json_errors, json_fields)
        return exc.exit_code
    except KeyboardInterrupt:
        _report_error(program, BadInput("interrupted"), 1, json_errors, json_fields)
        return 1
    except Exception as exc:  # noqa: BLE001 - last resort: exit 1 with the reason, never a traceback with a DSN
        _report_error(program, exc, 1, json_errors, json_fields)
        return 1


def _report_error(
    program: str, exc: BaseException, code: int, json_errors: bool, json_fields: dict[str, Any] | None
) -> None:
    message = mask_dsn_secrets(str(exc) or exc.__class__.__name__)
    sys.stderr.write(f"{program}: error: {message}\n")
    if json_errors:
        print_json({**(json_fields or {}), "error": message, "error_class": exc.__class__.__name__, "exit_code": code})


def mask_dsn_secrets(message: str) -> str:
    """``message`` with every secret of the DSN variables the commands read hidden (whatever a driver quoted)."""
    for dsn in [os.environ.get(DSN_ENV_CUTOVER, "").strip(), *settings.secret_values()]:
        if dsn:
            message = hide_dsn_secrets(message, dsn)
    return message

"""nexus_cutover.cli.common: Go-style durations, UTC times, flags with one dash or two, errors without DSN secrets."""

from __future__ import annotations

import argparse
import datetime as dt
import subprocess
import sys

import pytest

from nexus_cutover.cli.common import (
    MAX_DURATION_S,
    duration_arg,
    flag,
    parse_duration,
    positive_int_arg,
    run_command,
    utc_time_arg,
)
from nexus_cutover.errors import Unreachable


@pytest.mark.parametrize(
    ("text", "seconds"),
    [
        ("5m", 300),
        ("1h30m", 5400),
        ("2.5s", 2.5),
        ("300", 300),
        ("200ms", 0.2),
        ("90s", 90),
        ("1h", 3600),
        ("1.5h", 5400),
        ("1m30s", 90),
        ("1h0m5s", 3605),
        ("0.5", 0.5),
        (" 5m ", 300),
        ("1s500ms", 1.5),
    ],
)
def test_parse_duration(text, seconds):
    assert parse_duration(text) == pytest.approx(seconds)


@pytest.mark.parametrize(
    "text",
    ["", " ", "m", "5x", "5 m", "1h 30m", "s5", "5m-", "-5s", "-5", "+5s", "1e3", "inf", "nan", ".5s", "5.s", "1.2.3", "5M", "5min", "1d"],
)
def test_parse_duration_refuses_malformed_text(text):
    with pytest.raises(ValueError, match="invalid duration"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["0", "0s", "0ms", "0h0m", "0.0"])
def test_parse_duration_refuses_zero(text):
    with pytest.raises(ValueError, match="must be positive"):
        parse_duration(text)


@pytest.mark.parametrize("text", ["1000000000000", "8761h", "525601m", "31536001", "9" * 400])
def test_parse_duration_refuses_more_than_a_year(text):
    """A clock or a server setting downstream cannot hold it (datetime range, max_statement_time, thread waits)."""
    with pytest.raises(ValueError, match="at most 8760h"):
        parse_duration(text)


def test_parse_duration_takes_a_year_exactly():
    assert parse_duration("8760h") == MAX_DURATION_S == parse_duration("31536000")


@pytest.mark.parametrize(
    ("text", "utc"),
    [
        ("2026-12-04T01:30:00", dt.datetime(2026, 12, 4, 1, 30)),
        ("2026-12-04", dt.datetime(2026, 12, 4)),
        ("2026-12-04T03:30:00+02:00", dt.datetime(2026, 12, 4, 1, 30)),  # converted, not just stripped
        ("2026-12-04T01:30:00Z", dt.datetime(2026, 12, 4, 1, 30)),
    ],
)
def test_utc_time_arg_reads_iso_times_as_utc(text, utc):
    assert utc_time_arg(text) == utc


@pytest.mark.parametrize("text", ["not-a-date", "", "2026-13-01", "yesterday", "0001-01-01T00:00:00+05:00"])
def test_utc_time_arg_refuses_what_is_no_time(text):
    with pytest.raises(argparse.ArgumentTypeError, match="invalid time"):
        utc_time_arg(text)


def test_run_command_hides_the_secrets_of_the_dsn_variables_in_its_error_line(monkeypatch, capsys):
    """Whatever a driver quoted (the whole DSN, or a password from its query) is hidden on stderr and in the JSON."""
    dsn = "mysql+pymysql://nexus:Uinfo-Secret-1@db.internal/tenant?password=Query-Secret-2&ssl_key=Key-Secret-3"
    monkeypatch.setenv("NEXUS_TENANT_DSN", dsn)
    monkeypatch.delenv("CONNECTOR_CUTOVER_DSN", raising=False)

    def body() -> int:
        raise Unreachable(f"driver said: {dsn} refused Query-Secret-2 (user info Uinfo-Secret-1, key Key-Secret-3)")

    assert run_command(body, program="t", json_errors=True) == 1
    out = capsys.readouterr()
    for secret in ("Uinfo-Secret-1", "Query-Secret-2", "Key-Secret-3"):
        assert secret not in out.err + out.out
    assert "mysql+pymysql://nexus:***@db.internal/tenant?password=***&ssl_key=***" in out.err


def test_duration_arg_and_positive_int_arg_are_argparse_types():
    assert duration_arg("5m") == 300
    with pytest.raises(argparse.ArgumentTypeError, match="invalid duration"):
        duration_arg("soon")
    assert positive_int_arg("7") == 7
    for bad in ("0", "-1", "x", "1.5"):
        with pytest.raises(argparse.ArgumentTypeError):
            positive_int_arg(bad)


def _parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="nexus-test")
    flag(parser, "timeout", type=duration_arg, default=30.0)
    flag(parser, "pack-install-id")
    flag(parser, "dry-run", action="store_true")
    return parser


@pytest.mark.parametrize(
    "argv",
    [
        ["-timeout", "5m", "-pack-install-id", "pk-1", "-dry-run"],
        ["--timeout", "5m", "--pack-install-id", "pk-1", "--dry-run"],
        ["-timeout=5m", "--pack-install-id=pk-1", "-dry-run"],
        ["--dry-run", "-pack-install-id", "pk-1", "--timeout", "300"],
    ],
)
def test_flag_accepts_one_dash_and_two(argv):
    args = _parser().parse_args(argv)
    assert (args.timeout, args.pack_install_id, args.dry_run) == (300, "pk-1", True)


def test_flag_defaults_and_usage_errors_exit_2(capsys):
    args = _parser().parse_args([])
    assert (args.timeout, args.pack_install_id, args.dry_run) == (30.0, None, False)
    for argv in (["-timeout", "5x"], ["--timeout"], ["-bogus"]):
        with pytest.raises(SystemExit) as info:
            _parser().parse_args(argv)
        assert info.value.code == 2
    assert "invalid duration '5x'" in capsys.readouterr().err


_SIGNAL_WHILE_WAITING = """
import os, signal, sys, threading
from nexus_cutover.cli.common import stop_on_signals

stop = threading.Event()
if sys.argv[1] == "product":
    stop_on_signals(stop, (signal.SIGUSR1,))
else:  # the handler the CLIs had: set() inside the handler
    signal.signal(signal.SIGUSR1, lambda *_: stop.set())
with stop._cond:  # where stop.wait() holds its condition lock, before and after it sleeps
    os.kill(os.getpid(), signal.SIGUSR1)  # the handler runs here, the lock held
    print("handler returned", flush=True)
print("stopped" if stop.wait(10) else "not stopped", flush=True)
"""


@pytest.mark.parametrize("handler", ["product", "set-in-handler"])
def test_a_signal_while_the_stop_event_is_held_still_stops(handler):
    """SIGTERM landing while the main thread holds the stop event's lock (inside ``stop.wait()``): the product's
    handler returns and the event is set; ``stop.set()`` inside the handler waits on that lock forever."""
    try:
        out = subprocess.run([sys.executable, "-c", _SIGNAL_WHILE_WAITING, handler], capture_output=True, text=True,
                             timeout=5, check=True).stdout.split("\n")
    except subprocess.TimeoutExpired:
        out = ["hung"]
    assert out[:2] == (["handler returned", "stopped"] if handler == "product" else ["hung"])

"""A flag value a command cannot use exits 2 naming the flag, never 1 with a Python error; ``status`` on a database
without the tenant schema exits 2 like every other command.

Black-box through the console scripts (``python -m nexus_cutover.cli.<module>``), on a seeded tenant the commands
could otherwise work on. The list of duration and time flags is checked against the parsers, so a new one is
tested here or fails this file.
"""

from __future__ import annotations

import argparse
import json
import os
import random
import subprocess
import sys

import pytest

from nexus_cutover.cli import cutover_steps, field_history, lifecycle_entrypoint
from nexus_cutover.cli.common import duration_arg, duration_or_zero_arg, utc_time_arg
from nexus_cutover.db import make_engine
from nexus_sim.scenario import TenantScenario, drained_pack_history
from tests.support import make_cutover_ready

NS = "acme"
TOO_LONG = "1000000000000"  # seconds: past every clock and server setting a duration reaches
NOT_A_TIME = "not-a-date"

#: What each subcommand needs besides the flag under test.
REQUIRED = {
    ("cutover_steps", "plan"): ["-namespace", NS], ("cutover_steps", "apply-schema"): [],
    ("cutover_steps", "arm-fence"): ["-namespace", NS], ("cutover_steps", "drain"): ["-namespace", NS],
    ("cutover_steps", "writers"): ["-namespace", NS], ("cutover_steps", "stop-writers"): ["-namespace", NS],
    ("cutover_steps", "back-out"): ["-namespace", NS],
    ("cutover_steps", "confirm-writers"): ["-namespace", NS, "--confirm-writers-stopped"],
    ("cutover_steps", "start-host"): ["-namespace", NS],
    ("cutover_steps", "checkpoint"): ["-pack-install-id", "pk-a"], ("cutover_steps", "activate-pack"): ["-pack-install-id", "pk-a"],
    ("cutover_steps", "digest"): ["-namespace", NS], ("cutover_steps", "readiness"): ["-namespace", NS],
    ("cutover_steps", "release-fence"): ["-namespace", NS], ("cutover_steps", "verify"): ["-namespace", NS],
    ("cutover_steps", "status"): ["-namespace", NS], ("cutover_steps", "report"): ["-namespace", NS],
    ("cutover_steps", "run"): ["-namespace", NS, "--confirm-writers-stopped"],
    ("lifecycle_entrypoint", ""): ["-pack-install-id", "pk-a"],
    ("field_history", "materialize"): [], ("field_history", "stage2"): ["-producer-release", "4.13.0"],
    ("field_history", "stage3"): ["-producer-release", "4.13.0"],
}

#: (module, subcommand, flag): every duration and time flag of every console script (nexus-host has none).
STEPS_FLAGS = {
    "plan": ["-drain-timeout", "-arm-when-drain-below", "-pre-arm-timeout", "-poll-interval"],
    "drain": ["-drain-timeout", "-poll-interval"],
    "run": ["-drain-timeout", "-arm-when-drain-below", "-pre-arm-timeout", "-poll-interval", "-writers-stop-timeout", "-readiness-timeout",
            "-writers-stop-controller-timeout"],
    "stop-writers": ["-writers-stop-controller-timeout"],
    "verify": ["-since"],
}
FLAGS = [
    *(("cutover_steps", sub, f) for sub in cutover_steps.COMMANDS for f in ["-timeout", "-stale-heartbeat", *STEPS_FLAGS.get(sub, [])]),
    ("lifecycle_entrypoint", "", "-timeout"),
    *(("field_history", sub, "-timeout") for sub in ("materialize", "stage2", "stage3")),
]


def _typed_flags(module: str, parser: argparse.ArgumentParser, sub: str = "") -> list[tuple[str, str, str]]:
    found = []
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, child in action.choices.items():
                found += _typed_flags(module, child, name)
        elif action.type in (duration_arg, duration_or_zero_arg, utc_time_arg):
            found.append((module, sub, action.option_strings[0]))
    return found


def test_every_duration_and_time_flag_is_listed_here():
    modules = (("cutover_steps", cutover_steps), ("lifecycle_entrypoint", lifecycle_entrypoint), ("field_history", field_history))
    parsed = [f for module, m in modules for f in _typed_flags(module, m.build_parser())]
    assert sorted(parsed) == sorted(FLAGS)


@pytest.fixture(scope="module")
def tenant_dsn(tmp_path_factory) -> str:
    """A SQLite tenant, cutover step 1 applied, pack pk-a of 'acme' with drained history: every command can run."""
    path = tmp_path_factory.mktemp("bad-values") / "tenant.db"
    path.touch()
    dsn = f"sqlite:///{path}"
    engine = make_engine(dsn)
    make_cutover_ready(engine)
    sc = TenantScenario(namespace=NS)
    drained_pack_history(sc.pack("pk-a"), random.Random(7), lanes=1, generations=2)
    sc.write(engine)
    engine.dispose()
    return dsn


def run(module: str, args: list[str], dsn: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "NEXUS_TENANT_DSN": dsn}
    env.pop("CONNECTOR_CUTOVER_DSN", None)
    return subprocess.run([sys.executable, "-m", f"nexus_cutover.cli.{module}", *args], env=env, capture_output=True,
                          text=True, timeout=120, stdin=subprocess.DEVNULL)


@pytest.mark.parametrize(("module", "sub", "flag"), FLAGS, ids=[f"{m}-{s}{f}" for m, s, f in FLAGS])
def test_a_value_the_flag_cannot_use_exits_2_naming_the_flag(tenant_dsn, module, sub, flag):
    value = NOT_A_TIME if flag == "-since" else TOO_LONG
    proc = run(module, [*([sub] if sub else []), *REQUIRED[(module, sub)], flag, value], tenant_dsn)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"argument {flag}/-{flag}: invalid" in proc.stderr, proc.stderr
    assert "Traceback" not in proc.stderr


TOO_LONG_TEXT = [  # longer than the catalog column the value is stored in (Namespace 64, ProcessId 128)
    ("host", ["--namespace", "n" * 65, "--drain-and-exit"], "namespace", 64),
    ("host", ["--namespace", NS, "--process-id", "p" * 129, "--drain-and-exit"], "process-id", 128),
    ("cutover_steps", ["arm-fence", "-namespace", "n" * 65], "namespace", 64),
    ("cutover_steps", ["drain", "-namespace", "n" * 65], "namespace", 64),
    ("field_history", ["stage3", "-check", "-namespace", "n" * 65], "namespace", 64),
]


@pytest.mark.parametrize(("module", "args", "name", "longest"), TOO_LONG_TEXT,
                         ids=[f"{m}-{a[0]}-{n}" for m, a, n, _ in TOO_LONG_TEXT])
def test_text_longer_than_its_column_exits_2_naming_the_flag(tenant_dsn, module, args, name, longest):
    """On MariaDB the host's registration failed with 'Data too long' (exit 1); a read found nothing (exit 0)."""
    proc = run(module, args, tenant_dsn)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert f"argument -{name}/--{name}: at most {longest} characters, got {longest + 1}" in proc.stderr, proc.stderr


@pytest.mark.parametrize("value", ["2026-12-04T03:30:00+02:00", "2026-12-04T01:30:00"])
def test_since_is_read_as_utc(tenant_dsn, value):
    """An offset is converted to UTC, not dropped: both spellings check from 01:30 UTC."""
    proc = run("cutover_steps", ["verify", "-namespace", NS, "-since", value, "-json"], tenant_dsn)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["since"] == "2026-12-04T01:30:00"


def test_status_without_the_tenant_schema_exits_2_naming_what_is_missing(tenant_url):
    """An empty database (not a tenant, or the DSN names the wrong schema): exit 2 like every other command."""
    proc = run("cutover_steps", ["status", "-namespace", NS], tenant_url)
    assert proc.returncode == 2, proc.stdout + proc.stderr
    assert "missing prerequisite schema" in proc.stderr and "_System_WorkItem" in proc.stderr
    assert "not a tenant database" in proc.stderr
    as_json = run("cutover_steps", ["status", "-namespace", NS, "-json"], tenant_url)
    assert as_json.returncode == 2
    out = json.loads(as_json.stdout)
    assert out["exit_code"] == 2 and out["error_class"] == "MissingSchema" and "phase" not in out
    for other in (["plan", "-namespace", NS], ["drain", "-namespace", NS]):  # the other commands, for comparison
        assert run("cutover_steps", other, tenant_url).returncode == 2

"""The product's settings (issue 49, item 1): one declaration (:mod:`nexus_cutover.settings`), read through Airflow's
configuration with the ``NEXUS_*`` variables as aliases, shown by the real ``airflow config`` and in the README.

The ``airflow`` commands and the reading processes run as subprocesses in their own ``AIRFLOW_HOME``, with no
``AIRFLOW*`` or ``NEXUS_*`` variable of this session's, so only what a test sets is set.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from nexus_cutover import settings
from nexus_cutover.settings import SETTINGS, BadSetting, Setting

REPO = Path(__file__).resolve().parents[1]
AIRFLOW = str(Path(sys.executable).parent / "airflow")
SECRET = "pw-not-to-be-seen-9731"
TENANT_DSN = f"mysql+pymysql://cutover:{SECRET}@db.example:3306/tenant_acme"


def clean_env(home: Path, **more: str) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith(("AIRFLOW", "NEXUS_"))}
    return {**env, "AIRFLOW_HOME": str(home), "AIRFLOW__CORE__LOAD_EXAMPLES": "False", **more}


def airflow(home: Path, *args: str, **env: str) -> subprocess.CompletedProcess:
    return subprocess.run([AIRFLOW, *args], capture_output=True, text=True, timeout=180, cwd=home,
                          env=clean_env(home, **env))


def read_in_process(home: Path, code: str, **env: str) -> dict:
    done = subprocess.run([sys.executable, "-c", textwrap.dedent(code)], capture_output=True, text=True,
                          timeout=180, cwd=home, env=clean_env(home, **env), check=True)
    return json.loads(done.stdout.strip().splitlines()[-1])


# -- the declaration and the reader ------------------------------------------------------------------------------

def test_every_setting_is_declared_whole():
    for s in SETTINGS:
        assert s.name == s.name.lower() and s.alias == "NEXUS_" + s.name.upper(), s
        assert s.type in settings.TYPES and s.description.endswith("."), s
        kind = {"string": str, "integer": int, "float": float, "boolean": bool}[s.type]
        assert s.default is None or type(s.default) is kind, s  # noqa: E721 - a bool is no integer here
        assert not (s.secret and s.default is not None), f"{s.name}: a secret has no default"
    assert len(settings.BY_NAME) == len(SETTINGS)
    # the URLs may hold a token or credentials
    assert {s.name for s in SETTINGS if s.secret} == {"tenant_dsn", "ledger_dsn", "notify_webhook", "writers_stop_url"}


def test_the_airflow_variable_then_the_alias_then_airflow_config_then_the_default(monkeypatch):
    asked = []

    def config(key):
        asked.append(key)
        return {"statsd_prefix": "from-cfg", "status_readers": " "}.get(key)

    monkeypatch.setattr(settings, "_source", config)
    env = {"AIRFLOW__NEXUS__HOST_POLL_S": "0.25", "NEXUS_HOST_POLL_S": "9", "NEXUS_HOST_HEARTBEAT_S": "2",
           "NEXUS_STATSD": "  ", "NEXUS_STATSD_PREFIX": ""}
    assert settings.value("host_poll_s", env) == 0.25
    assert settings.raw("host_poll_s", env) == ("0.25", "AIRFLOW__NEXUS__HOST_POLL_S")
    assert settings.value("host_heartbeat_s", env) == 2.0
    assert settings.value("statsd_prefix", env) == "from-cfg"  # an empty alias is unset
    assert settings.value("statsd", env) is None and settings.value("status_readers", env) == 4
    assert "host_poll_s" not in asked  # a variable answered
    monkeypatch.setattr(settings, "_source", None)
    assert settings.value("statsd_prefix", env) == "airflow"


@pytest.mark.parametrize(("text", "expected"), [("1", True), ("True", True), ("on", True), ("0", False),
                                                ("false", False), ("NO", False)])
def test_a_boolean_reads_as_airflow_and_the_old_switches_read_it(text, expected):
    assert settings.value("fused_tasks", {"NEXUS_FUSED_TASKS": text}) is expected


def test_a_bad_value_names_the_setting_and_where_it_came_from_never_a_secret():
    with pytest.raises(BadSetting, match=r"nexus\.status_readers \(AIRFLOW__NEXUS__STATUS_READERS\) = 'four' is "
                                         r"not a whole number; unset it for the default 4"):
        settings.value("status_readers", {"AIRFLOW__NEXUS__STATUS_READERS": "four"})
    with pytest.raises(ValueError, match="NEXUS_FUSED_TASKS"):  # a ValueError too: callers that caught one still do
        settings.value("fused_tasks", {"NEXUS_FUSED_TASKS": "maybe"})
    secret = Setting("pin", "integer", None, "A secret number.", secret=True)
    with pytest.raises(BadSetting) as raised:
        settings.convert(secret, SECRET, "NEXUS_PIN")
    assert SECRET not in str(raised.value) and "hidden" in str(raised.value)


def test_secret_values_and_a_new_hosts_aliases():
    env = {"AIRFLOW__NEXUS__TENANT_DSN": TENANT_DSN, "NEXUS_TENANT_DSN": "sqlite:///old", "NEXUS_LEDGER_DSN": "x",
           "AIRFLOW__NEXUS__HOST_POLL_S": "0.1", "NEXUS_HOST_POLL_S": "7"}
    assert set(settings.secret_values(env)) == {TENANT_DSN, "sqlite:///old", "x"}
    assert settings.host_aliases(env) == {"NEXUS_HOST_POLL_S": "0.1"}  # the tenant DSN is passed by its starter
    from nexus_cutover.dsn import host_environment

    host = host_environment(env, "sqlite:///given")
    assert host["NEXUS_TENANT_DSN"] == "sqlite:///given" and host["NEXUS_HOST_POLL_S"] == "0.1"
    assert not [k for k in host if k.startswith("AIRFLOW")]


def test_the_provider_config_is_airflows_schema():
    import airflow
    import jsonschema

    from nexus_airflow.provider import get_provider_info

    schema = json.loads((Path(airflow.__file__).parent / "provider_info.schema.json").read_text())
    info = get_provider_info()
    jsonschema.validate(info, schema)
    options = info["config"]["nexus"]["options"]
    assert list(options) == [s.name for s in SETTINGS]
    assert {name for name, o in options.items() if o.get("sensitive")} == {
        "tenant_dsn", "ledger_dsn", "notify_webhook", "writers_stop_url"}
    assert options["trigger_quiet_log_s"]["default"] == "300.0" and options["fused_tasks"]["default"] == "True"
    assert options["statsd"]["default"] is None and options["statsd"]["example"] == "localhost:8125"


# -- the real Airflow --------------------------------------------------------------------------------------------

def test_airflow_config_lists_every_setting_hides_the_secrets_and_lints_clean(tmp_path):
    listed = airflow(tmp_path, "config", "list", "--section", "nexus", "--include-descriptions",
                     AIRFLOW__NEXUS__TENANT_DSN=TENANT_DSN)
    assert listed.returncode == 0, listed.stderr
    for s in SETTINGS:
        assert f"{s.name} = " in listed.stdout and s.alias in listed.stdout, s.name  # the description names the alias
    shown = airflow(tmp_path, "config", "list", "--section", "nexus", "--show-values", "--hide-sensitive",
                    AIRFLOW__NEXUS__TENANT_DSN=TENANT_DSN, AIRFLOW__NEXUS__STATUS_READERS="6")
    assert shown.returncode == 0, shown.stderr
    assert "status_readers = 6" in shown.stdout and "tenant_dsn = < hidden >" in shown.stdout
    assert SECRET not in listed.stdout + listed.stderr + shown.stdout + shown.stderr
    lint = airflow(tmp_path, "config", "lint", AIRFLOW__NEXUS__FUSED_TASKS="0")
    assert lint.returncode == 0 and "No issues found" in lint.stdout, lint.stdout + lint.stderr


def test_airflow_config_get_value_honours_the_airflow_variable_and_the_default(tmp_path):
    got = airflow(tmp_path, "config", "get-value", "nexus", "trigger_quiet_log_s",
                  AIRFLOW__NEXUS__TRIGGER_QUIET_LOG_S="42")
    assert (got.returncode, got.stdout.strip()) == (0, "42"), got.stderr
    default = airflow(tmp_path, "config", "get-value", "nexus", "statsd_prefix")
    assert (default.returncode, default.stdout.strip()) == (0, "airflow"), default.stderr


READ = """
    import json
    import nexus_airflow  # the plugin package: installs Airflow's configuration as a source
    from nexus_airflow.triggers import quiet_log_s
    from nexus_airflow.sensors import waits_end_in_triggerer
    from nexus_cutover import holders, settings
    print(json.dumps({"quiet": quiet_log_s(), "end_in_triggerer": waits_end_in_triggerer(),
                      "prefix": settings.value("statsd_prefix"), "link": holders.airflow_run_link("d", "r"),
                      "readers": settings.value("status_readers")}))
"""


def test_a_setting_reaches_the_product_from_the_airflow_variable_airflow_cfg_and_the_alias(tmp_path):
    (tmp_path / "airflow.cfg").write_text("[nexus]\nairflow_url = https://cfg.example/\nstatsd_prefix = cfg\n"
                                          "status_readers = 3\n")
    got = read_in_process(tmp_path, READ, AIRFLOW__NEXUS__TRIGGER_QUIET_LOG_S="7",
                          AIRFLOW__NEXUS__WAITS_END_IN_TRIGGERER="True", NEXUS_STATSD_PREFIX="alias")
    assert got == {"quiet": 7.0, "end_in_triggerer": True, "prefix": "alias",  # a variable beats airflow.cfg
                   "link": "https://cfg.example/dags/d/runs/r", "readers": 3}
    other = tmp_path / "no-cfg"
    other.mkdir()
    old = read_in_process(other, READ, NEXUS_TRIGGER_QUIET_LOG_S="0", NEXUS_WAITS_END_IN_TRIGGERER="1",
                          NEXUS_AIRFLOW_URL="https://alias.example")
    assert old == {"quiet": 0.0, "end_in_triggerer": True, "prefix": "airflow",  # only the aliases: as before
                   "link": "https://alias.example/dags/d/runs/r", "readers": 4}


def test_the_command_line_reads_the_airflow_variable_and_never_prints_the_secret(tmp_path):
    """Without Airflow's plugin (the command line) ``AIRFLOW__NEXUS__TENANT_DSN`` still gives the tenant; an error
    that carries the DSN is printed masked."""
    env = clean_env(tmp_path, AIRFLOW__NEXUS__TENANT_DSN=TENANT_DSN.replace("db.example", "127.0.0.1").replace(
        "3306", "9"))
    done = subprocess.run([sys.executable, "-m", "nexus_cutover.cli.cutover_steps", "status", "-namespace", "demo",
                           "-timeout", "2"], capture_output=True, text=True, timeout=120, cwd=tmp_path, env=env)
    assert done.returncode != 0 and "no tenant database given" not in done.stderr, done.stderr
    assert SECRET not in done.stdout + done.stderr


# -- the README ----------------------------------------------------------------------------------------------------

def test_the_readme_lists_every_setting_as_declared():
    readme = (REPO / "README.md").read_text(encoding="utf-8")
    assert settings.readme_table() in readme, (
        "README.md's Settings table differs from nexus_cutover.settings.SETTINGS: paste the output of "
        "python -c 'from nexus_cutover import settings; print(settings.readme_table(), end=\"\")' in its place")

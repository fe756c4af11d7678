"""The deployment recipe (deploy/Dockerfile, deploy/helm-values.yaml, deploy/helm-values-reference.yaml) and the tested
stack say what deploy/airflow-settings.toml says: the files are parsed (no Docker, no Helm), and a mutated copy of each
shows the check fails, naming the file, the setting and both values. The values' airflow.cfg passes Airflow's own
``airflow config lint``.

Not done here: validating the values against the chart's values.schema.json. The chart is not on PyPI, npm or Debian
(the only package indexes this CI reaches), so there is no schema to validate against without vendoring the chart."""

from __future__ import annotations

import os
import pathlib
import subprocess
import sys

import pytest

from scripts import deploy_settings
from scripts.deploy_settings import (
    CONSTRAINTS,
    DEV_LOCK,
    DOCKERFILE,
    HELM_REFERENCE,
    HELM_VALUES,
    RUNBOOK,
    SETTINGS_FILE,
    STATSD_MAPPING,
    environment_disagreements,
    load,
    recipe_disagreements,
)

METADATA_URL = "postgresql+psycopg2://airflow:pw-not-used@127.0.0.1:9/airflow"
BROKER_URL = "redis://:pw-not-used@127.0.0.1:9/0"


def test_the_recipe_agrees_with_the_settings_file():
    assert recipe_disagreements() == []


def test_the_check_reads_every_row_of_the_runbooks_settings_table():
    """The runbook's table quotes each of these settings (a row renamed out of the check's sight would hide a drift)."""
    rows = {(m["section"], m["key"]) for m in deploy_settings._RUNBOOK_ROW.finditer(RUNBOOK.read_text(encoding="utf-8"))}
    assert {("core", "parallelism"), ("celery", "worker_concurrency"), ("triggerer", "capacity"),
            ("scheduler", "scheduler_idle_sleep_time"), ("workers", "min_heartbeat_interval")} <= rows


def _stack_environment(tmp_path: pathlib.Path) -> tuple[dict[str, str], dict[str, list[str]]]:
    """What the stack gives its processes: the environment and each component's command line (nothing started)."""
    from scripts.stack_topology import COMPONENTS, ProductionStack

    stack = ProductionStack(tmp_path / "stack", port=1)
    env = stack.environment(METADATA_URL, BROKER_URL)
    return env, {name: stack._component_args(name)[0] for name in COMPONENTS}


def test_the_stack_runs_with_the_settings_file(tmp_path, monkeypatch):
    """The stack reads the file: every Airflow setting and product switch of it is in every process's environment,
    a caller's own Airflow configuration does not change them, and the workers' and triggerers' command lines and
    counts are the file's."""
    from scripts.stack_topology import DEPLOY_SETTINGS

    monkeypatch.setenv("AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL", "5")  # a caller's own Airflow setting: not leaked
    settings = load()
    assert settings == DEPLOY_SETTINGS
    env, argv = _stack_environment(tmp_path)
    assert environment_disagreements(env, settings, "the stack") == []
    workers = [a for name, a in argv.items() if name.startswith("worker-")]
    triggerers = [a for name, a in argv.items() if name.startswith("triggerer-")]
    assert len(workers) == settings["topology"]["workers"] and len(triggerers) == settings["topology"]["triggerers"]
    for args in workers:
        assert args[args.index("--concurrency") + 1] == str(settings["config"]["celery"]["worker_concurrency"])
    for args in triggerers:
        assert args[args.index("--capacity") + 1] == str(settings["config"]["triggerer"]["capacity"])
    assert env["AIRFLOW__CORE__EXECUTOR"] == settings["airflow"]["executor"]


def test_a_stack_environment_that_differs_from_the_settings_is_named(tmp_path):
    """The stack's check fails on a mutated copy of the settings (and on a process given another value)."""
    env, _ = _stack_environment(tmp_path)
    mutated = load()
    mutated["config"]["workers"]["min_heartbeat_interval"] = 5
    assert environment_disagreements(env, mutated, "the stack") == [
        "the stack: AIRFLOW__WORKERS__MIN_HEARTBEAT_INTERVAL='1', deploy/airflow-settings.toml says '5'"]
    changed = {**env, "NEXUS_FUSED_TASKS": "0"}
    assert environment_disagreements(changed, load(), "worker-1") == [
        "worker-1: NEXUS_FUSED_TASKS='0', deploy/airflow-settings.toml says '1'"]


#: (the file, the text replaced, its replacement, the disagreements expected: each line's start)
MUTATIONS = {
    "reference: parallelism": (HELM_REFERENCE, 'parallelism: "4"', 'parallelism: "8"',
                               ["deploy/helm-values-reference.yaml: config.core.parallelism is '8', "
                                "deploy/airflow-settings.toml says '4'"]),
    "reference: min_heartbeat_interval": (HELM_REFERENCE, 'min_heartbeat_interval: "1"', 'min_heartbeat_interval: "5"',
                                          ["deploy/helm-values-reference.yaml: config.workers.min_heartbeat_interval is '5'"]),
    "reference: scheduler_idle_sleep_time left out": (HELM_REFERENCE, '    scheduler_idle_sleep_time: "0.25"\n', "",
                                                      ["deploy/helm-values-reference.yaml: "
                                                       "config.scheduler.scheduler_idle_sleep_time is None"]),
    "reference: one triggerer": (HELM_REFERENCE, "  enabled: true\n  replicas: 2\n\n# Two Celery",
                                 "  enabled: true\n  replicas: 1\n\n# Two Celery",
                                 ["deploy/helm-values-reference.yaml: triggerer.replicas is 1, deploy/airflow-settings.toml says 2"]),
    "reference: pre-Airflow-3 capacity": (HELM_REFERENCE, '    capacity: "2000"', '    default_capacity: "2000"',
                                          ["deploy/helm-values-reference.yaml: config.triggerer.capacity is None",
                                           "deploy/helm-values-reference.yaml: config.triggerer.default_capacity is the option's "
                                           "name before Airflow 3: [triggerer] capacity"]),
    "reference: the deprecated workers.replicas": (HELM_REFERENCE, "workers:\n  celery:\n    replicas: 2\n", "workers:\n  replicas: 2\n",
                                                   ["deploy/helm-values-reference.yaml: workers.replicas is the chart's deprecated name",
                                                    "deploy/helm-values-reference.yaml: workers.celery.replicas is None"]),
    "reference: the chart's FAB auth manager": (
        HELM_REFERENCE, "    auth_manager: airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager\n", "",
        ["deploy/helm-values-reference.yaml: config.core.auth_manager is airflow.providers.fab.auth_manager.fab_auth_manager."
         "FabAuthManager (the chart's default): apache-airflow-providers-fab is not installed by deploy/Dockerfile"]),
    "reference: FAB named": (HELM_REFERENCE, "airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",
                             "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager",
                             ["deploy/helm-values-reference.yaml: config.core.auth_manager is airflow.providers.fab.auth_manager."
                              "fab_auth_manager.FabAuthManager: apache-airflow-providers-fab is not installed"]),
    "reference: the user job left on": (HELM_REFERENCE, "createUserJob:\n  enabled: false\n", "",
                                        ["deploy/helm-values-reference.yaml: createUserJob.enabled is not false"]),
    "helm: a cluster setting in the required values": (HELM_VALUES, 'airflowVersion: "3.3.2"\n',
                                                       'airflowVersion: "3.3.2"\nexecutor: CeleryExecutor\n',
                                                       ["deploy/helm-values.yaml: executor: a cluster's setting"]),
    "helm: a recommended airflow.cfg section in the required values": (
        HELM_VALUES, "config:\n  metrics:\n", 'config:\n  core:\n    parallelism: "4"\n  metrics:\n',
        ["deploy/helm-values.yaml: config.core: a cluster's setting"]),
    "helm: the ledger connection left out": (HELM_VALUES, "  - envName: AIRFLOW_CONN_NEXUS_LEDGER\n", "  - envName: AIRFLOW_CONN_LEDGER\n",
                                             ["deploy/helm-values.yaml: secret has no entry envName AIRFLOW_CONN_NEXUS_LEDGER"]),
    "helm: no image": (HELM_VALUES, "    repository: registry.example.com/nexus-airflow\n", "",
                       ["deploy/helm-values.yaml: images.airflow names no repository and tag"]),
    "helm: fused tasks off": (HELM_VALUES, '- name: NEXUS_FUSED_TASKS\n    value: "1"', '- name: NEXUS_FUSED_TASKS\n    value: "0"',
                              ["deploy/helm-values.yaml: env NEXUS_FUSED_TASKS is '0', deploy/airflow-settings.toml says '1'"]),
    "helm: metrics off": (HELM_VALUES, 'statsd_on: "True"', 'statsd_on: "False"',
                          ["deploy/helm-values.yaml: config.metrics.statsd_on is 'False'"]),
    "helm: local settings not imported": (HELM_VALUES, "  from nexus_cutover_airflow.airflow_local_settings import *",
                                          "  from my_settings import *",
                                          ["deploy/helm-values.yaml: airflowLocalSettings does not star-import"]),
    "helm: pool slots": (HELM_VALUES, '{"tidb_reads": {"slots": 2,', '{"tidb_reads": {"slots": 3,',
                         ["deploy/helm-values.yaml: the pools.json of extraConfigMaps is"]),
    "helm: statsd prefix": (HELM_VALUES, 'match: "airflow.nexus.lock.wait.*"', 'match: "af.nexus.lock.wait.*"',
                            ["deploy/helm-values.yaml: the StatsD mapping 'af.nexus.lock.wait.*' does not start with",
                             "deploy/helm-values.yaml: statsd.extraMappings entry 'af.nexus.lock.wait.*' is not in "
                             "deploy/statsd/nexus-mapping.yml",
                             "deploy/helm-values.yaml: statsd.extraMappings has no entry 'airflow.nexus.lock.wait.*' of"]),
    "helm: a mapping's name differs": (HELM_VALUES, "      name: nexus_lock_wait_seconds\n", "      name: nexus_lock_wait\n",
                                       ["deploy/helm-values.yaml: statsd.extraMappings entry 'airflow.nexus.lock.wait.*' is"]),
    "helm: a mapping left out": (HELM_VALUES, '''    - match: "airflow.nexus.ledger.pending.*"\n      name: nexus_ledger_pending\n'''
                                 '''      ttl: 24h\n      labels:\n        host: "$1"\n''', "",
                                 ["deploy/helm-values.yaml: statsd.extraMappings has no entry 'airflow.nexus.ledger.pending.*' "
                                  "of deploy/statsd/nexus-mapping.yml"]),
    "mapping: a new entry the values lack": (STATSD_MAPPING, "mappings:\n",
                                             'mappings:\n  - match: "airflow.nexus.new.*"\n    name: nexus_new\n',
                                             ["deploy/helm-values.yaml: statsd.extraMappings has no entry 'airflow.nexus.new.*' of "]),
    "mapping: a default ttl the chart cannot carry": (STATSD_MAPPING, "mappings:\n", "defaults:\n  ttl: 24h\nmappings:\n",
                                                      ["deploy/helm-values.yaml: statsd.extraMappings cannot carry the "
                                                       "top-level defaults {'ttl': '24h'} of "]),
    "mapping: a ttl the values lack": (STATSD_MAPPING, '    name: nexus_lock_wait_seconds\n    ttl: 24h\n',
                                       '    name: nexus_lock_wait_seconds\n    ttl: 48h\n',
                                       ["deploy/helm-values.yaml: statsd.extraMappings entry 'airflow.nexus.lock.wait.*' is"]),
    "mapping: a label renamed": (STATSD_MAPPING, '      reason: "$3"', '      why: "$3"',
                                 ["deploy/helm-values.yaml: statsd.extraMappings entry 'airflow.nexus.step.failed.*.*.*' is"]),
    "dockerfile: another Airflow": (DOCKERFILE, "FROM apache/airflow:3.3.2-python3.11",
                                    "FROM apache/airflow:3.3.1-python3.11",
                                    ["deploy/Dockerfile: FROM apache/airflow:3.3.1-python3.11 is Airflow 3.3.1"]),
    "dockerfile: another Python": (DOCKERFILE, "-python3.11", "-python3.12",
                                   ["deploy/Dockerfile: FROM apache/airflow:3.3.2-python3.12 is Python 3.12"]),
    "dockerfile: no constraints": (DOCKERFILE, "pip install --no-cache-dir -c /opt/nexus/constraints.txt",
                                   "pip install --no-cache-dir",
                                   ["deploy/Dockerfile: the pip install does not use the repository's constraints.txt"]),
    "dockerfile: Airflow not kept": (DOCKERFILE, '"apache-airflow==${AIRFLOW_VERSION}" \\\n', "",
                                     ["deploy/Dockerfile: the pip install does not keep the image's Airflow"]),
    "dockerfile: an extra pyproject lacks": (DOCKERFILE, "[airflow,stack]", "[airflow,celery]",
                                             ["deploy/Dockerfile: the wheel is installed with the extras"]),
    "dockerfile: no MySQL headers to build mysqlclient": (DOCKERFILE, " default-libmysqlclient-dev", "",
                                                          ["deploy/Dockerfile: mysqlclient has no Linux wheel on PyPI and pip may "
                                                           "build it: the image needs default-libmysqlclient-dev"]),
    "dockerfile: pip as root": (DOCKERFILE, "USER airflow\n", "",
                                ["deploy/Dockerfile: the pip install runs as root"]),
    "dockerfile: no DAG loader": (DOCKERFILE, "RUN python -m nexus_cutover_airflow.dags_loader /opt/airflow/dags\n", "",
                                  ["deploy/Dockerfile: no RUN python -m nexus_cutover_airflow.dags_loader"]),
    "settings: triggerer capacity": (SETTINGS_FILE, "capacity = 2000", "capacity = 1000",
                                     ["deploy/helm-values-reference.yaml: config.triggerer.capacity is '2000', "
                                      "deploy/airflow-settings.toml says '1000'",
                                      "docs/runbook.md: the row `[triggerer] capacity` says 2,000"]),
    "settings: three workers": (SETTINGS_FILE, "workers = 2", "workers = 3",
                                ["deploy/airflow-settings.toml: [config.core] parallelism is 4 but the task slots are 6",
                                 "deploy/helm-values-reference.yaml: workers.celery.replicas is 2, deploy/airflow-settings.toml says 3"]),
    "settings: one triggerer": (SETTINGS_FILE, "triggerers = 2", "triggerers = 1",
                                ["deploy/airflow-settings.toml: [topology] triggerers is 1: at least 2",
                                 "deploy/helm-values-reference.yaml: triggerer.replicas is 2, deploy/airflow-settings.toml says 1"]),
    "settings: another connection": (SETTINGS_FILE, "[connections]\n", '[connections]\nnexus_audit = "another one"\n',
                                     ["deploy/helm-values.yaml: secret has no entry envName AIRFLOW_CONN_NEXUS_AUDIT"]),
    "dev lock: another Airflow": (DEV_LOCK, "\napache-airflow==3.3.2\n", "\napache-airflow==3.3.3\n",
                                  ["constraints-dev.txt: apache-airflow==3.3.3, deploy/airflow-settings.toml says 3.3.2"]),
    "release: made against another Airflow": (CONSTRAINTS, "apache-airflow==3.3.2 on Python", "apache-airflow==3.3.1 on Python",
                                              ["constraints.txt: made against apache-airflow==3.3.1 on Python 3.11, "
                                               "deploy/airflow-settings.toml says apache-airflow==3.3.2"]),
    "release: pins Airflow": (CONSTRAINTS, "\ncelery==", "\napache-airflow==3.3.2\ncelery==",
                              ["constraints.txt: pins apache-airflow"]),
    "settings: armed slots without the armed pool": (SETTINGS_FILE, 'NEXUS_TRIGGER_QUIET_LOG_S = "300"\n',
                                                     'NEXUS_TRIGGER_QUIET_LOG_S = "300"\nNEXUS_ARMED_SLOTS = "2"\n',
                                                     ["deploy/airflow-settings.toml: [env] NEXUS_ARMED_SLOTS is 2 but the "
                                                      "pool nexus_armed has no such pool",
                                                      "deploy/helm-values.yaml: env NEXUS_ARMED_SLOTS"]),
    "settings: armed slots beyond the task slots": (
        SETTINGS_FILE, 'NEXUS_TRIGGER_QUIET_LOG_S = "300"\n',
        'NEXUS_TRIGGER_QUIET_LOG_S = "300"\nNEXUS_ARMED_SLOTS = "5"\n\n[pools.nexus_armed]\nslots = 5\n'
        'description = "armed"\n',
        ["deploy/airflow-settings.toml: [env] NEXUS_ARMED_SLOTS is 5, more than the 4 task slots",
         "deploy/helm-values.yaml: env NEXUS_ARMED_SLOTS", "deploy/helm-values.yaml: the pools.json of extraConfigMaps"]),
    "runbook: another parallelism": (RUNBOOK, "| `[core] parallelism` | 4 |", "| `[core] parallelism` | 8 |",
                                     ["docs/runbook.md: the row `[core] parallelism` says 8"]),
}


@pytest.mark.parametrize("mutation", list(MUTATIONS))
def test_a_mutated_copy_of_the_recipe_fails_the_check_naming_the_setting(tmp_path, mutation):
    path, old, new, expected = MUTATIONS[mutation]
    text = path.read_text(encoding="utf-8")
    assert text.count(old) == 1, f"the mutation's text is not once in {path}: {old!r}"
    copy = tmp_path / path.name
    copy.write_text(text.replace(old, new), encoding="utf-8")
    argument = {SETTINGS_FILE: "settings_file", DOCKERFILE: "dockerfile", HELM_VALUES: "helm_values",
                HELM_REFERENCE: "helm_reference", CONSTRAINTS: "constraints", DEV_LOCK: "dev_lock", RUNBOOK: "runbook",
                STATSD_MAPPING: "statsd_mapping"}[path]
    found = recipe_disagreements(**{argument: copy})
    if path in (DOCKERFILE, HELM_VALUES, HELM_REFERENCE):  # a recipe file outside deploy/ is named by its path
        expected = [line.replace(f"deploy/{path.name}:", f"{copy}:", 1) for line in expected]
    assert len(found) == len(expected), found
    for line, start in zip(sorted(found), sorted(expected), strict=True):
        assert line.startswith(start), (line, start)


def test_the_check_command_checks_a_teams_own_values_files(tmp_path, capsys):
    """``python scripts/deploy_settings.py check --helm-values <file> --helm-reference <file>``: exit 0 when they agree,
    1 naming each disagreement when they do not."""
    assert deploy_settings.main(["check"]) == 0
    own = tmp_path / "my-cluster-values.yaml"
    own.write_text(HELM_REFERENCE.read_text(encoding="utf-8").replace('refresh_interval: "30"', 'refresh_interval: "300"'))
    assert deploy_settings.main(["check", "--helm-reference", str(own)]) == 1
    assert f"{own}: config.dag_processor.refresh_interval is '300', deploy/airflow-settings.toml says '30'" \
        in capsys.readouterr().err


def test_the_required_values_hold_only_what_the_product_needs():
    """deploy/helm-values.yaml: the image, the product's switches, local settings, metrics, mappings, pools and
    connections, and nothing that sizes or shapes the cluster; the recommendations are all in the reference."""
    import yaml

    required = yaml.safe_load(HELM_VALUES.read_text(encoding="utf-8"))
    assert set(required) == {"airflowVersion", "images", "env", "secret", "airflowLocalSettings", "config", "statsd",
                             "extraConfigMaps", "volumes", "volumeMounts", "migrateDatabaseJob"}, sorted(required)
    assert set(required["config"]) == set(deploy_settings.REQUIRED_CONFIG)
    reference = yaml.safe_load(HELM_REFERENCE.read_text(encoding="utf-8"))
    assert {"executor", "triggerer", "workers", "config"} <= set(reference)
    assert set(reference["config"]) == set(load()["config"]) - set(deploy_settings.REQUIRED_CONFIG) | {"core"}


def test_the_connections_the_values_give_are_the_ones_the_product_reads():
    from nexus_airflow.ledger import LEDGER_CONN_ID

    assert set(load()["connections"]) == {LEDGER_CONN_ID}


def test_the_auth_manager_the_values_name_is_installed_where_the_image_gets_its_packages():
    """The reference's auth manager imports in the dev venv, which has what the image has of ours (Airflow and the
    product's extras: no apache-airflow-providers-fab), and the image installs no auth manager provider."""
    import importlib

    import yaml

    name = yaml.safe_load(HELM_REFERENCE.read_text(encoding="utf-8"))["config"]["core"]["auth_manager"]
    module, _, cls = name.rpartition(".")
    assert getattr(importlib.import_module(module), cls).__name__ == cls
    assert name in deploy_settings.CORE_AUTH_MANAGERS


def _lint(cfg: str, home: pathlib.Path) -> str:
    """``airflow config lint`` (the venv's Airflow) on ``cfg`` as the only configuration (no AIRFLOW_* of ours)."""
    (home / "airflow.cfg").write_text(cfg, encoding="utf-8")
    env = {k: v for k, v in os.environ.items() if not k.startswith("AIRFLOW") and k != "PYTHONPATH"}
    env.update(AIRFLOW_HOME=str(home), AIRFLOW_CONFIG=str(home / "airflow.cfg"))
    done = subprocess.run([str(pathlib.Path(sys.executable).parent / "airflow"), "config", "lint"], cwd=home, env=env,
                          capture_output=True, text=True, timeout=180)
    assert done.returncode == 0, done.stdout + done.stderr
    return done.stdout


def test_the_values_airflow_cfg_passes_airflow_config_lint(tmp_path):
    """The airflow.cfg the chart renders from both values files' ``config:`` has nothing Airflow 3.3 renamed or
    removed; a pre-Airflow-3 name in a copy is what the lint (and the check) names."""
    rendered = deploy_settings.airflow_cfg(HELM_VALUES, HELM_REFERENCE)
    assert "[triggerer]\ncapacity = 2000" in rendered and "[metrics]\nstatsd_on = True" in rendered
    out = _lint(rendered, tmp_path)
    assert "No issues found" in out, out
    old = tmp_path / "old-reference.yaml"
    old.write_text(HELM_REFERENCE.read_text(encoding="utf-8").replace('    capacity: "2000"', '    default_capacity: "2000"'))
    out = _lint(deploy_settings.airflow_cfg(HELM_VALUES, old), tmp_path)
    assert "`default_capacity` configuration parameter renamed to `capacity` in the `triggerer` section" in out, out

"""``deploy/airflow-settings.toml``, the one source of truth of the Airflow settings nexus-cutover relies on, and the
check that the deployment recipe beside it says the same.

* :func:`load` reads the file (``tomllib``: no dependency). The production stack (``scripts/stack_topology.py``)
  takes its Airflow configuration (:func:`config_env`), the product's switches (:func:`product_env`), its number of
  triggerers and workers and its pools from it: what the stack tests is what the recipe ships.
* :func:`recipe_disagreements` reads the recipe as a platform team uses it -- ``deploy/Dockerfile`` (the base image,
  the build dependencies, the install line, the local settings, the DAG loader), the official Helm chart's values
  split in two: ``deploy/helm-values.yaml`` (only what the product needs on any cluster, a shared one included: its
  image, switches, local settings, metrics and their StatsD mappings, pools and connections) and
  ``deploy/helm-values-reference.yaml`` (what it recommends for the cluster: executor, replicas, every other
  ``airflow.cfg`` setting, the auth manager) -- and the files they lean on (the release's ``constraints.txt`` and the
  dev lock ``constraints-dev.txt``, ``pyproject.toml``'s extras, the runbook's settings table, the StatsD exporter's
  mapping ``deploy/statsd/nexus-mapping.yml``, whose entries the values' ``statsd.extraMappings`` carry), and returns
  one line per disagreement with the settings file; :func:`environment_disagreements` does the same for an
  environment the stack built. Nothing here runs Docker or Helm: the files are parsed.
* ``python scripts/deploy_settings.py check [--helm-values FILE] [--helm-reference FILE] [--dockerfile FILE]`` prints
  the disagreements (exit 1 when there are any; a team checks its own copy of a values file the same way); ``env``
  prints the settings as ``AIRFLOW__SECTION__KEY=value`` lines, for a deployment that configures Airflow by
  environment; ``airflow-cfg`` prints the two values files' ``config:`` as the airflow.cfg the chart renders (what
  ``airflow config lint`` reads: tests/deploy/test_recipe.py).

Invariant: a value is compared as Airflow reads it (:func:`ini_value`: ``True``/``False``, ``4``, ``0.25``), so
``'4'`` in YAML and ``4`` in TOML agree.
"""

from __future__ import annotations

import ast
import json
import pathlib
import re
import shlex
import sys
import tomllib
from typing import Any

from nexus_airflow.armed_slots import ARMED_POOL  # the pool nexus_airflow.policies puts a pause's tasks in
from nexus_cutover.settings import BY_NAME as PRODUCT_SETTINGS

REPO = pathlib.Path(__file__).resolve().parents[1]
SETTINGS_FILE = REPO / "deploy" / "airflow-settings.toml"
DOCKERFILE = REPO / "deploy" / "Dockerfile"
HELM_VALUES = REPO / "deploy" / "helm-values.yaml"
HELM_REFERENCE = REPO / "deploy" / "helm-values-reference.yaml"
STATSD_MAPPING = REPO / "deploy" / "statsd" / "nexus-mapping.yml"
CONSTRAINTS = REPO / "constraints.txt"  # the release's: only what the product adds on top of Airflow
DEV_LOCK = REPO / "constraints-dev.txt"  # every version `make test` passed with
PYPROJECT = REPO / "pyproject.toml"
RUNBOOK = REPO / "docs" / "runbook.md"

#: The Celery executors: the only ones whose task slots are workers x [celery] worker_concurrency.
CELERY_EXECUTORS = ("CeleryExecutor", "CeleryKubernetesExecutor")
#: The ``[config.<section>]`` tables of the settings the product needs on any cluster (deploy/helm-values.yaml); every
#: other section is a recommendation for the cluster (deploy/helm-values-reference.yaml).
REQUIRED_CONFIG = ("metrics",)
#: The chart's values that shape or size the cluster: recommendations, never in deploy/helm-values.yaml.
CLUSTER_VALUES = ("executor", "scheduler", "dagProcessor", "triggerer", "workers", "apiServer", "webserver",
                  "createUserJob")
#: The distributions the product's extras install that PyPI has no Linux wheel of (pip builds them), with the Debian
#: packages the build needs: deploy/Dockerfile installs them as root before its pip install. tests/deploy/test_image.py
#: asks the index for a wheel of every other distribution the image may install.
BUILD_DEPS = {"mysqlclient": ("build-essential", "pkg-config", "default-libmysqlclient-dev")}
#: The chart's own ``config.core.auth_manager`` (its values.yaml), used when no values file names one.
CHART_AUTH_MANAGER = "airflow.providers.fab.auth_manager.fab_auth_manager.FabAuthManager"
#: The auth managers Airflow core ships (every image has them).
CORE_AUTH_MANAGERS = ("airflow.api_fastapi.auth.managers.simple.simple_auth_manager.SimpleAuthManager",)
#: ``airflow.cfg`` options renamed since Airflow 2 that a values file may still carry (``airflow config lint`` knows
#: them all; tests/deploy runs it).
RENAMED = {("triggerer", "default_capacity"): "[triggerer] capacity"}


def load(path: pathlib.Path = SETTINGS_FILE) -> dict[str, Any]:
    """The settings file, checked for the sections every reader relies on (ValueError naming what is missing)."""
    with open(path, "rb") as f:
        settings = tomllib.load(f)
    for section, keys in {"airflow": ("version", "python", "executor", "local_settings_module"),
                          "topology": ("triggerers", "workers"), "config": (), "env": (), "pools": (),
                          "connections": ()}.items():
        if not isinstance(settings.get(section), dict):
            raise ValueError(f"{path}: no [{section}] table")
        missing = [k for k in keys if k not in settings[section]]
        if missing:
            raise ValueError(f"{path}: [{section}] has no {', '.join(missing)}")
    return settings


def ini_value(value: Any) -> str:
    """``value`` as airflow.cfg (or an ``AIRFLOW__*`` variable) holds it: ``True``/``False`` for booleans, else its text."""
    if isinstance(value, bool):
        return "True" if value else "False"
    if isinstance(value, str) and value.strip().lower() in ("true", "false"):
        return value.strip().capitalize()
    return str(value)


def config_items(settings: dict[str, Any]) -> list[tuple[str, str, str]]:
    """``(section, key, value as Airflow reads it)`` for every ``[config.<section>] <key>`` of the settings."""
    return [(section, key, ini_value(value))
            for section, keys in settings["config"].items() for key, value in keys.items()]


def config_env(settings: dict[str, Any]) -> dict[str, str]:
    """The Airflow configuration of the settings as environment variables (``AIRFLOW__CORE__PARALLELISM=4``)."""
    return {f"AIRFLOW__{section.upper()}__{key.upper()}": value for section, key, value in config_items(settings)}


def product_env(settings: dict[str, Any]) -> dict[str, str]:
    """The product's switches (``[env]``), for every Airflow component's environment."""
    return {name: str(value) for name, value in settings["env"].items()}


def task_slots(settings: dict[str, Any]) -> int:
    """The task slots of the topology: workers x ``[celery] worker_concurrency``."""
    return int(settings["topology"]["workers"]) * int(settings["config"]["celery"]["worker_concurrency"])


def pools(settings: dict[str, Any]) -> dict[str, dict[str, Any]]:
    """The pools as ``airflow pools import`` reads them: ``{name: {slots, description, include_deferred}}``."""
    return {name: {"slots": int(p["slots"]), "description": str(p["description"]),
                   "include_deferred": bool(p.get("include_deferred", False))}
            for name, p in settings["pools"].items()}


# ---------------------------------------------------------------------------
# the check
# ---------------------------------------------------------------------------


def settings_problems(settings: dict[str, Any], where: str) -> list[str]:
    """What in the settings file contradicts itself (the rules the runbook's advice rests on)."""
    out = []
    topology, config = settings["topology"], settings["config"]
    if int(topology["triggerers"]) < 2:
        out.append(f"{where}: [topology] triggerers is {topology['triggerers']}: at least 2, so that one carries every "
                   "waiting tenant when the other dies")
    if settings["airflow"]["executor"] in CELERY_EXECUTORS:
        parallelism = int(config.get("core", {}).get("parallelism", 0))
        if parallelism != task_slots(settings):
            out.append(f"{where}: [config.core] parallelism is {parallelism} but the task slots are {task_slots(settings)} "
                       f"({topology['workers']} workers x worker_concurrency {config['celery']['worker_concurrency']}): "
                       "make them equal (the runbook's max_parallel advice counts on it)")
    for name, pool in settings["pools"].items():
        if int(pool.get("slots", 0)) < 1 or not pool.get("description"):
            out.append(f"{where}: pool {name!r} needs slots >= 1 and a description")
    out += _armed_slots_problems(settings, where)
    return out


#: The switch of "arm only what the workers can carry" (runbook, "Armed slots"), read by nexus_airflow.armed_slots.
ARMED_SLOTS_ENV = PRODUCT_SETTINGS["armed_slots"].alias


def _armed_slots_problems(settings: dict[str, Any], where: str) -> list[str]:
    """With armed slots set, the armed pool has as many and they fit in the task slots."""
    armed = int(str(settings["env"].get(ARMED_SLOTS_ENV, "0")).strip() or 0)
    if armed <= 0:
        return []
    pool = settings["pools"].get(ARMED_POOL)
    if pool is None or int(pool.get("slots", 0)) != armed:
        have = "no such pool" if pool is None else f"{pool.get('slots')} slots"
        return [f"{where}: [env] {ARMED_SLOTS_ENV} is {armed} but the pool {ARMED_POOL} has {have}: give "
                f"[pools.{ARMED_POOL}] {armed} slots (the armed tenants' tasks run there)"]
    if settings["airflow"]["executor"] in CELERY_EXECUTORS and armed > task_slots(settings):
        return [f"{where}: [env] {ARMED_SLOTS_ENV} is {armed}, more than the {task_slots(settings)} task slots: an "
                "armed tenant's task would queue inside its pause"]
    return []


def _dockerfile_instructions(text: str) -> list[tuple[str, str]]:
    """``(INSTRUCTION, arguments)`` of a Dockerfile, continuation lines joined, comments dropped."""
    lines, current = [], ""
    for raw in text.splitlines():
        line = raw.strip()
        if not current and (not line or line.startswith("#")):
            continue
        if line.startswith("#"):
            continue
        if line.endswith("\\"):
            current += line[:-1] + " "
            continue
        current += line
        lines.append(current)
        current = ""
    if current:
        lines.append(current)
    return [(line.split(None, 1)[0].upper(), line.split(None, 1)[1] if " " in line else "") for line in lines]


def dockerfile_facts(text: str) -> dict[str, Any]:
    """What the check reads from a Dockerfile: the first ``FROM`` image (``ARG`` defaults before it substituted), the
    ``COPY`` sources and destinations, the shell text of every ``RUN`` with the ``USER`` it runs as (``runs``, ``users``;
    the official image's default is ``airflow``) and, for each ``apt-get install``, ``(RUN index, user, packages)``."""
    args: dict[str, str] = {}
    facts: dict[str, Any] = {"from": None, "copies": [], "runs": [], "users": [], "apt": []}
    user = "airflow"
    for instruction, rest in _dockerfile_instructions(text):
        if instruction == "ARG" and facts["from"] is None and "=" in rest:
            name, value = rest.split("=", 1)
            args[name.strip()] = value.strip().strip('"')
        elif instruction == "FROM" and facts["from"] is None:
            image = rest.split()[0]
            facts["from"] = re.sub(r"\$\{?(\w+)\}?", lambda m: args.get(m.group(1), m.group(0)), image)
        elif instruction == "USER":
            user = rest.split(":")[0].strip()
        elif instruction == "COPY":
            words = [w for w in shlex.split(rest) if not w.startswith("--")]
            facts["copies"].append((words[:-1], words[-1]))
        elif instruction == "RUN":
            facts["runs"].append(rest)
            facts["users"].append(user)
            for command in re.split(r"&&|;|\|\|", rest):
                words = command.split()
                if "apt-get" in words and "install" in words:
                    packages = [w for w in words[words.index("install") + 1:] if not w.startswith("-")]
                    facts["apt"].append((len(facts["runs"]) - 1, user, packages))
    return facts


def _star_import_of(source: str) -> list[str]:
    """The modules a Python source star-imports (``from X import *``)."""
    try:
        tree = ast.parse(source)
    except SyntaxError:
        return []
    return [n.module for n in ast.walk(tree) if isinstance(n, ast.ImportFrom) and n.module and any(a.name == "*" for a in n.names)]


def _dockerfile_problems(settings: dict[str, Any], path: pathlib.Path, extras: set[str]) -> list[str]:
    where = f"deploy/{path.name}" if path.parent == DOCKERFILE.parent else str(path)
    facts = dockerfile_facts(path.read_text(encoding="utf-8"))
    version, python = settings["airflow"]["version"], settings["airflow"]["python"]
    out = []
    image = facts["from"] or ""
    m = re.fullmatch(r"apache/airflow:(?:slim-)?(?P<version>[\w.]+)-python(?P<python>[\d.]+)", image)
    if not m:
        out.append(f"{where}: FROM {image or '(none)'} is not apache/airflow:[slim-]<version>-python<python>")
    else:
        if m["version"] != version:
            out.append(f"{where}: FROM {image} is Airflow {m['version']}, deploy/airflow-settings.toml says {version}")
        if m["python"] != python:
            out.append(f"{where}: FROM {image} is Python {m['python']}, deploy/airflow-settings.toml says {python}")
    at = next((i for i, r in enumerate(facts["runs"]) if "pip install" in r), None)
    install = facts["runs"][at] if at is not None else ""
    if not install:
        out.append(f"{where}: no RUN pip install")
    else:
        if facts["users"][at] == "root":
            out.append(f"{where}: the pip install runs as root: the official image installs packages as its user airflow "
                       "(USER airflow before it)")
        root_packages = [p for i, user, packages in facts["apt"] if i < at and user == "root" for p in packages]
        for dist, packages in BUILD_DEPS.items():
            missing = [p for p in packages if p not in root_packages]
            if missing:
                out.append(f"{where}: {dist} has no Linux wheel on PyPI and pip may build it: the image needs "
                           f"{', '.join(missing)} (RUN apt-get install as USER root, before the pip install)")
        words = shlex.split(install.replace("$(", " ").replace(")", " "))
        pinned = [w for w in words if w.startswith("apache-airflow==")]
        if pinned != ["apache-airflow==${AIRFLOW_VERSION}"]:
            out.append(f"{where}: the pip install does not keep the image's Airflow (give \"apache-airflow==${{AIRFLOW_VERSION}}\" "
                       f"beside the wheel, as the image's documentation says); it has {pinned or 'none'}")
        constraint = next((words[i + 1] for i, w in enumerate(words[:-1]) if w in ("-c", "--constraint")), None)
        if constraint is None or not any(dest.rstrip("/") in (constraint, str(pathlib.PurePosixPath(constraint).parent))
                                         for (sources, dest) in facts["copies"] if "constraints.txt" in sources):
            out.append(f"{where}: the pip install does not use the repository's constraints.txt (-c, from its COPY); it has "
                       f"{constraint!r}")
        wheel = next((w for w in words if ".whl" in w), None)
        if wheel is None or not any(any(s.startswith("dist/") for s in sources) for sources, _ in facts["copies"]):
            out.append(f"{where}: the pip install does not install the product wheel copied from dist/")
        else:
            wanted = set(re.findall(r"\[([\w,-]+)\]", wheel)[0].split(",")) if "[" in wheel else set()
            unknown = sorted(wanted - extras)
            if "airflow" not in wanted or unknown:
                out.append(f"{where}: the wheel is installed with the extras {sorted(wanted)}: give [airflow] (and the "
                           f"executor's), each an extra of pyproject.toml (unknown: {unknown})")
    local = settings["airflow"]["local_settings_module"]
    local_copies = [sources for sources, dest in facts["copies"] if dest.endswith("config/airflow_local_settings.py")]
    if not local_copies:
        out.append(f"{where}: no COPY of the local settings to $AIRFLOW_HOME/config/airflow_local_settings.py")
    else:
        source = REPO / local_copies[0][0]  # COPY sources are relative to the build context, the repository
        if not source.exists() or local not in _star_import_of(source.read_text(encoding="utf-8")):
            out.append(f"{where}: the local settings it copies ({local_copies[0][0]}) do not star-import {local}")
    if not any(re.search(r"\bpython3? -m nexus_cutover_airflow\.dags_loader \S+", r) for r in facts["runs"]):
        out.append(f"{where}: no RUN python -m nexus_cutover_airflow.dags_loader <dags folder> (the DAG loader the "
                   "installed package writes)")
    return out


def _mapping_problems(values: dict[str, Any], where: str, mapping_file: pathlib.Path) -> list[str]:
    """The chart's ``statsd.extraMappings`` are the entries of the one mapping file (what the alert rules and the
    dashboard query), entry for entry in its order (each entry's ``ttl`` included). The file has no top-level
    ``defaults``: the chart's ConfigMap writes ``mappings:`` only, so the values could not carry them (and the
    exporter's default ``ttl`` would reach the fence gauge too: an entry's ``ttl: 0`` does not opt out of it)."""
    import yaml

    config = yaml.safe_load(mapping_file.read_text(encoding="utf-8"))
    source = config["mappings"]
    shipped = (values.get("statsd") or {}).get("extraMappings") or []
    by_match = {str(m.get("match")): m for m in shipped}
    name = f"deploy/statsd/{mapping_file.name}" if mapping_file.parent == STATSD_MAPPING.parent else str(mapping_file)
    out = [f"{where}: statsd.extraMappings cannot carry the top-level defaults {config['defaults']} of {name} (the "
           "chart writes entries only): give each entry its own setting (an entry's own ttl; the fence gauge none)"
           ] if config.get("defaults") else []
    out += [f"{where}: statsd.extraMappings has no entry {m['match']!r} of {name}" for m in source
            if m["match"] not in by_match]
    out += [f"{where}: statsd.extraMappings entry {m['match']!r} is {by_match[m['match']]}, {name} says {m}"
            for m in source if m["match"] in by_match and by_match[m["match"]] != m]
    known = {m["match"] for m in source}
    out += [f"{where}: statsd.extraMappings entry {match!r} is not in {name}" for match in by_match if match not in known]
    if not out and [m["match"] for m in shipped] != [m["match"] for m in source]:
        out.append(f"{where}: statsd.extraMappings are not in the order of {name}")
    return out


def _values(path: pathlib.Path) -> dict[str, Any]:
    import yaml

    return yaml.safe_load(path.read_text(encoding="utf-8")) or {}


def _where(path: pathlib.Path, default: pathlib.Path) -> str:
    return f"deploy/{path.name}" if path.parent == default.parent else str(path)


def _renamed_problems(values: dict[str, Any], where: str) -> list[str]:
    config = values.get("config") or {}
    return [f"{where}: config.{section}.{key} is the option's name before Airflow 3: {now}"
            for (section, key), now in RENAMED.items() if key in (config.get(section) or {})]


def _helm_problems(settings: dict[str, Any], path: pathlib.Path,
                   statsd_mapping: pathlib.Path = STATSD_MAPPING) -> list[str]:
    """deploy/helm-values.yaml: what the product needs, the settings' values of it, and nothing of the cluster's."""
    import yaml

    where = _where(path, HELM_VALUES)
    values = _values(path)
    out = []
    a = settings["airflow"]

    def differs(what: str, got: Any, want: Any) -> None:
        if ini_value(got) != ini_value(want):
            out.append(f"{where}: {what} is {got!r}, deploy/airflow-settings.toml says {want!r}")

    differs("airflowVersion", values.get("airflowVersion"), a["version"])
    image = ((values.get("images") or {}).get("airflow") or {})
    if not image.get("repository") or not image.get("tag"):
        out.append(f"{where}: images.airflow names no repository and tag (the image deploy/Dockerfile builds)")
    cluster = [key for key in CLUSTER_VALUES if key in values]
    config = values.get("config") or {}
    cluster += [f"config.{section}" for section in config if section not in REQUIRED_CONFIG]
    if cluster:
        out.append(f"{where}: {', '.join(cluster)}: a cluster's setting, not one the product needs (the recommendation "
                   "belongs in deploy/helm-values-reference.yaml, a shared cluster's in its own values)")
    for section, key, value in config_items(settings):
        if section in REQUIRED_CONFIG:
            differs(f"config.{section}.{key}", (config.get(section) or {}).get(key), value)
    out.extend(_renamed_problems(values, where))
    metrics = settings["config"].get("metrics", {})
    if "statsd_on" in metrics:
        differs("statsd.enabled (the chart's StatsD exporter)", (values.get("statsd") or {}).get("enabled"), metrics["statsd_on"])
    prefix = f"{metrics.get('statsd_prefix', 'airflow')}.nexus."
    for mapping in (values.get("statsd") or {}).get("extraMappings") or []:
        if not str(mapping.get("match", "")).startswith(prefix):
            out.append(f"{where}: the StatsD mapping {mapping.get('match')!r} does not start with {prefix!r} "
                       "([metrics] statsd_prefix)")
    out.extend(_mapping_problems(values, where, statsd_mapping))
    env = {e.get("name"): e.get("value") for e in values.get("env") or [] if isinstance(e, dict)}
    for name, value in product_env(settings).items():
        differs(f"env {name}", env.get(name), value)
    secrets = {s.get("envName"): s for s in values.get("secret") or [] if isinstance(s, dict)}
    for conn_id in settings["connections"]:
        variable = f"AIRFLOW_CONN_{conn_id.upper()}"
        entry = secrets.get(variable) or {}
        if not entry.get("secretName") or not entry.get("secretKey"):
            out.append(f"{where}: secret has no entry envName {variable} (secretName, secretKey): the connection "
                       f"{conn_id!r} from a Kubernetes Secret")
    if a["local_settings_module"] not in _star_import_of(values.get("airflowLocalSettings") or ""):
        out.append(f"{where}: airflowLocalSettings does not star-import {a['local_settings_module']}")
    shipped = None
    for body in (values.get("extraConfigMaps") or {}).values():
        data = (body or {}).get("data")
        if isinstance(data, str) and "pools.json" in data:
            shipped = json.loads(yaml.safe_load(data)["pools.json"])
    if shipped != pools(settings):
        out.append(f"{where}: the pools.json of extraConfigMaps is {shipped}, deploy/airflow-settings.toml says {pools(settings)}")
    migrate = " ".join(str(x) for x in ((values.get("migrateDatabaseJob") or {}).get("args") or []))
    if pools(settings) and "airflow pools import" not in migrate:
        out.append(f"{where}: migrateDatabaseJob.args does not run `airflow pools import` (the pools are not created)")
    return out


def _image_installs(dockerfile: pathlib.Path, pyproject: pathlib.Path) -> set[str]:
    """The distributions the image's pip install names (the wheel's extras' requirements and any it adds)."""
    from packaging.requirements import InvalidRequirement, Requirement

    facts = dockerfile_facts(dockerfile.read_text(encoding="utf-8"))
    install = next((r for r in facts["runs"] if "pip install" in r), "")
    words = shlex.split(install.replace("$(", " ").replace(")", " "))
    with open(pyproject, "rb") as f:
        project = tomllib.load(f)["project"]
    names = set()
    wheel = next((w for w in words if ".whl" in w), "")
    extras = re.findall(r"\[([\w,-]+)\]", wheel)[0].split(",") if "[" in wheel else []
    for line in project["dependencies"] + [r for e in extras for r in project.get("optional-dependencies", {}).get(e, [])]:
        names.add(_canonical(Requirement(line).name))
    for word in words:
        try:
            names.add(_canonical(Requirement(word).name))
        except InvalidRequirement:
            continue
    return names


def _canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def _reference_problems(settings: dict[str, Any], path: pathlib.Path, required: pathlib.Path,
                        dockerfile: pathlib.Path, pyproject: pathlib.Path) -> list[str]:
    """deploy/helm-values-reference.yaml: the settings' topology and every other ``[config.*]`` section, in the chart's
    current names, with an auth manager the image has."""
    where = _where(path, HELM_REFERENCE)
    values, needed = _values(path), _values(required)
    out = []
    a = settings["airflow"]

    def differs(what: str, got: Any, want: Any) -> None:
        if ini_value(got) != ini_value(want):
            out.append(f"{where}: {what} is {got!r}, deploy/airflow-settings.toml says {want!r}")

    differs("executor", values.get("executor"), a["executor"])
    differs("triggerer.replicas", (values.get("triggerer") or {}).get("replicas"), settings["topology"]["triggerers"])
    differs("triggerer.enabled", (values.get("triggerer") or {}).get("enabled", True), True)
    differs("dagProcessor.enabled", (values.get("dagProcessor") or {}).get("enabled"), True)
    workers = values.get("workers") or {}
    if "replicas" in workers:
        out.append(f"{where}: workers.replicas is the chart's deprecated name: workers.celery.replicas")
    if a["executor"] in CELERY_EXECUTORS:
        differs("workers.celery.replicas", (workers.get("celery") or {}).get("replicas"), settings["topology"]["workers"])
    config = values.get("config") or {}
    for section, key, value in config_items(settings):
        if section not in REQUIRED_CONFIG:
            differs(f"config.{section}.{key}", (config.get(section) or {}).get(key), value)
    out.extend(_renamed_problems(values, where))
    # the auth manager the chart ends up with (a values file's, else the chart's own) must be installed in the image
    named = [((v.get("config") or {}).get("core") or {}).get("auth_manager") for v in (needed, values)]
    auth = next((n for n in reversed(named) if n), CHART_AUTH_MANAGER)
    if auth not in CORE_AUTH_MANAGERS and auth.startswith("airflow.providers."):
        provider = "apache-airflow-providers-" + auth.split(".")[2].replace("_", "-")
        if provider not in _image_installs(dockerfile, pyproject):
            out.append(f"{where}: config.core.auth_manager is {auth}" + (" (the chart's default)" if not any(named) else "")
                       + f": {provider} is not installed by {_where(dockerfile, DOCKERFILE)}; name one the image has "
                       f"({', '.join(CORE_AUTH_MANAGERS)}) or install its provider")
    if auth != CHART_AUTH_MANAGER:
        enabled = [(v.get("createUserJob") or {}).get("enabled") for v in (needed, values)]
        if next((e for e in reversed(enabled) if e is not None), True) is not False:
            out.append(f"{where}: createUserJob.enabled is not false: the chart's job runs `airflow users create`, a "
                       f"command of FAB's auth manager, which {auth.rsplit('.', 1)[-1]} does not have")
    return out


def _constraints_problems(settings: dict[str, Any], release: pathlib.Path, dev_lock: pathlib.Path) -> list[str]:
    """The dev lock pins the settings' Airflow and was locked on its Python; the release's constraints were made
    against them and leave Airflow itself to the image."""
    version, python = settings["airflow"]["version"], settings["airflow"]["python"]
    out = []
    text = dev_lock.read_text(encoding="utf-8")
    pin = re.search(r"^apache-airflow==(\S+)$", text, re.MULTILINE)
    if not pin or pin.group(1) != version:
        out.append(f"{dev_lock.name}: apache-airflow=={pin.group(1) if pin else '(not pinned)'}, "
                   f"deploy/airflow-settings.toml says {version}")
    made_on = re.search(r"on Python (\d+\.\d+)", text)
    if made_on and made_on.group(1) != python:
        out.append(f"{dev_lock.name}: locked on Python {made_on.group(1)}, deploy/airflow-settings.toml says {python}")
    text = release.read_text(encoding="utf-8")
    against = re.search(r"apache-airflow==(\S+) on Python (\d+\.\d+)", text)
    if not against or (against.group(1), against.group(2)) != (version, python):
        out.append(f"{release.name}: made against {against.group(0) if against else '(it does not say)'}, "
                   f"deploy/airflow-settings.toml says apache-airflow=={version} on Python {python} (`make lock`)")
    if re.search(r"^apache-airflow==", text, re.MULTILINE):
        out.append(f"{release.name}: pins apache-airflow: a team's image keeps its own Airflow (`make lock`)")
    return out


#: The runbook's settings table names a setting as ``[section] key``; its value cell starts with the number.
_RUNBOOK_ROW = re.compile(r"^\| `\[(?P<section>\w+)\] (?P<key>\w+)` \| (?P<value>[^|]+)\|", re.MULTILINE)


def _runbook_problems(settings: dict[str, Any], path: pathlib.Path) -> list[str]:
    out = []
    wanted = {(s, k): v for s, k, v in config_items(settings)}
    for row in _RUNBOOK_ROW.finditer(path.read_text(encoding="utf-8")):
        want = wanted.get((row["section"], row["key"]))
        number = re.match(r"\s*\**([\d,]+(?:\.\d+)?)", row["value"])
        if want is None or number is None:
            continue
        if float(number.group(1).replace(",", "")) != float(want):
            out.append(f"docs/runbook.md: the row `[{row['section']}] {row['key']}` says {number.group(1)}, "
                       f"deploy/airflow-settings.toml says {want}")
    return out


def recipe_disagreements(*, settings_file: pathlib.Path = SETTINGS_FILE, dockerfile: pathlib.Path = DOCKERFILE,
                         helm_values: pathlib.Path = HELM_VALUES, helm_reference: pathlib.Path = HELM_REFERENCE,
                         constraints: pathlib.Path = CONSTRAINTS, dev_lock: pathlib.Path = DEV_LOCK,
                         pyproject: pathlib.Path = PYPROJECT, runbook: pathlib.Path = RUNBOOK,
                         statsd_mapping: pathlib.Path = STATSD_MAPPING) -> list[str]:
    """Every disagreement between the settings file and the recipe (one line each, naming the file, the setting and
    both values); empty when they agree."""
    settings = load(settings_file)
    with open(pyproject, "rb") as f:
        extras = set(tomllib.load(f)["project"].get("optional-dependencies", {}))
    return [*settings_problems(settings, f"deploy/{settings_file.name}"),
            *_constraints_problems(settings, constraints, dev_lock),
            *_dockerfile_problems(settings, dockerfile, extras),
            *_helm_problems(settings, helm_values, statsd_mapping),
            *_reference_problems(settings, helm_reference, helm_values, dockerfile, pyproject),
            *_runbook_problems(settings, runbook)]


def airflow_cfg(*values_files: pathlib.Path) -> str:
    """The ``config:`` of the values files (later ones win, as Helm merges them) as the airflow.cfg text the chart
    renders from it (values with a Go template are left out: only the chart can render them)."""
    import configparser
    import io

    merged: dict[str, dict[str, str]] = {}
    for path in values_files:
        for section, options in (_values(path).get("config") or {}).items():
            for key, value in (options or {}).items():
                if "{{" not in str(value):
                    merged.setdefault(section, {})[key] = ini_value(value)
    parser = configparser.ConfigParser(interpolation=None)
    parser.read_dict(merged)
    out = io.StringIO()
    parser.write(out)
    return out.getvalue()


def environment_disagreements(env: dict[str, str], settings: dict[str, Any], where: str) -> list[str]:
    """Every setting of ``settings`` (Airflow configuration and the product's switches) that ``env`` (a process's
    environment) sets otherwise, or leaves out."""
    wanted = {**config_env(settings), **product_env(settings)}
    return [f"{where}: {name}={env.get(name)!r}, deploy/airflow-settings.toml says {value!r}"
            for name, value in wanted.items() if env.get(name) != value]


def main(argv: list[str] | None = None) -> int:
    import argparse

    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("command", choices=("check", "env", "airflow-cfg"))
    parser.add_argument("--helm-values", type=pathlib.Path, default=HELM_VALUES,
                        help="check this values file instead of deploy/helm-values.yaml (e.g. your own copy of it)")
    parser.add_argument("--helm-reference", type=pathlib.Path, default=HELM_REFERENCE,
                        help="check this values file instead of deploy/helm-values-reference.yaml (e.g. your cluster's)")
    parser.add_argument("--dockerfile", type=pathlib.Path, default=DOCKERFILE,
                        help="check this Dockerfile instead of deploy/Dockerfile")
    args = parser.parse_args(argv)
    if args.command == "env":
        settings = load()
        for name, value in {**config_env(settings), **product_env(settings)}.items():
            print(f"{name}={value}")
        return 0
    if args.command == "airflow-cfg":
        print(airflow_cfg(args.helm_values, args.helm_reference), end="")
        return 0
    problems = recipe_disagreements(helm_values=args.helm_values, helm_reference=args.helm_reference,
                                    dockerfile=args.dockerfile)
    for line in problems:
        print(line, file=sys.stderr)
    print("the deployment recipe agrees with deploy/airflow-settings.toml" if not problems else
          f"{len(problems)} disagreement(s)", file=sys.stderr)
    return 1 if problems else 0


if __name__ == "__main__":
    raise SystemExit(main())

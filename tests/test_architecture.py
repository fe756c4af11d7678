"""Who may import whom, read from the source (ast) of every module, never by importing it.

* ``nexus_cutover`` (the product's domain package) never imports ``nexus_sim``,
  ``nexus_airflow``, ``nexus_status`` or ``airflow``;
* the Airflow plugins (``plugins/``) never import ``nexus_sim``;
* the DAG files import only ``airflow``, ``nexus_airflow``, ``pendulum`` and the
  standard library: never ``nexus_cutover`` directly, never ``nexus_sim``;
* ``nexus_sim`` (simulators and builders) is imported only from ``tests/``,
  ``scripts/`` (the demo) and ``bench/``.

Every import statement counts, also one inside a function or under ``TYPE_CHECKING``;
relative imports are resolved to their absolute module. In the product, a string
naming a ``nexus_sim`` module (``python -m nexus_sim...``, ``import_module``) counts too.
A failure names each offending ``file:line``.
"""

from __future__ import annotations

import ast
import os
import sys
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
INCLUDE, PLUGINS, DAGS = REPO / "include", REPO / "plugins", REPO / "dags"
PRODUCT = INCLUDE / "nexus_cutover"
SIM = INCLUDE / "nexus_sim"
SIM_IMPORTERS = ("tests", "scripts", "bench")
DAG_ALLOWED = {"airflow", "nexus_airflow", "pendulum"}
SKIP_DIRS = {".venv", ".git", "node_modules", "__pycache__", "build", "dist"}


def python_files(root: Path) -> list[Path]:
    """Every .py under root, not descending into virtualenvs, caches or hidden directories."""
    found = []
    for dirpath, dirnames, filenames in os.walk(root):
        dirnames[:] = [d for d in dirnames if d not in SKIP_DIRS and not d.startswith(".") and not d.endswith(".egg-info")]
        found += [Path(dirpath) / f for f in filenames if f.endswith(".py")]
    return sorted(found)


def module_name(path: Path) -> str:
    """The dotted module a file is imported as (include/ and plugins/ are on sys.path, the rest from the repo root)."""
    for root in (INCLUDE, PLUGINS, DAGS):
        if path.is_relative_to(root):
            rel = path.relative_to(root)
            break
    else:
        rel = path.relative_to(REPO)
    parts = list(rel.with_suffix("").parts)
    if parts[-1] == "__init__":
        parts.pop()
    return ".".join(parts)


def imports(path: Path, source: str | None = None) -> Iterator[tuple[int, str]]:
    """(line, absolute module) for every import in the file; ``from . import b`` yields the package's ``b``."""
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"), filename=str(path))
    module = module_name(path)
    package = module if path.name == "__init__.py" else module.rpartition(".")[0]
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            for alias in node.names:
                yield node.lineno, alias.name
        elif isinstance(node, ast.ImportFrom):
            if node.level:
                base_parts = package.split(".") if package else []
                keep = len(base_parts) - (node.level - 1)
                base = ".".join(base_parts[: max(keep, 0)] + ([node.module] if node.module else []))
            else:
                base = node.module or ""
            if node.module:
                yield node.lineno, base
            else:  # from . import a, b: submodules (or names) of the package
                for alias in node.names:
                    yield node.lineno, f"{base}.{alias.name}" if base else alias.name


def top(module: str) -> str:
    return module.partition(".")[0]


def where(path: Path, line: int) -> str:
    return f"{path.relative_to(REPO)}:{line}"


def violations(paths: list[Path], forbidden: set[str]) -> list[str]:
    return sorted({f"{where(p, line)} imports {mod}" for p in paths for line, mod in imports(p) if top(mod) in forbidden})


def sim_strings(paths: list[Path]) -> list[str]:
    """String constants naming a nexus_sim module (subprocess ``-m`` lines, ``importlib.import_module``)."""
    found = []
    for p in paths:
        for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"), filename=str(p))):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and top(node.value.strip()) == "nexus_sim":
                found.append(f"{where(p, node.lineno)} names {node.value.strip()!r}")
    return found


def report(what: str, found: list[str]) -> str:
    return f"{what} ({len(found)}):\n  " + "\n  ".join(found)


def test_every_area_has_modules_to_check():
    for root in (PRODUCT, SIM, PLUGINS, DAGS, *(REPO / d for d in SIM_IMPORTERS)):
        assert python_files(root), f"no modules found under {root.relative_to(REPO)}: the checks below would pass vacuously"


def test_relative_imports_resolve_to_their_absolute_module():
    path = PRODUCT / "runtime" / "host.py"
    found = {mod for _, mod in imports(path, "from ..catalog import Event\nfrom . import tx\nfrom .model import Input\n")}
    assert {"nexus_cutover.catalog", "nexus_cutover.runtime.tx", "nexus_cutover.runtime.model"} <= found
    init = PRODUCT / "runtime" / "__init__.py"
    assert {mod for _, mod in imports(init, "from .host import run_host\n")} >= {"nexus_cutover.runtime.host"}


def test_product_never_imports_simulators_airflow_or_the_plugins():
    forbidden = {"nexus_sim", "nexus_airflow", "nexus_status", "airflow"}
    found = violations(python_files(PRODUCT), forbidden) + sim_strings(python_files(PRODUCT))
    assert not found, report("nexus_cutover must not import nexus_sim, nexus_airflow, nexus_status or airflow", found)


def test_plugins_never_import_simulators():
    found = violations(python_files(PLUGINS), {"nexus_sim"}) + sim_strings(python_files(PLUGINS))
    assert not found, report("plugins/ must not import nexus_sim", found)


def test_dags_import_only_airflow_nexus_airflow_pendulum_and_the_standard_library():
    allowed = DAG_ALLOWED | set(sys.stdlib_module_names) | {"__future__"}
    found = sorted(
        {f"{where(p, line)} imports {mod}" for p in python_files(DAGS) for line, mod in imports(p) if top(mod) not in allowed}
    )
    found += sim_strings(python_files(DAGS))
    assert not found, report("dags/ may import only airflow, nexus_airflow, pendulum and the standard library", found)


def test_nexus_sim_is_imported_only_from_tests_scripts_and_bench():
    allowed_roots = [REPO / d for d in SIM_IMPORTERS] + [SIM]
    others = [p for p in python_files(REPO) if not any(p.is_relative_to(root) for root in allowed_roots)]
    found = violations(others, {"nexus_sim"})
    assert not found, report("nexus_sim may be imported only from tests/, scripts/ and bench/", found)


def test_nothing_imports_a_private_module_of_airflow():
    """Airflow's public API only (issue 38: the metrics client through ``airflow.sdk.observability.stats``): a private
    module (a ``_``-prefixed segment, e.g. ``airflow.sdk._shared``) may change in any Airflow release."""
    found = sorted({f"{where(p, line)} imports {mod}" for root in (PRODUCT, PLUGINS, DAGS) for p in python_files(root)
                    for line, mod in imports(p)
                    if top(mod) == "airflow" and any(part.startswith("_") for part in mod.split(".")[1:])})
    assert not found, report("only Airflow's public modules may be imported", found)


#: What the plugins and the command lines may import of the cutover's domain (``nexus_cutover.projection``): its
#: declaration, its door (the step bodies, what they return and raise, the reads callers show), the fleet's
#: preflight and dry run over it, and the DAG's parse-time limits. Nothing deeper (issue 35, item 2).
PROJECTION_DOORS = {f"nexus_cutover.projection.{m}" for m in ("steps", "transition", "next_actions", "preflight",
                                                               "dry_run", "digest_limits")} | {"nexus_cutover.projection"}


def test_the_plugins_and_the_command_lines_reach_the_cutover_only_through_its_door():
    callers = python_files(PLUGINS) + python_files(PRODUCT / "cli")
    found = sorted({f"{where(p, line)} imports {mod}" for p in callers for line, mod in imports(p)
                    if mod.startswith("nexus_cutover.projection") and mod not in PROJECTION_DOORS})
    assert callers and not found, report("import the cutover's steps module (nexus_cutover.projection.steps), not "
                                         "what is behind it", found)

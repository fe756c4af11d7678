"""Who may import whom, read from the source (ast) of every module, never by importing it.

* ``nexus_cutover`` (the product's domain package) never imports ``nexus_sim``,
  ``nexus_airflow``, ``nexus_status`` or ``airflow``;
* the Airflow plugins (``plugins/``) never import ``nexus_sim``;
* the DAG files import only ``airflow``, ``nexus_airflow``, ``pendulum`` and the
  standard library: never ``nexus_cutover`` directly, never ``nexus_sim``;
* ``nexus_sim`` (simulators and builders) is imported only from ``tests/``,
  ``scripts/`` (the demo) and ``bench/``, and is no package of the product's wheel: pyproject.toml maps
  exactly the folders checked here (its own distribution is ``sim/pyproject.toml``);
* no import circle among the modules of the product, the plugins, ``scripts/`` and
  ``bench/``: a module that imports one that imports it back (directly or through
  others) means a rule without one home. Importing a package is importing its
  ``__init__``; ``from pkg import name`` where ``name`` is a submodule is importing
  that submodule; in ``scripts/`` and ``bench/`` (run as scripts, their own directory
  first on ``sys.path``) ``import benchlib`` is the sibling ``bench/benchlib.py``;
* a ``NEXUS_*`` setting is read only through ``nexus_cutover.settings`` (Airflow's ``[nexus]`` section, its alias
  the variable): no ``os.environ``/``os.getenv`` read of a ``NEXUS_`` name, spelled or through a module constant,
  anywhere else in the product, the plugins or the DAGs; the test hooks of ``nexus_airflow.faults`` excepted;
* an XCom is pulled by a task id spelled in the call (a string, an f-string, a rollout
  task id name) only in the declared readers: ``nexus_airflow.results`` (the cutover's
  steps) and ``nexus_airflow.rollout`` (the rollout DAG's tasks);
* no module under ``include/`` (every package: ``nexus_cutover``, ``nexus_sim``, ...), ``plugins/`` or ``dags/`` is
  over :data:`MAX_LINES` (500) lines (issue 48): a longer one is split along its seams, its old module re-exporting
  what moved.

Every import statement counts, also one inside a function or under ``TYPE_CHECKING``;
relative imports are resolved to their absolute module. In the product, a string
naming a ``nexus_sim`` module (``python -m nexus_sim...``, ``import_module``) counts too.
A failure names each offending ``file:line``.
"""

from __future__ import annotations

import ast
import os
import sys
from collections import deque
from collections.abc import Collection, Iterable, Iterator, Mapping
from itertools import pairwise
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
INCLUDE, PLUGINS, DAGS = REPO / "include", REPO / "plugins", REPO / "dags"
PRODUCT = INCLUDE / "nexus_cutover"
SIM = INCLUDE / "nexus_sim"
SIM_IMPORTERS = ("tests", "scripts", "bench")
SCRIPT_DIRS = (REPO / "scripts", REPO / "bench")
CIRCLE_FREE = (PRODUCT, PLUGINS, *SCRIPT_DIRS)
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


def imports(path: Path, source: str | None = None, *, each_name: bool = False) -> Iterator[tuple[int, str]]:
    """(line, absolute module) for every import in the file; ``from . import b`` yields the package's ``b``.

    With ``each_name``, ``from a import b, c`` yields ``a.b`` and ``a.c`` (a submodule or a name of ``a``:
    :func:`resolve` tells which) instead of ``a``."""
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
            if node.module and not (each_name and node.names[0].name != "*"):
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


def resolve(imported: str, importer: Path, known: Collection[str]) -> str | None:
    """The known module an import loads: the longest known prefix of ``imported`` (``pkg.name`` where ``name`` is
    not a submodule is ``pkg``, i.e. its ``__init__``), tried first as a sibling for a file run as a script;
    None for a module outside ``known`` (the standard library, Airflow, ...)."""
    candidates = [imported]
    if any(importer.is_relative_to(d) for d in SCRIPT_DIRS):
        sibling_package = module_name(importer).rpartition(".")[0]
        if f"{sibling_package}.{top(imported)}" in known:
            candidates.insert(0, f"{sibling_package}.{imported}")
    for candidate in candidates:
        parts = candidate.split(".")
        for end in range(len(parts), 0, -1):
            if ".".join(parts[:end]) in known:
                return ".".join(parts[:end])
    return None


def import_graph(sources: Mapping[Path, str | None]) -> dict[str, dict[str, list[str]]]:
    """module -> {imported module -> ["file:line", ...]} among the given files (source None: read the file)."""
    known = {module_name(p) for p in sources}
    graph: dict[str, dict[str, list[str]]] = {m: {} for m in known}
    for path, source in sources.items():
        importer = module_name(path)
        for line, imported in imports(path, source, each_name=True):
            target = resolve(imported, path, known)
            if target is not None and target != importer:
                graph[importer].setdefault(target, []).append(where(path, line))
    return {m: {t: sorted(set(lines), key=lambda w: int(w.rpartition(":")[2])) for t, lines in targets.items()}
            for m, targets in graph.items()}


def circles(graph: Mapping[str, Mapping[str, list[str]]]) -> list[list[str]]:
    """Import circles, each as [a, b, ..., a] starting at its smallest module: for every module on a circle, the
    shortest circle through it (so every module of every circle is named, without listing every permutation)."""
    found: set[tuple[str, ...]] = set()
    for start in sorted(graph):
        parent: dict[str, str] = {}
        queue = deque([start])
        while queue:  # breadth first from start until an edge leads back to it
            node = queue.popleft()
            if start in graph[node]:
                cycle = []  # walked back from node (which imports start) to start, then reversed
                while node != start:
                    cycle.append(node)
                    node = parent[node]
                cycle = [start, *reversed(cycle)]
                smallest = cycle.index(min(cycle))
                found.add(tuple(cycle[smallest:] + cycle[:smallest]))
                break
            for nxt in sorted(graph[node]):
                if nxt != start and nxt not in parent:
                    parent[nxt] = node
                    queue.append(nxt)
    return [[*c, c[0]] for c in sorted(found)]


def describe(circle: list[str], graph: Mapping[str, Mapping[str, list[str]]]) -> str:
    edges = "\n    ".join(f"{a} -> {b}: {', '.join(graph[a][b])}" for a, b in pairwise(circle))
    return f"{' -> '.join(circle)}\n    {edges}"


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


def test_the_product_wheel_is_made_of_the_checked_folders_and_has_no_simulator():
    import tomllib

    setuptools = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["tool"]["setuptools"]
    mapped = {package: (REPO / folder).resolve() for package, folder in setuptools["package-dir"].items()}
    assert mapped == {"nexus_cutover": PRODUCT, "nexus_airflow": PLUGINS / "nexus_airflow", "nexus_status": PLUGINS / "nexus_status",
                      "nexus_cutover_airflow": PLUGINS, "nexus_cutover_dags": DAGS}, mapped
    assert not [p for p in setuptools["packages"] if top(p) == "nexus_sim" or top(p) not in mapped], setuptools["packages"]
    subpackages = {".".join((package, *init.parent.relative_to(folder).parts))
                   for package, folder in mapped.items() if package != "nexus_cutover_airflow"
                   for init in folder.rglob("__init__.py") if "__pycache__" not in init.parts}
    missing = sorted(subpackages - set(setuptools["packages"]))
    assert not missing, f"add to [tool.setuptools] packages in pyproject.toml (the wheel would lack them): {missing}"
    # the DAG loader the installed package writes into a dags folder (plugins/dags_loader.py) brings in the DAGs only,
    # and the module that writes it imports nothing (it runs from a bare Python: `make dist`)
    from nexus_cutover_airflow import dags_loader

    loader = DAGS / dags_loader.LOADER_NAME  # where it would sit; it is parsed, not read
    assert {top(mod) for _, mod in imports(loader, dags_loader.LOADER_SOURCE)} == {"nexus_cutover_dags"}
    assert {top(mod) for _, mod in imports(PLUGINS / "dags_loader.py")} == {"__future__", "pathlib", "sys"}


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


#: Airflow's modules that are not its public interface for a plugin, a provider or a task (issue 49): reached only
#: through ``nexus_airflow.compat``, with its version range, its contract test and its switch.
AIRFLOW_INTERNALS = ("airflow.models", "airflow.utils.session", "airflow.sdk.execution_time", "airflow.sdk.bases")
COMPAT = PLUGINS / "nexus_airflow" / "compat.py"


def test_airflow_internals_are_reached_only_through_the_compat_module():
    """Issue 49, item 1: Airflow's ORM models, its sessions, the Task SDK's supervisor channel and XCom base class are
    imported in ``plugins/nexus_airflow/compat.py`` only, and only it names ``SUPERVISOR_COMMS`` or listens on an ORM
    session's events (a platform team re-validates that one module at an Airflow upgrade)."""
    found = sorted({f"{where(p, line)} imports {mod}" for root in (PLUGINS, DAGS) for p in python_files(root)
                    if p != COMPAT for line, mod in imports(p) if mod.startswith(AIRFLOW_INTERNALS)})
    for root in (PLUGINS, DAGS):
        for p in python_files(root):
            if p == COMPAT:
                continue
            for node in ast.walk(ast.parse(p.read_text(encoding="utf-8"))):
                if isinstance(node, ast.Name) and node.id == "SUPERVISOR_COMMS":
                    found.append(f"{where(p, node.lineno)} names SUPERVISOR_COMMS")
                if (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "listen"
                        and isinstance(node.func.value, ast.Name) and node.func.value.id == "event"):
                    found.append(f"{where(p, node.lineno)} listens on an event")
    assert not found, report("Airflow's internals are reached only through nexus_airflow.compat", found)
    assert any(mod.startswith(AIRFLOW_INTERNALS) for _, mod in imports(COMPAT))  # the check looks where they are


#: What the plugins and the command lines may import of the cutover's domain (``nexus_cutover.projection``): its
#: declaration, its door (the step bodies, what they return and raise, the reads callers show), the fleet's
#: preflight and dry run over it, and the DAG's parse-time limits. Nothing deeper (issue 35, item 2).
PROJECTION_DOORS = {f"nexus_cutover.projection.{m}" for m in ("steps", "transition", "next_actions", "preflight",
                                                               "dry_run", "digest_limits")} | {"nexus_cutover.projection"}


#: The same for Field History (``nexus_cutover.field_history``): its steps module and its declaration.
FIELD_HISTORY_DOORS = {"nexus_cutover.field_history.steps", "nexus_cutover.field_history.transition"}

#: Each domain package with a door: what may be imported of it, and what to import instead of anything else.
DOORS = {
    "nexus_cutover.projection": (PROJECTION_DOORS, "the cutover's steps module (nexus_cutover.projection.steps)"),
    "nexus_cutover.field_history": (FIELD_HISTORY_DOORS, "Field History's steps module "
                                                         "(nexus_cutover.field_history.steps) or its declaration"),
}


@pytest.mark.parametrize("package", sorted(DOORS))
def test_the_plugins_and_the_command_lines_reach_a_domain_package_only_through_its_door(package):
    doors, instead = DOORS[package]
    callers = python_files(PLUGINS) + python_files(PRODUCT / "cli")
    found = sorted({f"{where(p, line)} imports {mod}" for p in callers for line, mod in imports(p)
                    if mod.startswith(package) and mod not in doors})
    assert callers and not found, report(f"import {instead}, not what is behind it", found)


def test_the_circle_finder_finds_a_circle_through_every_kind_of_import():
    """A synthetic package: a -> b by ``from pkg import b`` (a submodule), b -> c by a function-level relative
    import, c -> a by ``import pkg.a``; d imports a name of the package (its ``__init__``) and ``__init__`` imports a."""
    pkg = PLUGINS / "circle_pkg"
    sources = {
        pkg / "__init__.py": "from .a import thing\n",
        pkg / "a.py": "import json\nfrom circle_pkg import b\nthing = 1\n",
        pkg / "b.py": "def late():\n    from .c import helper\n    return helper\n",
        pkg / "c.py": "import circle_pkg.a\n\ndef helper():\n    return circle_pkg.a.thing\n",
        pkg / "d.py": "from circle_pkg import thing\n",
    }
    graph = import_graph(sources)
    assert graph["circle_pkg.d"] == {"circle_pkg": ["plugins/circle_pkg/d.py:1"]}
    assert graph["circle_pkg"] == {"circle_pkg.a": ["plugins/circle_pkg/__init__.py:1"]}
    assert circles(graph) == [["circle_pkg.a", "circle_pkg.b", "circle_pkg.c", "circle_pkg.a"]]
    assert describe(circles(graph)[0], graph).splitlines()[1:] == [
        "    circle_pkg.a -> circle_pkg.b: plugins/circle_pkg/a.py:2",
        "    circle_pkg.b -> circle_pkg.c: plugins/circle_pkg/b.py:2",
        "    circle_pkg.c -> circle_pkg.a: plugins/circle_pkg/c.py:1",
    ]
    sources[pkg / "c.py"] = "def helper():\n    return 1\n"
    assert circles(import_graph(sources)) == []
    bench = REPO / "bench"
    siblings = {bench / "one.py": "import two\n", bench / "two.py": "def f():\n    from one import g\n"}
    assert circles(import_graph(siblings)) == [["bench.one", "bench.two", "bench.one"]]


def test_no_import_circle_among_the_product_plugins_scripts_and_bench():
    graph = import_graph({p: None for root in CIRCLE_FREE for p in python_files(root)})
    found = [describe(c, graph) for c in circles(graph)]
    assert not found, report("import circles (a module reached again through its own imports)", found)


#: Issue 48: the most lines a module of the product, the simulators, the plugins or the DAGs may have.
MAX_LINES = 500


def lines_over(paths: Iterable[Path], limit: int = MAX_LINES) -> list[tuple[Path, int]]:
    """(file, its line count) of every file over ``limit`` lines, the longest first."""
    counted = [(p, len(p.read_text(encoding="utf-8").splitlines())) for p in paths]
    return sorted(((p, n) for p, n in counted if n > limit), key=lambda pn: (-pn[1], pn[0]))


def test_the_line_count_check_names_only_a_file_over_the_limit(tmp_path):
    at, over = tmp_path / "at.py", tmp_path / "over.py"
    at.write_text("x = 1\n" * MAX_LINES, encoding="utf-8")
    over.write_text("x = 1\n" * MAX_LINES + "y = 2", encoding="utf-8")  # a last line without its newline counts too
    assert lines_over([at, over]) == [(over, MAX_LINES + 1)]


def test_no_module_under_include_plugins_or_dags_is_over_500_lines():
    """Issue 48: a module over :data:`MAX_LINES` lines holds more than one thing; split it along its seams (the old
    module re-exports what moved, so no importer changes). Every package under ``include/`` counts, the simulators
    (``nexus_sim``) too, as do the plugins and the DAG files."""
    roots = (INCLUDE, PLUGINS, DAGS)
    paths = [p for root in roots for p in python_files(root)]
    packages = {top(module_name(p)) for p in paths if p.is_relative_to(INCLUDE)}
    assert {"nexus_cutover", "nexus_sim"} <= packages and all(any(p.is_relative_to(r) for p in paths) for r in roots)
    found = [f"{p.relative_to(REPO)}: {n} lines" for p, n in lines_over(paths)]
    assert not found, report(f"split these modules along their seams into modules of at most {MAX_LINES} lines", found)


def _rollout_task_id_names() -> set[str]:
    """The names ``nexus_airflow.rollout`` declares the rollout DAG's task ids with (``PLAN_TASK``, ``wave_task``, ...)."""
    tree = ast.parse((PLUGINS / "nexus_airflow" / "rollout.py").read_text(encoding="utf-8"))
    names = {t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets if isinstance(t, ast.Name)}
    names |= {n.name for n in tree.body if isinstance(n, ast.FunctionDef)}
    return {n for n in names if n.endswith(("_TASK", "_TASKS")) or n in {"wave_group", "wave_task", "close_task"}}


def spelled_task_ids(path: Path, source: str | None = None, declared: Collection[str] = ()) -> list[str]:
    """``file:line`` of every ``xcom_pull`` whose ``task_ids`` is spelled in the call: a string, an f-string, or
    built from the rollout's declared task ids (one of ``declared``)."""
    found = []
    for node in ast.walk(ast.parse(source if source is not None else path.read_text(encoding="utf-8"), filename=str(path))):
        if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute) and node.func.attr == "xcom_pull"):
            continue
        for kw in node.keywords:
            if kw.arg == "task_ids" and any(
                    (isinstance(n, ast.Constant) and isinstance(n.value, str)) or isinstance(n, ast.JoinedStr)
                    or (isinstance(n, ast.Name) and n.id in declared) or (isinstance(n, ast.Attribute) and n.attr in declared)
                    for n in ast.walk(kw.value)):
                found.append(f"{where(path, node.lineno)} pulls an XCom by a task id it spells")
    return sorted(set(found), key=lambda w: int(w.partition(" ")[0].rpartition(":")[2]))


def test_an_xcom_is_pulled_by_a_spelled_task_id_only_in_the_declared_readers():
    """The cutover's results are read by declared step name (``nexus_airflow.results``), the rollout DAG's by its
    task ids declared once (``nexus_airflow.rollout``'s readers): no other module of plugins/ or dags/ passes
    ``xcom_pull`` a task id of its own (issue 35)."""
    readers = {PLUGINS / "nexus_airflow" / "results.py", PLUGINS / "nexus_airflow" / "rollout.py"}
    declared = _rollout_task_id_names()
    assert {"PLAN_TASK", "PREFLIGHT_TASK", "close_task", "wave_task"} <= declared
    probe = PLUGINS / "nexus_airflow" / "probe.py"
    assert len(spelled_task_ids(probe, 'ti.xcom_pull(task_ids="plan")\nti.xcom_pull(task_ids=f"{g}.open")\n'
                                       "ti.xcom_pull(task_ids=ro.close_task(1))\nti.xcom_pull(task_ids=ti.task_id)\n",
                                declared)) == 3
    found = [f for root in (PLUGINS, DAGS) for p in python_files(root) if p not in readers
             for f in spelled_task_ids(p, declared=declared)]
    assert not found, report("XComs are pulled through nexus_airflow.results or nexus_airflow.rollout's readers", found)


def _docstrings(tree: ast.AST) -> set[int]:
    """The ids of the string expressions that are statements (docstrings, and strings standing as comments)."""
    return {id(node.value) for node in ast.walk(tree)
            if isinstance(node, ast.Expr) and isinstance(node.value, ast.Constant) and isinstance(node.value.value, str)}


def spelled_step_names(path: Path, source: str | None = None, names: Collection[str] = ()) -> list[str]:
    """``file:line`` of every string literal (an f-string's literal parts too) that equals one of the step ``names``;
    docstrings and comments are not code and do not count."""
    tree = ast.parse(source if source is not None else path.read_text(encoding="utf-8"), filename=str(path))
    skipped = _docstrings(tree)
    return [f"{where(path, node.lineno)} spells the step {node.value!r}" for node in ast.walk(tree)
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skipped
            and node.value in names]


def test_no_string_in_the_plugins_or_the_dags_spells_a_declared_step_name():
    """What each declared step *is* belongs to its declaration (``nexus_cutover.transition.Step``: its wait, its heavy
    reads, the task it is fused into, its role), and the Airflow adapter reads those fields: no table or literal of
    plugins/ names a step of the cutover or of Field History (issue 48, item 3). A reader that needs one step's
    result asks for it by its declared role (``nexus_airflow.results.step_with``). The DAG files name their operators
    by role or kind, and their docs are the declaration's (issue 51, item 5)."""
    from nexus_cutover.field_history.transition import FIELD_HISTORY
    from nexus_cutover.projection.transition import CUTOVER

    names = set(CUTOVER.names) | set(FIELD_HISTORY.names)
    assert {"arm_fence", "stage_3"} <= names
    probe = PLUGINS / "nexus_airflow" / "probe.py"
    source = ('"""Docstring naming arm_fence."""\n# a comment naming "arm_fence"\n'
              'def f(ti):\n    """arm_fence"""\n    "arm_fence"\n    return pulled(ti, "arm_fence"), {"stage_3": 1}, '
              'f"{x}" + f"stage_3{y}", f"{z}arm_fence", "arm_fences"\n')
    spelled = sorted(f.rpartition(" ")[2] for f in spelled_step_names(probe, source, names))
    assert spelled == ["'arm_fence'", "'arm_fence'", "'stage_3'", "'stage_3'"], spelled  # not the docstrings, comments
    found = [f for root in (PLUGINS, DAGS) for p in python_files(root) for f in spelled_step_names(p, names=names)]
    assert not found, report("plugins/ and dags/ must read what a step is from its declaration, never spell a step "
                             "name", found)


SETTINGS_MODULE = PRODUCT / "settings.py"
#: Where a NEXUS_ variable may be read from the environment: the settings' reader, and the test hooks.
ENV_READERS = {SETTINGS_MODULE: "every", PLUGINS / "nexus_airflow" / "faults.py": "TEST_HOOKS"}


def _nexus_constants(paths: list[Path]) -> dict[str, str]:
    """Module-level ``NAME = "NEXUS_..."`` of the given files, by name (an imported constant reads the same)."""
    found = {}
    for p in paths:
        for node in ast.parse(p.read_text(encoding="utf-8")).body:
            if (isinstance(node, ast.Assign) and isinstance(node.value, ast.Constant)
                    and str(node.value.value).startswith("NEXUS_")):
                found.update({t.id: node.value.value for t in node.targets if isinstance(t, ast.Name)})
    return found


def env_reads(path: Path, source: str | None = None, constants: Mapping[str, str] = {}) -> list[str]:  # noqa: B006
    """``file:line NAME`` of each read of a NEXUS_ variable: ``os.environ.get(k)``/``[k]``/``.setdefault(k)``,
    ``os.getenv(k)``, ``k in os.environ``, ``k`` a string or a name of ``constants``."""
    def environ(node: ast.AST) -> bool:
        return ast.unparse(node) in ("os.environ", "environ")

    def key(node: ast.AST) -> str | None:
        name = node.value if isinstance(node, ast.Constant) else constants.get(getattr(node, "id", ""))
        return name if isinstance(name, str) and name.startswith("NEXUS_") else None

    found = []
    for node in ast.walk(ast.parse(source if source is not None else path.read_text(encoding="utf-8"))):
        keys: list[ast.AST] = []
        if isinstance(node, ast.Call) and node.args and isinstance(node.func, ast.Attribute):
            if (node.func.attr in ("get", "setdefault", "pop") and environ(node.func.value)) or ast.unparse(
                    node.func) == "os.getenv":
                keys = [node.args[0]]
        elif isinstance(node, ast.Subscript) and environ(node.value) and isinstance(node.ctx, ast.Load):
            keys = [node.slice]
        elif isinstance(node, ast.Compare) and any(isinstance(o, ast.In) for o in node.ops) and any(
                environ(c) for c in node.comparators):
            keys = [node.left]
        found += [f"{where(path, node.lineno)} {name}" for k in keys if (name := key(k))]
    return found


def test_the_env_read_check_finds_every_kind_of_read():
    path = PLUGINS / "nexus_airflow" / "example.py"
    code = ("import os\nA = 'NEXUS_A'\nos.environ.get('NEXUS_B', '1')\nos.getenv(A)\nos.environ['NEXUS_C']\n"
            "'NEXUS_D' in os.environ\nos.environ.get('HOME')\nos.environ['NEXUS_E'] = '1'\n")
    assert env_reads(path, code, {"A": "NEXUS_A"}) == [f"plugins/nexus_airflow/example.py:{n} {name}" for n, name in
                                                       ((3, "NEXUS_B"), (4, "NEXUS_A"), (5, "NEXUS_C"), (6, "NEXUS_D"))]


def test_a_nexus_setting_is_read_only_through_the_settings_module():
    """Issue 49: every setting is declared in the provider's ``[nexus]`` section and read through Airflow's config;
    a direct environment read would miss ``AIRFLOW__NEXUS__*`` and ``airflow.cfg``."""
    sys.path[:0] = [str(INCLUDE), str(PLUGINS)]
    try:
        from nexus_airflow.faults import TEST_HOOKS
    finally:
        del sys.path[:2]
    paths = python_files(PRODUCT) + python_files(PLUGINS) + python_files(DAGS)
    constants = _nexus_constants(paths)
    found = [read for p in paths if p != SETTINGS_MODULE for read in env_reads(p, constants=constants)
             if not (p in ENV_READERS and read.rsplit(" ", 1)[1] in TEST_HOOKS)]
    assert constants and not found, report("read a NEXUS_ setting with nexus_cutover.settings.value(name) (declare "
                                           "it in nexus_cutover.settings.SETTINGS), not os.environ", found)

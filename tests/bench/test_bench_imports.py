"""Every name the bench and the project's scripts import from the product exists.

``make bench-stack`` has no smoke run in CI (a stack start alone is a minute, a quick run ~9 minutes), and its
scripts import product modules inside functions, so a rename in the product broke it only when someone ran it
(``bench_preflight`` imported ``rollout_preflight._engine`` after it became ``tenant_engine_of``: the full run
stopped at its first part). This reads every ``from <module> import <name>`` of ``bench/`` and ``scripts/``,
function bodies included, imports the module and checks the name is there.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
PRODUCT_PACKAGES = ("nexus_cutover", "nexus_airflow", "nexus_status", "nexus_sim")


def _product_imports() -> list[tuple[str, int, str, str]]:
    found = []
    for path in sorted([*REPO.joinpath("bench").rglob("*.py"), *REPO.joinpath("scripts").rglob("*.py")]):
        for node in ast.walk(ast.parse(path.read_text(), str(path))):
            if isinstance(node, ast.ImportFrom) and node.level == 0 and node.module \
                    and node.module.split(".")[0] in PRODUCT_PACKAGES:
                found += [(str(path.relative_to(REPO)), node.lineno, node.module, a.name) for a in node.names]
    return found


def _resolves(module: str, name: str) -> bool:
    if name == "*" or hasattr(importlib.import_module(module), name):
        return True
    try:
        importlib.import_module(f"{module}.{name}")
    except ModuleNotFoundError:
        return False
    return True


def test_every_product_name_the_bench_imports_exists(monkeypatch):
    for folder in ("plugins", "bench"):
        monkeypatch.syspath_prepend(str(REPO / folder))
    imports = _product_imports()
    assert any(module == "nexus_airflow.rollout_preflight" for _, _, module, _ in imports)  # the case that broke
    missing = [f"{where}:{line}: from {module} import {name}"
               for where, line, module, name in imports if not _resolves(module, name)]
    assert not missing, "names the bench imports that the product no longer has:\n" + "\n".join(missing)

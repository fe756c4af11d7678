"""Releases of the product as a team installs them: wheels built at a chosen version, and a venv Airflow runs from.

Each wheel is built from a temporary copy of this tree (never the tree itself) whose ``pyproject.toml`` says the
chosen version; whatever the tree packages, the build packages. The venv holds Airflow with the product's
``[airflow]`` extra, pinned by the release's ``constraints.txt`` and, standing in for Airflow's own constraints file
(the README's install line takes both), the dev lock ``constraints-dev.txt``; no checkout on ``sys.path``.
"""

from __future__ import annotations

import os
import pathlib
import re
import shutil
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[2]
_NOT_SOURCE = shutil.ignore_patterns(".venv", ".git", ".run", "__pycache__", "*.egg-info", "build", "dist",
                                     "node_modules", ".pytest_cache", ".ruff_cache", "*.db")
_VERSION_LINE = re.compile(r'(?m)^version\s*=\s*"([^"]+)"\s*$')


def _project_table(text: str) -> tuple[int, int]:
    """Where ``[project]``'s keys are in a pyproject text: (start, end) offsets."""
    start = text.index("[project]\n") + len("[project]\n")
    following = re.search(r"(?m)^\[", text[start:])
    return start, start + following.start() if following else len(text)


def static_version(pyproject: pathlib.Path = REPO / "pyproject.toml") -> str:
    """The ``[project] version`` of ``pyproject`` (a clear error when the version is not a static one)."""
    text = pyproject.read_text(encoding="utf-8")
    start, end = _project_table(text)
    found = _VERSION_LINE.search(text, start, end)
    if found is None:
        raise AssertionError(f"{pyproject}: no static [project] version line (version = \"X\"): this test builds "
                             "releases by editing it; teach tests/pinning/releases.py the new way")
    return found.group(1)


def build_wheel(workdir: pathlib.Path, version: str) -> pathlib.Path:
    """The product wheel at ``version``, built (``pip wheel``, no dependencies) from a copy of this tree."""
    tree, dist = workdir / f"tree-{version}", workdir / f"dist-{version}"
    shutil.copytree(REPO, tree, ignore=_NOT_SOURCE)
    pyproject = tree / "pyproject.toml"
    text = pyproject.read_text(encoding="utf-8")
    start, end = _project_table(text)
    static_version(pyproject)  # a clear error when there is none to edit
    pyproject.write_text(text[:start] + _VERSION_LINE.sub(f'version = "{version}"', text[start:end], count=1)
                         + text[end:], encoding="utf-8")
    subprocess.run([sys.executable, "-m", "pip", "wheel", "-q", "--no-deps", "-w", str(dist), str(tree)], check=True,
                   timeout=600)
    (wheel,) = dist.glob("nexus_cutover-*.whl")
    return wheel


def make_venv(path: pathlib.Path, wheel: pathlib.Path) -> pathlib.Path:
    """A fresh venv at ``path`` with ``wheel[airflow]`` installed under the release's constraints and the dev lock (the
    stand-in for Airflow's); its ``bin/``."""
    subprocess.run([sys.executable, "-m", "venv", str(path)], check=True, timeout=300)
    pip(path / "bin", "install", "-c", str(REPO / "constraints.txt"), "-c", str(REPO / "constraints-dev.txt"),
        f"{wheel}[airflow]")
    return path / "bin"


def outside_the_checkout() -> dict[str, str]:
    """This process's environment without ``PYTHONPATH``: nothing of the checkout on a venv process's ``sys.path``."""
    return {k: v for k, v in os.environ.items() if k != "PYTHONPATH"}


def pip(bin_dir: pathlib.Path, *args: str) -> None:
    subprocess.run([str(bin_dir / "python"), "-m", "pip", "-q", *args], check=True, timeout=1200,
                   cwd=bin_dir.parent, env=outside_the_checkout())


def installed_version(bin_dir: pathlib.Path) -> str:
    """The product version the venv of ``bin_dir`` has installed, as a fresh process of it reads it."""
    return subprocess.run([str(bin_dir / "python"), "-c", "import nexus_cutover; print(nexus_cutover.__version__)"],
                          check=True, capture_output=True, text=True, timeout=120, cwd=bin_dir.parent,
                          env=outside_the_checkout()).stdout.strip()

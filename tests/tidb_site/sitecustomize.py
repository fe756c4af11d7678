"""Loaded at start-up by every child Python process of a TiDB-semantics test run.

In that mode (``NEXUS_TIDB_SEMANTICS=1``) tests/conftest.py puts this directory
and the repository root on ``PYTHONPATH``, so product CLIs started as
subprocesses install the harness of :mod:`tests.tidb_semantics` on the
``Engine`` class too. Outside the mode this file does nothing but hand over to
any other ``sitecustomize`` further down ``sys.path`` (none exists in the
project's venv today).
"""

from __future__ import annotations

import importlib.machinery
import importlib.util
import os
import sys


def _chain_next_sitecustomize() -> None:
    here = os.path.dirname(os.path.abspath(__file__))
    for entry in sys.path:
        if os.path.abspath(entry or os.curdir) == here:
            continue
        spec = importlib.machinery.PathFinder.find_spec("sitecustomize", [entry])
        if spec is not None and spec.origin and os.path.dirname(os.path.abspath(spec.origin)) != here:
            module = importlib.util.module_from_spec(spec)
            spec.loader.exec_module(module)
            return


_chain_next_sitecustomize()

if os.environ.get("NEXUS_TIDB_SEMANTICS") == "1":
    try:
        from tests import tidb_semantics

        tidb_semantics.install_from_environment()
    except Exception as exc:  # noqa: BLE001 - say so loudly, but never stop the child from starting
        sys.stderr.write(f"tests/tidb_site/sitecustomize.py: the TiDB-semantics harness is NOT installed: {exc!r}\n")

"""The deploy tests' tools: ``promtool`` (Debian's ``prometheus`` package), for the alert rules and the dashboard's
queries."""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest


@pytest.fixture(scope="session")
def promtool() -> str:
    found = shutil.which("promtool") or ("/usr/bin/promtool" if os.path.exists("/usr/bin/promtool") else None)
    if found is None:  # the Debian package, as scripts/bootstrap.sh installs it
        env = {**os.environ, "DEBIAN_FRONTEND": "noninteractive"}
        subprocess.run(["apt-get", "update", "-qq"], check=True, env=env)
        subprocess.run(["apt-get", "install", "-y", "-qq", "prometheus"], check=True, env=env)
        found = shutil.which("promtool") or "/usr/bin/promtool"
    return found

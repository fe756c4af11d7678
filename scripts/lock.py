"""``make lock``: pin every installed distribution of the project's venv into ``constraints.txt``.

Run it after a passing ``make test`` (the versions that passed are the ones pinned). ``scripts/bootstrap.sh``
installs with ``-c constraints.txt``, so a fresh clone, CI and a team's image get exactly these versions; a
team installs the wheel the same way (README, "Install"). The project itself (installed editable) is not pinned.
"""

from __future__ import annotations

import pathlib
import platform
import subprocess
import sys

REPO = pathlib.Path(__file__).resolve().parents[1]
TARGET = REPO / "constraints.txt"
HEADER = """\
# Pinned versions of every distribution the project's extras install (airflow, test, stack), from a venv that passed
# `make test` on Python {python} ({system}). Regenerate with `make lock` after a passing `make test`; commit it.
# scripts/bootstrap.sh installs with `-c constraints.txt`; tests/test_constraints.py checks the venv agrees.
"""


def frozen() -> list[str]:
    """``name==version`` of every installed distribution but the editable project, sorted by name."""
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True,
                         check=True).stdout
    pins = [line.strip() for line in out.splitlines() if "==" in line and not line.startswith(("-e", "#"))]
    return sorted(pins, key=lambda pin: pin.split("==")[0].lower())


def main() -> int:
    pins = frozen()
    TARGET.write_text(HEADER.format(python=platform.python_version(), system=platform.system())
                      + "\n".join(pins) + "\n", encoding="utf-8")
    print(f"lock: {len(pins)} pins written to {TARGET.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

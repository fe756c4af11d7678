"""``make lock``: pin every installed distribution of the project's venv into ``constraints.txt``.

Run it after a passing ``make test`` (the versions that passed are the ones pinned). One file for every extra
(airflow, stack, test): the dev venv has them all, and a constraint on a package an install does not need is
ignored by pip. ``scripts/bootstrap.sh`` installs with ``-c constraints.txt``, so a fresh clone, CI and a team's image
get exactly these versions; ``make dist`` ships it beside the wheel as ``constraints-<version>.txt`` (README,
"Install into your Airflow"). The project itself and nexus-sim (installed editable) are not pinned.

``--against FILE`` compares the pins with another constraints file (Airflow's for 3.3.x and your Python) and lists
every distribution both pin to different versions: pip refuses ``-c`` with both files when such a conflict matters to
the install, so this says which one to settle (exit 1 when any differs).
"""

from __future__ import annotations

import argparse
import pathlib
import platform
import re
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


def read_pins(path: pathlib.Path) -> dict[str, str]:
    """``{canonical name: version}`` of a constraints file's ``name==version`` lines (comments and markers ignored)."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in line:
            name, version = (part.strip() for part in line.split("==", 1))
            found[re.sub(r"[-_.]+", "-", name).lower()] = version
    return found


def differences(ours: dict[str, str], theirs: dict[str, str]) -> list[str]:
    return [f"{name}: ours {ours[name]}, theirs {theirs[name]}" for name in sorted(ours.keys() & theirs.keys())
            if ours[name] != theirs[name]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=pathlib.Path, help="another constraints file to compare the pins with")
    args = parser.parse_args(argv)
    if args.against:
        differ = differences(read_pins(TARGET), read_pins(args.against))
        print("\n".join(differ) if differ else f"lock: no pin of {TARGET.name} differs from {args.against}")
        return 1 if differ else 0
    pins = frozen()
    TARGET.write_text(HEADER.format(python=platform.python_version(), system=platform.system())
                      + "\n".join(pins) + "\n", encoding="utf-8")
    print(f"lock: {len(pins)} pins written to {TARGET.relative_to(REPO)}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

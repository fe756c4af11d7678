"""Pinned installs (issue 37, item 2): ``constraints.txt`` pins every distribution, bootstrap installs with it, and the
venv the tests run in is exactly what it pins (so a stale file fails here, and CI's fresh install proves it works)."""

from __future__ import annotations

import importlib.metadata as md
import pathlib
import re
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins() -> dict[str, str]:
    lines = [line.strip() for line in (REPO / "constraints.txt").read_text(encoding="utf-8").splitlines()]
    found = {}
    for line in lines:
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"constraints.txt: {line!r} is not name==version (no URL, no path, no editable)"
        found[canonical(match[1])] = match[2]
    return found


def test_every_requirement_of_every_extra_is_pinned():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    names = {canonical(re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0]) for r in requirements}
    missing = sorted(names - set(pins()))
    assert not missing, f"not pinned in constraints.txt: {missing} (run `make lock` after a passing `make test`)"


def test_the_venv_is_what_the_constraints_pin():
    installed = {canonical(d.metadata["Name"]): d.version for d in md.distributions() if d.metadata["Name"]}
    differ = sorted(f"{name}: pinned {version}, installed {installed.get(name, 'nothing')}"
                    for name, version in pins().items() if installed.get(name) != version)
    assert not differ, "the venv differs from constraints.txt (run `make lock` after a passing `make test`):\n" + "\n".join(differ)


def test_bootstrap_installs_with_the_constraints_and_reinstalls_when_they_change():
    script = (REPO / "scripts" / "bootstrap.sh").read_text(encoding="utf-8")
    assert "pip\" install -q -c constraints.txt -e '.[airflow,test,stack]'" in script
    assert "cat pyproject.toml constraints.txt | sha1sum" in script  # a new pin re-runs the install

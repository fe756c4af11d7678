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
    assert "pip\" install -q -c constraints.txt -e '.[airflow,test,stack]' -e ./sim" in script
    assert "cat pyproject.toml sim/pyproject.toml constraints.txt | sha1sum" in script  # a new pin re-runs the install


def test_lock_against_names_every_pin_another_constraints_file_sets_differently(tmp_path):
    """How our pins combine with Airflow's own constraints (README): ``scripts/lock.py --against`` lists the conflicts."""
    import subprocess
    import sys

    ours = pins()
    airflow_pin, sqlalchemy_pin = ours["apache-airflow"], ours["sqlalchemy"]
    theirs = tmp_path / "constraints-3.11.txt"
    theirs.write_text(f"# Airflow's\napache-airflow=={airflow_pin}\nSQLAlchemy==0.0.1 ; python_version >= '3.10'\n"
                      "not-in-ours==1.0\n", encoding="utf-8")
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "lock.py"), "--against", str(theirs)],
                         capture_output=True, text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.strip().splitlines() == [f"sqlalchemy: ours {sqlalchemy_pin}, theirs 0.0.1"]
    theirs.write_text(f"apache-airflow=={airflow_pin}\n", encoding="utf-8")
    agreeing = subprocess.run([sys.executable, str(REPO / "scripts" / "lock.py"), "--against", str(theirs)],
                              capture_output=True, text=True)
    assert agreeing.returncode == 0 and "no pin of constraints.txt differs" in agreeing.stdout, agreeing.stdout


def test_make_dist_ships_the_constraints_beside_the_wheel_under_the_version():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "cp constraints.txt dist/constraints-$$version.txt" in makefile

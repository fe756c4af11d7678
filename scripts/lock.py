"""``make lock``: the dev lock and the release's constraints, from the project's venv after a passing ``make test``.

* ``constraints-dev.txt``, the dev lock: every distribution installed in the dev venv (``pip freeze``: the product's
  extras, the test tools of ``requirements-dev.txt`` and everything they bring) but the editable project and
  nexus-sim. ``scripts/bootstrap.sh`` installs with it, so a fresh clone and CI get exactly what ``make test`` passed on.
* ``constraints.txt``, the release's constraints (``make dist`` ships it as ``dist/constraints-<version>.txt``): only
  what nexus-cutover adds on top of Airflow. A team installs it together with Airflow's own constraints file, which
  pins Airflow's dependencies and providers; ours must then pin nothing of those, or pip refuses the pair. It holds
  the distributions of the product's runtime closure (``nexus-cutover[airflow,stack]``, read from the venv's
  metadata: no test tool, nothing of nexus-sim) that a fresh resolve of Airflow with the extras and providers
  the product names (:func:`airflow_baseline`) does not bring, plus -- each with a comment saying why -- those the
  product needs at a version that fresh resolve does not pick (a requirement of ours excludes it). Every version
  is the dev lock's, the one ``make test`` passed with. Writing it resolves Airflow against the package index
  (``pip install --dry-run``; needs the network).

``--against FILE`` compares the release's pins with another constraints file (Airflow's for 3.3.x and your Python)
and lists every distribution both pin to different versions: pip refuses ``-c`` with both files when such a conflict
matters to the install, so this says which one to settle (exit 1 when any differs).
"""

from __future__ import annotations

import argparse
import importlib.metadata as md
import json
import pathlib
import platform
import re
import subprocess
import sys
import tomllib

REPO = pathlib.Path(__file__).resolve().parents[1]
TARGET = REPO / "constraints.txt"
DEV_LOCK = REPO / "constraints-dev.txt"
PYPROJECT = REPO / "pyproject.toml"
PROJECT = "nexus-cutover"
#: The product's extras a deployment installs (the image: deploy/Dockerfile).
RELEASE_EXTRAS = ("airflow", "stack")
#: Airflow's own extras the product names: its ``statsd`` requirement is Airflow's StatsD client (``[statsd]``).
AIRFLOW_EXTRAS = ("statsd",)
#: What the dev lock never pins: the editable project and the simulators (installed from the checkout).
NOT_PINNED = {"nexus-cutover", "nexus-sim"}

DEV_HEADER = """\
# The dev lock: every distribution of the dev venv (the product's extras {extras}, the test tools of
# requirements-dev.txt, and what they bring) from a venv that passed `make test` on Python {python} ({system}).
# Regenerate with `make lock` after a passing `make test`; commit it. scripts/bootstrap.sh installs with
# `-c constraints-dev.txt`; tests/test_constraints.py checks the venv agrees. Not what a release ships:
# constraints.txt is (scripts/lock.py).
"""
RELEASE_HEADER = """\
# nexus-cutover's release constraints: only what the product adds on top of Airflow, made against
# apache-airflow=={airflow} on Python {python} ({system}), at the versions of the dev lock that passed `make test`.
# What Airflow brings itself is left to Airflow's own constraints file: every distribution a fresh resolve of
{baseline}
# installs, but those below. A team installs both files:
#   pip install "nexus-cutover[airflow,stack]==<version>" -c constraints-<version>.txt -c <Airflow's constraints file>
# A pin with a comment above it is one Airflow brings, at a version a requirement of ours excludes (the comment
# says why). Written by `make lock` (scripts/lock.py); do not edit by hand. `python scripts/lock.py --against
# <Airflow's file>` lists every pin both files set differently.
"""


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


# ---------------------------------------------------------------------------
# what is installed: closures over the venv's metadata
# ---------------------------------------------------------------------------


def _installed() -> dict[str, md.Distribution]:
    return {canonical(d.metadata["Name"]): d for d in md.distributions() if d.metadata["Name"]}


def closure(roots: list[str], installed: dict[str, md.Distribution] | None = None) -> dict[str, str]:
    """``{canonical name: installed version}`` of every distribution ``roots`` (requirement strings such as
    ``nexus-cutover[airflow,stack]``) bring in the running interpreter's environment, themselves included, following
    each requirement's extras and markers. A requirement whose distribution is not installed is left out (its
    marker may be false elsewhere; ``pip check`` vouches for the venv)."""
    from packaging.requirements import Requirement

    installed = _installed() if installed is None else installed
    found: dict[str, str] = {}
    wanted: dict[str, set[str]] = {}
    todo = [Requirement(r) for r in roots]
    while todo:
        req = todo.pop()
        name = canonical(req.name)
        if name not in installed:
            continue
        extras = {canonical(e) for e in req.extras}
        seen = wanted.setdefault(name, set())
        if name in found and extras <= seen:
            continue
        seen |= extras
        dist = installed[name]
        found[name] = dist.version
        for line in dist.requires or []:
            dep = Requirement(line)
            if dep.marker is None or any(dep.marker.evaluate({"extra": e}) for e in (seen or {""})):
                todo.append(dep)
    return found


def _optional(pyproject: pathlib.Path = PYPROJECT) -> tuple[list[str], dict[str, list[str]]]:
    project = tomllib.loads(pyproject.read_text(encoding="utf-8"))["project"]
    return project["dependencies"], project.get("optional-dependencies", {})


def release_requirements(pyproject: pathlib.Path = PYPROJECT) -> list[str]:
    """The requirement strings of the product as a deployment installs it (its dependencies and release extras)."""
    dependencies, optional = _optional(pyproject)
    return dependencies + [r for extra in RELEASE_EXTRAS for r in optional.get(extra, [])]


def airflow_baseline(version: str, pyproject: pathlib.Path = PYPROJECT) -> list[str]:
    """What "Airflow with the extras and providers we name" is: ``apache-airflow[statsd]==<version>`` and every
    ``apache-airflow-providers-*`` the release extras name, unversioned (the providers Airflow's constraints pin)."""
    from packaging.requirements import Requirement

    providers = sorted({canonical(Requirement(r).name) for r in release_requirements(pyproject)
                        if canonical(Requirement(r).name).startswith("apache-airflow-providers-")})
    return [f"apache-airflow[{','.join(AIRFLOW_EXTRAS)}]=={version}", *providers]


def runtime_closure() -> dict[str, str]:
    """The installed distributions ``nexus-cutover[airflow,stack]`` brings (the product itself left out)."""
    found = closure([f"{PROJECT}[{','.join(RELEASE_EXTRAS)}]"])
    found.pop(PROJECT, None)
    return found


# ---------------------------------------------------------------------------
# the files
# ---------------------------------------------------------------------------


def frozen() -> list[str]:
    """``name==version`` of every installed distribution but the editable project, sorted by name."""
    out = subprocess.run([sys.executable, "-m", "pip", "freeze", "--exclude-editable"], capture_output=True, text=True,
                         check=True).stdout
    pins = [line.strip() for line in out.splitlines() if "==" in line and not line.startswith(("-e", "#"))]
    pins = [p for p in pins if canonical(p.split("==")[0]) not in NOT_PINNED]
    return sorted(pins, key=lambda pin: pin.split("==")[0].lower())


def read_pins(path: pathlib.Path) -> dict[str, str]:
    """``{canonical name: version}`` of a constraints file's ``name==version`` lines (comments and markers ignored)."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in line:
            name, version = (part.strip() for part in line.split("==", 1))
            found[canonical(name)] = version
    return found


def read_names(path: pathlib.Path) -> dict[str, str]:
    """``{canonical name: the name as the file spells it}`` of a constraints file's pins."""
    found = {}
    for line in path.read_text(encoding="utf-8").splitlines():
        line = line.split("#", 1)[0].split(";", 1)[0].strip()
        if "==" in line:
            name = line.split("==", 1)[0].strip()
            found[canonical(name)] = name
    return found


def fresh_resolve(requirements: list[str], constraints: list[pathlib.Path] = (), timeout: float = 600) -> dict[str, str]:
    """``{canonical name: version}`` a fresh ``pip install`` of ``requirements`` would install here (``--dry-run
    --ignore-installed``: nothing is installed; the index is asked)."""
    cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed", "--report", "-",
           *(arg for c in constraints for arg in ("-c", str(c))), *requirements]
    done = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout, cwd=REPO)
    if done.returncode != 0:
        noise = "WARNING: Location"  # a machine's pip configuration may name index folders it lacks
        raise RuntimeError(f"{' '.join(cmd)} exited {done.returncode}:\n"
                           + "\n".join(line for line in done.stderr.splitlines() if not line.startswith(noise)))
    report = json.loads(done.stdout)
    return {canonical(item["metadata"]["name"]): item["metadata"]["version"] for item in report["install"]}


def _requirement_comments(pyproject: pathlib.Path = PYPROJECT) -> dict[str, str]:
    """``{canonical name: the comment of its requirement line in pyproject.toml}``."""
    found = {}
    for match in re.finditer(r'^\s*"([A-Za-z0-9][A-Za-z0-9._-]*)[^"]*",\s*#\s*(.+)$', pyproject.read_text(encoding="utf-8"),
                             re.MULTILINE):
        found[canonical(match[1])] = match[2].strip()
    return found


def release_pins(dev: dict[str, str], runtime: dict[str, str], baseline: dict[str, str],
                 requirements: list[str], airflow: str, comments: dict[str, str] | None = None) -> dict[str, tuple[str, str]]:
    """``{canonical name: (version, why)}``: the runtime distributions the baseline does not bring (``why`` empty), and
    those it brings at a version a requirement of ours excludes (``why``: the requirement, its pyproject comment and
    the version the baseline picks)."""
    from packaging.requirements import Requirement

    comments = comments or {}
    specs = {}
    for line in requirements:
        req = Requirement(line)
        specs.setdefault(canonical(req.name), []).append(req)
    out = {}
    for name in sorted(runtime):
        if name not in dev:
            raise ValueError(f"{name} is installed but not in the dev lock: run `make lock` from a venv `make deps` made")
        if name not in baseline:
            out[name] = (dev[name], "")
            continue
        excluding = [r for r in specs.get(name, []) if not r.specifier.contains(baseline[name], prereleases=True)]
        if excluding:
            why = "; ".join(f"we require {r}" + (f" ({comments[name]})" if name in comments else "") for r in excluding)
            out[name] = (dev[name], f"{why}; a fresh resolve of apache-airflow=={airflow} with the providers we name "
                                    f"picks {baseline[name]}")
        continue
    return out


def write_release(airflow: str, target: pathlib.Path = TARGET) -> dict[str, tuple[str, str]]:
    import textwrap

    dev = read_pins(DEV_LOCK)
    baseline_requirements = airflow_baseline(airflow)
    baseline = fresh_resolve(baseline_requirements)
    pins = release_pins(dev, runtime_closure(), baseline, release_requirements(), airflow, _requirement_comments())
    spelled = read_names(DEV_LOCK)
    python = ".".join(platform.python_version_tuple()[:2])
    text = RELEASE_HEADER.format(airflow=airflow, python=python, system=platform.system(),
                                 baseline=textwrap.fill(" ".join(baseline_requirements), width=117,
                                                        initial_indent="#   ", subsequent_indent="#   ", break_on_hyphens=False))
    for name, (version, why) in pins.items():
        if why:
            text += textwrap.fill(f"{spelled[name]}: {why}", width=117, initial_indent="# ", subsequent_indent="#   ",
                                  break_on_hyphens=False) + "\n"
        text += f"{spelled[name]}=={version}\n"
    target.write_text(text, encoding="utf-8")
    return pins


def differences(ours: dict[str, str], theirs: dict[str, str]) -> list[str]:
    return [f"{name}: ours {ours[name]}, theirs {theirs[name]}" for name in sorted(ours.keys() & theirs.keys())
            if ours[name] != theirs[name]]


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--against", type=pathlib.Path, help="another constraints file to compare the release's pins with")
    args = parser.parse_args(argv)
    if args.against:
        differ = differences(read_pins(TARGET), read_pins(args.against))
        print("\n".join(differ) if differ else f"lock: no pin of {TARGET.name} differs from {args.against}")
        return 1 if differ else 0
    pins = frozen()
    DEV_LOCK.write_text(DEV_HEADER.format(extras=", ".join(RELEASE_EXTRAS), python=platform.python_version(),
                                          system=platform.system()) + "\n".join(pins) + "\n", encoding="utf-8")
    print(f"lock: {len(pins)} pins written to {DEV_LOCK.relative_to(REPO)}")
    airflow = md.version("apache-airflow")
    release = write_release(airflow)
    print(f"lock: {len(release)} pins written to {TARGET.relative_to(REPO)} (what the product adds to apache-airflow=={airflow})")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

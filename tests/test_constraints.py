"""Pinned installs (issue 37, item 2; issue 49, item 4). Two files, both written by ``make lock`` (scripts/lock.py):

* ``constraints-dev.txt``, the dev lock, pins every distribution of the dev venv; bootstrap installs with it, and the
  venv the tests run in is exactly what it pins (so a stale file fails here, and CI's fresh install proves it works);
* ``constraints.txt``, the release's constraints, pins only what the product adds on top of Airflow: what Airflow with
  the extras and providers we name does not bring, and, each with its reason above it, what we need at another
  version than Airflow's resolve picks. It holds no test tool, agrees with the dev lock, and resolves together with a
  fresh Airflow (the index is asked: pip's dry run).
"""

from __future__ import annotations

import importlib.metadata as md
import pathlib
import re
import subprocess
import sys
import tomllib

from scripts import lock

REPO = pathlib.Path(__file__).resolve().parents[1]
PIN = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!_-]+)$")
DEV_LOCK, RELEASE = REPO / "constraints-dev.txt", REPO / "constraints.txt"


def canonical(name: str) -> str:
    return re.sub(r"[-_.]+", "-", name).lower()


def pins(path: pathlib.Path = DEV_LOCK) -> dict[str, str]:
    lines = [line.strip() for line in path.read_text(encoding="utf-8").splitlines()]
    found = {}
    for line in lines:
        if not line or line.startswith("#"):
            continue
        match = PIN.match(line)
        assert match, f"{path.name}: {line!r} is not name==version (no URL, no path, no editable, no inline comment)"
        found[canonical(match[1])] = match[2]
    return found


def requirement_names(lines: list[str]) -> set[str]:
    return {canonical(re.split(r"[<>=!~\[ ;]", r, maxsplit=1)[0]) for r in lines}


def dev_requirements() -> list[str]:
    text = (REPO / "requirements-dev.txt").read_text(encoding="utf-8")
    return [line.split("#", 1)[0].strip() for line in text.splitlines() if line.split("#", 1)[0].strip()]


def test_every_requirement_of_every_extra_and_every_dev_tool_is_in_the_dev_lock():
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    requirements = project["dependencies"] + [r for extra in project["optional-dependencies"].values() for r in extra]
    missing = sorted(requirement_names(requirements + dev_requirements()) - set(pins()))
    assert not missing, f"not pinned in constraints-dev.txt: {missing} (run `make lock` after a passing `make test`)"


def test_the_venv_is_what_the_dev_lock_pins():
    installed = {canonical(d.metadata["Name"]): d.version for d in md.distributions() if d.metadata["Name"]}
    differ = sorted(f"{name}: pinned {version}, installed {installed.get(name, 'nothing')}"
                    for name, version in pins().items() if installed.get(name) != version)
    assert not differ, "the venv differs from constraints-dev.txt (run `make lock` after a passing `make test`):\n" + "\n".join(differ)


def test_the_published_metadata_has_no_test_extra_and_carries_license_and_classifiers():
    """What a team's pip sees (issue 49): the extras a deployment installs, the license, the classifiers."""
    project = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]
    assert set(project["optional-dependencies"]) == {"airflow", "stack"}
    assert not requirement_names(dev_requirements()) & requirement_names(
        [r for extra in project["optional-dependencies"].values() for r in extra] + project["dependencies"])
    assert project["license"] == "Apache-2.0" and project["license-files"] == ["LICENSE"]
    assert (REPO / "LICENSE").read_text(encoding="utf-8").split()[:4] == ["Apache", "License", "Version", "2.0,"]
    assert "Framework :: Apache Airflow :: Provider" in project["classifiers"]
    installed = md.metadata("nexus-cutover")  # the editable install's metadata, built from the same pyproject
    assert installed.get_all("Provides-Extra") == ["airflow", "stack"], installed.get_all("Provides-Extra")
    assert installed["License-Expression"] == "Apache-2.0"


def test_bootstrap_installs_with_the_dev_lock_and_reinstalls_when_it_changes():
    script = (REPO / "scripts" / "bootstrap.sh").read_text(encoding="utf-8")
    assert "pip\" install -q -c constraints-dev.txt -r requirements-dev.txt -e '.[airflow,stack]' -e ./sim" in script
    # a new pin or tool re-runs the install
    assert "cat pyproject.toml sim/pyproject.toml requirements-dev.txt constraints-dev.txt | sha1sum" in script


# ---------------------------------------------------------------------------
# the release's constraints
# ---------------------------------------------------------------------------


def release_comments() -> dict[str, str]:
    """``{canonical name: the comment block right above its pin}`` of the release's file (the header is no pin's)."""
    out, block = {}, []
    for line in RELEASE.read_text(encoding="utf-8").splitlines():
        if line.startswith("#"):
            block.append(line)
        elif PIN.match(line.strip()):
            name = canonical(PIN.match(line.strip())[1])
            if block and block[0].lower().startswith(f"# {name}:"):
                out[name] = " ".join(block)
            block = []
        else:
            block = []
    return out


def test_the_release_pins_what_the_dev_lock_pins_and_no_test_tool():
    release, dev = pins(RELEASE), pins()
    differ = sorted(f"{n}: release {v}, dev lock {dev.get(n)}" for n, v in release.items() if dev.get(n) != v)
    assert not differ, differ
    runtime = lock.runtime_closure()
    stray = sorted(set(release) - set(runtime))
    assert not stray, f"constraints.txt pins what nexus-cutover[airflow,stack] does not install: {stray} (`make lock`)"
    assert "apache-airflow" not in release  # the team's image pins its Airflow; ours would move it


def test_the_release_pins_all_that_airflow_does_not_bring_and_explains_each_of_airflows_it_pins():
    """Offline, from the venv's metadata: the runtime closure minus Airflow's (with the extras and providers we name)
    is pinned; a pin of one Airflow brings carries its reason, which names the requirement of ours it comes from."""
    version = md.version("apache-airflow")
    airflows = lock.closure(lock.airflow_baseline(version))
    runtime, release, comments = lock.runtime_closure(), pins(RELEASE), release_comments()
    ours = set(runtime) - set(airflows)
    assert ours, "the product adds nothing to Airflow? (the closure reads no metadata)"
    assert not sorted(ours - set(release)), f"not pinned in constraints.txt: {sorted(ours - set(release))} (`make lock`)"
    for name in set(release) & set(airflows):
        assert name in comments, f"constraints.txt pins {name}, which Airflow brings, without saying why above it"
        assert "we require" in comments[name] and "picks" in comments[name], comments[name]
    header = RELEASE.read_text(encoding="utf-8")
    assert f"apache-airflow=={version} on Python 3.11" in header


def test_the_release_resolves_with_a_fresh_airflow():
    """What a team gets installing ours over a fresh Airflow (no Airflow constraints file: the index's newest): pip
    resolves the product's requirements with the release's pins, and installs each pin as pinned."""
    version = md.version("apache-airflow")
    resolved = lock.fresh_resolve([f"apache-airflow=={version}", *lock.release_requirements()], [RELEASE], timeout=300)
    differ = sorted(f"{n}: pinned {v}, resolved {resolved.get(n)}" for n, v in pins(RELEASE).items() if resolved.get(n) != v)
    assert not differ, differ
    assert resolved["apache-airflow"] == version


def test_lock_against_names_every_pin_another_constraints_file_sets_differently(tmp_path):
    """How our pins combine with Airflow's own constraints (README): ``scripts/lock.py --against`` lists the conflicts."""
    ours = pins(RELEASE)
    name = sorted(ours)[0]
    theirs = tmp_path / "constraints-3.11.txt"
    theirs.write_text(f"# Airflow's\napache-airflow==3.3.2\n{name.upper()}==0.0.1 ; python_version >= '3.10'\n"
                      "not-in-ours==1.0\n", encoding="utf-8")
    run = subprocess.run([sys.executable, str(REPO / "scripts" / "lock.py"), "--against", str(theirs)],
                         capture_output=True, text=True)
    assert run.returncode == 1, run.stdout + run.stderr
    assert run.stdout.strip().splitlines() == [f"{name}: ours {ours[name]}, theirs 0.0.1"]
    theirs.write_text(f"apache-airflow==3.3.2\n{name}=={ours[name]}\n", encoding="utf-8")
    agreeing = subprocess.run([sys.executable, str(REPO / "scripts" / "lock.py"), "--against", str(theirs)],
                              capture_output=True, text=True)
    assert agreeing.returncode == 0 and "no pin of constraints.txt differs" in agreeing.stdout, agreeing.stdout


def test_the_release_rule_pins_what_airflow_lacks_and_what_it_picks_outside_our_range():
    """:func:`scripts.lock.release_pins` on a made-up case: one distribution Airflow lacks, one it brings at a version
    our requirement excludes (pinned with the reason), one it brings within our range (left to Airflow)."""
    dev = {"ours-only": "1.0", "celery": "5.6.3", "redis": "8.1.0"}
    baseline = {"celery": "5.7.0", "redis": "8.2.0"}
    got = lock.release_pins(dev, dict(dev), baseline, ["celery[redis]>=5.5,<5.7", "redis>=6.4,<9"], "3.3.2",
                            {"celery": "5.7 broke it"})
    assert got == {"ours-only": ("1.0", ""),
                   "celery": ("5.6.3", "we require celery[redis]<5.7,>=5.5 (5.7 broke it); a fresh resolve of "
                                       "apache-airflow==3.3.2 with the providers we name picks 5.7.0")}


def test_make_dist_ships_the_release_constraints_beside_the_wheel_under_the_version():
    makefile = (REPO / "Makefile").read_text(encoding="utf-8")
    assert "cp constraints.txt dist/constraints-$$version.txt" in makefile
    assert re.search(r"^dist:\s*$", makefile, re.MULTILINE), "`make dist` must not depend on `deps` (the dev venv)"


def test_make_dist_builds_the_release_from_a_bare_python_in_seconds(tmp_path):
    """``make dist`` in a copy of what a release is made of, with a Python that has nothing but pip (a fresh venv):
    the wheel, the release's constraints under the version, and the deploy tarball, a build context for
    deploy/Dockerfile with the DAG loader the package writes."""
    import shutil
    import tarfile
    import time

    from nexus_cutover_airflow import dags_loader

    tree = tmp_path / "tree"
    ignore = shutil.ignore_patterns("__pycache__", "*.pyc")
    tree.mkdir()
    for name in ("Makefile", "pyproject.toml", "README.md", "LICENSE", "constraints.txt"):
        shutil.copy(REPO / name, tree / name)
    for folder in ("include", "plugins", "dags", "deploy"):
        shutil.copytree(REPO / folder, tree / folder, ignore=ignore)
    subprocess.run([sys.executable, "-m", "venv", str(tmp_path / "bare")], check=True, timeout=300)
    bare = tmp_path / "bare" / "bin" / "python"
    started = time.monotonic()
    done = subprocess.run(["make", "dist", f"PYTHON={bare}"], cwd=tree, capture_output=True, text=True, timeout=300)
    took = time.monotonic() - started
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert took < 60, f"make dist took {took:.0f} s"
    version = tomllib.loads((REPO / "pyproject.toml").read_text(encoding="utf-8"))["project"]["version"]
    dist = tree / "dist"
    assert sorted(p.name for p in dist.iterdir()) == [
        f"constraints-{version}.txt", f"nexus-cutover-deploy-{version}.tar.gz", f"nexus_cutover-{version}-py3-none-any.whl"]
    assert (dist / f"constraints-{version}.txt").read_bytes() == RELEASE.read_bytes()
    top = f"nexus-cutover-deploy-{version}"
    with tarfile.open(dist / f"nexus-cutover-deploy-{version}.tar.gz") as tar:
        members = set(tar.getnames())
        loader = tar.extractfile(f"{top}/deploy/dags_folder/{dags_loader.LOADER_NAME}").read().decode()
        packed_constraints = tar.extractfile(f"{top}/constraints.txt").read()
    for member in ("deploy/Dockerfile", "deploy/helm-values.yaml", "deploy/helm-values-reference.yaml",
                   "deploy/airflow-settings.toml", "deploy/airflow_local_settings.py", "deploy/statsd/nexus-mapping.yml",
                   "deploy/prometheus/nexus-alerts.yml", "deploy/grafana/nexus-fleet.json", "LICENSE",
                   f"dist/nexus_cutover-{version}-py3-none-any.whl"):
        assert f"{top}/{member}" in members, member
    assert not [m for m in members if "__pycache__" in m]
    assert loader == dags_loader.LOADER_SOURCE and packed_constraints == RELEASE.read_bytes()

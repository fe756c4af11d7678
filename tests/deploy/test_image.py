"""The image builds (issue 49, item 2), proven without Docker: every distribution deploy/Dockerfile's ``pip install``
may install -- each pin of the release's constraints.txt, and every other distribution ``nexus-cutover[airflow,stack]``
brings, at the dev lock's version -- has a wheel on the package index for the image's Python on Linux, on both
platforms the official image is built for (x86_64 and aarch64), or is one ``scripts.deploy_settings.BUILD_DEPS``
names, whose build dependencies the Dockerfile installs as root before its pip install (the recipe check, which
parses the Dockerfile). The index is asked by pip's own resolver (``--dry-run --only-binary :all: --no-deps`` with the
image's Python and platform tags): nothing is downloaded or installed, one request per distribution lacking a wheel.
"""

from __future__ import annotations

import json
import pathlib
import re
import subprocess
import sys

import pytest

from scripts import deploy_settings, lock

REPO = pathlib.Path(__file__).resolve().parents[2]
#: The glibc of the official image's Debian (bookworm: 2.36) down to manylinux2014's 2.17 (pip widens manylinux2014 to
#: manylinux2010 and manylinux1 itself, but not manylinux_2_X to lower X).
GLIBC_MINORS = range(17, 37)
ARCHES = ("x86_64", "aarch64")


def platforms(arch: str) -> list[str]:
    return [f"manylinux2014_{arch}", *(f"manylinux_2_{minor}_{arch}" for minor in GLIBC_MINORS)]


def without_wheel(pins: dict[str, str], python: str, arch: str, tmp_path: pathlib.Path) -> list[str]:
    """The names of ``pins`` with no wheel for CPython ``python`` on Linux ``arch``: pip's dry run over all of them,
    dropping the one it names as unmatched and asking again, until it resolves."""
    remaining, missing = dict(pins), []
    requirements = tmp_path / f"pins-{arch}.txt"
    for _ in range(len(pins) + 1):
        requirements.write_text("".join(f"{name}=={version}\n" for name, version in remaining.items()), encoding="utf-8")
        cmd = [sys.executable, "-m", "pip", "install", "--quiet", "--dry-run", "--ignore-installed", "--no-deps",
               "--only-binary", ":all:", "--python-version", python, "--implementation", "cp",
               "--abi", f"cp{python.replace('.', '')}", *(a for p in platforms(arch) for a in ("--platform", p)),
               "--report", "-", "-r", str(requirements)]
        done = subprocess.run(cmd, capture_output=True, text=True, timeout=300, cwd=tmp_path)
        if done.returncode == 0:
            report = json.loads(done.stdout)
            assert {lock.canonical(i["metadata"]["name"]) for i in report["install"]} == set(remaining)
            return sorted(missing)
        unmatched = re.search(r"No matching distribution found for ([A-Za-z0-9._-]+)==", done.stderr)
        assert unmatched, done.stderr[-3000:]
        name = lock.canonical(unmatched[1])
        assert name in remaining and name not in missing, done.stderr[-3000:]
        missing.append(name)
        del remaining[name]
    raise AssertionError(f"pip never resolved: {missing}")


@pytest.fixture(scope="module")
def image_pins() -> dict[str, str]:
    """What the image's pip install may install: the product's runtime closure at the dev lock's versions (the
    release's pins are among them, at the same versions: tests/test_constraints.py)."""
    dev, release = lock.read_pins(lock.DEV_LOCK), lock.read_pins(lock.TARGET)
    runtime = lock.runtime_closure()
    assert set(release) <= set(runtime)
    return {name: release.get(name, dev[name]) for name in sorted(runtime)}


@pytest.mark.parametrize("arch", ARCHES)
def test_every_distribution_the_image_installs_has_a_wheel_or_the_dockerfile_builds_it(image_pins, arch, tmp_path):
    python = deploy_settings.load()["airflow"]["python"]
    missing = without_wheel(image_pins, python, arch, tmp_path)
    unbuildable = sorted(set(missing) - set(deploy_settings.BUILD_DEPS))
    assert not unbuildable, (f"no wheel for Python {python} on Linux {arch}: {unbuildable}. Name the Debian packages "
                             "its build needs in scripts/deploy_settings.py BUILD_DEPS and apt-get install them in "
                             "deploy/Dockerfile")
    release_without_wheel = sorted(set(missing) & set(lock.read_pins(lock.TARGET)))
    assert set(release_without_wheel) <= set(deploy_settings.BUILD_DEPS)
    # the ones built from source: the Dockerfile installs what their build needs, as root, before the pip install
    assert [line for line in deploy_settings.recipe_disagreements() if "no Linux wheel" in line] == []


def test_build_deps_names_only_what_the_product_installs():
    runtime = lock.runtime_closure()
    assert set(deploy_settings.BUILD_DEPS) <= set(runtime), sorted(set(deploy_settings.BUILD_DEPS) - set(runtime))


def test_a_dockerfile_without_the_build_deps_is_named(tmp_path):
    dockerfile = tmp_path / "Dockerfile"
    dockerfile.write_text(deploy_settings.DOCKERFILE.read_text(encoding="utf-8")
                          .replace(" pkg-config default-libmysqlclient-dev", ""), encoding="utf-8")
    found = [line for line in deploy_settings.recipe_disagreements(dockerfile=dockerfile) if "no Linux wheel" in line]
    assert found == [f"{dockerfile}: mysqlclient has no Linux wheel on PyPI and pip may build it: the image needs "
                     "pkg-config, default-libmysqlclient-dev (RUN apt-get install as USER root, before the pip install)"]

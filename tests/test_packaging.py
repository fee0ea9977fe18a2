"""The install's metadata and pins: no deprecation pages at set-up, and constraints.txt pins
every dependency the suite installs but torch (a GPU user's own build stays)."""

import re
import warnings
from pathlib import Path

import pytest
from packaging.requirements import Requirement

ROOT = Path(__file__).parent.parent


def test_the_package_metadata_is_read_without_deprecation_warnings(monkeypatch):
    pytest.importorskip("setuptools", minversion="77")  # the first that reads an SPDX license string
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)
    with warnings.catch_warnings():
        warnings.simplefilter("error")  # the table form of `license` printed pages of them at `make setup`
        dist = apply_configuration(Distribution(), "pyproject.toml")
    assert dist.metadata.license_expression == "MIT"


def pins() -> dict[str, Requirement]:
    lines = [line for line in (ROOT / "constraints.txt").read_text().splitlines() if line and not line.startswith("#")]
    return {re.sub(r"[-_.]+", "-", r.name).lower(): r for r in map(Requirement, lines)}


def test_constraints_pin_every_dependency_but_torch_within_the_ranges_pyproject_allows():
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    extras = project["optional-dependencies"]
    wanted = [Requirement(d) for d in project["dependencies"]]
    todo = ["dev"]
    while todo:  # the [dev] extra, with the extras it names expanded
        for dep in map(Requirement, extras[todo.pop()]):
            if dep.name == "omnigym":
                todo += sorted(dep.extras)
            else:
                wanted.append(dep)
    pinned = pins()
    assert not [name for name in pinned if re.match(r"(torch|triton|nvidia-|cuda-)", name)]
    for dep in wanted:
        name = re.sub(r"[-_.]+", "-", dep.name).lower()
        if name == "torch":
            continue
        assert name in pinned, f"{dep.name} is not in constraints.txt"
        version = next(iter(pinned[name].specifier)).version
        assert dep.specifier.contains(version, prereleases=True), f"{name}=={version} is outside {dep.specifier}"
    markers = {str(r.marker) for r in pinned.values()}
    assert len(markers) == 1 and "python_version" in markers.pop()  # each pin says which Python it was tested on

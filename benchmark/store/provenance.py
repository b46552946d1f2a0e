"""What produced a result: code version, package versions, hardware (modded-nanogpt records
the code and config with every run; so do we)."""

from __future__ import annotations

import functools
import importlib.metadata
import os
import re
import subprocess
from pathlib import Path

PACKAGES = (
    "shapebench",
    "torch",
    "numpy",
    "tokenizers",
    "optuna",
    "ray",
    "pandas",
    "pyarrow",
    "lm_eval",
)


@functools.cache
def code_version() -> str:
    """The git commit of this checkout (with '+dirty' for uncommitted changes), else the
    installed package version."""
    root = Path(__file__).resolve().parent.parent
    try:
        sha = subprocess.run(
            ["git", "rev-parse", "--short=12", "HEAD"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
            check=True,
        ).stdout.strip()
        dirty = subprocess.run(
            ["git", "status", "--porcelain", "--untracked-files=no"],
            cwd=root,
            capture_output=True,
            text=True,
            timeout=5,
        ).stdout.strip()
        return sha + ("+dirty" if dirty else "")
    except (OSError, subprocess.SubprocessError):
        return "shapebench " + _version("shapebench")


def _version(name: str) -> str:
    try:
        return importlib.metadata.version(name)
    except importlib.metadata.PackageNotFoundError:
        return "absent"


@functools.cache
def package_versions() -> dict[str, str]:
    return {name: _version(name.replace("_", "-")) for name in PACKAGES}


@functools.cache
def hardware(hc_kernels: bool = False) -> str:
    """This process's: the row's `hardware` of a run trained here; `hc_kernels`: whether its
    hyper-connections run on the Triton kernels (models/kernels.in_use, asked by the caller: the
    store sits below the models)."""
    import torch

    return machine(torch.get_num_threads(), *gpus(), hc_kernels=hc_kernels)


def gpus() -> tuple[int, str]:
    """(how many GPUs torch sees here, the first one's name; "" without one)."""
    import torch

    count = torch.cuda.device_count() if torch.cuda.is_available() else 0
    return count, torch.cuda.get_device_name(0) if count else ""


def machine(threads: int, gpus: int = 0, gpu_name: str = "", hc_kernels: bool = False) -> str:
    """A run's `hardware` on this machine: its CPU (speeds.cpu_name), its CPU count, the torch
    threads the run trains with and the GPUs it sees (`gpus` of `gpu_name`; none: a CPU run), and
    where its hyper-connections run on the Triton kernels (`hc_kernels`, a GPU's only:
    models/kernels), that: they round unlike torch's code, so a run on them is not one without
    them (search/reuse.py), as a run on another CPU is not."""
    from benchmark.store.speeds import cpu_name

    gpu = f", {gpus} x {gpu_name}" if gpus else ""
    if gpus and hc_kernels:
        gpu += ", Triton HC kernels"
    return f"{cpu_name()} ({os.cpu_count()} cpus, {threads} torch threads){gpu}"


# What `machine` writes for the threads, read back where a row is trained again (search/replay).
_THREADS = re.compile(r"\((\d+) cpus, (\d+) torch threads\)")


def machine_threads(hardware: str) -> int | None:
    """The torch threads a row's `hardware` (as `machine` wrote it) says its run trained with;
    None where it does not say (a row of an older format)."""
    found = _THREADS.search(hardware)
    return int(found.group(2)) if found else None

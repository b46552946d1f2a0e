"""Fused Triton kernels for the hyper-connections' hot path (hc.py): the gates' normed
projection, the read u = H_pre Y, the write H_res Y + H_post ⊗ F, and Sinkhorn with a
recomputing backward (mHC §4.3.1). models/hyper.py calls them for CUDA tensors only, and only
where SHAPEBENCH_HC_KERNELS=triton asks for them (`fused`): measured on a GPU, torch.compile's
fusion of the PyTorch code ran every hyper family faster than these kernels (their Sinkhorn
backward above all; benchmarks/2026-11-26-hc-kernels-h200.md), so that code is the default
everywhere. Tests run the kernels under TRITON_INTERPRET=1, and compiled on a GPU where there is one.
"""

from __future__ import annotations

import os
from functools import cache

ENV = "SHAPEBENCH_HC_KERNELS"  # `triton`: the connections' hot path on these kernels (CUDA tensors)


def chosen() -> bool:
    """Whether the user asked for the Triton kernels (ENV=triton); any other value is refused."""
    value = os.environ.get(ENV, "torch").strip().lower() or "torch"
    if value not in ("torch", "triton"):
        raise ValueError(f"{ENV}={value!r}: expected triton or torch")
    return value == "triton"


def in_use() -> bool:
    """Whether a CUDA run here takes the Triton kernels: asked for (chosen) and able to (available).
    A row's `hardware` says so (store/provenance.machine), for their sums round unlike torch's."""
    return chosen() and available()


@cache
def available() -> bool:
    """Whether triton imports (torch's CUDA wheels depend on it; its CPU wheels do not) and finds
    a GPU driver to compile for: a machine without one (or one whose CUDA tensors are simulated,
    as tests/fake_cuda.py does) runs the PyTorch path."""
    try:
        from triton.runtime import driver

        driver.active.get_current_target()
    except Exception:  # ImportError, or no libcuda / ROCm runtime: triton says so in its own types
        return False
    return True

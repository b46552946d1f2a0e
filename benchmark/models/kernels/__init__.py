"""Fused Triton kernels for the hyper-connections' hot path (hc.py): the gates' normed
projection, the read u = H_pre Y, the write H_res Y + H_post ⊗ F, and Sinkhorn with a
recomputing backward (mHC §4.3.1). models/hyper.py calls them for CUDA tensors only (`fused`);
on a CPU the PyTorch code there runs, and tests run these kernels under TRITON_INTERPRET=1."""

from __future__ import annotations

from functools import cache


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

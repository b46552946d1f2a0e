"""Fused Triton kernels for the hyper-connections' hot path (hc.py): the gates' normed
projection, the read u = H_pre Y, the write H_res Y + H_post ⊗ F, and Sinkhorn with a
recomputing backward (mHC §4.3.1). models/hyper.py calls them for CUDA tensors only (`fused`);
on a CPU the PyTorch code there runs, and tests run these kernels under TRITON_INTERPRET=1."""

from __future__ import annotations

from functools import cache


@cache
def available() -> bool:
    """Whether triton imports (torch's CUDA wheels depend on it; its CPU wheels do not)."""
    try:
        import triton  # noqa: F401
    except ImportError:
        return False
    return True

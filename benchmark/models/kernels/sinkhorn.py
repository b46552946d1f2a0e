"""mHC's Sinkhorn (eq. 9) as a Triton kernel registered as torch custom ops
(`shapebench::hc_sinkhorn`), forward and backward: hyper.sinkhorn's column softmax, then
alternating row and column normalisations, one (n, n) matrix per program (n padded to a power of
two); the backward recomputes the iterations on chip instead of storing them (mHC §4.3.1).
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

from benchmark.models.kernels.hc import _np


@triton.jit
def _col_softmax(x, ok):
    """softmax over the rows i of each column j (hyper.sinkhorn's first normalisation)."""
    e = tl.exp(x - tl.max(x, axis=0)[None, :])
    e = tl.where(ok, e, 0.0)
    return tl.where(ok, e / tl.sum(e, axis=0)[None, :], 0.0)


@triton.jit
def _divisor(mat, rows, NP: tl.constexpr):
    """Each entry's row sum (rows) or column sum, unclamped, as an (NP, NP) tile."""
    rs = tl.broadcast_to(tl.sum(mat, axis=1)[:, None], (NP, NP))
    cs = tl.broadcast_to(tl.sum(mat, axis=0)[None, :], (NP, NP))
    return tl.where(rows, rs, cs)


@triton.jit
def _sinkhorn_fwd(X, Z, floor, n: tl.constexpr, NP: tl.constexpr, ITERS: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, NP)
    ok = (i[:, None] < n) & (i[None, :] < n)
    offs = m * n * n + i[:, None] * n + i[None, :]
    x = tl.load(X + offs, mask=ok, other=-1e30).to(tl.float32)
    mat = _col_softmax(x, ok)
    for s in range(1, 2 * ITERS):  # step s divides by row sums when s is odd, column sums when even
        mat = mat / tl.maximum(_divisor(mat, s % 2 == 1, NP), floor)
    tl.store(Z + offs, mat, mask=ok)


@triton.jit
def _sinkhorn_bwd(X, G, DX, floor, n: tl.constexpr, NP: tl.constexpr, ITERS: tl.constexpr):
    m = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, NP)
    ok = (i[:, None] < n) & (i[None, :] < n)
    offs = m * n * n + i[:, None] * n + i[None, :]
    x = tl.load(X + offs, mask=ok, other=-1e30).to(tl.float32)
    g = tl.load(G + offs, mask=ok, other=0.0).to(tl.float32)
    for back in range(0, 2 * ITERS - 1):  # steps t = 2 ITERS - 1, ..., 1, last first
        t = 2 * ITERS - 1 - back
        mat = _col_softmax(x, ok)  # recompute step t's input: steps 0 .. t - 1
        for s in range(1, t):
            mat = mat / tl.maximum(_divisor(mat, s % 2 == 1, NP), floor)
        rows = t % 2 == 1
        div = _divisor(mat, rows, NP)
        clamped = tl.maximum(div, floor)
        gy = g * (mat / clamped)
        dot = _divisor(gy, rows, NP)  # Σ over the same row or column of G ∘ out
        g = tl.where(ok, (g - tl.where(div >= floor, dot, 0.0)) / clamped, 0.0)
    p = _col_softmax(x, ok)
    dx = p * (g - tl.sum(g * p, axis=0)[None, :])
    tl.store(DX + offs, dx, mask=ok)


# ---- custom ops --------------------------------------------------------------------------------


@torch.library.custom_op("shapebench::hc_sinkhorn", mutates_args=())
def _sinkhorn(logits: torch.Tensor, iters: int, floor: float) -> torch.Tensor:
    M, n, _ = logits.shape
    out = torch.empty_like(logits)
    _sinkhorn_fwd[(M,)](logits, out, floor, n, _np(n), iters)
    return out


@_sinkhorn.register_fake
def _(logits, iters, floor):
    return torch.empty_like(logits)


@torch.library.custom_op("shapebench::hc_sinkhorn_bwd", mutates_args=())
def _sinkhorn_backward(
    logits: torch.Tensor, g: torch.Tensor, iters: int, floor: float
) -> torch.Tensor:
    M, n, _ = logits.shape
    dx = torch.empty_like(logits)
    _sinkhorn_bwd[(M,)](logits, g.contiguous(), dx, floor, n, _np(n), iters)
    return dx


@_sinkhorn_backward.register_fake
def _(logits, g, iters, floor):
    return torch.empty_like(logits)


def _sinkhorn_setup(ctx, inputs, output):
    logits, ctx.iters, ctx.floor = inputs
    ctx.save_for_backward(logits)


def _sinkhorn_grad(ctx, g):
    (logits,) = ctx.saved_tensors
    return _sinkhorn_backward(logits, g, ctx.iters, ctx.floor), None, None


_sinkhorn.register_autograd(_sinkhorn_grad, setup_context=_sinkhorn_setup)


def sinkhorn(logits: torch.Tensor, iters: int, floor: float) -> torch.Tensor:
    """hyper.sinkhorn on (..., n, n) float32 logits, dividing by sums of at least `floor`."""
    n = logits.shape[-1]
    return _sinkhorn(logits.contiguous().reshape(-1, n, n), iters, floor).reshape(logits.shape)

"""Triton kernels for hyper-connections (HC, mHC, Hyperloop), forward and backward, registered as
torch custom ops (`shapebench::hc_*`) so that torch.compile keeps each as one node of its graph.

What they compute is models/hyper.py's PyTorch path, with the mHC paper's precision (eq. 10-19):
the streams Y (M, n, d) are read in their storage dtype (bf16 or fp32) and every product and sum
runs in fp32; the write stores Y' in the streams' dtype.

  normed_linear   (x W^T) * rsqrt(mean(x²) + eps), x (M, K), W (N, K): one pass over x for the
                  projection and its norm (mHC §4.3.1); backward: one pass for dx, one for dW
  read            u = Σ_i H_pre[i] Y_i: one pass over Y; backward: dY and dH_pre in one pass
  write           Y'_i = Σ_j H_res[i, j] Y_j + H_post[i] F, with H_res full (mHC, HC), diagonal
                  (Hyperloop) or none: one pass; backward: dY, dF, dH_post, dH_res in one pass
  sinkhorn        in sinkhorn.py

Why not Liger-Kernel's `ops/mhc.py` (the closest kept library): its normed projection is ours,
but its Sinkhorn starts with a row softmax and adds eps to every divisor (ours: a column softmax
and a floor), its H_pre is σ + eps (ours (2/n) σ), its write always writes fp32 and takes a full
H_res only (Hyperloop's is diagonal, HC's static one is shared), and none of it has HC's gates.

Each program of read and write handles one row (token); n is padded to a power of two.
"""

from __future__ import annotations

import torch
import triton
import triton.language as tl

BLOCK_D = 512  # stream elements per step of the row kernels' loop over d
BLOCK_M, BLOCK_K = 32, 64  # normed_linear's tiles (tl.dot needs 16 or more on each side)
DW_SPLIT = 8  # normed_linear's dW: partial sums over this many slices of the rows
WRITE_KINDS = {"none": 0, "diagonal": 1, "full": 2}


def _np(n: int) -> int:
    return triton.next_power_of_2(n)


def _block_d(d: int) -> int:
    return min(triton.next_power_of_2(d), BLOCK_D)


# ---- kernels ---------------------------------------------------------------------------------


@triton.jit
def _read_fwd(
    Y, P, U, d, sy_m, sy_n, sp_m, sp_n, n: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr
):
    m = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, NP)
    pre = tl.load(P + m * sp_m + i * sp_n, mask=i < n, other=0.0).to(tl.float32)
    for d0 in range(0, d, BD):
        c = d0 + tl.arange(0, BD)
        mask = (i[:, None] < n) & (c[None, :] < d)
        y = tl.load(Y + m * sy_m + i[:, None] * sy_n + c[None, :], mask=mask, other=0.0).to(
            tl.float32
        )
        tl.store(U + m * d + c, tl.sum(pre[:, None] * y, axis=0), mask=c < d)


@triton.jit
def _read_bwd(
    Y, P, DU, DY, DP, d, sy_m, sy_n, sp_m, sp_n, n: tl.constexpr, NP: tl.constexpr, BD: tl.constexpr
):
    m = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, NP)
    pre = tl.load(P + m * sp_m + i * sp_n, mask=i < n, other=0.0).to(tl.float32)
    dpre = tl.zeros((NP,), tl.float32)
    for d0 in range(0, d, BD):
        c = d0 + tl.arange(0, BD)
        mask = (i[:, None] < n) & (c[None, :] < d)
        du = tl.load(DU + m * d + c, mask=c < d, other=0.0).to(tl.float32)
        y = tl.load(Y + m * sy_m + i[:, None] * sy_n + c[None, :], mask=mask, other=0.0).to(
            tl.float32
        )
        dy = pre[:, None] * du[None, :]
        tl.store(
            DY + m * n * d + i[:, None] * d + c[None, :], dy.to(DY.dtype.element_ty), mask=mask
        )
        dpre += tl.sum(du[None, :] * y, axis=1)
    tl.store(DP + m * n + i, dpre, mask=i < n)


@triton.jit
def _write_fwd(
    Y,
    O,
    P,
    R,
    Z,
    d,
    sy_m,
    sy_n,
    so_m,
    sp_m,
    sp_n,
    sr_m,
    sr_i,
    sr_j,
    n: tl.constexpr,
    NP: tl.constexpr,
    BD: tl.constexpr,
    KIND: tl.constexpr,
):
    m = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, NP)
    ok = i < n
    post = tl.load(P + m * sp_m + i * sp_n, mask=ok, other=0.0).to(tl.float32)
    for d0 in range(0, d, BD):
        c = d0 + tl.arange(0, BD)
        mask = ok[:, None] & (c[None, :] < d)
        y = tl.load(Y + m * sy_m + i[:, None] * sy_n + c[None, :], mask=mask, other=0.0).to(
            tl.float32
        )
        o = tl.load(O + m * so_m + c, mask=c < d, other=0.0).to(tl.float32)
        if KIND == 2:  # Σ_j H_res[i, j] Y_j
            r = tl.load(
                R + m * sr_m + i[:, None] * sr_i + i[None, :] * sr_j,
                mask=ok[:, None] & ok[None, :],
                other=0.0,
            ).to(tl.float32)
            acc = tl.sum(r[:, :, None] * y[None, :, :], axis=1)
        elif KIND == 1:  # diag(H_res) Y
            r = tl.load(R + m * sr_m + i * sr_i, mask=ok, other=0.0).to(tl.float32)
            acc = r[:, None] * y
        else:
            acc = y
        acc += post[:, None] * o[None, :]
        tl.store(Z + m * n * d + i[:, None] * d + c[None, :], acc.to(Z.dtype.element_ty), mask=mask)


@triton.jit
def _write_bwd(
    G,
    Y,
    O,
    P,
    R,
    DY,
    DO,
    DP,
    DR,
    d,
    sy_m,
    sy_n,
    so_m,
    sp_m,
    sp_n,
    sr_m,
    sr_i,
    sr_j,
    n: tl.constexpr,
    NP: tl.constexpr,
    BD: tl.constexpr,
    KIND: tl.constexpr,
):
    m = tl.program_id(0).to(tl.int64)
    i = tl.arange(0, NP)
    ok = i < n
    post = tl.load(P + m * sp_m + i * sp_n, mask=ok, other=0.0).to(tl.float32)
    dpost = tl.zeros((NP,), tl.float32)
    dres_full = tl.zeros((NP, NP), tl.float32)
    dres_diag = tl.zeros((NP,), tl.float32)
    for d0 in range(0, d, BD):
        c = d0 + tl.arange(0, BD)
        mask = ok[:, None] & (c[None, :] < d)
        g = tl.load(G + m * n * d + i[:, None] * d + c[None, :], mask=mask, other=0.0).to(
            tl.float32
        )
        o = tl.load(O + m * so_m + c, mask=c < d, other=0.0).to(tl.float32)
        if KIND == 2:  # dY_j = Σ_i H_res[i, j] G_i;  dH_res[i, j] = <G_i, Y_j>
            r = tl.load(
                R + m * sr_m + i[:, None] * sr_i + i[None, :] * sr_j,
                mask=ok[:, None] & ok[None, :],
                other=0.0,
            ).to(tl.float32)
            y = tl.load(Y + m * sy_m + i[:, None] * sy_n + c[None, :], mask=mask, other=0.0).to(
                tl.float32
            )
            dy = tl.sum(r[:, :, None] * g[:, None, :], axis=0)
            dres_full += tl.sum(g[:, None, :] * y[None, :, :], axis=2)
        elif KIND == 1:
            r = tl.load(R + m * sr_m + i * sr_i, mask=ok, other=0.0).to(tl.float32)
            y = tl.load(Y + m * sy_m + i[:, None] * sy_n + c[None, :], mask=mask, other=0.0).to(
                tl.float32
            )
            dy = r[:, None] * g
            dres_diag += tl.sum(g * y, axis=1)
        else:
            dy = g
        tl.store(
            DY + m * n * d + i[:, None] * d + c[None, :], dy.to(DY.dtype.element_ty), mask=mask
        )
        tl.store(
            DO + m * d + c, tl.sum(post[:, None] * g, axis=0).to(DO.dtype.element_ty), mask=c < d
        )
        dpost += tl.sum(g * o[None, :], axis=1)
    tl.store(DP + m * n + i, dpost, mask=ok)
    if KIND == 2:
        tl.store(
            DR + m * n * n + i[:, None] * n + i[None, :], dres_full, mask=ok[:, None] & ok[None, :]
        )
    elif KIND == 1:
        tl.store(DR + m * n + i, dres_diag, mask=ok)


@triton.jit
def _normed_linear_fwd(
    X, W, Z, RS, M, K, N, sx_m, sw_n, eps, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rn = tl.arange(0, BN)
    acc = tl.zeros((BM, BN), tl.float32)
    ss = tl.zeros((BM,), tl.float32)
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        x = tl.load(
            X + rm[:, None] * sx_m + rk[None, :],
            mask=(rm[:, None] < M) & (rk[None, :] < K),
            other=0.0,
        ).to(tl.float32)
        w = tl.load(
            W + rn[None, :] * sw_n + rk[:, None],
            mask=(rn[None, :] < N) & (rk[:, None] < K),
            other=0.0,
        ).to(tl.float32)
        acc = tl.dot(x, w, acc)
        ss += tl.sum(x * x, axis=1)
    r = tl.rsqrt(ss / K + eps)
    tl.store(
        Z + rm[:, None] * N + rn[None, :],
        acc * r[:, None],
        mask=(rm[:, None] < M) & (rn[None, :] < N),
    )
    tl.store(RS + rm, r, mask=rm < M)


@triton.jit
def _normed_linear_dx(
    X, W, Z, RS, G, DX, M, K, N, sx_m, sw_n, BM: tl.constexpr, BN: tl.constexpr, BK: tl.constexpr
):
    # z = (x W^T) r, r = (mean(x²) + eps)^-1/2:  dx = (g r) W - (Σ_n g z) r² x / K
    rm = tl.program_id(0).to(tl.int64) * BM + tl.arange(0, BM)
    rn = tl.arange(0, BN)
    mn = (rm[:, None] < M) & (rn[None, :] < N)
    g = tl.load(G + rm[:, None] * N + rn[None, :], mask=mn, other=0.0).to(tl.float32)
    z = tl.load(Z + rm[:, None] * N + rn[None, :], mask=mn, other=0.0)
    r = tl.load(RS + rm, mask=rm < M, other=0.0)
    dp = g * r[:, None]
    coef = -tl.sum(g * z, axis=1) * r * r / K
    for k0 in range(0, K, BK):
        rk = k0 + tl.arange(0, BK)
        mk = (rm[:, None] < M) & (rk[None, :] < K)
        w = tl.load(
            W + rn[:, None] * sw_n + rk[None, :],
            mask=(rn[:, None] < N) & (rk[None, :] < K),
            other=0.0,
        ).to(tl.float32)
        x = tl.load(X + rm[:, None] * sx_m + rk[None, :], mask=mk, other=0.0).to(tl.float32)
        dx = tl.dot(dp, w) + coef[:, None] * x
        tl.store(DX + rm[:, None] * K + rk[None, :], dx.to(DX.dtype.element_ty), mask=mk)


@triton.jit
def _normed_linear_dw(
    X,
    RS,
    G,
    DWP,
    M,
    K,
    N,
    sx_m,
    SPLIT: tl.constexpr,
    BM: tl.constexpr,
    BN: tl.constexpr,
    BK: tl.constexpr,
):
    # dW = (g r)^T x, one slice of the rows per program along axis 1, summed by the caller
    rk = tl.program_id(0) * BK + tl.arange(0, BK)
    part = tl.program_id(1)
    rn = tl.arange(0, BN)
    acc = tl.zeros((BN, BK), tl.float32)
    for m0 in range(part * BM, M, SPLIT * BM):
        rm = m0 + tl.arange(0, BM)
        g = tl.load(
            G + rm[:, None] * N + rn[None, :], mask=(rm[:, None] < M) & (rn[None, :] < N), other=0.0
        )
        r = tl.load(RS + rm, mask=rm < M, other=0.0)
        x = tl.load(
            X + rm[:, None].to(tl.int64) * sx_m + rk[None, :],
            mask=(rm[:, None] < M) & (rk[None, :] < K),
            other=0.0,
        ).to(tl.float32)
        acc = tl.dot(tl.trans(g * r[:, None]), x, acc)
    tl.store(
        DWP + part * N * K + rn[:, None] * K + rk[None, :],
        acc,
        mask=(rn[:, None] < N) & (rk[None, :] < K),
    )


# ---- custom ops --------------------------------------------------------------------------------
# Flat shapes: Y (M, n, d) with unit stride along d; gates (M, n) and (M, n, n), any row strides
# (HC's static gates come expanded with stride 0).


@torch.library.custom_op("shapebench::hc_read", mutates_args=())
def _read(Y: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    M, n, d = Y.shape
    u = torch.empty(M, d, device=Y.device, dtype=torch.float32)
    _read_fwd[(M,)](
        Y, pre, u, d, Y.stride(0), Y.stride(1), pre.stride(0), pre.stride(1), n, _np(n), _block_d(d)
    )
    return u


@_read.register_fake
def _(Y, pre):
    return Y.new_empty(Y.shape[0], Y.shape[2], dtype=torch.float32)


@torch.library.custom_op("shapebench::hc_read_bwd", mutates_args=())
def _read_backward(
    Y: torch.Tensor, pre: torch.Tensor, du: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    M, n, d = Y.shape
    dY = torch.empty(M, n, d, device=Y.device, dtype=Y.dtype)
    dpre = torch.empty(M, n, device=Y.device, dtype=torch.float32)
    _read_bwd[(M,)](
        Y,
        pre,
        du.contiguous(),
        dY,
        dpre,
        d,
        Y.stride(0),
        Y.stride(1),
        pre.stride(0),
        pre.stride(1),
        n,
        _np(n),
        _block_d(d),
    )
    return dY, dpre


@_read_backward.register_fake
def _(Y, pre, du):
    return torch.empty_like(Y, memory_format=torch.contiguous_format), Y.new_empty(
        Y.shape[:2], dtype=torch.float32
    )


def _read_setup(ctx, inputs, output):
    ctx.save_for_backward(*inputs)


def _read_grad(ctx, du):
    Y, pre = ctx.saved_tensors
    dY, dpre = _read_backward(Y, pre, du)
    return dY, dpre.to(pre.dtype)


_read.register_autograd(_read_grad, setup_context=_read_setup)


def _res_strides(res: torch.Tensor | None, kind: int) -> tuple[int, int, int]:
    if kind == 2:
        return res.stride(0), res.stride(1), res.stride(2)
    return (res.stride(0), res.stride(1), 0) if kind == 1 else (0, 0, 0)


@torch.library.custom_op("shapebench::hc_write", mutates_args=())
def _write(
    Y: torch.Tensor,
    out: torch.Tensor,
    post: torch.Tensor,
    res: torch.Tensor | None,
    kind: int,
    dtype: torch.dtype,
) -> torch.Tensor:
    M, n, d = Y.shape
    Z = torch.empty(M, n, d, device=Y.device, dtype=dtype)
    _write_fwd[(M,)](
        Y,
        out,
        post,
        Y if res is None else res,
        Z,
        d,
        Y.stride(0),
        Y.stride(1),
        out.stride(0),
        post.stride(0),
        post.stride(1),
        *_res_strides(res, kind),
        n,
        _np(n),
        _block_d(d),
        kind,
    )
    return Z


@_write.register_fake
def _(Y, out, post, res, kind, dtype):
    return Y.new_empty(Y.shape, dtype=dtype)


@torch.library.custom_op("shapebench::hc_write_bwd", mutates_args=())
def _write_backward(
    g: torch.Tensor,
    Y: torch.Tensor,
    out: torch.Tensor,
    post: torch.Tensor,
    res: torch.Tensor | None,
    kind: int,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor, torch.Tensor]:
    M, n, d = Y.shape
    dY = torch.empty(M, n, d, device=Y.device, dtype=Y.dtype)
    dout = torch.empty(M, d, device=Y.device, dtype=out.dtype)
    dpost = torch.empty(M, n, device=Y.device, dtype=torch.float32)
    dres = torch.empty(
        *((M, n, n) if kind == 2 else (M, n) if kind == 1 else (0,)),
        device=Y.device,
        dtype=torch.float32,
    )
    _write_bwd[(M,)](
        g.contiguous(),
        Y,
        out,
        post,
        Y if res is None else res,
        dY,
        dout,
        dpost,
        dres,
        d,
        Y.stride(0),
        Y.stride(1),
        out.stride(0),
        post.stride(0),
        post.stride(1),
        *_res_strides(res, kind),
        n,
        _np(n),
        _block_d(d),
        kind,
    )
    return dY, dout, dpost, dres


@_write_backward.register_fake
def _(g, Y, out, post, res, kind):
    M, n, d = Y.shape
    dres = Y.new_empty(
        *((M, n, n) if kind == 2 else (M, n) if kind == 1 else (0,)), dtype=torch.float32
    )
    return (
        torch.empty_like(Y, memory_format=torch.contiguous_format),
        out.new_empty(M, d),
        Y.new_empty(M, n, dtype=torch.float32),
        dres,
    )


def _write_setup(ctx, inputs, output):
    Y, out, post, res, kind, _ = inputs
    ctx.kind = kind
    ctx.save_for_backward(Y, out, post, res)


def _write_grad(ctx, g):
    Y, out, post, res = ctx.saved_tensors
    dY, dout, dpost, dres = _write_backward(g, Y, out, post, res, ctx.kind)
    return dY, dout, dpost.to(post.dtype), None if res is None else dres.to(res.dtype), None, None


_write.register_autograd(_write_grad, setup_context=_write_setup)


@torch.library.custom_op("shapebench::hc_normed_linear", mutates_args=())
def _normed_linear(
    x: torch.Tensor, weight: torch.Tensor, eps: float
) -> tuple[torch.Tensor, torch.Tensor]:
    M, K = x.shape
    N = weight.shape[0]
    z = torch.empty(M, N, device=x.device, dtype=torch.float32)
    r = torch.empty(M, device=x.device, dtype=torch.float32)
    _normed_linear_fwd[(triton.cdiv(M, BLOCK_M),)](
        x,
        weight,
        z,
        r,
        M,
        K,
        N,
        x.stride(0),
        weight.stride(0),
        eps,
        BLOCK_M,
        max(16, _np(N)),
        BLOCK_K,
    )
    return z, r


@_normed_linear.register_fake
def _(x, weight, eps):
    return x.new_empty(x.shape[0], weight.shape[0], dtype=torch.float32), x.new_empty(
        x.shape[0], dtype=torch.float32
    )


@torch.library.custom_op("shapebench::hc_normed_linear_bwd", mutates_args=())
def _normed_linear_backward(
    x: torch.Tensor, weight: torch.Tensor, z: torch.Tensor, r: torch.Tensor, g: torch.Tensor
) -> tuple[torch.Tensor, torch.Tensor]:
    M, K = x.shape
    N = weight.shape[0]
    g = g.contiguous()
    dx = torch.empty(M, K, device=x.device, dtype=x.dtype)
    _normed_linear_dx[(triton.cdiv(M, BLOCK_M),)](
        x,
        weight,
        z,
        r,
        g,
        dx,
        M,
        K,
        N,
        x.stride(0),
        weight.stride(0),
        BLOCK_M,
        max(16, _np(N)),
        BLOCK_K,
    )
    parts = torch.empty(DW_SPLIT, N, K, device=x.device, dtype=torch.float32)
    _normed_linear_dw[(triton.cdiv(K, BLOCK_K), DW_SPLIT)](
        x, r, g, parts, M, K, N, x.stride(0), DW_SPLIT, BLOCK_M, max(16, _np(N)), BLOCK_K
    )
    return dx, parts.sum(0).to(weight.dtype)


@_normed_linear_backward.register_fake
def _(x, weight, z, r, g):
    return torch.empty_like(x, memory_format=torch.contiguous_format), torch.empty_like(weight)


def _normed_linear_setup(ctx, inputs, output):
    x, weight, _ = inputs
    ctx.save_for_backward(x, weight, *output)


def _normed_linear_grad(ctx, dz, dr):
    x, weight, z, r = ctx.saved_tensors
    dx, dw = _normed_linear_backward(x, weight, z, r, dz)
    return dx, dw, None


_normed_linear.register_autograd(_normed_linear_grad, setup_context=_normed_linear_setup)


# ---- what models/hyper.py calls: its shapes in, its shapes out ---------------------------------


def _rows(x: torch.Tensor, inner: int) -> torch.Tensor:
    """x (..., *inner dims) as rows with a unit stride along the last dimension."""
    x = x if x.stride(-1) == 1 else x.contiguous()
    return x.reshape(-1, *x.shape[x.dim() - inner :])


def normed_linear(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """hyper.normed_linear: (..., K) x (N, K) -> (..., N) float32."""
    z, _ = _normed_linear(
        _rows(x, 1), weight if weight.is_contiguous() else weight.contiguous(), eps
    )
    return z.reshape(*x.shape[:-1], weight.shape[0])


def read(Y: torch.Tensor, pre: torch.Tensor) -> torch.Tensor:
    """hyper.weigh: u = H_pre Y, Y (..., n, d), H_pre (..., n) or one (n,) for every token -> (..., d) float32."""
    lead, (n, d) = Y.shape[:-2], Y.shape[-2:]
    pre = pre.float().expand(*lead, n).reshape(-1, n)
    return _read(_rows(Y, 2), pre).reshape(*lead, d)


def write(
    Y: torch.Tensor,
    out: torch.Tensor,
    post: torch.Tensor,
    res: torch.Tensor | None,
    dtype: torch.dtype,
) -> torch.Tensor:
    """Connection.write: Y' = H_res Y + H_post ⊗ out stored as `dtype`; H_res None (identity),
    (..., n) (diagonal) or (..., n, n), each gate possibly one for every token."""
    lead, (n, d) = Y.shape[:-2], Y.shape[-2:]
    post = post.float().expand(*lead, n).reshape(-1, n)
    kind = 0
    if res is not None:
        kind = 1 if res.dim() == Y.dim() - 1 else 2
        res = res.float().expand(*lead, *res.shape[-kind:]).reshape(-1, *res.shape[-kind:])
    return _write(_rows(Y, 2), _rows(out.expand(*lead, d), 1), post, res, kind, dtype).reshape(
        Y.shape
    )

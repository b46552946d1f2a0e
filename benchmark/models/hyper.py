"""Hyper-connections: n parallel residual streams Y (B, T, n, d) that a wrapped span of the
network reads from and writes to (Zhu et al. 2025; mHC; Hyperloop §3).

One rule for every placement (sublayer, layer, k layers, loop): the connection replaces the
identity path around its span. With u = H_pre Y and Δ = span(u) - u (for a sublayer, Δ is the
sublayer's branch itself),

    Y' = H_res Y + H_post ⊗ Δ                                   (Hyperloop eq. 3, mHC eq. 3)

so with one stream and H_pre = H_post = H_res = 1 the span is an ordinary residual block and
the network is exactly its plain counterpart. Layers inside a span keep their own residuals
(Hyperloop §4.3, "Number of hyper-connections").
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from .layers import RMSNorm

GATE_SCALE_INIT = 0.01  # mHC's α / HC's s_α, s_β: the input-dependent part starts small
# Diagonal H_res = σ(b) at initialisation. σ(3) = 0.95: close to the identity path (the HC
# paper's §2.3 principle: start near the Pre-Norm residual) while leaving gradient to learn.
DIAGONAL_BIAS_INIT = 3.0


def sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """Sinkhorn-Knopp: exp, then alternate column and row normalisation (mHC), done in log
    space for stability and in float32 even under autocast. (..., n, n) -> doubly stochastic."""
    with torch.autocast(device_type=logits.device.type, enabled=False):
        z = logits.float()
        for _ in range(iters):
            z = z - torch.logsumexp(z, dim=-2, keepdim=True)  # columns sum to 1
            z = z - torch.logsumexp(z, dim=-1, keepdim=True)  # rows sum to 1
        return z.exp()


class SigmoidGate(nn.Module):
    """Input-dependent gates of mHC and Hyperloop (Hyperloop §2.2 and §3):

        z = RMSNorm(flatten(Y))                         (no affine weight, as in mHC)
        H_pre  = (2/n) σ(α_pre  W_pre z + b_pre)        -> (B, T, n)
        H_post = 2 σ(α_post W_post z + b_post)          -> (B, T, n)
        H_res  = I | diag(σ(α_res W_res z + b_res)) | sinkhorn(α_res W_res z + b_res)

    The 2/n factor on H_pre (the paper's σ for n = 2) makes the read-out at initialisation the
    mean of the streams, so one stream with identity mixing is exactly a residual connection.
    """

    def __init__(self, d: int, n: int, mixing: str, sinkhorn_iters: int = 20):
        super().__init__()
        self.n, self.mixing, self.iters = n, mixing, sinkhorn_iters
        n_res = {"identity": 0, "diagonal": n, "sinkhorn": n * n}[mixing]
        self.norm = RMSNorm(n * d, affine=False)
        self.weight = nn.Parameter(torch.zeros(2 * n + n_res, n * d))
        res_bias = torch.full((n_res,), DIAGONAL_BIAS_INIT if mixing == "diagonal" else 0.0)
        self.bias = nn.Parameter(torch.cat([torch.zeros(2 * n), res_bias]))
        self.alpha = nn.Parameter(torch.full((3 if n_res else 2,), GATE_SCALE_INIT))

    def forward(self, Y: torch.Tensor):
        B, T, n, d = Y.shape
        logits = F.linear(self.norm(Y.reshape(B, T, n * d)), self.weight)  # (B, T, 2n + n_res)
        pre = (2.0 / n) * torch.sigmoid(self.alpha[0] * logits[..., :n] + self.bias[:n])
        post = 2.0 * torch.sigmoid(self.alpha[1] * logits[..., n:2 * n] + self.bias[n:2 * n])
        if self.mixing == "identity":
            return pre, post, None
        res = self.alpha[2] * logits[..., 2 * n:] + self.bias[2 * n:]
        if self.mixing == "diagonal":
            return pre, post, torch.sigmoid(res)                       # (B, T, n)
        return pre, post, sinkhorn(res.view(B, T, n, n), self.iters)     # (B, T, n, n)


class ZhuGate(nn.Module):
    """Static or dynamic hyper-connections (Zhu et al. 2025, eq. 1-14). Static: learnable
    B (1 x n), A_m (n x 1), A_r (n x n). Dynamic adds s ∘ tanh(norm(H) W) per stream (eq. 10-13),
    or s ∘ norm(H) W without the tanh (the paper's "W/O tanh" ablation).
    Initialised (eq. 14) so the network equals a Pre-Norm residual: W = 0, B = 1,
    A_m = e_{k mod n}, A_r = I."""

    def __init__(self, d: int, n: int, index: int, dynamic: bool, tanh: bool = True):
        super().__init__()
        self.n = n
        am = torch.zeros(n)
        am[index % n] = 1.0
        self.static_beta = nn.Parameter(torch.ones(n))
        self.static_am = nn.Parameter(am)
        self.static_ar = nn.Parameter(torch.eye(n))
        self.dynamic, self.tanh = dynamic, tanh
        if dynamic:
            self.norm = RMSNorm(d, affine=False)  # OLMo's norm has no parameters (HC App. B)
            self.weight = nn.Parameter(torch.zeros(d, n + 2))  # columns: W_β | W_m | W_r (n)
            self.scale = nn.Parameter(torch.full((2,), GATE_SCALE_INIT))  # s_α, s_β

    def forward(self, Y: torch.Tensor):
        if not self.dynamic:
            return self.static_am, self.static_beta, self.static_ar.t()
        dyn = self.norm(Y) @ self.weight                            # (B, T, n, n + 2)
        if self.tanh:
            dyn = torch.tanh(dyn)
        beta = self.scale[1] * dyn[..., 0] + self.static_beta       # (B, T, n)
        am = self.scale[0] * dyn[..., 1] + self.static_am           # (B, T, n)
        ar = self.scale[0] * dyn[..., 2:] + self.static_ar          # (B, T, n, n), row i from h_i
        return am, beta, ar.transpose(-1, -2)                       # H' = A_r^T H   (eq. 4)


def make_gate(hyper, d: int, index: int) -> nn.Module:
    """The gate for the index-th connection of a model (HC's A_m depends on the index)."""
    if hyper.mixing in ("static", "dynamic"):
        return ZhuGate(d, hyper.streams, index, hyper.mixing == "dynamic", hyper.tanh)
    return SigmoidGate(d, hyper.streams, hyper.mixing, hyper.sinkhorn_iters)


def hyper_connect(gate: nn.Module, Y: torch.Tensor, span, extra: torch.Tensor | None = None) -> torch.Tensor:
    """Y' = H_res Y + H_post ⊗ (Δ + extra), Δ = span(u), u = H_pre Y. `span` maps (B, T, d) to the
    change it makes; `extra` is Hyperloop's loop position embedding e_l."""
    pre, post, res = gate(Y)
    u = (pre.unsqueeze(-2).to(Y.dtype) @ Y).squeeze(-2)               # (B, T, d)
    delta = span(u)
    if extra is not None:
        delta = delta + extra
    if res is None:
        mixed = Y
    elif res.dim() == Y.dim() - 1:
        mixed = Y * res.unsqueeze(-1).to(Y.dtype)                       # diagonal
    else:
        mixed = res.to(Y.dtype) @ Y                                     # (.., n, n) @ (.., n, d)
    return mixed + post.unsqueeze(-1).to(Y.dtype) * delta.unsqueeze(-2)

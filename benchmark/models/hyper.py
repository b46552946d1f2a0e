"""Hyper-connections: n parallel residual streams Y (B, T, n, d) that a wrapped span of the
network reads from and writes to (Zhu et al. 2025; mHC; Hyperloop §3).

One rule for every placement (sublayer, layer, k layers, loop): with u = H_pre Y,

    Y' = H_res Y + H_post ⊗ (F(u) + e_l)                        (Hyperloop eq. 3, mHC eq. 3)

where F(u) is what the span contributes: for a sublayer its branch (mHC: F is attention or the
MLP); for whole layers (`hyper.read`) either the span's output, as Hyperloop eq. 3 reads with F
the middle block (`block`), or the change it makes, span(u) - u (`delta`), with which one
stream and H_pre = H_post = H_res = 1 is exactly the plain model. Layers inside a span keep their
own residuals (Hyperloop §4.3, "Number of hyper-connections"). e_l is Hyperloop's loop embedding.
"""

from __future__ import annotations

import torch
import torch.nn as nn
import torch.nn.functional as F

from benchmark.models import kernels
from benchmark.models.layers import NORM_EPS, float32_region

GATE_SCALE_INIT = 0.01  # mHC App. A.1: the gating factors α start at 0.01 (HC: s_α, s_β)
# Diagonal H_res = σ(b) at initialisation, by how the span is read (Hyperloop eq. 3):
#  * delta, Y' = H_res Y + H_post ⊗ (F(u) - u): H_res carries the residual path, so it starts
#    near the identity (σ(3) = 0.95; the HC paper's §2.3 principle: start near the Pre-Norm
#    residual) while leaving gradient to learn;
#  * block, Y' = H_res Y + H_post ⊗ F(u): F(u) already contains u, and an identity-leaning H_res
#    would count it twice, doubling the streams' scale every loop. b = 0 (σ = 0.5, the zero bias
#    of Megatron-LM's hyper_connection.py) keeps them a geometric average of the loops' outputs.
DIAGONAL_BIAS_INIT = {"delta": 3.0, "block": 0.0}
# Sinkhorn H_res logits at initialisation: 0 on the diagonal, -3 off it, so H_res leans to the
# identity (diagonal 0.87 after Sinkhorn for n = 4) as in MindSpore MindFormers (0 / -5) and
# FFTYYY/mhc-lite (0 / -8) (docs/architectures.md, "How the n streams start"). Not further:
# near a permutation Sinkhorn converges slowly, and with -5 twenty iterations (mHC's t_max) left
# column sums off by up to 5e-3 under gate noise of 0.15 (2e-4 at -3); logits of -8/0.05
# underflow and never learn (tokenbender's mHC, its issue #2).
SINKHORN_OFF_DIAGONAL_INIT = -3.0
SINKHORN_FLOOR = 1e-30  # smallest row or column sum Sinkhorn divides by (see sinkhorn)
STREAM_DTYPES = {"bf16": torch.bfloat16, "fp32": torch.float32}


def resolve_stream_dtype(
    setting: str, device_type: str, autocast_dtype: torch.dtype | None
) -> torch.dtype:
    """The streams' storage dtype for `hyper.stream_dtype`: `auto` is mHC's recipe (eq. 10-19:
    bf16 streams, gates, Sinkhorn and accumulations in fp32) where the steps run under bf16
    autocast on CUDA, and fp32 elsewhere, the precision of the plain model's residual stream."""
    if setting == "auto":
        return (
            torch.bfloat16
            if device_type == "cuda" and autocast_dtype == torch.bfloat16
            else torch.float32
        )
    return STREAM_DTYPES[setting]


def stream_record(hyper, device_type: str, precision: str) -> dict[str, str]:
    """A results row's `stream_dtype` (`bf16` | `fp32`; null without streams), what the
    streams of a model with the spec's hyper section (None: no streams) were stored in, given
    the row's `precision` column."""
    if hyper is None:
        return {}
    dtype = resolve_stream_dtype(
        hyper.stream_dtype, device_type, torch.bfloat16 if precision == "bf16" else None
    )
    return {"stream_dtype": next(name for name, d in STREAM_DTYPES.items() if d == dtype)}


def compute_dtype(dtype: torch.dtype) -> torch.dtype:
    """What the gates and sums over streams of `dtype` compute in: float32 for bf16 streams."""
    return torch.promote_types(dtype, torch.float32)


def fused(t: torch.Tensor) -> bool:
    """Whether the connections' hot path runs the Triton kernels (models/kernels): CUDA tensors
    only, where SHAPEBENCH_HC_KERNELS=triton asks for them and triton imports. Otherwise the
    PyTorch code below runs (compiled on a GPU, the faster path there: kernels/__init__.py)."""
    if not t.is_cuda:
        return False
    return kernels.in_use()


def home_stream_logits(n: int, index: int) -> torch.Tensor:
    """The `home` initialisation of the read and write gates (init: home), logits b with
    H_pre = (2/n) σ(b) and H_post = 2 σ(b).

    n copied streams under gates that are alike stay copies for ever: every stream gets the same
    value and the same gradient (measured here: per-stream gate rows equal to 0.0 after 40 AdamW
    steps). As HC's A_m = e_(k mod n) (Zhu et al. eq. 14) and the public mHC implementations do
    (lucidrains' hyper-connections: read logit 1 on stream `layer_index % n`; FFTYYY/mhc-lite:
    +1/-1 on both read and write), connection k favours a home stream k mod n. Here it reads and
    writes it twice as strongly as each other stream, normalised so that at initialisation the
    read weights sum to 1 and the mean write is 1 (the streams' mean follows the plain residual
    model, as MindFormers' -log(n-1) read bias does). The asymmetric write separates the streams
    in the forward pass at once, not only through gradients. Both gates: σ(b) = n / (n + 1) at
    home, n / (2 (n + 1)) elsewhere; with n = 1 that is σ(0), the plain residual."""
    p = torch.full((n,), n / (2 * (n + 1)))
    p[index % n] = n / (n + 1)
    return torch.logit(p)


def sinkhorn(logits: torch.Tensor, iters: int) -> torch.Tensor:
    """Sinkhorn-Knopp as mHC eq. 9 writes it: M = exp(logits), then `iters` times a column and a
    row normalisation; in float32 even under autocast. (..., n, n) -> doubly stochastic.

    The first column normalisation is a softmax, so the exponentials never overflow; after it the
    normalisations divide by sums that only underflow if a whole row lies ~87 nats below the rest,
    and the floor keeps even that finite. Not in log space: the iterates are the same (within 1e-6,
    tests/test_models.py) but each of the 2 x iters normalisations is then a logsumexp, an exp and
    a log per entry, more than twice the time of these (benchmarks/2026-11-24-perf-cpu-epyc.md);
    Megatron-LM's native mHC Sinkhorn also normalises in linear space after a softmax."""
    if fused(logits):
        # The Triton kernels import triton: they load only where they run (fused).
        from benchmark.models.kernels import sinkhorn as fused_sinkhorn

        return fused_sinkhorn.sinkhorn(logits.float(), iters, SINKHORN_FLOOR)
    with float32_region(logits.device.type):
        m = torch.softmax(logits.float(), dim=-2)  # columns sum to 1
        m = m / m.sum(-1, keepdim=True).clamp_min(SINKHORN_FLOOR)  # rows sum to 1
        for _ in range(iters - 1):
            m = m / m.sum(-2, keepdim=True).clamp_min(SINKHORN_FLOOR)
            m = m / m.sum(-1, keepdim=True).clamp_min(SINKHORN_FLOOR)
        return m


def normed_linear(x: torch.Tensor, weight: torch.Tensor, eps: float) -> torch.Tensor:
    """F.linear(RMSNorm(x), weight) for a norm without affine weight, in float32 for bf16 x
    (compute_dtype; mHC eq. 14-15), dividing by x's RMS after the projection rather than before
    (mHC §4.3.1, kernel fusion, reorders its gates' norm the same way): the same numbers without
    a normalised copy of the streams written and read back, forward and backward."""
    if fused(x):
        from benchmark.models.kernels import hc  # triton: loads only where it runs (fused)

        return hc.normed_linear(x, weight, eps)
    dt = compute_dtype(x.dtype)
    # The projection too, not only what follows it, in float32 under autocast (mHC eq. 14-15: phi
    # in tf32, as the fused kernel's tl.dot of float32 tiles): in bf16 the gates' logits would carry
    # bf16's 3-digit rounding into every coefficient of the residual mixing.
    with float32_region(x.device.type):
        z = x.to(dt)
        return F.linear(z, weight.to(dt)) * torch.rsqrt(z.pow(2).mean(-1, keepdim=True) + eps)


class Connection(nn.Module):
    """What every gate does around its span (hyper_connect): `read` the span's input u = H_pre Y
    with the gates, `write` the streams back. Two methods, so that a compiler fuses each with its
    gate arithmetic (trial/step.py compiles them once for every connection, LanguageModel.regions).
    Subclasses' forward(Y) returns (H_pre, H_post, H_res); `stream_dtype` is hyper.stream_dtype."""

    stream_dtype = "auto"

    def read(self, Y: torch.Tensor):
        pre, post, res = self(Y)
        # The streams are the residual stream: read and mixed in float32 (compute_dtype), even
        # where they are stored in bf16, not in bf16, which autocast would pick for these matmuls.
        # Otherwise u, and with the block read the whole middle block's residual, would run in
        # bf16 where the Transformer's stays in float32 (seen on an H100: bf16 u reaching
        # RMSNorm's float32 weight, and its slow unfused path). u as a weighted sum, not a (1 x n) @ (n x d) matmul: a compiler fuses it into one
        # pass over the streams, where a batched matmul of B*T tiny products is slow on a GPU.
        return weigh(pre, Y), post, res

    def write(
        self, Y: torch.Tensor, out: torch.Tensor, post: torch.Tensor, res: torch.Tensor | None
    ) -> torch.Tensor:
        """Y' = H_res Y + H_post ⊗ out, summed in float32 and stored in the streams' dtype
        (resolve_stream_dtype; the first connection's Y is the embedding's float32 copy)."""
        device = Y.device.type
        autocast = torch.get_autocast_dtype(device) if torch.is_autocast_enabled(device) else None
        stored = resolve_stream_dtype(self.stream_dtype, device, autocast)
        if stored == torch.float32:  # fp32 or wider: float64 streams (gradcheck) stay float64
            stored = compute_dtype(Y.dtype)
        if fused(Y):
            from benchmark.models.kernels import hc  # triton: loads only where it runs (fused)

            return hc.write(Y, out, post, res, stored)
        dt = compute_dtype(Y.dtype)
        with float32_region(device):
            out, post = out.to(dt), post.to(dt)
            if res is None:
                return (Y + post.unsqueeze(-1) * out.unsqueeze(-2)).to(stored)
            res = res.to(dt)
            if torch.compiler.is_compiling():
                return StreamWrite.apply(Y, out, post, res).to(stored)
            mixed = (
                Y * res.unsqueeze(-1) if res.dim() == Y.dim() - 1 else res @ Y.to(dt)
            )  # diagonal | (.., n, n) @ (.., n, d)
            return (mixed + post.unsqueeze(-1) * out.unsqueeze(-2)).to(stored)


class StreamWrite(torch.autograd.Function):
    """Y' = H_res Y + H_post ⊗ out, as compiled code computes it, with its gradients written out
    so that a compiler fuses them into few passes over the streams (the write is memory-bound).

    H_res Y as a broadcast sum, not B*T tiny batched matmuls: Inductor unrolls the n terms into
    the write's one pass over the streams (eager, the broadcast would first write a (B, T, n, n, d)
    product, ten times the matmul's time at the reference size, so eager code keeps the matmul).
    The gradients of H_res and H_post are sums over d of (B, T, n) shapes, stream j's and stream
    i's, that Inductor fuses with the streams' gradient, where autograd's own (a (B, T, n, n) sum,
    and H_res^T G and G Y^T as batched matmuls) each took a pass of their own; the gains are in
    benchmarks/2026-11-24-perf-cpu-epyc.md."""

    @staticmethod
    def forward(ctx, Y, out, post, res):
        ctx.save_for_backward(Y, out, post, res)
        if res.dim() == Y.dim() - 1:  # diagonal
            mixed = Y * res.unsqueeze(-1)
        else:
            mixed = (res.unsqueeze(-1) * Y.unsqueeze(-3)).sum(-2)  # Σ_j H_res[i, j] Y_j
        return mixed + post.unsqueeze(-1) * out.unsqueeze(-2)

    @staticmethod
    def backward(ctx, g):
        Y, out, post, res = ctx.saved_tensors
        d_post = (g * out.unsqueeze(-2)).sum(-1)  # (B, T, n)
        d_out = (g * post.unsqueeze(-1)).sum(-2)  # (B, T, d)
        if res.dim() == Y.dim() - 1:
            return g * res.unsqueeze(-1), d_out, d_post, (g * Y).sum(-1)
        d_Y = (res.unsqueeze(-1) * g.unsqueeze(-2)).sum(-3)  # Σ_i H_res[i, j] G_i
        # d H_res[i, j] = <G_i, Y_j>: one (B, T, n) sum over Y's streams j per row i
        d_res = torch.stack([(Y * g[..., i : i + 1, :]).sum(-1) for i in range(Y.shape[-2])], -2)
        return d_Y, d_out, d_post, d_res


class SigmoidGate(Connection):
    """Input-dependent gates of mHC and Hyperloop (Hyperloop §2.2 and §3):

        z = RMSNorm(flatten(Y))                         (no affine weight, as in mHC)
        H_pre  = (2/n) σ(α_pre  W_pre z + b_pre)        -> (B, T, n)
        H_post = 2 σ(α_post W_post z + b_post)          -> (B, T, n)
        H_res  = I | diag(σ(α_res W_res z + b_res)) | sinkhorn(α_res W_res z + b_res)

    The 2/n factor on H_pre (the paper's σ for n = 2) bounds the read weights' sum by 2, so that
    reads summing to 1 (a weighted mean of the streams) sit mid-range; one stream with identity
    mixing and a zero bias is then exactly a residual connection.

    The weights W start at zero (lucidrains', mhc-lite's φ = 0), the biases per `init`:
    `home` (home_stream_logits; Sinkhorn logits leaning to the identity) or `symmetric` (every
    stream alike: zero read and write logits, uniform Sinkhorn logits), the ablation whose streams
    never separate.
    """

    def __init__(
        self,
        d: int,
        n: int,
        mixing: str,
        sinkhorn_iters: int = 20,
        *,
        index: int = 0,
        init: str = "home",
        read: str = "delta",
    ):
        super().__init__()
        self.n, self.mixing, self.iters = n, mixing, sinkhorn_iters
        n_res = {"identity": 0, "diagonal": n, "sinkhorn": n * n}[mixing]
        self.eps = NORM_EPS  # z's RMSNorm (no affine weight, as in mHC), applied in logits()
        self.weight = nn.Parameter(torch.zeros(2 * n + n_res, n * d))
        io = home_stream_logits(n, index) if init == "home" else torch.zeros(n)
        if mixing == "diagonal":
            res = torch.full((n,), DIAGONAL_BIAS_INIT[read])
        elif mixing == "sinkhorn" and init == "home":
            res = torch.full((n, n), SINKHORN_OFF_DIAGONAL_INIT).fill_diagonal_(0.0).flatten()
        else:
            res = torch.zeros(n_res)
        self.bias = nn.Parameter(torch.cat([io, io, res]))
        self.alpha = nn.Parameter(torch.full((3 if n_res else 2,), GATE_SCALE_INIT))

    def logits(self, Y: torch.Tensor):
        """The pre-activations α W z + b of H_pre, H_post and H_res: (B, T, n) x 2 and (B, T, n_res)."""
        B, T, n, d = Y.shape
        # The projection (normed_linear) and the gates (sigmoid, Sinkhorn's 20 normalisations)
        # run in float32 under autocast too, whatever the streams' storage (mHC eq. 14-19).
        proj = normed_linear(
            Y.reshape(B, T, n * d), self.weight, self.eps
        )  # W z: (B, T, 2n + n_res)
        pre = self.alpha[0] * proj[..., :n] + self.bias[:n]
        post = self.alpha[1] * proj[..., n : 2 * n] + self.bias[n : 2 * n]
        res = (
            self.alpha[2] * proj[..., 2 * n :] + self.bias[2 * n :]
            if self.mixing != "identity"
            else None
        )
        return pre, post, res

    def forward(self, Y: torch.Tensor):
        pre, post, res = self.logits(Y)
        pre, post = (2.0 / self.n) * torch.sigmoid(pre), 2.0 * torch.sigmoid(post)
        if res is None:
            return pre, post, None
        if self.mixing == "diagonal":
            return pre, post, torch.sigmoid(res)  # (B, T, n)
        return pre, post, sinkhorn(res.unflatten(-1, (self.n, self.n)), self.iters)  # (B, T, n, n)


class ZhuGate(Connection):
    """Static or dynamic hyper-connections (Zhu et al. 2025, eq. 1-14). Static: learnable
    B (1 x n), A_m (n x 1), A_r (n x n). Dynamic adds s ∘ tanh(norm(H) W) per stream (eq. 10-13),
    or s ∘ norm(H) W without the tanh (the paper's "W/O tanh" ablation).
    Initialised (eq. 14) so the network equals a Pre-Norm residual: W = 0, B = 1,
    A_m = e_{k mod n}, A_r = I. `init: symmetric` reads the mean, A_m = 1/n (still a Pre-Norm
    residual at initialisation, but every stream alike: the collapsed ablation)."""

    def __init__(
        self, d: int, n: int, index: int, dynamic: bool, tanh: bool = True, init: str = "home"
    ):
        super().__init__()
        self.n = n
        am = torch.full((n,), 1.0 / n)
        if init == "home":
            am = torch.zeros(n)
            am[index % n] = 1.0
        self.static_beta = nn.Parameter(torch.ones(n))
        self.static_am = nn.Parameter(am)
        self.static_ar = nn.Parameter(torch.eye(n))
        self.dynamic, self.tanh = dynamic, tanh
        if dynamic:
            self.eps = (
                NORM_EPS  # norm(H): OLMo's norm has no parameters (HC App. B), applied in forward
            )
            # rows: W_β | W_m | W_r (n), stored (out, in) as nn.Linear stores its weight: with the
            # transposed (d, n + 2) layout F.linear's forward and gradient matmuls took slow paths
            # on a CPU (benchmarks/2026-11-27-measurements-from-comments.md, "The gates' layout").
            # Checkpoints of that layout load (_load_from_state_dict).
            self.weight = nn.Parameter(torch.zeros(n + 2, d))
            self.scale = nn.Parameter(torch.full((2,), GATE_SCALE_INIT))  # s_α, s_β

    def forward(self, Y: torch.Tensor):
        if not self.dynamic:
            return self.static_am, self.static_beta, self.static_ar.t()
        dyn = normed_linear(Y, self.weight, self.eps)  # (B, T, n, n + 2), float32
        if self.tanh:
            dyn = torch.tanh(dyn)
        beta = self.scale[1] * dyn[..., 0] + self.static_beta  # (B, T, n)
        am = self.scale[0] * dyn[..., 1] + self.static_am  # (B, T, n)
        ar = self.scale[0] * dyn[..., 2:] + self.static_ar  # (B, T, n, n), row i from h_i
        return am, beta, ar.transpose(-1, -2)  # H' = A_r^T H   (eq. 4)

    def _load_from_state_dict(self, state_dict, prefix, *args, **kwargs):
        w = state_dict.get(prefix + "weight")
        if self.dynamic and w is not None and tuple(w.shape) == (self.weight.shape[1], self.n + 2):
            state_dict[prefix + "weight"] = w.t()  # checkpoints of the earlier (d, n + 2) layout
        super()._load_from_state_dict(state_dict, prefix, *args, **kwargs)


def make_gate(hyper, d: int, index: int) -> nn.Module:
    """The gate for the index-th connection of a model (HC's A_m depends on the index)."""
    if hyper.mixing in ("static", "dynamic"):
        gate = ZhuGate(d, hyper.streams, index, hyper.mixing == "dynamic", hyper.tanh, hyper.init)
    else:
        gate = SigmoidGate(
            d,
            hyper.streams,
            hyper.mixing,
            hyper.sinkhorn_iters,
            index=index,
            init=hyper.init,
            read=hyper.read,
        )
    gate.stream_dtype = hyper.stream_dtype
    return gate


def res_matrix(gate: nn.Module, res: torch.Tensor | None) -> torch.Tensor:
    """The H_res a gate returned, as (..., n, n) matrices (identity mixing returns None, diagonal
    mixing the diagonal)."""
    if res is None:
        return torch.eye(gate.n, device=next(gate.parameters()).device)
    return torch.diag_embed(res) if getattr(gate, "mixing", None) == "diagonal" else res


def weigh(pre: torch.Tensor, Y: torch.Tensor) -> torch.Tensor:
    """u = H_pre Y: (B, T, n) read weights over (B, T, n, d) streams -> (B, T, d), summed in
    float32 for bf16 streams (compute_dtype)."""
    if fused(Y):
        from benchmark.models.kernels import hc  # triton: loads only where it runs (fused)

        return hc.read(Y, pre)
    return (pre.unsqueeze(-1).to(compute_dtype(Y.dtype)) * Y).sum(-2)


def hyper_connect(
    gate: "Connection",
    Y: torch.Tensor,
    span,
    extra: torch.Tensor | None = None,
    gates: tuple | None = None,
) -> torch.Tensor:
    """Y' = H_res Y + H_post ⊗ (F(u) + extra), u = H_pre Y. `span` maps u (B, T, d) to F(u), what
    the span contributes (see the module docstring); `extra` is Hyperloop's loop embedding e_l.
    `gates`, (H_pre, H_post, H_res) computed already, saves calling the gate (and its hooks)."""
    if gates is None:
        u, post, res = gate.read(Y)
    else:
        pre, post, res = gates
        u = weigh(pre, Y)
    out = span(u)
    if extra is not None:
        out = out + extra
    return gate.write(Y, out, post, res)

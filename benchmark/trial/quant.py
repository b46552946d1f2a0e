"""Post-training weight-only quantisation: round-to-nearest (RTN) and GPTQ, INT4 / INT8, per group.

Hyperloop §4 ("Post-training quantization") quantises its models with GPTQ (Frantar et al. 2023)
to INT4 with group size 128, "where we modify the GPTQ algorithm so that the Hessian estimation
for a looped layer aggregates activations across all inputs to that layer across loops". Here a
forward pre-hook on every quantised `Proj` adds each call's inputs to that layer's Hessian, so a
layer of the middle block, called once per loop, sees `loops` times the rows of a begin-block one.

Choices (each one also a place where the papers leave room):
  * What is quantised: the transformer layers' projections (attention q, k, v, o; FFN w1, w3, w2)
    and Depth's injection map. Embedding and LM head stay 16-bit, tied or not: Hyperloop quantises
    "transformer weights", GPTQ's reference scripts quantise the decoder layers only, and tied and
    untied models then quantise the same set. Norms, hyper-connection gates, the loop embedding and
    LoRA adapters stay 16-bit too.
  * Hessians come from one calibration pass through the full-precision model, and every layer is
    then quantised from its own Hessian. GPTQ's reference code instead quantises block by block,
    feeding each block the outputs of the already-quantised blocks before it; for a shared layer
    that order is not defined, since its inputs at loop l depend on its own (not yet quantised)
    weights at loops < l.
  * The grid is GPTQ's `Quantizer`: per row and group of `group_size` consecutive input columns, a
    range that includes 0; asymmetric (scale + integer zero point) by default, or symmetric
    (zero point fixed at the middle of the grid). Scales are rounded to fp16, as they are stored.
    A last group shorter than `group_size` takes the remaining columns.

The quantised model is a copy whose weights are dequantised back to float ("fake quantisation"),
so the same forward pass evaluates it; `model_bytes` gives the size the packed form would take.
"""

from __future__ import annotations

import copy
import math
from collections.abc import Iterable
from dataclasses import dataclass

import torch

from benchmark.models import LanguageModel
from benchmark.models.layers import Proj

BITS = (4, 8)
METHODS = ("rtn", "gptq")
FLOAT_BITS = 16  # unquantised tensors and per-group scales are stored at 16 bits (bf16 / fp16)


@dataclass(frozen=True, kw_only=True)
class QuantConfig:
    """`damp`: GPTQ adds damp x mean(diag H) to the Hessian's diagonal (GPTQ §4, Step 3: 1%).
    `block_size`: columns per lazy batch update (GPTQ §4, Step 2), rounded down to whole groups.
    `act_order`: quantise columns in order of decreasing Hessian diagonal (GPTQ's "act-order");
    groups then keep their parameters from the unpermuted weight, so the stored format is unchanged.
    A group_size of at least a layer's input width gives one group per row (per-channel)."""

    bits: int = 4
    method: str = "gptq"
    group_size: int = 128
    symmetric: bool = False
    damp: float = 0.01
    block_size: int = 128
    act_order: bool = False

    def __post_init__(self):
        if self.bits not in BITS:
            raise ValueError(f"bits: {self.bits} is not one of {', '.join(map(str, BITS))}")
        if self.method not in METHODS:
            raise ValueError(f"method: '{self.method}' is not one of {', '.join(METHODS)}")
        if self.group_size < 1 or self.block_size < 1:
            raise ValueError(
                f"group_size and block_size must be >= 1, got {self.group_size}, {self.block_size}"
            )
        if not 0 <= self.damp < 1:
            raise ValueError(f"damp must be in [0, 1), got {self.damp}")

    @property
    def maxq(self) -> int:
        return 2**self.bits - 1


@dataclass(frozen=True, kw_only=True)
class Hessian:
    """H = 2 X^T X / rows over every input row a layer saw (GPTQ §3; rows from all loops)."""

    H: torch.Tensor  # (in, in)
    rows: int


@dataclass(frozen=True, kw_only=True)
class QuantReport:
    method: str
    bits: int
    group_size: int
    symmetric: bool
    bytes: int  # the model with quantised weights packed (model_bytes)
    bytes_bf16: int  # every tensor at 16 bits
    calib_rows: dict[str, int]  # GPTQ: input rows seen per quantised layer; empty for RTN


# ---- which weights, and how many bytes -------------------------------------------------------


def quantizable(model: LanguageModel) -> dict[str, Proj]:
    """The projections that get quantised, by module name: every `Proj` except an untied LM head."""
    return {
        name: m
        for name, m in model.named_modules()
        if isinstance(m, Proj) and m is not model.lm_head
    }


def weight_bytes(shape: tuple[int, int], cfg: QuantConfig) -> int:
    """Packed size of one (out, in) weight: `bits` per entry, one fp16 scale per row and group,
    and (asymmetric) one `bits`-wide zero point per row and group, as GPTQ's packed format."""
    out, d_in = shape
    groups = out * math.ceil(d_in / cfg.group_size)
    zeros = 0 if cfg.symmetric else math.ceil(groups * cfg.bits / 8)
    return math.ceil(out * d_in * cfg.bits / 8) + groups * FLOAT_BITS // 8 + zeros


def model_bytes(model: LanguageModel, cfg: QuantConfig | None = None) -> int:
    """Bytes to store the model: the `quantizable` weights packed per `cfg`, every other parameter
    at 16 bits; with cfg None, everything at 16 bits (the bf16 size). Tied weights count once."""
    quant = {id(m.weight) for m in quantizable(model).values()} if cfg is not None else set()
    return sum(
        weight_bytes(tuple(p.shape), cfg) if id(p) in quant else p.numel() * FLOAT_BITS // 8
        for p in model.parameters()
    )


# ---- the quantisation grid --------------------------------------------------------------------


def grid(w: torch.Tensor, cfg: QuantConfig) -> tuple[torch.Tensor, torch.Tensor]:
    """Scale and zero point per row of w (..., rows, g) -> (..., rows, 1) each (GPTQ's
    Quantizer.find_params)."""
    lo = w.amin(dim=-1, keepdim=True).clamp(max=0)
    hi = w.amax(dim=-1, keepdim=True).clamp(min=0)
    if cfg.symmetric:
        hi = torch.maximum(-lo, hi)
        lo = -hi
    scale = ((hi - lo) / cfg.maxq).half().float()  # stored in fp16
    scale = torch.where(scale > 0, scale, torch.ones_like(scale))  # an all-zero group
    if cfg.symmetric:
        return scale, torch.full_like(scale, (cfg.maxq + 1) / 2)
    return scale, torch.round(-lo / scale)


def fake_quant(w: torch.Tensor, scale: torch.Tensor, zero: torch.Tensor, maxq: int) -> torch.Tensor:
    """Round onto the integer grid and map back: scale (clamp(round(w / scale) + zero) - zero)."""
    q = torch.clamp(torch.round(w / scale) + zero, 0, maxq)
    return scale * (q - zero)


def rtn(w: torch.Tensor, cfg: QuantConfig) -> torch.Tensor:
    """Round-to-nearest, per row and group of input columns: (..., out, in) -> dequantised."""
    w = w.detach().float()
    out = torch.empty_like(w)
    for s in range(0, w.shape[-1], cfg.group_size):
        g = w[..., s : s + cfg.group_size]
        out[..., s : s + cfg.group_size] = fake_quant(g, *grid(g, cfg), cfg.maxq)
    return out


# ---- GPTQ ---------------------------------------------------------------------------------------


def _inverse_cholesky(H: torch.Tensor, damp: float) -> torch.Tensor:
    """Upper Cholesky factor of the dampened H^-1 (GPTQ §4, Step 3: its rows give the updates)."""
    eye = torch.eye(H.shape[-1], dtype=H.dtype, device=H.device)
    H = H + damp * H.diagonal(dim1=-2, dim2=-1).mean(-1)[..., None, None] * eye
    Hinv = torch.cholesky_inverse(torch.linalg.cholesky(H))
    return torch.linalg.cholesky(Hinv, upper=True)


def gptq(w: torch.Tensor, H: torch.Tensor, cfg: QuantConfig) -> torch.Tensor:
    """GPTQ (Frantar et al. 2023, Algorithm 1): quantise column by column, spreading each column's
    error over the columns not yet quantised through the inverse Hessian, with lazy batch updates
    of `block_size` columns. w (out, in), H (in, in) -> dequantised (out, in); or a stack of L
    layers of one shape, w (L, out, in) and H (L, in, in), quantised together: each layer's
    arithmetic is its own, and one pass over the columns serves all L (`quantize` stacks a
    model's layers by shape, as Python's per-column steps, not FLOPs, take the time at d <= 1K)."""
    single = w.dim() == 2
    W, H = w.detach().float().clone(), H.float().clone()
    if single:
        W, H = W.unsqueeze(0), H.unsqueeze(0)
    cols, g = W.shape[-1], cfg.group_size
    diag = H.diagonal(dim1=-2, dim2=-1)  # a view: writing it writes H
    dead = diag == 0  # inputs that are always zero: weight is irrelevant
    diag.masked_fill_(dead, 1)
    W.masked_fill_(dead.unsqueeze(1), 0)
    static = perm = None
    if cfg.act_order:  # per layer: (L, out, groups) grids, (L, in) order
        static = [
            torch.cat(p, dim=-1)
            for p in zip(*(grid(W[..., s : s + g], cfg) for s in range(0, cols, g)))
        ]
        perm = torch.argsort(diag, dim=-1, descending=True, stable=True)  # ties in a fixed order
        W = W.gather(-1, perm.unsqueeze(1).expand_as(W))
        H = H.gather(-1, perm.unsqueeze(1).expand_as(H)).gather(-2, perm.unsqueeze(2).expand_as(H))
    del diag  # else it would keep the unpermuted H alive
    Hinv = _inverse_cholesky(H, cfg.damp)
    Q = torch.zeros_like(W)
    block = max(cfg.block_size // g, 1) * g  # whole groups per block: a group's grid is found
    for i1 in range(0, cols, block):  # on its up-to-date (error-compensated) columns
        i2 = min(i1 + block, cols)
        W1, Hinv1 = W[..., i1:i2].clone(), Hinv[..., i1:i2, i1:i2]
        Err1 = torch.zeros_like(W1)
        for i in range(i2 - i1):
            if static is not None:  # each layer's group of its column i1 + i
                at = (perm[:, i1 + i] // g)[:, None, None].expand(-1, W.shape[1], 1)
                scale, zero = static[0].gather(-1, at), static[1].gather(-1, at)
            elif i % g == 0:
                scale, zero = grid(W1[..., i : i + g], cfg)
            q = fake_quant(W1[..., i : i + 1], scale, zero, cfg.maxq).squeeze(-1)
            Q[..., i1 + i] = q
            err = (W1[..., i] - q) / Hinv1[..., i, i, None]
            W1[..., i:] -= err.unsqueeze(-1) * Hinv1[..., i, None, i:]
            Err1[..., i] = err
        W[..., i2:] -= Err1 @ Hinv[..., i1:i2, i2:]
    if perm is not None:
        Q = Q.gather(-1, torch.argsort(perm, dim=-1).unsqueeze(1).expand_as(Q))
    return Q[0] if single else Q


def collect_hessians(
    model: LanguageModel, layers: dict[str, Proj], calib: Iterable[torch.Tensor]
) -> dict[str, Hessian]:
    """Run the calibration batches ((B, T) token ids, or (inputs, targets) pairs) through the
    model; every call of a layer adds its input rows to that layer's Hessian (Hyperloop §4)."""
    sums, rows = {}, dict.fromkeys(layers, 0)

    def hook(name):
        def add(module, args):
            x = args[0].detach().reshape(-1, args[0].shape[-1]).float()  # (rows, in)
            sums[name] = sums.get(name, 0) + (x.T @ x).double()  # float64: many rows
            rows[name] += x.shape[0]

        return add

    handles = [p.register_forward_pre_hook(hook(name)) for name, p in layers.items()]
    device = next(model.parameters()).device
    try:
        with torch.no_grad():
            for batch in calib:  # batches come from the CPU batch builder: onto the model's device
                # The features only: the head is not quantised, and at a small width its logits
                # would cost more than all the layers the Hessians are for.
                model.features((batch[0] if isinstance(batch, (tuple, list)) else batch).to(device))
    finally:
        for h in handles:
            h.remove()
    missing = [name for name, n in rows.items() if n == 0]
    if missing:
        raise ValueError(f"GPTQ: no calibration inputs reached {', '.join(missing[:3])}")
    return {
        name: Hessian(H=(2 * sums[name] / rows[name]).float(), rows=rows[name]) for name in layers
    }


# ---- the model ------------------------------------------------------------------------------------


def calibrate(model: LanguageModel, calib: Iterable[torch.Tensor]) -> dict[str, Hessian]:
    """The Hessians of `model`'s quantised layers from the calibration batches, in eval mode. They
    depend on the full-precision model only, so one set serves every GPTQ bit width."""
    was_training = model.training
    model.eval()
    try:
        return collect_hessians(model, quantizable(model), calib)
    finally:
        model.train(was_training)


# A stack's weights and Hessians together, at most (256 MB in fp32); GPTQ's copies, the inverse
# and its factors take several times that at the peak, as one large layer alone would.
STACK_ELEMENTS = 2**26


def _stacks(layers: dict[str, Proj]) -> list[list[str]]:
    """The layers in stacks of one weight shape that `gptq` quantises together, each stack's
    weights and Hessians at most STACK_ELEMENTS (a 1B model's FFN layers go a few at a time)."""
    shapes: dict[tuple[int, int], list[str]] = {}
    for name, proj in layers.items():
        shapes.setdefault(tuple(proj.weight.shape), []).append(name)
    out = []
    for (rows, cols), names in shapes.items():
        per = max(1, STACK_ELEMENTS // (rows * cols + cols * cols))
        out += [names[i : i + per] for i in range(0, len(names), per)]
    return out


def quantize(
    model: LanguageModel,
    cfg: QuantConfig,
    calib: Iterable[torch.Tensor] | None = None,
    *,
    hessians: dict[str, Hessian] | None = None,
) -> tuple[LanguageModel, QuantReport]:
    """A fake-quantised copy of `model` (the original is untouched) and its report. GPTQ needs
    `calib`, batches of token ids run at the model's training loop count, or the `hessians` that
    `calibrate` collected from them; RTN ignores both."""
    if cfg.method != "gptq":
        hessians = {}
    elif hessians is None:
        if calib is None:
            raise ValueError("GPTQ needs calibration batches (calib) or their Hessians")
        hessians = calibrate(model, calib)
    qmodel = copy.deepcopy(model).eval()
    layers = quantizable(qmodel)
    with torch.no_grad():
        for names in _stacks(layers):
            w = torch.stack([layers[n].weight for n in names])
            q = (
                gptq(w, torch.stack([hessians[n].H for n in names]).to(w.device), cfg)
                if hessians
                else rtn(w, cfg)
            )
            for n, qn in zip(names, q):
                layers[n].weight.copy_(qn.to(w.dtype))
    report = QuantReport(
        method=cfg.method,
        bits=cfg.bits,
        group_size=cfg.group_size,
        symmetric=cfg.symmetric,
        bytes=model_bytes(model, cfg),
        bytes_bf16=model_bytes(model),
        calib_rows={name: h.rows for name, h in hessians.items()},
    )
    return qmodel, report

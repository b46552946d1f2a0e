"""A training step's peak accelerator memory, estimated from the spec and the recipe without
building the model, and the micro-batch that fits a GPU (`shapebench plan --gpu-memory 80GiB`).

The peak of a step is reached at the start of its backward pass, when every activation of the
forward is still held and the head's logits and their gradient are alive:

    weights + gradients + AdamW state    16 bytes per parameter
    autocast's 16-bit weight copies      2 bytes per parameter under bf16 (kept for the backward)
    activations                          per unrolled layer and token, below
    hyper-connection streams             per connection and token, below
    logits and loss                      per token and vocabulary entry, below

16 bytes per parameter: fp32 weights (4), their gradient (4) and Adam's two moments (8) under
autocast, the same total as the ZeRO paper's mixed-precision Adam (2 + 2 in 16-bit and 12 in
fp32: Rajbhandari et al. 2020, §3.1). Gradients are counted whole: with grad_accum > 1 they are
held across the micro-batches' backward passes.

Activations follow Korthikanti et al. 2022 ("Reducing Activation Recomputation in Large
Transformer Models", §4.1: 34·s·b·h bytes per layer in 16-bit without the attention matrix),
term by term for this model's layer (models/layers.py): a fused (flash) attention stores no
s x s matrix, there is no dropout, the norms are RMSNorms whose input is the float32 residual
stream (4 bytes, not Korthikanti's 2), and the MLP is a SwiGLU whose three hidden tensors (W1's
and W3's outputs, W2's input) replace the GeLU MLP's two. An eager step also keeps each norm's
output and SiLU's output, which a compiled region recomputes in its backward (torch.compile's
min-cut partitioner recomputes pointwise ops rather than storing them). A looped model stores
every unrolled layer. The check against measured peaks (an H200 at 113M, a CPU at a few million
parameters) and its error: benchmarks/2026-11-29-memory-estimate.md.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from benchmark.arch import ArchSpec, count_params, hyper_spans
from benchmark.recipe.settings import TrainConfig

FP32, BF16 = 4, 2
# Bytes per parameter (module docstring): fp32 weight, gradient and Adam's two moments.
STATE_BYTES_PER_PARAM = 4 + 4 + 8
GIB = 2**30
_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*(GiB|GB|MiB|MB|TiB|TB)?\s*$", re.IGNORECASE)
_UNITS = {"gib": GIB, "gb": 10**9, "mib": 2**20, "mb": 10**6, "tib": 2**40, "tb": 10**12}


def parse_size(text: str | int) -> int:
    """'80GiB' -> 85899345920 bytes; GB, MB, TB are powers of ten, GiB, MiB, TiB of two; a bare
    number in text is GiB (as GPUs are sold: an H100 has 80 GiB), an int is bytes already.
    ValueError in one line otherwise."""
    if isinstance(text, int) and not isinstance(text, bool) and text > 0:
        return text
    match = _SIZE.match(str(text))
    if not match or float(match.group(1)) <= 0:
        raise ValueError(f"expected a memory size like 80GiB, 40GB or 24, got {text!r}")
    return int(float(match.group(1)) * _UNITS[(match.group(2) or "gib").lower()])


def fmt_size(n: float) -> str:
    return f"{n / GIB:.1f} GiB" if n >= GIB / 10 else f"{n / 2**20:.0f} MiB"


@dataclass(frozen=True)
class MemoryEstimate:
    """A step's peak, in bytes, by what holds it (module docstring)."""

    state: int  # weights, gradients and AdamW's moments
    weight_copies: int  # autocast's 16-bit copies of the weights
    activations: int  # the layers' stored activations, every unrolled layer
    streams: int  # the hyper-connections' n streams and their read/write inputs
    logits: int  # the head's logits and their gradient (and an eager loss's float32 copies)

    @property
    def total(self) -> int:
        return self.state + self.weight_copies + self.activations + self.streams + self.logits


def compute_bytes(cfg: TrainConfig) -> int:
    """Bytes per activation: bf16 under autocast (`auto` is bf16 on every GPU with bf16 tensor
    cores, the GPUs a plan's --gpu-memory is for: trial/policy.py), else fp32."""
    return FP32 if cfg.precision == "fp32" else BF16


def stream_bytes(spec: ArchSpec, cfg: TrainConfig) -> int:
    """The hyper-connection streams' storage (models/hyper.py resolve_stream_dtype): `auto` is
    bf16 under bf16 autocast on a GPU, else fp32."""
    setting = spec.hyper.stream_dtype
    if setting == "auto":
        return compute_bytes(cfg)
    return BF16 if setting == "bf16" else FP32


def layer_bytes_per_token(spec: ArchSpec, a: int, compiled: bool) -> int:
    """Stored activations of one layer per token (Korthikanti §4.1, adapted: module docstring).
    Attention: the norm's float32 input, Q, K and V, the fused attention's output and the output
    projection's input (a copy, after the heads are merged), and the log-sum-exp per head.
    Each SwiGLU block: the norm's float32 input and W1's, W3's and W2's inputs of its width.
    Eager also: each norm's output and SiLU's output."""
    d, f = spec.d_model, spec.ffn.width
    attention = FP32 * d + a * (spec.q_dim + 2 * spec.kv_dim + 2 * spec.q_dim) + FP32 * spec.n_heads
    mlp = FP32 * d + 3 * a * f
    if not compiled:
        attention += a * d
        mlp += a * (d + f)
    return attention + spec.ffn.depth * mlp


def stream_bytes_per_token(spec: ArchSpec, cfg: TrainConfig) -> int:
    """Stored per token by the hyper-connections: at each connection the n streams of width d
    (read and written from the same stored tensor) and the branch's output and the read's, in
    the compute precision (lucidrains/hyper-connections: n residual streams per connection)."""
    if spec.hyper is None:
        return 0
    n, d = spec.hyper.streams, spec.d_model
    per_connection = n * d * stream_bytes(spec, cfg) + 2 * compute_bytes(cfg) * d
    return len(hyper_spans(spec)) * per_connection


def logit_bytes_per_token(spec: ArchSpec, a: int, compiled: bool) -> int:
    """The head at the start of the backward: the logits (B, T, V) in the compute precision and
    their gradient; compiled, the loss is fused with the softmax (trial/step.py head_loss), eager
    it keeps the float32 upcast and log-softmax and their gradient as well."""
    v = spec.vocab_size
    return (2 * a + (0 if compiled else 3 * FP32)) * v


def estimate_memory(
    spec: ArchSpec, cfg: TrainConfig, micro_batch: int | None = None
) -> MemoryEstimate:
    """The peak of one training step of `spec` under `cfg` (its precision, compilation,
    seq_len, and micro-batch: `micro_batch` or cfg.batch_size)."""
    a, compiled = compute_bytes(cfg), cfg.compile
    tokens = (micro_batch or cfg.batch_size) * cfg.seq_len
    params = count_params(spec)["total"]
    layers = spec.unrolled_layers()
    inject = (
        2 * a * spec.d_model * spec.loops if spec.injection == "concat" else 0
    )  # Depth's [e; h]
    return MemoryEstimate(
        state=STATE_BYTES_PER_PARAM * params,
        weight_copies=BF16 * params if a == BF16 else 0,
        activations=tokens * (layers * layer_bytes_per_token(spec, a, compiled) + inject),
        streams=tokens * stream_bytes_per_token(spec, cfg),
        logits=tokens * logit_bytes_per_token(spec, a, compiled),
    )


# The share of a GPU's memory a run's estimated peak may take: the estimate is of what torch's
# allocator holds at its peak (max_memory_allocated, what the H200 record measured); the CUDA
# context and the caching allocator's fragmentation (reserved beyond allocated) take the rest.
USABLE = 0.9


@dataclass(frozen=True)
class Fit:
    """The micro-batch and accumulation a run uses on a GPU of `limit` bytes: the largest
    micro-batch that divides the declared batch (batch_size x grad_accum sequences per step) and
    fits, the accumulation that keeps that batch; `micro_batch` None: not even one sequence fits."""

    micro_batch: int | None
    grad_accum: int | None
    peak: int  # the estimate at that micro-batch (at 1 when nothing fits)
    limit: int


def fit_micro_batch(spec: ArchSpec, cfg: TrainConfig, limit: int) -> Fit:
    """The largest micro-batch m dividing batch_size x grad_accum whose estimated peak is at most
    USABLE x `limit`, with grad_accum = batch / m; the declared batch (and so the optimiser's
    steps) is kept."""
    batch = cfg.batch_size * cfg.grad_accum
    for m in sorted((m for m in range(1, batch + 1) if batch % m == 0), reverse=True):
        peak = estimate_memory(spec, cfg, m).total
        if peak <= USABLE * limit:
            return Fit(m, batch // m, peak, limit)
    return Fit(None, None, estimate_memory(spec, cfg, 1).total, limit)

"""The training step and its execution policy: bf16 autocast and torch.compile where they help,
the same code on CPU and CUDA. Training loops (training.py) and the speed benchmark (benchmark/perf)
both use `TrainStep`, so the path that is benchmarked is the path that trains.
"""

from __future__ import annotations

import contextlib
import time
from dataclasses import dataclass
from typing import Callable

import torch
import torch.nn.functional as F

from benchmark.models.layers import float32_region
from benchmark.trial.config import PRECISIONS


@dataclass(frozen=True, kw_only=True)
class ExecPolicy:
    """How a model runs. `precision: auto` picks bf16 autocast where it is faster (CUDA with bf16
    tensor cores; a CPU whose measured bf16 matmuls are, `bf16_faster_here`); `compile` compiles
    the model's regions and the head with its loss (`compile_regions`), or with `compile_scope:
    model` the whole loss as one graph."""

    precision: str = "auto"
    compile: bool = True
    compile_scope: str = "regions"   # or "model": the whole loss as one graph (benchmark.perf compares them)

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: '{self.precision}' is not one of {', '.join(PRECISIONS)}")
        if self.compile_scope not in COMPILE_SCOPES:
            raise ValueError(f"compile_scope: '{self.compile_scope}' is not one of {', '.join(COMPILE_SCOPES)}")

    def autocast_dtype(self, device: torch.device) -> torch.dtype | None:
        if self.precision == "fp32":
            return None
        if self.precision == "bf16" or bf16_supported(device):
            return torch.bfloat16
        return None


def bf16_supported(device: torch.device) -> bool:
    """Whether bf16 autocast is *faster* here, which is what `precision: auto` asks."""
    if device.type == "cuda":
        # Native bf16 tensor cores from compute capability 8.0 (Ampere); torch's
        # is_bf16_supported() also counts emulation, which would train V100s and T4s slowly.
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type == "cpu":
        return bf16_faster_here()
    return False


# bf16 is chosen on a CPU when its matmuls are at least this much faster than fp32's: a training
# step also casts and runs elementwise work that bf16 does not speed up. Seen so far: Xeons with
# AMX several times faster (bf16 wins), a Xeon with AVX512-BF16 only at half fp32's rate and an
# AMD EPYC with AVX2 hundreds of times slower (fp32 wins).
BF16_MARGIN = 1.25
PROBE_BUDGET_S = 0.5  # per dtype: the probe's few seconds are paid once per CPU model and torch version


def bf16_faster_here() -> bool:
    """`auto` on this CPU, from a timed matmul probe (bounded in time whatever bf16's speed;
    `matmul_peak`) cached per CPU model, core count and torch version (store/speeds.py), so every
    run on one machine makes the same choice: a process decides once, and concurrent workers on a
    fresh machine wait for one probe rather than each timing matmuls while the others run.
    `benchmark.perf models` shows how the choice compares with eager fp32, compiled fp32 and
    compiled bf16 measured side by side."""
    from benchmark.data import cache_root
    from benchmark.store import speeds

    path = speeds.path_in(cache_root())
    if str(path) not in _BF16_FASTER:
        probe = speeds.precision_probe(path)
        if probe is None:
            from filelock import FileLock

            with FileLock(str(path) + ".probe.lock", timeout=60):
                probe = speeds.precision_probe(path)
                if probe is None:
                    cpu = torch.device("cpu")
                    probe = {"fp32": matmul_peak(torch.float32, PROBE_BUDGET_S, device=cpu),
                             "bf16": matmul_peak(torch.bfloat16, PROBE_BUDGET_S, device=cpu)}
                    speeds.record_precision_probe(path, probe["fp32"], probe["bf16"])
        _BF16_FASTER[str(path)] = probe["bf16"] >= BF16_MARGIN * probe["fp32"]
    return _BF16_FASTER[str(path)]


_BF16_FASTER: dict[str, bool] = {}  # speeds file -> this process's choice


def matmul_peak(dtype: torch.dtype, budget_s: float = 2.0, n_max: int = 2048,
                device: torch.device | None = None) -> float:
    """Achieved FLOP/s of an n x n matmul, the machine's practical peak for that dtype, within
    about `budget_s` whatever the dtype's speed: n doubles from 128 only while the next size (8x
    the work) still fits, so a dtype hundreds of times slower than fp32 (bf16 on CPUs without
    AVX-512-BF16 or AMX) is measured at a small n in seconds instead of minutes."""
    device = device or default_device()
    n, spent = 128, 0.0
    while True:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        once = _timed(lambda: a @ b, device)          # the first call also warms up
        once = min(once, _timed(lambda: a @ b, device))
        spent += 2 * once
        if n >= n_max or spent + 16 * once > budget_s / 2:
            break
        n *= 2
    reps = max(1, min(50, int(budget_s / 2 / max(once, 1e-9))))
    seconds = _timed(lambda: [a @ b for _ in range(reps)], device)
    return 2 * n ** 3 * reps / seconds


def _timed(fn, device: torch.device) -> float:
    t = time.perf_counter()
    fn()
    if device.type == "cuda":
        torch.cuda.synchronize(device)
    return time.perf_counter() - t


def precision_name(dtype: torch.dtype | None, device: torch.device) -> str:
    """What a row records: bf16 autocast, fp32 with TF32 matmuls (CUDA), or fp32."""
    if dtype is not None:
        return "bf16"
    return "fp32+tf32" if device.type == "cuda" else "fp32"


def prepare_device(device: torch.device) -> None:
    """fp32 matmuls on CUDA in TF32 (Ampere and newer; a no-op before), as fp32 training usually
    runs there; its precision is recorded with the row (precision_name). And torch.compile's
    caches (Inductor's FX graph cache and AOTAutograd's, both on by default) under shapebench's
    cache folder rather than /tmp, so that a trial of shapes compiled before, in any earlier
    process on this node, reuses the generated code after a reboot too (an H100: Hyperloop's
    first step 71 s cold, 7 s warm). TORCHINDUCTOR_CACHE_DIR, when set, wins."""
    import os

    from benchmark.data import cache_root

    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast(device_type: str, dtype: torch.dtype | None):
    """Autocast to `dtype`, or with None float32 (`float32_region`: nothing where autocast is
    off, which keeps a compiled region cacheable)."""
    return float32_region(device_type) if dtype is None else torch.autocast(device_type=device_type, dtype=dtype)


def lm_loss(model, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None, loops: int | None = None,
            head=None) -> torch.Tensor:
    """Mean next-token cross-entropy; logits are upcast so the softmax runs in float32. `head`
    (default `head_loss`) scores the model's features: the training step passes it compiled."""
    with autocast(x.device.type, dtype):
        h = model.features(x, loops=loops)                  # (B, T, d)
    return (head or head_loss)(model, h, y, dtype)


class LossModule(torch.nn.Module):
    """The whole training loss as one module's forward, `lm_loss(model, x, y)`: what a
    data-parallel wrapper wraps (trial/distributed.py). DDP arms its gradient all-reduce in the
    wrapped module's `forward`, and `lm_loss` calls the model's parts (`features`, the head)
    directly, so wrapping the model itself would train each rank on its own gradients. The
    single-process step runs the same module, so both paths compute the same thing."""

    def __init__(self, model: torch.nn.Module, dtype: torch.dtype | None, head=None):
        super().__init__()
        self.model, self.dtype, self.head = model, dtype, head

    def forward(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return lm_loss(self.model, x, y, self.dtype, head=self.head)


def head_loss(model, h: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """Final norm, head and cross-entropy: one region for the compiler, which fuses the softmax
    over the vocabulary with the loss rather than writing the (B, T, vocab) log-probabilities."""
    with autocast(h.device.type, dtype):
        logits = model._logits(h)                            # (B, T, vocab)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


# Logits a scoring pass holds at once (elements). On a CPU, 2^20 float32 is 4 MB, which stays in
# the last-level cache between the head's matmul and the softmax: a whole quickstart evaluation
# (24K tokens, vocab 8,192, 128 rows a chunk) took 0.78-0.82 s for the Transformer and 1.04-1.09 s
# for Hyperloop where 2^21 (256 rows) took 0.89 and 1.13-1.18 (2-core AMD EPYC, 2026-11-24, three
# runs of five rounds interleaved; 2^18 and 2^19 in between). Elsewhere (a GPU, not measured)
# chunks of 2^26 (256 MB) keep the kernel count low and still bound the memory the logits take:
# a whole 16 x 1024-token batch at a 50K vocabulary would hold 3.3 GB.
SCORE_CHUNK_LOGITS = {"cpu": 2 ** 20}
SCORE_CHUNK_LOGITS_OTHER = 2 ** 26


@torch.no_grad()
def score_head_loss(model, h: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None) -> torch.Tensor:
    """head_loss for evaluation (no gradient), over chunks of tokens: the same mean, without the
    (B, T, vocab) logits written out and read back by the softmax. Measured on a 2-core AMD EPYC
    (32 MB L3), quickstart shapes (2,048 tokens, d 96, vocab 8,192): head and loss 110 ms per batch
    in one piece, 57 ms in chunks of 256 tokens (the softmax was memory-bound: 37 of them in
    log_softmax); an evaluation of the quickstart Transformer is mostly head."""
    h, y = h.flatten(0, -2), y.flatten()
    rows = max(64, SCORE_CHUNK_LOGITS.get(h.device.type, SCORE_CHUNK_LOGITS_OTHER) // model.spec.vocab_size)
    total = h.new_zeros((), dtype=torch.float64)  # the chunks' sums: float64, as evaluation adds batches
    for hc, yc in zip(h.split(rows), y.split(rows)):
        with autocast(h.device.type, dtype):
            logits = model._logits(hc)
        total = total + F.cross_entropy(logits.float(), yc, reduction="sum").double()
    return (total / max(y.numel(), 1)).float()


COMPILE_SCOPES = ("regions", "model")


def compile_regions(model) -> Callable[[], None]:
    """Regional compilation: each of the model's repeated units (`LanguageModel.regions`: its
    layers or sublayers, its gates) gets its own compiled method, with one graph per class that
    every layer and loop reuses. Returns the function that makes the model eager again, which
    the step calls when training ends: a deep copy (quantisation) must not carry methods bound
    to the original model.

    Measured on a 2-core AMD EPYC (AVX2, torch 2.13, quickstart shapes, seq 128, batch 16),
    against the whole loss compiled as one graph: first step cold 12-15 s vs 26-38 s, warm
    (compile cache) 2.0 s vs 5.7-7.1 s, steady tokens/s within 3% (Transformer 8,277 vs 8,281;
    Hyperloop 6,176 vs 6,344); eager 6,921 and 5,245. Most of the gain is the head's fused
    softmax (the head alone compiled: 7,917 and 6,075)."""
    compiled = []
    for module, name in model.regions():
        setattr(module, name, torch.compile(getattr(module, name), dynamic=False))
        compiled.append((module, name))

    def restore():
        for module, name in compiled:
            module.__dict__.pop(name, None)
    return restore


def cached_functions():
    """Lets torch's AOTAutograd cache keep graphs with a custom autograd Function in them (the
    gates' write, StreamWrite in models/hyper.py), which it passes by unless told: a warm trial of
    a hyper-connected family then re-traced that region each time. Its key covers the Function's
    traced forward and backward (a changed backward missed the cache and trained differently,
    checked 2026-11-24, torch 2.13); a quickstart Hyperloop's warm first step took 0.94-1.01 s
    against 1.57 (2-core AMD EPYC). Scoped to the step, so code compiled elsewhere in the process
    keeps torch's default."""
    return torch._functorch.config.patch(autograd_cache_allow_custom_autograd_functions=True)


class TrainStep:
    """One optimiser step: forward + backward (compiled when asked), gradient clipping, update.
    Returns the loss as a detached tensor so callers decide when to synchronise. Call `close()`
    when done: a compiled step leaves the model eager again. `fresh=False` keeps the code compiled
    for other live steps (benchmark.perf interleaves a few models' steps in one process)."""

    def __init__(self, model, optimizer, policy: ExecPolicy, device: torch.device, clip: float | None = 1.0,
                 fresh: bool = True, parallel=None):
        self.model, self.optimizer, self.clip = model, optimizer, clip
        self.dtype = policy.autocast_dtype(device)
        self.close = lambda: None
        self.scope = cached_functions if policy.compile else contextlib.nullcontext
        head = None
        if policy.compile:
            # A fresh model per step function: drop code compiled for earlier models, which would
            # otherwise fill dynamo's per-function cache (8 entries) and silently fall back to eager
            # after eight architectures in one process (a reused Ray worker, the perf benchmark).
            if fresh:
                torch._dynamo.reset()
            if policy.compile_scope == "regions":
                self.close = compile_regions(model)
                head = torch.compile(head_loss, dynamic=False)
        loss = LossModule(model, self.dtype, head)
        if policy.compile and policy.compile_scope == "model":   # one graph of the whole loss
            loss.forward = torch.compile(loss.forward, dynamic=False)
        # `parallel` (trial/distributed.py Ranks) wraps the loss after compiling, as torchtitan
        # and OLMo-core order it: DDP or FSDP2 around compiled regions. None: one process.
        self.parallel = parallel
        self.loss = loss if parallel is None else parallel.wrap(loss, optimizer)

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.accumulate([(x, y)])

    def accumulate(self, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One step over k equal micro-batches: each loss scaled by 1/k before its backward, so the
        summed gradient is that of the mean loss over all k, as one batch k times larger gives.
        Across ranks the gradients are averaged once, in the last micro-batch's backward (the
        others run without sync), and the step's loss is the ranks' mean: the global batch's."""
        total = None
        for k, (x, y) in enumerate(micro):
            last = k == len(micro) - 1
            sync = contextlib.nullcontext() if self.parallel is None else self.parallel.sync(self.loss, last)
            with self.scope(), sync:             # where the regions compile, forward and backward
                loss = self.loss(x, y) / len(micro)
                loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total if self.parallel is None else self.parallel.mean(total)


def policy_of(cfg) -> ExecPolicy:
    """A TrainConfig's execution policy (TrainConfig itself is torch-free)."""
    return ExecPolicy(precision=cfg.precision, compile=cfg.compile)


def device_of(cfg) -> torch.device:
    """A TrainConfig's device: `auto` is the best one here."""
    return default_device() if cfg.device == "auto" else torch.device(cfg.device)

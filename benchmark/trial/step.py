"""The training step and its execution policy: bf16 autocast and torch.compile where they help,
the same code on CPU and CUDA. Training loops (training.py) and the speed benchmark (perf.py)
both use `TrainStep`, so the path that is benchmarked is the path that trains.
"""

from __future__ import annotations

from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmark.trial.config import PRECISIONS


@dataclass(frozen=True, kw_only=True)
class ExecPolicy:
    """How a model runs. `precision: auto` picks bf16 autocast where bf16 matmuls are fast (CUDA
    with bf16; CPUs with AMX); `compile` wraps the loss in torch.compile."""

    precision: str = "auto"
    compile: bool = True

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: '{self.precision}' is not one of {', '.join(PRECISIONS)}")

    def autocast_dtype(self, device: torch.device) -> torch.dtype | None:
        if self.precision == "fp32":
            return None
        if self.precision == "bf16" or bf16_supported(device):
            return torch.bfloat16
        return None


def bf16_supported(device: torch.device) -> bool:
    """Whether bf16 autocast is *faster* here. On CPUs that needs AMX tiles: with AVX512-BF16 alone
    oneDNN's bf16 matmul measured slower than fp32 MKL on our 2-core runners (see perf.py), so
    `auto` stays in fp32 there. A fixed rule per machine, not a timing probe, keeps runs reproducible."""
    if device.type == "cuda":
        # Native bf16 tensor cores from compute capability 8.0 (Ampere); torch's
        # is_bf16_supported() also counts emulation, which would train V100s and T4s slowly.
        return torch.cuda.get_device_capability(device) >= (8, 0)
    if device.type == "cpu":
        return _cpu_has_amx() and bool(torch.ops.mkldnn._is_mkldnn_bf16_supported())
    return False


def _cpu_has_amx() -> bool:
    try:
        with open("/proc/cpuinfo") as f:
            return "amx_bf16" in f.read()
    except OSError:
        return False


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


def lm_loss(model, x: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None, loops: int | None = None) -> torch.Tensor:
    """Mean next-token cross-entropy; logits are upcast so the softmax runs in float32."""
    with torch.autocast(device_type=x.device.type, dtype=dtype or torch.float32, enabled=dtype is not None):
        logits = model(x, loops=loops)                        # (B, T, vocab)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


class TrainStep:
    """One optimiser step: forward + backward (compiled when asked), gradient clipping, update.
    Returns the loss as a detached tensor so callers decide when to synchronise."""

    def __init__(self, model, optimizer, policy: ExecPolicy, device: torch.device, clip: float | None = 1.0):
        self.model, self.optimizer, self.clip = model, optimizer, clip
        self.dtype = policy.autocast_dtype(device)
        loss = lambda x, y: lm_loss(model, x, y, self.dtype)  # noqa: E731 (compiled as a unit)
        if policy.compile:
            # A fresh model per step function: drop code compiled for earlier models, which would
            # otherwise fill dynamo's per-function cache (8 entries) and silently fall back to eager
            # after eight architectures in one process (a reused Ray worker, the perf benchmark).
            torch._dynamo.reset()
        self.loss = torch.compile(loss, dynamic=False) if policy.compile else loss

    def __call__(self, x: torch.Tensor, y: torch.Tensor) -> torch.Tensor:
        return self.accumulate([(x, y)])

    def accumulate(self, micro: list[tuple[torch.Tensor, torch.Tensor]]) -> torch.Tensor:
        """One step over k equal micro-batches: each loss scaled by 1/k before its backward, so the
        summed gradient is that of the mean loss over all k, as one batch k times larger gives."""
        total = None
        for x, y in micro:
            loss = self.loss(x, y) / len(micro)
            loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        if self.clip:
            torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total


def policy_of(cfg) -> ExecPolicy:
    """A TrainConfig's execution policy (TrainConfig itself is torch-free)."""
    return ExecPolicy(precision=cfg.precision, compile=cfg.compile)


def device_of(cfg) -> torch.device:
    """A TrainConfig's device: `auto` is the best one here."""
    return default_device() if cfg.device == "auto" else torch.device(cfg.device)

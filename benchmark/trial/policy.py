"""The execution policy: which precision and device a model runs in. `precision: auto` picks bf16
autocast where it is faster (CUDA with bf16 tensor cores; a CPU whose measured bf16 matmuls are),
measured once per machine; fp32 on CUDA runs its matmuls in TF32. Read by the training step
(step.py), evaluation, lm-eval scoring and the speed benchmark.
"""

from __future__ import annotations

import os
import time
from dataclasses import dataclass

import torch

from benchmark.data import cache_root
from benchmark.models.layers import float32_region
from benchmark.recipe import PRECISIONS
from benchmark.store import speeds
from benchmark.trial.compilation import COMPILE_SCOPES


@dataclass(frozen=True, kw_only=True)
class ExecPolicy:
    """How a model runs. `precision: auto` picks bf16 autocast where it is faster (CUDA with bf16
    tensor cores; a CPU whose measured bf16 matmuls are, `bf16_faster_here`); `compile` compiles
    the model's regions and the head with its loss (`compile_regions`), or with `compile_scope:
    model` the whole loss as one graph."""

    precision: str = "auto"
    compile: bool = True
    compile_scope: str = (
        "regions"  # or "model": the whole loss as one graph (benchmark.perf compares them)
    )

    def __post_init__(self):
        if self.precision not in PRECISIONS:
            raise ValueError(f"precision: '{self.precision}' is not one of {', '.join(PRECISIONS)}")
        if self.compile_scope not in COMPILE_SCOPES:
            raise ValueError(
                f"compile_scope: '{self.compile_scope}' is not one of {', '.join(COMPILE_SCOPES)}"
            )

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
# AMX several times faster (bf16 wins), a Xeon with AVX512-BF16 only at half fp32's rate and AMD
# EPYCs with AVX2 only, where bf16 is emulated, 50-100x slower (fp32 wins).
BF16_MARGIN = 1.25
PROBE_BUDGET_S = (
    0.5  # per dtype: the probe's few seconds are paid once per CPU model and torch version
)
PROBE_ROUNDS = 3  # fp32 and bf16 timed in turn, each dtype's best round kept


def bf16_faster_here() -> bool:
    """`auto` on this CPU: fp32 where the CPU has no native bf16 instruction (speeds.cpu_flags),
    else from a timed matmul probe (bounded in time whatever bf16's speed; `matmul_peak`) cached
    per CPU model, core count and torch version (store/speeds.py), so every run on one machine
    makes the same choice: a process decides once, and concurrent workers on a fresh machine wait
    for one probe rather than each timing matmuls while the others run. The dtypes are timed in
    alternating rounds and each keeps its best: other work on a shared CPU only slows a round, and
    a single slowed fp32 pass can make an emulated bf16 look faster. `benchmark.perf models` shows
    how the choice compares with eager fp32, compiled fp32 and compiled bf16 side by side."""
    path = speeds.path_in(cache_root())
    if str(path) not in _BF16_FASTER:
        flags = speeds.cpu_flags()
        if flags is not None and not flags & speeds.NATIVE_BF16_FLAGS:
            _BF16_FASTER[str(path)] = False
            return False
        probe = speeds.precision_probe(path)
        if probe is None:
            from filelock import FileLock

            with FileLock(str(path) + ".probe.lock", timeout=60):
                probe = speeds.precision_probe(path)
                if probe is None:
                    probe = _probe_in_rounds()
                    speeds.record_precision_probe(path, probe["fp32"], probe["bf16"])
        _BF16_FASTER[str(path)] = probe["bf16"] >= BF16_MARGIN * probe["fp32"]
    return _BF16_FASTER[str(path)]


def _probe_in_rounds() -> dict[str, float]:
    cpu, best = torch.device("cpu"), {"fp32": 0.0, "bf16": 0.0}
    for _ in range(PROBE_ROUNDS):
        for name, dtype in (("fp32", torch.float32), ("bf16", torch.bfloat16)):
            peak = matmul_peak(dtype, PROBE_BUDGET_S / PROBE_ROUNDS, device=cpu)
            best[name] = max(best[name], peak)
    return best


_BF16_FASTER: dict[str, bool] = {}  # speeds file -> this process's choice


def matmul_peak(
    dtype: torch.dtype, budget_s: float = 2.0, n_max: int = 2048, device: torch.device | None = None
) -> float:
    """Achieved FLOP/s of an n x n matmul, the machine's practical peak for that dtype, within
    about `budget_s` whatever the dtype's speed: n doubles from 128 only while the next size (8x
    the work) still fits, so a dtype hundreds of times slower than fp32 (bf16 on CPUs without
    AVX-512-BF16 or AMX) is measured at a small n in seconds instead of minutes."""
    device = device or default_device()
    n, spent = 128, 0.0
    while True:
        a = torch.randn(n, n, device=device).to(dtype)
        b = torch.randn(n, n, device=device).to(dtype)
        once = _timed(lambda: a @ b, device)  # the first call also warms up
        once = min(once, _timed(lambda: a @ b, device))
        spent += 2 * once
        if n >= n_max or spent + 16 * once > budget_s / 2:
            break
        n *= 2
    reps = max(1, min(50, int(budget_s / 2 / max(once, 1e-9))))
    seconds = _timed(lambda: [a @ b for _ in range(reps)], device)
    return 2 * n**3 * reps / seconds


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
    process on this node, reuses the generated code after a reboot too (a tenth of a cold first
    step: benchmarks/2026-11-27-measurements-from-comments.md, "The compile cache"). TORCHINDUCTOR_CACHE_DIR, when set, wins."""
    os.environ.setdefault("TORCHINDUCTOR_CACHE_DIR", str(cache_root() / "inductor"))
    if device.type == "cuda":
        torch.backends.cuda.matmul.allow_tf32 = True
        torch.backends.cudnn.allow_tf32 = True


def default_device() -> torch.device:
    return torch.device("cuda" if torch.cuda.is_available() else "cpu")


def autocast(device_type: str, dtype: torch.dtype | None):
    """Autocast to `dtype`, or with None float32 (`float32_region`: nothing where autocast is
    off, which keeps a compiled region cacheable)."""
    return (
        float32_region(device_type)
        if dtype is None
        else torch.autocast(device_type=device_type, dtype=dtype)
    )


def policy_of(cfg) -> ExecPolicy:
    """A TrainConfig's execution policy (TrainConfig itself is torch-free)."""
    return ExecPolicy(precision=cfg.precision, compile=cfg.compile)


def device_of(cfg) -> torch.device:
    """A TrainConfig's device: `auto` is the best one here."""
    return default_device() if cfg.device == "auto" else torch.device(cfg.device)

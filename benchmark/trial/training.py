"""One trial: a spec plus training settings in, a row of measurements out.

AdamW (β = (0.9, 0.95), weight decay 0.1 by `models.weight_decays`), gradient clipping at 1.0, linear warmup
then cosine or warmup-stable-decay, a token budget given as a count ("5M") or a multiple of the
parameters ("20x"), periodic evaluation, bf16 autocast and torch.compile where they help (with a
switch to turn them off), seeded so the same spec, settings and seed give the same losses on CPU.
A NaN/inf loss stops the trial as `diverged`.
"""

from __future__ import annotations

import math
import resource
import time
from dataclasses import dataclass, field
from typing import Callable, Mapping

import torch

from benchmark.arch.counting import count_flops, count_params
from benchmark.arch.spec import ArchSpec
from benchmark.models import build_model, weight_decays
from benchmark.trial.config import TrainConfig
from benchmark.trial.evaluate import evaluate
from benchmark.trial.step import TrainStep, device_of, policy_of


class TrialDiverged(RuntimeError):
    """The training loss became NaN or infinite."""


def make_optimizer(model: torch.nn.Module, cfg: TrainConfig) -> torch.optim.Optimizer:
    """AdamW; weight decay where `models.weight_decays` says (matrices, not norms, static
    hyper-connection parameters or loop embeddings)."""
    named = list(model.named_parameters())
    decay = [p for name, p in named if weight_decays(name, p)]
    other = [p for name, p in named if not weight_decays(name, p)]
    groups = [{"params": decay, "weight_decay": cfg.weight_decay}, {"params": other, "weight_decay": 0.0}]
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=(cfg.beta1, cfg.beta2))


@dataclass
class TrainResult:
    model: torch.nn.Module
    steps: int
    tokens_trained: int
    train_loss: float
    losses: list[float] = field(default_factory=list)   # every step's training loss
    evals: list[dict] = field(default_factory=list)     # periodic evaluations (step, val_loss)
    tokens_per_s: float = 0.0
    flops_per_s: float = 0.0
    wall_s: float = 0.0
    peak_mem_bytes: int = 0


def train(spec: ArchSpec, cfg: TrainConfig, batches, eval_data: Mapping[str, torch.Tensor] | None = None,
          on_step: Callable[[int, int, float], None] | None = None,
          on_eval: Callable[[dict], None] | None = None) -> TrainResult:
    """Train a fresh model of `spec` on `batches` (an iterator of (x, y) token tensors) for the
    configured token budget. `on_step(step, total, loss)` reports progress; `on_eval(record)`
    receives every periodic evaluation (step, tokens, val_loss, val_ppl, ...)."""
    device = device_of(cfg)
    torch.manual_seed(cfg.seed)
    model = build_model(spec).to(device).train()
    opt = make_optimizer(model, cfg)
    step_fn = TrainStep(model, opt, policy_of(cfg), device, clip=cfg.grad_clip)
    params = count_params(spec)
    total = cfg.steps(params)
    result = TrainResult(model=model, steps=total, tokens_trained=0, train_loss=float("nan"))
    t0 = time.perf_counter()
    timed_from, timed_tokens = None, 0
    for step in range(total):
        for group in opt.param_groups:
            group["lr"] = cfg.lr_at(step, total)
        x, y = next(batches)
        loss = step_fn(x.to(device), y.to(device)).item()
        if not math.isfinite(loss):
            raise TrialDiverged(f"loss is {loss} at step {step} of {total}")
        result.losses.append(loss)
        result.tokens_trained += x.numel()
        if step == 0:  # the first step pays for compilation; throughput is timed after it
            timed_from = time.perf_counter()
        else:
            timed_tokens += x.numel()
        if on_step is not None:
            on_step(step + 1, total, loss)
        if eval_data is not None and cfg.eval_every and (step + 1) % cfg.eval_every == 0 and step + 1 < total:
            record = {"step": step + 1, "tokens": result.tokens_trained, **evaluate(model, eval_data, cfg)}
            result.evals.append(record)
            if on_eval is not None:
                on_eval(record)
            model.train()
    end = time.perf_counter()
    result.wall_s = end - t0
    timed = end - (timed_from or t0)
    result.tokens_per_s = timed_tokens / timed if timed_tokens else result.tokens_trained / result.wall_s
    result.flops_per_s = result.tokens_per_s * count_flops(spec, cfg.seq_len)["train"]
    result.train_loss = result.losses[-1]
    result.peak_mem_bytes = peak_memory_bytes(device)
    model.eval()
    return result


def peak_memory_bytes(device: torch.device) -> int:
    """CUDA: peak allocated by torch. CPU: the process's peak resident set size."""
    if device.type == "cuda":
        return int(torch.cuda.max_memory_allocated(device))
    return int(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss) * 1024

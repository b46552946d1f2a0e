"""Training settings: a torch-free dataclass, so the search space validates its `training:`
section with the very class a trial trains with (one validator path)."""

from __future__ import annotations

import math
from dataclasses import dataclass, fields
from typing import Any, Mapping

from benchmark.space.budget import parse_amount, parse_tokens

SCHEDULES = ("cosine", "wsd")
PRECISIONS = ("auto", "bf16", "fp32")
TOKENS_PER = ("total", "non_embedding")


@dataclass(frozen=True, kw_only=True)
class TrainConfig:
    tokens: str | int = "20x"     # absolute ("5M", 5_000_000) or a multiple of parameters ("20x")
    tokens_per: str = "total"     # which parameter count "Nx" multiplies: total | non_embedding
    seq_len: int = 256
    batch_size: int = 16
    lr: float = 6e-4
    min_lr: float | None = None   # end of the decay; default lr / 10 (Hyperloop App. A: 4e-4 -> 4e-5)
    schedule: str = "cosine"
    warmup: float = 0.05          # fraction of the steps (< 1) or a number of steps (>= 1)
    decay: float = 0.2            # wsd: fraction of the steps in the final decay (AbbIE §3.2)
    weight_decay: float = 0.1
    beta1: float = 0.9
    beta2: float = 0.95
    grad_clip: float = 1.0
    eval_every: int = 0           # steps between evaluations; 0 = at the end only
    eval_tokens: int | str = 65_536  # held-out tokens per source
    precision: str = "auto"
    compile: bool = True
    seed: int = 0
    device: str = "auto"

    def __post_init__(self):
        for name, ok, why in (
            ("schedule", self.schedule in SCHEDULES, f"one of {', '.join(SCHEDULES)}"),
            ("precision", self.precision in PRECISIONS, f"one of {', '.join(PRECISIONS)}"),
            ("tokens_per", self.tokens_per in TOKENS_PER, "total or non_embedding"),
            ("seq_len", self.seq_len >= 1, "a positive integer"),
            ("batch_size", self.batch_size >= 1, "a positive integer"),
            ("lr", self.lr > 0, "a positive number"),
            ("warmup", self.warmup >= 0, "a fraction or a number of steps >= 0"),
            ("decay", 0 <= self.decay <= 1, "a fraction in [0, 1]"),
        ):
            if not ok:
                raise ValueError(f"training.{name}: {getattr(self, name)!r} must be {why}")
        try:
            parse_tokens(self.tokens)
            object.__setattr__(self, "eval_tokens", parse_amount(self.eval_tokens))
        except ValueError as e:
            raise ValueError(f"training.tokens: {e}") from None

    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "TrainConfig":
        known = {f.name for f in fields(cls)}
        unknown = sorted(set(raw) - known)
        if unknown:
            raise ValueError(f"training.{unknown[0]}: unknown key (known: {', '.join(sorted(known))})")
        return cls(**raw)

    def total_tokens(self, params: Mapping[str, int]) -> int:
        return parse_tokens(self.tokens).resolve(params[self.tokens_per])

    def steps(self, params: Mapping[str, int]) -> int:
        return max(1, math.ceil(self.total_tokens(params) / (self.batch_size * self.seq_len)))

    def lr_at(self, step: int, total: int) -> float:
        """Linear warmup, then cosine to min_lr_ratio, or stable then cosine decay (WSD)."""
        warm = int(self.warmup if self.warmup >= 1 else round(self.warmup * total))
        if step < warm:
            return self.lr * (step + 1) / warm
        floor = self.lr / 10 if self.min_lr is None else self.min_lr
        if self.schedule == "cosine":
            start, length = warm, max(1, total - warm)
        else:
            length = max(1, int(round(self.decay * total)))
            start = total - length
            if step < start:
                return self.lr
        progress = min(1.0, (step - start) / length)
        return floor + 0.5 * (self.lr - floor) * (1 + math.cos(math.pi * progress))

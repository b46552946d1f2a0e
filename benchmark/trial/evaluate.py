"""Held-out evaluation: validation loss and perplexity overall and per source, and at each
loop count for looped models (test-time scaling: AbbIE Fig. 6, Hyperloop Fig. 2)."""

from __future__ import annotations

import math
from typing import Mapping

import numpy as np
import torch

from benchmark.trial.policy import device_of, policy_of
from benchmark.trial.step import lm_loss, score_head_loss


@torch.no_grad()
def source_losses(
    model,
    eval_data: Mapping[str, torch.Tensor],
    batch_size: int = 16,
    dtype: torch.dtype | None = None,
    loops: int | None = None,
) -> dict[str, tuple[float, int]]:
    """{source: (mean next-token loss, tokens)} over fixed windows (N, T+1) per source."""
    was_training = model.training
    model.eval()
    device = next(model.parameters()).device
    totals, counts = {}, {}
    for name, windows in eval_data.items():
        # Summed on the device and read once at the end: a read per batch would make the host wait
        # for the GPU after every batch (float64, as the sum of .item() values was, so the same numbers).
        total, count = torch.zeros((), dtype=torch.float64, device=device), 0
        for i in range(0, len(windows), batch_size):
            w = windows[i : i + batch_size].to(device)
            n = w[:, 1:].numel()
            total = (
                total
                + lm_loss(model, w[:, :-1], w[:, 1:], dtype, loops, score_head_loss).double() * n
            )
            count += n
        totals[name], counts[name] = total, count
    model.train(was_training)
    read = torch.stack(list(totals.values())).tolist() if totals else []  # the one host sync
    return {name: (t / max(counts[name], 1), counts[name]) for name, t in zip(totals, read)}


def evaluate(
    model, eval_data: Mapping[str, torch.Tensor], cfg=None, loops: int | None = None
) -> dict:
    """val_loss (token-weighted over sources), val_ppl and val_loss_by_source."""
    dtype = policy_of(cfg).autocast_dtype(device_of(cfg)) if cfg is not None else None
    batch = cfg.batch_size if cfg is not None else 16
    per = source_losses(model, eval_data, batch, dtype, loops)
    tokens = sum(n for _, n in per.values())
    loss = sum(mean * n for mean, n in per.values()) / max(tokens, 1)
    return {
        "val_loss": loss,
        "val_ppl": math.exp(min(loss, 50.0)),
        "val_loss_by_source": {k: mean for k, (mean, _) in per.items()},
    }


def evaluate_loops(
    model, eval_data: Mapping[str, torch.Tensor], loop_counts, cfg=None
) -> dict[int, dict]:
    """`evaluate` at each loop count (the model's `eval_loops`): {r: {val_loss, val_ppl, ...}}."""
    return {r: evaluate(model, eval_data, cfg, loops=r) for r in loop_counts}


def unigram_perplexity(counts: np.ndarray, eval_data: Mapping[str, torch.Tensor]) -> float:
    """The perplexity of the best context-free model (the training split's token frequencies,
    `counts` from TokenArray.counts, add-one smoothed) on the same targets `evaluate` scores: the
    floor a model must beat to have learned anything beyond frequencies."""
    p = counts.astype(np.float64) + 1.0
    logp = np.log(p / p.sum())
    targets = np.concatenate([w[:, 1:].reshape(-1).numpy() for w in eval_data.values()])
    return float(np.exp(-logp[targets].mean()))

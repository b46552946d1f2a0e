"""How a trial reads its token arrays: endless random training batches, and the fixed held-out
windows (per corpus part) that every evaluation scores. torch is imported inside the functions,
so planning tools that import benchmark.data stay light."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from benchmark.data.cache import TokenArray

if TYPE_CHECKING:
    import torch


def batches(
    tokens: np.ndarray, seq_len: int, batch_size: int, seed: int, *, skip: int = 0
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless training batches of uniformly random windows: inputs (B, T) and the targets one
    token later (B, T), int64. One seed gives one sequence of batches; `skip` drops the first
    batches without reading them, so a resumed run continues the same sequence."""
    import torch

    n_starts = len(tokens) - seq_len  # a window is seq_len + 1 tokens
    if n_starts < 1:
        raise ValueError(f"a training window needs seq_len + 1 = {seq_len + 1} tokens; the data has {len(tokens)}")
    generator = torch.Generator().manual_seed(seed)
    offsets = np.arange(seq_len + 1)
    for step in itertools.count():
        starts = torch.randint(n_starts, (batch_size,), generator=generator).numpy()
        if step < skip:
            continue
        windows = torch.from_numpy(tokens[starts[:, None] + offsets].astype(np.int64))  # (B, T + 1)
        yield windows[:, :-1].contiguous(), windows[:, 1:].contiguous()


def eval_windows(tokens: np.ndarray, seq_len: int, n_tokens: int) -> torch.Tensor:
    """The fixed held-out set: consecutive windows from the start of `tokens`, (N, seq_len + 1)
    int64, overlapping by one token (inputs w[:, :-1], targets w[:, 1:]) so that each of the first
    N * seq_len <= n_tokens targets is scored once. Fewer windows when tokens is shorter."""
    import torch

    n_windows = min(n_tokens, len(tokens) - 1) // seq_len
    if n_windows < 1:
        raise ValueError(f"an evaluation window needs seq_len + 1 = {seq_len + 1} tokens; the data has {len(tokens)}")
    index = np.arange(n_windows)[:, None] * seq_len + np.arange(seq_len + 1)  # (N, T + 1)
    return torch.from_numpy(tokens[index].astype(np.int64))


def eval_sets(val: TokenArray, seq_len: int, n_tokens: int) -> dict[str, torch.Tensor]:
    """eval_windows for each part of the validation split, so a loss can be reported per part."""
    return {name: eval_windows(val.part(name), seq_len, n_tokens) for name in val.spans}

"""How a trial reads its token arrays: endless random training batches and the fixed held-out
windows that every evaluation scores, both drawn from the parts by the corpus's weights
(TokenArray.weights), so that training and validation see one mixture. torch is imported inside
the functions, so planning tools that import benchmark.data stay light.

Training: each batch gives part p floor(B * w_p) rows and draws the few remaining rows from the
parts by their leftover fractions, so every batch holds the mixture to within a row and the
realised shares equal the weights in expectation. Which windows the rows read (`sampling`, the
space's `data.sampling`): `permutation` cuts each part into windows of seq_len + 1 tokens that
overlap by one (each target scored once) and reads them in a permutation of its own per pass
(seeded by the seed, the part and the pass, as OLMo shuffles a global index per epoch), so a run of
one pass reads each token once and a part smaller than its share is read again in a new order;
`replacement` starts every window uniformly at random inside its part (with replacement), the
sampling of studies begun before (their declaration says so), which finish under it. Either way a
part is read about w_p * tokens / len(part) times in a run (`passes`), and the batch at step k is a
function of the data, the seed and k alone, so `skip=k` resumes a run exactly. Validation: part p gets the
first round(N * w_p) windows of its held-out split, so `val_loss`, the token-weighted mean that
evaluation computes, is the mixture's loss to within one window per part; each part's own loss
stays in `val_loss_by_source`. Sampling the held-out tokens by the weights, rather than weighting
the per-part losses, means every reader of these windows (val_loss, the perplexities per loop
count and per precision, the unigram floor, the diagnostics) sees the mixture without being told
the weights."""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterator
from typing import TYPE_CHECKING

import numpy as np

from benchmark.data.cache import TokenArray
from benchmark.recipe import SAMPLINGS

if TYPE_CHECKING:
    import torch


def batches(
    train: TokenArray,
    seq_len: int,
    batch_size: int,
    seed: int,
    *,
    skip: int = 0,
    sampling: str = "permutation",
) -> Iterator[tuple[torch.Tensor, torch.Tensor]]:
    """Endless training batches of windows drawn by the mixture (module docstring): inputs (B, T)
    and the targets one token later (B, T), int64, rows grouped by part. One seed gives one
    sequence of batches; `skip` drops the first batches without reading them, so a resumed run
    continues the same sequence. A one-part array under `replacement` draws exactly as the
    concatenated rule did."""
    import torch

    if not isinstance(
        train, TokenArray
    ):  # its tokens alone lose the weights: the old, concatenated rule
        raise TypeError(
            f"batches takes the split's TokenArray (data.train), which carries the mixture, not {type(train).__name__}"
        )
    if sampling not in SAMPLINGS:
        raise ValueError(f"data.sampling: {sampling!r} is not one of {', '.join(SAMPLINGS)}")
    names = list(train.weights)
    parts = [train.part(name) for name in names]
    for name, tokens in zip(names, parts):  # a window is seq_len + 1 tokens
        if len(tokens) <= seq_len:
            raise ValueError(
                f"a training window needs seq_len + 1 = {seq_len + 1} tokens; "
                f"part {name!r} of the data has {len(tokens)}"
            )
    base, leftover = _floor_shares(batch_size, train.weights)
    extra = batch_size - int(base.sum())  # rows drawn by the leftover fractions, 0 for one part
    generator = torch.Generator().manual_seed(seed)
    windows = [_Windows(len(t), seq_len, seed, i) for i, t in enumerate(parts)]
    offsets = np.arange(seq_len + 1)
    for step in itertools.count():
        rows = base.copy()
        if extra:
            drawn = torch.multinomial(
                torch.from_numpy(leftover), extra, replacement=True, generator=generator
            )
            rows += np.bincount(drawn.numpy(), minlength=len(names))
        if sampling == "replacement":  # the generator's draws, in the order studies began with
            starts = [
                torch.randint(len(t) - seq_len, (int(n),), generator=generator).numpy()
                for t, n in zip(parts, rows)
            ]
        else:  # a cursor per part: skipping a step moves it without reading a token
            starts = [w.take(int(n), read=step >= skip) for w, n in zip(windows, rows)]
        if step < skip:
            continue
        batch = np.concatenate(
            [t[s[:, None] + offsets] for t, s in zip(parts, starts)]
        )  # (B, T + 1)
        batch = torch.from_numpy(batch.astype(np.int64))
        yield batch[:, :-1].contiguous(), batch[:, 1:].contiguous()


class _Windows:
    """One part's windows without replacement within a pass: window i starts at i * seq_len (the
    last target of one is the first input of the next), read in pass k's permutation, a function
    of (seed, part, k) alone."""

    def __init__(self, length: int, seq_len: int, seed: int, part: int):
        self.count = (length - 1) // seq_len  # windows of seq_len + 1 tokens, overlapping by one
        self.seq_len, self.seed, self.part = seq_len, seed, part
        self.cursor, self.order = 0, {}

    def take(self, n: int, read: bool = True) -> np.ndarray | None:
        """The starts of the next n windows (None, moving on alone, when not `read`)."""
        at, self.cursor = self.cursor, self.cursor + n
        if not read:
            return None
        if n == 0:  # a part the batch's leftover rows passed over
            return np.zeros(0, dtype=np.int64)
        index = np.arange(at, at + n)
        passes, within = np.divmod(index, self.count)
        order = np.concatenate([self._order(k)[within[passes == k]] for k in np.unique(passes)])
        return order.astype(np.int64) * self.seq_len

    def _order(self, k: int) -> np.ndarray:
        if k not in self.order:
            self.order = {  # the pass before is kept: a batch may straddle two passes
                **{j: o for j, o in self.order.items() if j == k - 1},
                k: np.random.default_rng([self.seed, self.part, k]).permutation(self.count),
            }
        return self.order[k]


def passes(tokens: int, weights: dict[str, float], sizes: dict[str, int]) -> dict[str, float]:
    """The passes a run of `tokens` training tokens makes over each part: w_p * tokens / len(part),
    the part's share of the tokens over the tokens it has (any sampling, in expectation)."""
    return {name: weights[name] * tokens / sizes[name] for name in weights}


def _floor_shares(total: int, weights: dict[str, float]) -> tuple[np.ndarray, np.ndarray]:
    """floor(total * w) per part and the fractions left over (float64, per part)."""
    exact = total * np.array(list(weights.values()), dtype=np.float64)
    base = np.floor(exact + 1e-9).astype(np.int64)  # 1e-9: 3 * (1/3) is one row, not 0.999...
    return base, np.clip(exact - base, 0.0, None)


def eval_windows(tokens: np.ndarray, seq_len: int, n_tokens: int) -> torch.Tensor:
    """The fixed held-out set: consecutive windows from the start of `tokens`, (N, seq_len + 1)
    int64, overlapping by one token (inputs w[:, :-1], targets w[:, 1:]) so that each of the first
    N * seq_len <= n_tokens targets is scored once. Fewer windows when tokens is shorter."""
    import torch

    n_windows = min(n_tokens, len(tokens) - 1) // seq_len
    if n_windows < 1:
        raise ValueError(
            f"an evaluation window needs seq_len + 1 = {seq_len + 1} tokens; the data has {len(tokens)}"
        )
    index = np.arange(n_windows)[:, None] * seq_len + np.arange(seq_len + 1)  # (N, T + 1)
    return torch.from_numpy(tokens[index].astype(np.int64))


def eval_sets(val: TokenArray, seq_len: int, n_tokens: int) -> dict[str, torch.Tensor]:
    """The held-out windows of each part, as many as its weight's share of N = parts *
    (n_tokens // seq_len): n_tokens per part on average (equal weights: n_tokens each, the windows
    used before the mixture rule). When a part's split is shorter than its share, N shrinks until
    it fits, so the shares hold and no window repeats; every part keeps at least one window."""
    available = {name: (len(val.part(name)) - 1) // seq_len for name in val.weights}
    for name, n in available.items():
        if n < 1:
            raise ValueError(
                f"an evaluation window needs seq_len + 1 = {seq_len + 1} tokens; "
                f"part {name!r} of the held-out split has {len(val.part(name))}"
            )
    fits = min(available[name] / weight for name, weight in val.weights.items())
    shares = _rounded_shares(
        min(len(val.weights) * (n_tokens // seq_len), math.floor(fits + 1e-9)), val.weights
    )
    # min: the 1e-9 (as in _floor_shares) must never round a part past its split
    return {
        name: eval_windows(val.part(name), seq_len, max(1, min(n, available[name])) * seq_len)
        for name, n in shares.items()
    }


def _rounded_shares(total: int, weights: dict[str, float]) -> dict[str, int]:
    """total split by the weights, rounding by the largest remainders so the counts sum to total."""
    base, leftover = _floor_shares(total, weights)
    for i in np.argsort(-leftover, kind="stable")[: total - int(base.sum())]:
        base[i] += 1
    return dict(zip(weights, base.tolist()))

"""The training step: the loss (`lm_loss`, one module's forward for data-parallel wrappers) and
`TrainStep`, run under the execution policy (policy.py: bf16 autocast where it helps, the device)
and compiled by region (compilation.py), the same code on CPU and CUDA. Training loops
(training.py) and the speed benchmark (benchmark/perf) both use `TrainStep`, so the path that is
benchmarked is the path that trains.
"""

from __future__ import annotations

import contextlib

import torch
import torch.nn.functional as F

from benchmark.trial.compilation import cached_functions, compile_regions
from benchmark.trial.policy import ExecPolicy, autocast


def lm_loss(
    model,
    x: torch.Tensor,
    y: torch.Tensor,
    dtype: torch.dtype | None,
    loops: int | None = None,
    head=None,
) -> torch.Tensor:
    """Mean next-token cross-entropy; logits are upcast so the softmax runs in float32. `head`
    (default `head_loss`) scores the model's features: the training step passes it compiled."""
    with autocast(x.device.type, dtype):
        h = model.features(x, loops=loops)  # (B, T, d)
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
        logits = model._logits(h)  # (B, T, vocab)
    return F.cross_entropy(logits.float().flatten(0, 1), y.flatten())


# Logits a scoring pass holds at once (elements). On a CPU, 2^20 float32 is 4 MB, which stays in
# the last-level cache between the head's matmul and the softmax, and it scored a quickstart
# evaluation faster than 2^21 (benchmarks/2026-11-27-measurements-from-comments.md, "Scoring chunks").
# Elsewhere (a GPU, not measured) chunks of 2^26 (256 MB) keep the kernel count low and still bound
# the memory the logits take: a whole 16 x 1024-token batch at a 50K vocabulary would hold 3.3 GB.
SCORE_CHUNK_LOGITS = {"cpu": 2**20}
SCORE_CHUNK_LOGITS_OTHER = 2**26


@torch.no_grad()
def score_head_loss(
    model, h: torch.Tensor, y: torch.Tensor, dtype: torch.dtype | None
) -> torch.Tensor:
    """head_loss for evaluation (no gradient), over chunks of tokens: the same mean, without the
    (B, T, vocab) logits written out and read back by the softmax, which on a CPU is bound by
    memory: chunks halved a quickstart batch's head and loss (benchmarks/2026-11-27-measurements-from-comments.md,
    "Scoring chunks"); an evaluation of the quickstart Transformer is mostly head."""
    h, y = h.flatten(0, -2), y.flatten()
    rows = max(
        64, SCORE_CHUNK_LOGITS.get(h.device.type, SCORE_CHUNK_LOGITS_OTHER) // model.spec.vocab_size
    )
    total = h.new_zeros(
        (), dtype=torch.float64
    )  # the chunks' sums: float64, as evaluation adds batches
    for hc, yc in zip(h.split(rows), y.split(rows)):
        with autocast(h.device.type, dtype):
            logits = model._logits(hc)
        total = total + F.cross_entropy(logits.float(), yc, reduction="sum").double()
    return (total / max(y.numel(), 1)).float()


class TrainStep:
    """One optimiser step: forward + backward (compiled when asked), gradient clipping, update.
    Returns the loss as a detached tensor so callers decide when to synchronise. Call `close()`
    when done: a compiled step leaves the model eager again. `fresh=False` keeps the code compiled
    for other live steps (benchmark.perf interleaves a few models' steps in one process)."""

    def __init__(
        self,
        model,
        optimizer,
        policy: ExecPolicy,
        device: torch.device,
        clip: float | None = 1.0,
        fresh: bool = True,
        parallel=None,
    ):
        self.model, self.optimizer, self.clip = model, optimizer, clip
        self.dtype = policy.autocast_dtype(device)
        self.close = lambda: None
        self.grad_norm = torch.zeros(())  # the last step's gradient norm, before clipping
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
        if policy.compile and policy.compile_scope == "model":  # one graph of the whole loss
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
            sync = (
                contextlib.nullcontext()
                if self.parallel is None
                else self.parallel.sync(self.loss, last)
            )
            with self.scope(), sync:  # where the regions compile, forward and backward
                loss = self.loss(x, y) / len(micro)
                loss.backward()
            total = loss.detach() if total is None else total + loss.detach()
        # The norm before clipping, kept on the device for the training curve (curve.py) to read.
        if self.clip:
            norm = torch.nn.utils.clip_grad_norm_(self.model.parameters(), self.clip)
        else:
            norm = torch.nn.utils.get_total_norm(
                [p.grad for p in self.model.parameters() if p.grad is not None]
            )
        self.grad_norm = (
            norm.full_tensor() if hasattr(norm, "full_tensor") else norm
        ).detach()  # FSDP: a DTensor
        self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return total if self.parallel is None else self.parallel.mean(total)

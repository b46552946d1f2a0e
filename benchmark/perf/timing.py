"""Timing training steps on this machine (measure, measure_together), and the time a search spends
outside its trials that `shapebench plan` adds (search_times; its trials: perf/probe.py)."""

from __future__ import annotations

import gc
import statistics
import time
from collections.abc import Collection
from dataclasses import dataclass
from pathlib import Path

from benchmark.arch import ArchSpec, count_flops
from benchmark.data import cache_root
from benchmark.recipe import TrainConfig
from benchmark.space import SEARCH_START_S
from benchmark.store import speeds


@dataclass(frozen=True)
class Measurement:
    step_s: float  # median seconds per step after warm-up
    first_step_s: float  # includes compilation
    tokens_per_s: float
    flops_per_s: float  # achieved training FLOP/s (count_flops' train FLOPs per token x tokens/s)
    peak_mem_bytes: int = (
        0  # the path's own peak (CUDA allocator; on a CPU the process's resident memory)
    )
    step_times: tuple[
        float, ...
    ] = ()  # the timed steps, one per round of measure_together (paired_ratio)


def measure(
    spec: ArchSpec,
    policy,
    steps: int = 8,
    warmup: int = 2,
    seq_len: int = 256,
    batch_size: int = 16,
    seed: int = 0,
) -> Measurement:
    """One training path's speed: `steps` timed steps after `warmup` (the first includes compiling)."""
    return measure_together([(spec, policy)], steps, warmup, seq_len, batch_size, seed)[0]


MIN_ROUNDS = 3  # the fewest rounds a time budget leaves a group: a paired interval needs three


def measure_together(
    paths: list[tuple[ArchSpec, object]],
    steps: int = 8,
    warmup: int = 2,
    seq_len: int = 256,
    batch_size: int = 16,
    seed: int = 0,
    until: float | None = None,
    focus: Collection[int] | None = None,
) -> list[Measurement]:
    """Several (spec, policy) paths measured side by side: each is built and warmed up in turn, then the
    timed steps go round the paths, one step each per round, so that a slow stretch of a shared CPU
    slows every path alike (measured one after another, two families' ratio moved by tens of points
    between runs: benchmarks/2026-11-24-perf-cpu-epyc.md); their ratios are what `_ratios` reports.
    Up to `steps` rounds, fewer (never under MIN_ROUNDS) where the next would end after `until`, a
    time.perf_counter() deadline. `focus`, indices into `paths`: only these go on after MIN_ROUNDS
    rounds (the others' medians need no interval), so the rounds that an interval is read from come
    faster. Each path's peak memory is its own: the high-water mark while it was built and warmed up
    (the first step allocates the optimiser's state), over what was held before (the paths built
    earlier), so that paths timed together report what each needs alone."""
    # torch and the trial load when something is measured: the plan reads this module for its estimates.
    import torch

    from benchmark.models import build_model
    from benchmark.trial.memory import held_memory_bytes, peak_memory_bytes, reset_peak_memory
    from benchmark.trial.policy import default_device, prepare_device
    from benchmark.trial.step import TrainStep
    from benchmark.trial.training import make_optimizer

    device = default_device()
    prepare_device(device)
    gen = torch.Generator().manual_seed(seed)
    vocab = min(spec.vocab_size for spec, _ in paths)
    data = torch.randint(0, vocab, (batch_size, seq_len + 1), generator=gen).to(device)
    x, y = data[:, :-1], data[:, 1:]

    def timed(step) -> float:
        t = time.perf_counter()
        step(x, y).item()  # .item() synchronises (CUDA) so the step is really done
        return time.perf_counter() - t

    def build(spec, policy, fresh: bool):
        torch.manual_seed(seed)
        model = build_model(spec).to(device).train()
        opt = make_optimizer(
            model, TrainConfig(lr=1e-4)
        )  # the trial's optimiser (fused AdamW on CUDA)
        return TrainStep(model, opt, policy, device, fresh=fresh)

    peaks: list[int] = []

    def run() -> list[list[float]]:
        """Each path's step times (and its own peak into `peaks`); its models are freed when it returns."""
        built, times = [], []
        try:
            for i, (spec, policy) in enumerate(paths):
                held = held_memory_bytes(device)
                reset_peak_memory(device)
                # only the first drops dynamo's compiled code: the others' must stay for the rounds
                built.append(build(spec, policy, fresh=i == 0))
                times.append([timed(built[-1]) for _ in range(warmup)])
                peaks.append(max(0, peak_memory_bytes(device) - held))
            last = 0.0  # the previous round's seconds: the next one's forecast
            for r in range(steps):
                start = time.perf_counter()
                if until is not None and r >= MIN_ROUNDS and start + last > until:
                    break
                # every other round in reverse (ABBA): a machine that speeds up or slows down
                # through a round weighs on the first and last paths alike over two rounds
                going = [
                    (step, ts)
                    for i, (step, ts) in enumerate(zip(built, times))
                    if focus is None or r < MIN_ROUNDS or i in focus
                ]
                for step, ts in going[:: 1 if r % 2 == 0 else -1]:
                    ts.append(timed(step))
                last = time.perf_counter() - start
        finally:
            for step in built:
                step.close()  # compiled methods refer to their modules: left on, they keep the model alive
        return times

    times = run()
    out = []
    for (spec, _), ts, peak in zip(paths, times, peaks):
        step_s = statistics.median(ts[warmup:])
        tps = batch_size * seq_len / step_s
        out.append(
            Measurement(
                step_s,
                ts[0],
                tps,
                tps * count_flops(spec, seq_len)["train"],
                peak,
                tuple(ts[warmup:]),
            )
        )
    gc.collect()
    if device.type == "cuda":
        torch.cuda.empty_cache()
    return out


def speeds_file() -> Path:
    return speeds.path_in(cache_root())


def probe_shape(device_type: str) -> tuple[ArchSpec, int, int]:
    """(spec, seq_len, batch) of the probe for a candidate whose one sequence is too long a step to
    probe (perf/probe.py). On a CPU a small model, so the probe takes seconds. On a GPU a step sized
    like a real one (~100M parameters, 8 x 1024 tokens): a tiny model there measures kernel
    launches, not the GPU, and would put 113M estimates off by an order of magnitude."""
    if device_type == "cuda":
        spec = ArchSpec.from_dict(
            {"d_model": 768, "n_heads": 12, "layers": {"n": 12}, "vocab_size": 8192}
        )
        return spec, 1024, 8
    return (
        ArchSpec.from_dict({"d_model": 128, "n_heads": 4, "layers": {"n": 4}, "vocab_size": 4096}),
        128,
        8,
    )


def search_times() -> tuple[float, float, int]:
    """(start_s, per_trial_s, searches) for `--plan`: the time finished searches here spent
    outside their trials (store/speeds.py), else the plan's assumed start."""
    return speeds.search_times(speeds_file(), SEARCH_START_S)

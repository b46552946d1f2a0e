"""The plan's memory: each candidate's estimated peak per GPU (recipe/memory.py) and, given a GPU's
memory (`--gpu-memory 80GiB`), the micro-batch and accumulation it trains with, the declared batch
kept; a candidate that cannot fit even one sequence is refused before anything runs."""

from __future__ import annotations

import dataclasses
from typing import Any

from benchmark.recipe import (
    USABLE,
    TrainConfig,
    estimate_memory,
    fit_micro_batch,
    fmt_count,
    fmt_size,
    parse_size,
)
from benchmark.space.language import SearchSpace


def memory_columns(spec, cfg: TrainConfig, gpu_memory: int | str | None) -> dict[str, Any]:
    """A plan record's memory: `micro_batch` and `grad_accum` it trains with (the declared ones,
    or those that fit `gpu_memory`: bytes, or a size such as "80GiB") and `peak_mem_est`, the
    estimated peak at them; `gpu_memory` (bytes) and `memory_policy` (the precision and
    compilation estimated) say what the estimate assumed."""
    limit = None if gpu_memory is None else parse_size(gpu_memory)
    policy = f"{'fp32' if cfg.precision == 'fp32' else 'bf16'}, "
    policy += "compiled" if cfg.compile else "eager"
    if limit is None:
        micro, accum, peak = cfg.batch_size, cfg.grad_accum, estimate_memory(spec, cfg).total
    else:
        fit = fit_micro_batch(spec, cfg, limit)
        micro, accum, peak = fit.micro_batch, fit.grad_accum, fit.peak
    return {
        "micro_batch": micro,
        "grad_accum": accum,
        "peak_mem_est": peak,
        "gpu_memory": limit,
        "memory_policy": policy,
    }


def check_fits(space: SearchSpace, rows: list[dict[str, Any]]) -> None:
    """SpaceError (one line, at `training.batch_size`) for the first candidate whose estimated
    peak at micro-batch 1 exceeds the GPU's memory its records were fitted to (memory_columns)."""
    for r in rows:
        if r["micro_batch"] is None:
            raise space.source.error(
                ("training", "batch_size"),
                f"candidate {r['candidate']} ({r['family']}, {fmt_count(r['params_total'])} "
                f"parameters) needs an estimated {fmt_size(r['peak_mem_est'])} at micro-batch 1 x "
                f"seq_len {space.training_value('seq_len')}, more than {USABLE:.0%} of the GPU's "
                f"{fmt_size(r['gpu_memory'])} (--gpu-memory); a shorter training.seq_len or a smaller "
                "vocabulary needs less",
            )


def fitted_space(space: SearchSpace, rows: list[dict[str, Any]]) -> SearchSpace:
    """`space` training at the smallest micro-batch the plan's candidates fit (memory_columns with
    a GPU's memory) and the accumulation that keeps the declared batch: every trial of a search
    trains at one micro-batch, and a sampled candidate the plan did not see falls back to the
    out-of-memory retry (trial/run.py). The space itself when the declared micro-batch fits."""
    micro = min(r["micro_batch"] for r in rows)
    if micro == space.training_value("batch_size"):
        return space
    batch = space.training_value("batch_size") * space.training_value("grad_accum")
    training = {**space.training, "batch_size": micro, "grad_accum": batch // micro}
    return dataclasses.replace(space, training=training)


def memory_summary(rows: list[dict[str, Any]]) -> str:
    """The plan's memory phrase: the estimated peaks, and with a GPU's memory the micro-batches."""
    if not rows:
        return "no memory to estimate"
    gpu_memory, how = rows[0]["gpu_memory"], rows[0]["memory_policy"]
    batch = rows[0]["micro_batch"] * rows[0]["grad_accum"] if rows[0]["micro_batch"] else None

    def span(values, fmt=str) -> str:
        lo, hi = fmt(min(values)), fmt(max(values))
        return lo if lo == hi else f"{lo}-{hi}"

    peaks = span([r["peak_mem_est"] for r in rows], fmt_size)
    if gpu_memory is None:
        return f"est. peak memory {peaks} a GPU ({how}; recipe/memory.py)"
    return (
        f"on {fmt_size(gpu_memory)} GPUs: micro-batch {span([r['micro_batch'] for r in rows])} x "
        f"accumulation {span([r['grad_accum'] for r in rows])} keeps the batch of "
        f"{batch}, est. peak {peaks} ({how}; recipe/memory.py)"
    )

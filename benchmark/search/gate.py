"""The headline command on a machine too small for it: a search estimated at more than a day of
training on this machine is a cluster job, and asks before it starts (`shapebench search --yes`
skips the question)."""

from __future__ import annotations

import sys

from benchmark.perf import probe
from benchmark.recipe import TrainConfig
from benchmark.space.plan import ASSUMED_GPU_FLOPS, Plan, gpu_time, records

# A search estimated to take longer than this on one machine is a cluster job: it asks first.
LIMIT_HOURS = 24


def too_big(
    plan: Plan,
    cfg: TrainConfig,
    seeds: int,
    name: str,
    space_arg: str | None,
    budget: str | None,
    gpu_flops: float = ASSUMED_GPU_FLOPS,
) -> int | None:
    """Estimate first, ask before hours of training: None to go on, else the exit code. `cfg`: the
    trials' training settings (their precision and compilation, which the estimate trains with);
    every run of each candidate counts, its `seeds` and its tuning runs (records' `runs`);
    `space_arg` and `budget` as given on the command line (None: not given), for the cluster command;
    `gpu_flops`: the achieved training FLOP/s per GPU the GPU-hours assume."""
    space = plan.space
    speed = probe.estimates(plan, cfg)
    flops, recs = speed(plan.candidates[0].spec.family).flops_per_s, records(plan, speed, seeds)
    hours = sum(r["est_seconds"] * r["runs"] for r in recs) / 3600
    if hours <= LIMIT_HOURS:
        return None
    print(
        f"shapebench search: {name}: {len(recs)} candidates x {recs[0]['runs']} runs estimated at "
        f"{hours:,.0f} machine-hours on this machine ({flops / 1e9:.0f} GFLOP/s measured here), "
        f"{gpu_time(recs, gpu_flops)}. This is a cluster job (docs/clusters.md):\n"
        f"  ray start --head --port 6379 --num-cpus 0   (each worker: ray start --address HEAD_IP:6379)\n"
        f"  shapebench search {f'{space_arg} ' if space_arg else ''}--budget {budget or ','.join(map(str, space.budgets))}"
        f" --address auto --results s3://BUCKET/results "
        f"--gpus-per-trial 1\nAdd --yes to run it here anyway.",
        file=sys.stderr,
    )
    if sys.stdin.isatty() and input("Run it on this machine anyway? [y/N] ").strip().lower() in (
        "y",
        "yes",
    ):
        return None
    return 2

"""How long a study takes on a cluster of `workers` GPUs when every run is its own task
(search/dispatch.py): `shapebench plan --workers N`. Each run holds one GPU for its FLOPs at the
plan's assumed rate (space/plan.py, `--gpu-tflops`); a candidate's tuning runs are ready at once,
its final seeds once its last tuning run is done; a free GPU takes the ready run that is longest,
the runs of all candidates sharing the cluster, as Ray hands out tasks. A grid that the tuning
extends past an edge adds runs the plan cannot know of: the wall time is for the grid as written."""

from __future__ import annotations

import heapq
from dataclasses import dataclass
from typing import Any, Mapping, Sequence


@dataclass(frozen=True)
class Schedule:
    runs: int  # every run of the study
    at_once: int  # the most runs training at one moment
    wall_h: float  # hours from the first run's start to the last run's end
    gpu_h: float  # the runs' GPU-hours: wall_h x workers at best


def simulate(
    rows: Sequence[Mapping[str, Any]], tuning_runs: int, workers: int, gpu_flops: float
) -> Schedule:
    """`rows`: the plan's records (space/plan.records: a run's FLOPs per token and tokens, and
    `runs`, the candidate's tuning runs and final seeds); `tuning_runs` of them are tuning runs."""
    hours = [r["flops_per_token_train"] * r["tokens"] / gpu_flops / 3600 for r in rows]
    finals = {i: r["runs"] - tuning_runs for i, r in enumerate(rows)}
    left = {i: tuning_runs for i in range(len(rows))}  # tuning runs not yet done
    ready = [(-hours[i], i, tuning_runs > 0) for i in range(len(rows)) for _ in range(left[i])]
    ready += [
        (-hours[i], i, False) for i in range(len(rows)) if not tuning_runs for _ in range(finals[i])
    ]
    heapq.heapify(ready)
    running: list[tuple[float, int, bool]] = []  # (end, candidate, a tuning run)
    now, most = 0.0, 0
    while ready or running:
        while ready and len(running) < workers:
            h, i, tuning = heapq.heappop(ready)
            heapq.heappush(running, (now - h, i, tuning))
        most = max(most, len(running))
        now, i, tuning = heapq.heappop(running)
        if tuning:
            left[i] -= 1
            if left[i] == 0:  # its choice is made: its final seeds are ready
                for _ in range(finals[i]):
                    heapq.heappush(ready, (-hours[i], i, False))
    total = sum(h * r["runs"] for h, r in zip(hours, rows))
    return Schedule(sum(r["runs"] for r in rows), most, now, total)


def describe(s: Schedule, workers: int) -> str:
    return (
        f"on {workers} GPU{'s' if workers != 1 else ''}, every run its own task: {s.runs} runs, "
        f"up to {s.at_once} at once; about {s.wall_h:.3g} h of wall time "
        f"({s.gpu_h:.3g} GPU-hours / {workers} = {s.gpu_h / workers:.3g} h if they packed "
        "perfectly; a candidate's final seeds wait for its tuning)"
    )


def add_flag(p) -> None:
    """`shapebench plan --workers N` (command.build_plan_parser)."""
    p.add_argument(
        "--workers",
        type=_gpus,
        help="then the study's wall time on N GPUs, every run its own task (search/schedule.py)",
    )


def _gpus(text: str) -> int:
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of GPUs (1 or more), got {text!r}")
    return int(text)


def line(space, rows: Sequence[Mapping[str, Any]], workers: int, gpu_flops: float) -> str:
    """The plan's line for `--workers`: the space's runs on that many GPUs."""
    tuning = space.tune.runs if space.tune else 0
    return describe(simulate(rows, tuning, workers, gpu_flops), workers)

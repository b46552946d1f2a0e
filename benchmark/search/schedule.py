"""How long a study takes on a cluster of `workers` GPUs: `shapebench plan --workers N`. Each run
holds one GPU for its FLOPs at the plan's assumed rate (space/plan.py, `--gpu-tflops`).

Every run its own task (search/dispatch.py, the search's default): a candidate's tuning runs are
ready at once, its final seeds once its last tuning run is done; a free GPU takes the ready run
that is longest, the runs of all candidates sharing the cluster, as Ray hands out tasks. With
`--no-runs-as-tasks` a candidate's runs train in turn inside its trial, one GPU each: a free GPU
takes the next candidate in the plan's order (the order the searcher asks them in), and a
candidate's final seeds never train side by side. A grid that the tuning extends past an edge
adds runs the plan cannot know of: the wall time is for the grid as written."""

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
    hours = _hours(rows, gpu_flops)
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


def in_trials(rows: Sequence[Mapping[str, Any]], workers: int, gpu_flops: float) -> Schedule:
    """`--no-runs-as-tasks`: each candidate of `rows` one trial on one GPU, training its runs one
    after another; trials start in the rows' order as GPUs come free."""
    trials = [h * r["runs"] for h, r in zip(_hours(rows, gpu_flops), rows)]
    free = [0.0] * min(workers, len(trials))  # when each GPU is next free
    for h in trials:
        heapq.heapreplace(free, free[0] + h)
    return Schedule(sum(r["runs"] for r in rows), len(free), max(free, default=0.0), sum(trials))


def _hours(rows: Sequence[Mapping[str, Any]], gpu_flops: float) -> list[float]:
    """Each candidate's run on one GPU, in hours."""
    return [r["flops_per_token_train"] * r["tokens"] / gpu_flops / 3600 for r in rows]


def describe(s: Schedule, workers: int, runs_as_tasks: bool = True) -> str:
    how, wait = (
        ("every run its own task", "a candidate's final seeds wait for its tuning")
        if runs_as_tasks
        else ("a candidate's runs in turn inside its trial", "one run of a candidate at a time")
    )
    return (
        f"on {workers} GPU{'s' if workers != 1 else ''}, {how}: {s.runs} runs, "
        f"up to {s.at_once} at once; about {s.wall_h:.3g} h of wall time "
        f"({s.gpu_h:.3g} GPU-hours / {workers} = {s.gpu_h / workers:.3g} h if they packed "
        f"perfectly; {wait})"
    )


def add_flag(p) -> None:
    """`shapebench plan --workers N [--no-runs-as-tasks]` (command.build_plan_parser)."""
    import argparse

    p.add_argument(
        "--workers",
        type=_gpus,
        help="then the study's wall time on N GPUs, every run its own task (search/schedule.py)",
    )
    p.add_argument(
        "--runs-as-tasks",
        action=argparse.BooleanOptionalAction,
        help="with --workers: --no-runs-as-tasks schedules a candidate's runs in turn inside its "
        "trial, as `shapebench search --no-runs-as-tasks` trains them",
    )


def unused(args) -> str | None:
    """A plan's --[no-]runs-as-tasks sets how --workers schedules the runs: alone it does nothing,
    and is refused rather than ignored."""
    if args.runs_as_tasks is None or args.workers:
        return None
    return (
        f"--{'' if args.runs_as_tasks else 'no-'}runs-as-tasks schedules --workers N: give it too"
    )


def _gpus(text: str) -> int:
    import argparse

    if not text.isdigit() or int(text) < 1:
        raise argparse.ArgumentTypeError(f"expected a number of GPUs (1 or more), got {text!r}")
    return int(text)


def line(
    space, rows: Sequence[Mapping[str, Any]], workers: int, gpu_flops: float, tasks: bool = True
) -> str:
    """The plan's line for `--workers`: the space's runs on that many GPUs, every run its own task
    (`tasks`) or each candidate's in turn inside its trial."""
    if not tasks:
        return describe(in_trials(rows, workers, gpu_flops), workers, runs_as_tasks=False)
    tuning = space.tune.runs if space.tune else 0
    return describe(simulate(rows, tuning, workers, gpu_flops), workers)

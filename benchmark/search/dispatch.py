"""The run as the unit of scheduling: a candidate's runs (its tuning runs, a batch at a time as
search/tuning.py wants them, then its final seeds) each as a Ray task with the resources a run
asks for, so that they train side by side on as many workers as the cluster has free, and the
runs of every candidate the searcher has out share the cluster. The Tune trial of the candidate
holds no resources of its own: it hands its runs to Ray, waits for their rows and tells Optuna
the candidate's value as before (the mean over its final seeds).

A task whose worker or node dies is run again by Ray (a task's `max_retries`, for system
failures: docs.ray.io "Fault tolerance: tasks"), and the run continues from the state it saved
(trial/runstate.py). Each run writes its own rows, as a run inside a trial does.

Used when no result of a run goes to Tune while it trains: ASHA's rungs and the curves for
TensorBoard and MLflow are Tune results of the trial (`tune.report`), which a task cannot make;
with them, and for trials of several workers (Ray Train jobs), the runs stay inside their trial,
one after another (search/trainable.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from benchmark.search.context import TrialContext

# Ray's default for tasks; a run that raised is retried by attempts(), not by Ray
LOST_WORKER_RETRIES = 3


def run_all(
    run: Callable[..., dict], config: Mapping[str, Any], ctx: TrialContext, jobs: list[tuple]
) -> list[dict]:
    """Train `jobs` ((trial id, seed, setting, phase) each) side by side, each `run(config, ctx,
    job)` (trainable.run_task: its row) in a Ray task of ctx.run_resources; their rows, in order."""
    import ray

    task = ray.remote(run).options(
        num_cpus=ctx.run_resources["cpu"],
        num_gpus=ctx.run_resources["gpu"],
        max_retries=LOST_WORKER_RETRIES,
        # not the trial's placement group (Tune has its tasks join it: its one bundle is the
        # trial's token of memory), but wherever the cluster has a run's resources free
        scheduling_strategy="DEFAULT",
    )
    return ray.get([task.remote(dict(config), ctx, job) for job in jobs])


# Tests only: "<folder>:<n>" makes each final run of a candidate, trained as a task, wait after
# its first step until n runs of that candidate have come there (a file each in
# <folder>/<study>-t<number>/), or TOGETHER_WAIT_S has passed, then a second more (the rows'
# times are to the second): a test then sees n runs of one candidate train at once however
# short they are, and a dispatch that trains them one at a time fails it rather than hangs
# (tests/test_run_tasks.py).
TOGETHER = "SHAPEBENCH_TEST_TOGETHER"
TOGETHER_WAIT_S = 120.0


def together_fault(ctx: TrialContext, trial_id: str, final: bool) -> Callable[[], None] | None:
    given = os.environ.get(TOGETHER)
    if not given or not final:
        return None
    folder, _, n = given.rpartition(":")
    here = Path(folder) / f"{ctx.study}-{trial_id.split('-')[0]}"

    def wait() -> None:
        here.mkdir(parents=True, exist_ok=True)
        (here / trial_id).touch()
        deadline = time.monotonic() + TOGETHER_WAIT_S
        while len(list(here.iterdir())) < int(n) and time.monotonic() < deadline:
            time.sleep(0.05)
        time.sleep(1.0)

    return wait

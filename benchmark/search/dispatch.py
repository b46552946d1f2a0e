"""The run as the unit of scheduling: a candidate's runs (its tuning runs, a batch at a time as
search/tuning.py wants them, then its final seeds) each as a Ray task with the resources a run
asks for, so that they train side by side on as many workers as the cluster has free, and the
runs of every candidate the searcher has out share the cluster. The Tune trial of the candidate
holds no resources of its own: it hands its runs to Ray, waits for their rows and tells Optuna
the candidate's value as before (the mean over its final seeds).

A task whose worker or node dies is run again by Ray (a task's `max_retries`, for system
failures: docs.ray.io "Fault tolerance: tasks"), and the run continues from the state it saved
(trial/runstate.py). Each run writes its own rows, as a run inside a trial does.

The trial and its tasks speak through the progress board (search/progress.py), the search's one
small actor: each run's stage (so that runs that cannot start stop the search as trials that
cannot start do: search/callback.py); the evaluations of the run whose evaluations are the
trial's intermediate results (ASHA's rungs, Optuna's intermediate values: the first final seed,
as inside a trial), which the trial reports to Tune as they come (a task cannot: `tune.report`
is the trial's); and the trials the driver has ended (ASHA stopped them), which cancel their
runs. The curves for TensorBoard, MLflow and W&B (a report at every point), and trials of
several workers (Ray Train jobs), keep the runs inside their trial, one after another
(search/trainable.py)."""

from __future__ import annotations

import os
import time
from pathlib import Path
from typing import Any, Callable, Mapping

from benchmark.search.context import TrialContext

# Ray's default for tasks; a run that raised is retried by attempts(), not by Ray
LOST_WORKER_RETRIES = 3


# How often a trial waiting for its runs reads the board: the evaluations its reporting run has
# posted, and whether the driver has ended the trial (seconds)
WAIT_S = 1.0


def run_all(
    run: Callable[..., dict],
    config: Mapping[str, Any],
    ctx: TrialContext,
    jobs: list[tuple],
    report: Callable[[dict], None] | None = None,
) -> list[dict]:
    """Train `jobs` ((trial id, seed, setting, phase) each) side by side, each `run(config, ctx,
    job, posts)` (trainable.run_task: its row) in a Ray task of ctx.run_resources; their rows, in
    order. `report(record)`: the first job's evaluations, as they come (it `posts` them). Each
    run's stage goes to the progress board (search/progress.py), for the callback to tell a run
    that cannot start. A trial the driver has ended (ASHA stopped it) cancels the tasks still
    running, their saved state kept for --resume, and ends as Tune ends a stopped trial's thread
    (SystemExit 0); so does one whose wait raises. (ASHA's stop comes as that SystemExit out of
    the report of the evaluation it was decided on, which waits for the driver; the board's
    word ends a trial the driver ended while it was not reporting.) (At the search's end, Ctrl-C or
    --time-budget, Tune ends the trials' actors, and Ray the tasks they own.)"""
    import ray

    task = ray.remote(run).options(
        num_cpus=ctx.run_resources["cpu"],
        num_gpus=ctx.run_resources["gpu"],
        max_retries=LOST_WORKER_RETRIES,
        # not the trial's placement group (Tune has its tasks join it: its one bundle is the
        # trial's token of memory), but wherever the cluster has a run's resources free
        scheduling_strategy="DEFAULT",
    )
    ray.get(ctx.progress.ask.remote(int(config["optuna_trial"]), [job[0] for job in jobs]))
    refs = [
        task.remote(dict(config), ctx, job, report is not None and k == 0)
        for k, job in enumerate(jobs)
    ]
    try:
        if not _wait(ctx, int(config["optuna_trial"]), jobs[0][0], refs, report):
            raise SystemExit(0)
        return ray.get(refs)
    except BaseException:
        for ref in refs:
            ray.cancel(ref, force=True)  # nothing for a task that has ended
        raise
    finally:
        for job in jobs:
            stage(ctx, job[0], "ended")


def _wait(ctx: TrialContext, number: int, run: str, refs: list, report) -> bool:
    """Wait until every task has ended (True), reporting `run`'s evaluations as they come (the
    last read after the end: a run posts each before it goes on, so none is left behind);
    False as soon as the driver has ended trial `number`."""
    import ray

    told, ended = 0, False
    while not ended:
        ready, _ = ray.wait(refs, num_returns=len(refs), timeout=WAIT_S)
        ended = len(ready) == len(refs)
        news = ray.get(ctx.progress.news.remote(number, run if report else None, told))
        if news["stopped"]:
            return False
        for record in news["evaluations"]:
            report(record)
            told += 1
    return True


def post_evaluations(ctx: TrialContext, run: str) -> Callable[[dict], None]:
    """A task's run_trial on_eval that posts each evaluation to the board for its trial without
    waiting for it: a task waiting in ray.get lends its CPU, and Ray starts another run there,
    which then trains beside it on the same core (Ray's "yielding resources while blocked";
    GPUs are not lent). Its `flush()`, once the run has ended, waits until the board has them
    all, so that they are there when its trial sees the task ended (_wait)."""
    import ray

    sent: list = []

    def post(record: dict) -> None:
        sent.append(ctx.progress.evaluated.remote(run, record))

    def flush() -> None:
        ray.get(sent)
        sent.clear()

    post.flush = flush  # type: ignore[attr-defined]
    return post


def stage(ctx: TrialContext, run: str, name: str) -> None:
    """Post a run task's stage to the progress board (fire and forget; runs are tasks only in a
    search, which has its board: driver._run): `started` with the task's node, which the board
    watches (a run whose node died is waiting again)."""
    import ray

    node = ray.get_runtime_context().get_node_id() if name == "started" else None
    ctx.progress.stage.remote(run, name, node)


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

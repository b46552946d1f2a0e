"""A search's runs continue from their saved state (trial/runstate.py) when they are stopped: a
worker killed part-way (Tune runs its trial again) and a driver stopped with Ctrl-C or by its
--time-budget (the same command run again) end with one ok row per run, continued from the step
it saved, whose validation loss and whole training curve are those of the run that never
stopped."""

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pandas as pd
import pytest
import tiny_search
import torch

from benchmark.data import prepare
from benchmark.recipe import TrainConfig
from benchmark.store.curves import read_curves
from benchmark.trial.run import run_trial
from benchmark.trial.runstate import saved_record

pytestmark = pytest.mark.slow

SPACE = """
name: {name}
budget: 100K
count: total
tolerance: 2%
base: {{vocab_size: 320, n_heads: 2, layers: {{begin: 1, middle: 1, end: 1}}}}
axes:
  family: [transformer]
training: {{tokens: {tokens}, seq_len: 32, batch_size: 8, lr: 3e-3, eval_tokens: 2K}}
data: {{max_epochs: 20}}  # a small corpus read many times over: the test is resume, not data
quantize: {{group_size: 16, calib_sequences: 16}}
objectives: [val_loss:min]
pruner: none
trials: 1
"""
EVERY = 20  # steps between saves
TOKENS, STEPS = "80K", 312  # a run's tokens, and its steps at 256 tokens a step


def _search(corpus: Path, results: Path, name: str, *flags: str) -> list[str]:
    space = results.parent / f"{name}.yaml"
    space.write_text(SPACE.format(name=name, tokens=TOKENS))
    return [
        sys.executable,
        "-m",
        "benchmark.main",
        "search",
        str(space),
        "--name",
        name,
        "--results",
        str(results),
        "--cpus-per-trial",
        "1",
        "--checkpoint-every",
        str(EVERY),
        *flags,
        *tiny_search.cli(corpus),
    ]


def _after_second_save(proc, state_dir: Path) -> dict:
    """The saved state's record once the run has saved twice."""
    deadline = time.time() + 300
    while time.time() < deadline:
        assert proc.poll() is None, proc.communicate()[1][-3000:]
        curves = state_dir.parent / "_curves"
        for path in state_dir.glob("*.state.safetensors"):
            record = saved_record(str(path))
            if record and record["step"] >= 2 * EVERY and list(curves.glob("*.parquet")):
                return record
        time.sleep(0.05)
    pytest.fail("no run saved its state twice")


def _uninterrupted(row, corpus: Path) -> dict:
    torch.set_num_threads(1)  # as the search's trial (--cpus-per-trial 1)
    cfg = TrainConfig.from_dict(json.loads(row["training"]))
    return run_trial(
        json.loads(row["spec"]), cfg, data=prepare(tiny_search.data(corpus)), quantize=None
    )


def _check(results: Path, name: str, corpus: Path, reference: dict | None) -> dict:
    study = results / name
    rows = pd.read_parquet(study)
    (row,) = rows.itertuples()  # one row: the run, recorded once
    assert row.status == "ok" and row.resumes == 1 and row.resumed_from_step >= 2 * EVERY
    reference = reference or _uninterrupted(rows.iloc[0], corpus)
    assert row.val_loss == pytest.approx(reference["val_loss"], abs=1e-6)
    curve = read_curves(str(study)).dropna(subset=["train_loss"]).sort_values("step")
    expected = pd.DataFrame(reference["curve"])
    assert len(curve) == len(expected) > 10
    for column in ("train_loss", "train_loss_max", "grad_norm", "lr"):
        assert curve[column].to_numpy() == pytest.approx(expected[column].to_numpy(), abs=1e-6)
    assert not list((study / "_runstate").glob("*"))  # removed once the row was written
    return reference


def test_a_killed_worker_and_a_stopped_driver_continue_their_runs(corpus, tmp_path):
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    results = tmp_path / "results"
    results.mkdir()
    # the worker that trains the run is killed after its second save; Ray runs its task again
    # (the run inside its trial: Tune runs the trial again)
    proc = subprocess.Popen(
        _search(corpus, results, "killed", "--runs-as-tasks"),
        stderr=subprocess.PIPE,
        text=True,
        env=env,
    )
    record = _after_second_save(proc, results / "killed" / "_runstate")
    assert record["pid"] != proc.pid  # the Ray worker's process, not the driver
    # the curve so far is beside the rows while the run trains (written after each save)
    live = pd.read_parquet(results / "killed" / "_curves")
    assert set(live["trial_id"]) == {"t0000"} and EVERY - 3 <= live["step"].max() < STEPS
    os.kill(record["pid"], signal.SIGKILL)
    _, err = proc.communicate(timeout=300)
    assert proc.returncode == 0, err[-3000:]
    reference = _check(results, "killed", corpus, None)
    resumed = pd.read_parquet(results / "killed")["resumed_from_step"]
    assert resumed.iloc[0] % EVERY == 0  # from its last periodic save

    # the driver stopped with Ctrl-C after the run's second save, then the command it prints: the
    # run's trial ends with the search, its saved state kept, and the resumed search continues it.
    # The run is paused (SIGSTOP) first: Ray Tune ends a trial some seconds after the signal, in
    # which a fast machine would finish the run
    command = _search(corpus, results, "stopped")
    proc = subprocess.Popen(command, stderr=subprocess.PIPE, text=True, env=env)
    pid = _after_second_save(proc, results / "stopped" / "_runstate")["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        proc.send_signal(signal.SIGINT)
        _, err = proc.communicate(timeout=300)
        assert tiny_search.gone([pid])  # Ray ended the trial, paused as it was
    finally:  # a paused process left behind would stay so for ever
        if tiny_search.alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 130 and "Traceback" not in err, err[-3000:]
    assert not list((results / "stopped" / "trials").glob("[!.]*.parquet"))  # stopped: no row yet
    again = subprocess.run(
        [*command, "--resume", "--save-weights"], capture_output=True, text=True, env=env
    )
    assert again.returncode == 0, again.stderr[-3000:]
    _check(results, "stopped", corpus, reference)  # the same run: the same spec and seed
    assert list((results / "stopped" / "_checkpoints").glob("*/model.safetensors"))


def test_a_search_stopped_by_its_time_budget_continues_its_run_on_resume(corpus, tmp_path):
    """`--time-budget` ends a search while its run's task trains: the run writes no row, its
    saved state is kept, and the same command with `--resume` continues the run from it. The
    run's worker is paused (SIGSTOP) after its second save, so that the budget ends a run still
    in flight however fast the machine. The budget counts from the start of Tune's loop, and
    only has to outlast the start of the trial and its task and the run's first 40 steps (5 to
    20 s on a 2-core machine under a load of 10)."""
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[1])}
    results = tmp_path / "results"
    results.mkdir()
    command = _search(corpus, results, "budget")
    proc = subprocess.Popen(
        [*command, "--time-budget", "60s"], stderr=subprocess.PIPE, text=True, env=env
    )
    pid = _after_second_save(proc, results / "budget" / "_runstate")["pid"]
    os.kill(pid, signal.SIGSTOP)
    try:
        _, err = proc.communicate(timeout=300)
        assert tiny_search.gone([pid])  # Ray ended the task with its trial, paused as it was
    finally:  # a paused process left behind would stay so for ever
        if tiny_search.alive(pid):
            os.kill(pid, signal.SIGKILL)
    assert proc.returncode == 0 and "Traceback" not in err, err[-3000:]
    said = " ".join(err.split())
    assert "0 trials were already done, 0 ran now, 0 rows written now" in said
    # the stop is said, with the command that goes on (the run in flight keeps its state)
    assert "budget: --time-budget 60s spent with 1 of 1 trials unfinished" in said
    assert said.endswith("--resume"), said[-300:]
    assert not list((results / "budget" / "trials").glob("[!.]*.parquet"))  # stopped: no row yet
    again = subprocess.run([*command, "--resume"], capture_output=True, text=True, env=env)
    assert again.returncode == 0, again.stderr[-3000:]
    _check(results, "budget", corpus, None)


def test_a_budget_spent_with_trials_unfinished_is_said_with_how_to_go_on():
    from dataclasses import replace

    from benchmark.search.driver import SearchSummary
    from benchmark.search.summary import budget_spent

    s = SearchSummary(study_dir="r/s", requested=4, finished_before=1, ran=2)
    go_on = "shapebench search s.yaml --name s --resume"
    assert budget_spent(s, "30m", go_on) == (
        "--time-budget 30m spent with 1 of 4 trials unfinished (runs in flight keep their "
        f"saved state); to go on: {go_on}"
    )
    assert budget_spent(replace(s, ran=3), "30m", go_on) is None  # it ended within its budget
    assert budget_spent(s, None, go_on) is None  # no budget: another driver has them

"""A run's saved state (trial/runstate.py): a run stopped part-way and continued from its last
save ends with the losses, curve and evaluations of the run that never stopped, to the bit on a
CPU at one thread count; the interval's grammar; the state on an S3 URI."""

import math

import pytest
import tiny_trial
import torch

from benchmark.recipe import TrainConfig
from benchmark.trial.run import run_trial
from benchmark.trial.runstate import Every, RunState, parse_every

CFG = TrainConfig.from_dict({**tiny_trial.CFG, "tokens": "12K", "eval_every": 7})


class Killed(BaseException):
    """Stands for the process dying: no handler in the trial catches it."""


def _run(data, state=None, on_step=None, on_eval=None):
    torch.set_num_threads(1)
    return run_trial(
        tiny_trial.SPEC,
        CFG,
        data=data,
        quantize=None,
        state=state,
        on_step=on_step,
        on_eval=on_eval,
    )


def _stop_after(steps: int):
    def on_step(step, total, loss):
        if step == steps:
            raise Killed

    return on_step


@pytest.mark.parametrize("where", ["local", "s3"])
def test_a_run_stopped_after_its_second_save_ends_as_if_it_never_stopped(
    grammar_corpus, tmp_path, where, request
):
    folder = str(tmp_path / "_resume")
    if where == "s3":
        folder = f"{request.getfixturevalue('s3_prefix')}/study/_resume"
    whole = _run(grammar_corpus)
    total = whole["tokens_trained"] // CFG.tokens_per_step
    assert total == 47  # 12K tokens / 256 per step: two saves at 10 and 20, stopped at 25
    state = RunState(folder, tiny_trial.SPEC, CFG, Every(steps=10))
    with pytest.raises(Killed):
        _run(grammar_corpus, state, _stop_after(25))
    assert state.saves == 2
    again = RunState(folder, tiny_trial.SPEC, CFG, Every(steps=10))
    resumed = _run(grammar_corpus, again)
    assert (resumed["resumed_from_step"], resumed["resumes"]) == (20, 1)
    assert (whole["resumed_from_step"], whole["resumes"]) == (0, 0)
    assert resumed["curve"] == whole["curve"]  # every point: losses, gradient norms, lr
    assert resumed["evals"] == whole["evals"]  # the evaluations at 7, 14 before the save and after
    for key in ("val_loss", "train_loss", "loss_spike", "tokens_trained", "val_ppl_by_loops"):
        assert resumed[key] == whole[key], key
    again.remove()  # as the search does once the row is written
    assert not again.load()
    # stopped twice (after saves at 20, then at 30): continued from 30, counting both
    for stop in (25, 35):
        with pytest.raises(Killed):
            _run(
                grammar_corpus,
                RunState(folder, tiny_trial.SPEC, CFG, Every(steps=10)),
                _stop_after(stop),
            )
    last = _run(grammar_corpus, RunState(folder, tiny_trial.SPEC, CFG, None))
    assert (last["resumed_from_step"], last["resumes"]) == (30, 2)
    assert last["val_loss"] == whole["val_loss"] and last["curve"] == whole["curve"]


def test_a_state_is_the_runs_own():
    """Another seed or another setting is another run: it never continues this one's state."""
    a = RunState("/r", tiny_trial.SPEC, CFG, None).path
    assert a == RunState("/r", dict(tiny_trial.SPEC), CFG, None).path
    assert (
        a
        != RunState(
            "/r",
            tiny_trial.SPEC,
            CFG.__class__.from_dict(
                {**tiny_trial.CFG, "tokens": "12K", "eval_every": 7, "seed": 1}
            ),
            None,
        ).path
    )
    assert a != RunState("/r", {**tiny_trial.SPEC, "loops": 3}, CFG, None).path


def test_the_interval_is_steps_or_a_duration():
    assert parse_every("500") == Every(steps=500)
    assert parse_every("90s") == Every(seconds=90.0)
    assert parse_every("10m") == Every(seconds=600.0)
    assert parse_every("1.5h") == Every(seconds=5400.0)
    assert parse_every("off") is None
    for bad in ("ten", "-5", "1.5", "5d"):
        with pytest.raises(ValueError, match="expected steps"):
            parse_every(bad)
    # a duration never lets a save cost more than 2% of the time between saves
    every = Every(seconds=60.0)
    assert not every.due(1, since_s=100.0, last_save_s=3.0)  # 3 s a save: every 150 s at least
    assert every.due(1, since_s=150.0, last_save_s=3.0)
    assert every.due(1, since_s=60.0, last_save_s=0.5) and not every.due(1, 59.0, 0.5)
    assert Every(steps=10).due(20, 0, math.inf) and not Every(steps=10).due(21, 1e9, 0)


STALLED = """
import sys, torch
sys.path.insert(0, {root!r})
torch.set_num_threads(1)
from benchmark.data import prepare
from benchmark.recipe import TrainConfig
from benchmark.trial.run import run_trial
from benchmark.trial.runstate import Every, RunState
import tiny_search, tiny_trial
cfg = TrainConfig.from_dict({cfg!r})
state = RunState({folder!r}, {spec!r}, cfg, Every(steps=10), watch=True, stall_after_s=2.0, name="t0003-s1")
run_trial({spec!r}, cfg, data=prepare(tiny_search.data(Path({corpus!r}))), quantize=None, state=state)
"""


def test_a_run_that_makes_no_step_is_ended_and_continues_from_its_last_save(corpus, tmp_path):
    """A test-only fault sleeps inside step 25: the watchdog ends the process after 2 s with no
    step, in one line and no traceback; run again, the run continues from its save at 20, counts
    the stall, and ends as the run that never stalled."""
    import os
    import subprocess
    import sys
    from pathlib import Path

    import tiny_search

    from benchmark.data import prepare
    from benchmark.trial.watchdog import FAULT, STALLED_EXIT

    spec = {**tiny_trial.SPEC, "vocab_size": 320}
    folder = str(tmp_path / "_runstate")
    code = "from pathlib import Path\n" + STALLED.format(
        root=str(Path(__file__).resolve().parents[1]),
        cfg={**tiny_trial.CFG, "tokens": "12K", "eval_every": 7},
        folder=folder,
        spec=spec,
        corpus=str(corpus),
    )
    env = {
        **os.environ,
        FAULT: f"{tmp_path / 'stalled-once'}:25",
        "PYTHONPATH": str(Path(__file__).resolve().parent),
    }
    proc = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, env=env)
    assert proc.returncode == STALLED_EXIT, proc.stderr[-2000:]
    (line,) = [x for x in proc.stderr.splitlines() if x.strip()]
    assert line.startswith("shapebench: run t0003-s1: no step for ")
    assert line.endswith("after step 24 (limit 2 s): ended, to run again from its last save")
    data = prepare(tiny_search.data(corpus))
    torch.set_num_threads(1)
    whole = run_trial(spec, CFG, data=data, quantize=None)
    state = RunState(folder, spec, CFG, Every(steps=10), watch=True, stall_after_s=2.0)
    again = run_trial(spec, CFG, data=data, quantize=None, state=state)
    assert (again["resumed_from_step"], again["resumes"], again["stalls"]) == (20, 1, 1)
    assert again["curve"] == whole["curve"] and again["val_loss"] == whole["val_loss"]
    assert whole["stalls"] == 0


def test_a_save_killed_mid_write_leaves_a_temporary_the_next_driver_removes(tmp_path):
    """A save is written whole or not at all (store/atomic.py): a process killed mid-save leaves
    the last whole save and a hidden temporary beside it, which the next driver's start removes
    (search/resume.py prepare_store), the save kept."""
    import os
    import tempfile

    from benchmark.search.context import STATE_DIR
    from benchmark.search.resume import prepare_store
    from benchmark.store import location

    study = tmp_path / "study"
    state = RunState(str(study / STATE_DIR), tiny_trial.SPEC, CFG, None)
    location.write_bytes(state.path, b"the last whole save")
    fd, _ = tempfile.mkstemp(  # what SIGKILL inside atomic_open leaves: its own name for it
        dir=study / STATE_DIR, prefix=f".{os.path.basename(state.path)}.", suffix=".tmp"
    )
    os.close(fd)
    prepare_store(str(study), None, str(tmp_path / "fallback"))
    assert sorted(os.listdir(study / STATE_DIR)) == [os.path.basename(state.path)]
    assert location.read_bytes(state.path) == b"the last whole save"


def test_a_run_continued_under_a_new_trial_leaves_one_curve_though_it_ends_before_a_save(
    grammar_corpus, tmp_path
):
    """A driver stopped after the run's last save: the resumed search numbers the trial anew and
    the run, continued from that save, ends before another. The curve the stopped attempt left
    under its old name is removed by the run's end (search/trainable.py), so the study reads one
    curve, the whole run's."""
    from benchmark.search import trainable, tuning
    from benchmark.search.context import TrialContext
    from benchmark.store import read_curves

    ctx = TrialContext(
        study="s",
        study_dir=str(tmp_path / "s"),
        data=None,
        training={**tiny_trial.CFG, "tokens": "12K", "eval_every": 7},
        count="total",
        objectives=("val_loss",),
        checkpoint_every="10",
    )
    whole = _run(grammar_corpus)
    # the stopped driver's attempt: saves at 10, 20, 30 and 40, its curve so far beside the rows
    state = RunState(ctx.state_dir(), tiny_trial.SPEC, CFG, Every(steps=10))
    state.on_save = trainable._live_curve(ctx, state, "t0000", 0, tuning.FINAL, 0)
    with pytest.raises(Killed):
        _run(grammar_corpus, state, _stop_after(45))
    assert sorted(p.name for p in (tmp_path / "s" / "_curves").iterdir()) == ["t0000.a0.parquet"]
    config = {"spec": tiny_trial.SPEC, "optuna_trial": 1, "family": "looped"}
    row = trainable.attempts(config, ctx, "t0001", 0, grammar_corpus, None)
    assert (row["status"], row["resumed_from_step"], row["resumes"]) == ("ok", 40, 1)
    assert sorted(p.name for p in (tmp_path / "s" / "_curves").iterdir()) == ["t0001.a0.parquet"]
    curve = read_curves(ctx.study_dir).dropna(subset=["train_loss"])
    assert set(curve["trial_id"]) == {"t0001"}
    assert curve["train_loss"].tolist() == [p["train_loss"] for p in whole["curve"]]


def test_a_stall_is_counted_once_by_whichever_rank_sees_it(tmp_path, monkeypatch):
    """Each rank of a run of several watches itself. The stuck rank's watchdog counts the stall
    though it is not rank 0 (rank 0 may be ended first by the lost peer, not by its own
    watchdog), and when both ranks' watchdogs fire, the stall counts once: each writes the count
    its attempt began with plus one. The next attempt's stall counts again."""
    from types import SimpleNamespace

    from benchmark.trial import runstate

    ended = []
    monkeypatch.setattr(runstate, "end_process", ended.append)
    folder = str(tmp_path / "_runstate")

    def rank(main: bool) -> RunState:
        state = RunState(folder, tiny_trial.SPEC, CFG, None, True, 2.0)
        state.ranks = SimpleNamespace(main=main)  # what bind sets (trial/distributed.py Ranks)
        return state

    stuck, main = rank(False), rank(True)
    dogs = [stuck.watchdog(lambda: 10), main.watchdog(lambda: 10)]  # both begin the attempt
    dogs[0].on_stall(3.0, 2.0)  # the stuck rank alone
    assert stuck.stalls() == 1 and len(ended) == 1
    dogs[1].on_stall(3.0, 2.0)  # then rank 0, waiting in the collective
    assert main.stalls() == 1 and len(ended) == 2
    main.watchdog(lambda: 14).on_stall(3.0, 2.0)  # the next attempt stalls too
    assert main.stalls() == 2


def test_a_continued_run_tells_its_evaluations_before_the_save_again(grammar_corpus, tmp_path):
    """A run lost after a save continues from it and first tells its trial the evaluations the
    save holds (steps 7 and 14), then the rest as it makes them: an evaluation the lost run made
    but its trial never received, and every evaluation of a trial numbered anew on resume, reach
    Optuna and ASHA (the searcher keeps the first value at each number of tokens)."""
    whole: list[dict] = []
    _run(grammar_corpus, on_eval=whole.append)
    folder = str(tmp_path / "_resume")
    told: list[dict] = []
    with pytest.raises(Killed):
        state = RunState(folder, tiny_trial.SPEC, CFG, Every(steps=10))
        _run(grammar_corpus, state, _stop_after(25), told.append)
    assert [r["step"] for r in told] == [7, 14, 21]  # 21: after the save at 20, lost with the run
    again: list[dict] = []
    _run(
        grammar_corpus,
        RunState(folder, tiny_trial.SPEC, CFG, Every(steps=10)),
        on_eval=again.append,
    )
    # the save's two first, then 21 on: every evaluation of the run that never stopped, as it made them
    assert [r["step"] for r in again] == [r["step"] for r in whole] == [7, 14, 21, 28, 35, 42]
    assert again == whole

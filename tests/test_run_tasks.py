"""The run as the unit of scheduling (search/dispatch.py): on a local Ray cluster of 6 CPU slots
(standing for GPUs), a study of 2 candidates x (2 tuning runs + 3 final seeds) trains runs of one
candidate side by side, and ends with the rows, Optuna study and report of the same study run one
run at a time inside each candidate's trial; on one CPU slot, a trial ASHA stops cancels its runs.

The final runs of this tiny study last a second or two, so one could end before the third of its
candidate starts even when all three were handed to Ray at once (seen on a 2-core CI machine): a
test fault (dispatch.TOGETHER) holds each after its first step until the three have come, or two
minutes have passed, so runs trained one at a time fail the count rather than hang."""

import argparse
import json
from dataclasses import replace
from pathlib import Path

import optuna
import pandas as pd
import pytest
import tiny_search

from benchmark.search import OPTUNA_DB, SearchOptions, run_search, saving
from benchmark.search.dispatch import TOGETHER
from benchmark.space.language import load_space

pytestmark = pytest.mark.slow

SPACE = """
name: runs
budget: 100K
tolerance: 2%
base: {vocab_size: 320, n_heads: 2, layers: {begin: 1, middle: 1, end: 1}}
axes:
  family: [transformer, looped]
training: {tokens: 12K, seq_len: 32, batch_size: 8, lr: 3e-3, eval_tokens: 2K}
data: {max_epochs: 20}  # a small corpus read many times over: the test is scheduling, not data
quantize: {group_size: 16, calib_sequences: 16}
objectives: [val_loss:min]
trials: 2
seeds: 3
pruner: none
tune: {grid: {lr: [1e-3, 1e-2]}, seeds: [100], metric: val_loss}
"""
POLICY = {"compile": False, "precision": "fp32"}


@pytest.fixture
def six_slots(monkeypatch, tmp_path):
    """A local cluster of 6 CPUs whose workers hold each final run at its first step until the 3
    of its candidate have come (set before the cluster starts: its workers inherit it)."""
    import ray

    monkeypatch.setenv(TOGETHER, f"{tmp_path / 'together'}:3")
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 6})
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def _most_at_once(runs: pd.DataFrame) -> int:
    """The most runs training at one moment, from their rows' start and end times (seconds)."""
    start = pd.to_datetime(runs["started_at"])
    end = pd.to_datetime(runs["finished_at"])
    return max(int(((start <= t) & (t < end)).sum()) for t in start)


def test_runs_of_a_candidate_train_side_by_side_with_the_same_results(six_slots, corpus, tmp_path):
    path = tmp_path / "runs.yaml"
    path.write_text(SPACE)
    opts = SearchOptions(
        name="side",
        results_dir=tmp_path / "r",
        asha=False,
        retries=0,
        data=tiny_search.data(corpus),
        address=six_slots.address,
        cpus_per_trial=1,
        seeds=3,
    )  # every run its own task: the default
    run_search(load_space(path), opts, console=None, policy=POLICY)
    one = replace(opts, name="alone", concurrency=1, runs_as_tasks=False)
    run_search(load_space(path), one, console=None, policy=POLICY)

    side = pd.read_parquet(tmp_path / "r" / "side").set_index("trial_id").sort_index()
    alone = pd.read_parquet(tmp_path / "r" / "alone").set_index("trial_id").sort_index()
    assert len(side) == 10 and set(side["status"]) == {"ok"}
    assert sorted(side["phase"].value_counts().items()) == [("final", 6), ("tune", 4)]
    finals = side[side["phase"] == "final"]
    assert [_most_at_once(g) for _, g in finals.groupby("optuna_trial")] == [3, 3]
    assert _most_at_once(alone) == 1  # the reference: one run at a time
    # the same runs, at the same points, to the same losses (one thread each)
    assert list(side.index) == list(alone.index)
    for column in ("family", "seed", "phase", "tuned", "params_total"):
        assert list(side[column]) == list(alone[column]), column
    assert side["val_loss"].to_numpy() == pytest.approx(alone["val_loss"].to_numpy(), abs=1e-6)
    # Optuna: one value per candidate, the mean over its final seeds, in both
    values = {}
    for name in ("side", "alone"):
        study = optuna.load_study(
            study_name=name, storage=f"sqlite:///{tmp_path / 'r' / name / OPTUNA_DB}"
        )
        values[name] = sorted((t.params["family"], t.value) for t in study.trials)
    means = finals.groupby("family")["val_loss"].mean()
    assert [f for f, _ in values["side"]] == ["looped", "transformer"]
    assert [v for _, v in values["side"]] == pytest.approx(list(means), abs=1e-9)
    assert [v for _, v in values["side"]] == pytest.approx(
        [v for _, v in values["alone"]], abs=1e-6
    )
    tuned = json.loads(finals["tuned"].iloc[0])
    assert set(tuned) == {"lr"}
    assert Path(tmp_path / "r" / "side" / "_runstate").exists() is False or not list(
        (tmp_path / "r" / "side" / "_runstate").iterdir()
    )


RUNGS = """
name: rungs
budget: 100K
tolerance: 2%
base: {vocab_size: 320, n_heads: 2, layers: {begin: 1, middle: 1, end: 1}}
axes:
  family: [transformer]
training: {tokens: 12K, seq_len: 32, batch_size: 8, lr: 3e-3, eval_tokens: 2K}
data: {max_epochs: 20}
quantize: {group_size: 16, calib_sequences: 16}
objectives: [val_loss:min]
trials: 1
seeds: 3
"""


def test_the_first_seeds_evaluations_reach_optuna_from_its_task(six_slots, corpus, tmp_path):
    """Under ASHA (the space's pruner) the seeds of a candidate still train side by side, and its
    first seed's evaluations, posted from its task, are the trial's intermediate values in the
    Optuna study: the same as when the seeds train one after another inside the trial. (One
    candidate: ASHA has nothing to stop it for, so both studies train the same runs.)"""
    path = tmp_path / "rungs.yaml"
    path.write_text(RUNGS)
    opts = SearchOptions(
        name="side",
        results_dir=tmp_path / "r",
        retries=0,
        data=tiny_search.data(corpus),
        address=six_slots.address,
        cpus_per_trial=1,
        seeds=3,
    )
    run_search(load_space(path), opts, console=None, policy=POLICY)
    one = replace(opts, name="alone", runs_as_tasks=False)
    run_search(load_space(path), one, console=None, policy=POLICY)

    side = pd.read_parquet(tmp_path / "r" / "side").set_index("trial_id").sort_index()
    assert _most_at_once(side) == 3 and set(side["status"]) == {"ok"}
    evals = [e["val_loss"] for e in json.loads(side.loc["t0000-s0", "evals"])]
    assert len(evals) == 9  # driver._eval_every: 46 steps of 256 tokens, one at every 5th
    values = {}
    for name in ("side", "alone"):
        study = optuna.load_study(
            study_name=name, storage=f"sqlite:///{tmp_path / 'r' / name / OPTUNA_DB}"
        )
        (trial,) = study.trials
        values[name] = [v for _, v in sorted(trial.intermediate_values.items())]
    # each evaluation of seed 0, as when the seeds train inside the trial
    assert values["side"] == pytest.approx(evals, abs=1e-9)
    assert values["side"] == pytest.approx(values["alone"], abs=1e-6)


def test_every_run_its_own_task_is_the_default_and_a_flag_turns_it_off():
    parser = argparse.ArgumentParser()
    saving.add_flags(parser.add_argument)
    assert SearchOptions(name="s").runs_as_tasks is True
    assert "runs_as_tasks" not in saving.options(parser.parse_args([]))  # SearchOptions' default
    assert saving.options(parser.parse_args(["--no-runs-as-tasks"]))["runs_as_tasks"] is False
    assert saving.options(parser.parse_args(["--runs-as-tasks"]))["runs_as_tasks"] is True


CANCEL = """
name: cancel
budget: 100K
tolerance: 2%
base: {vocab_size: 320, n_heads: 2, layers: {begin: 1, middle: 1, end: 1}}
axes:
  family: [transformer]
  norm_eps: [1e-5, 1e4, 1e-6]  # 1e4: the norms scale every activation by about 1/100
training: {tokens: 20K, seq_len: 32, batch_size: 8, lr: 3e-3, eval_tokens: 2K}
data: {max_epochs: 20}
quantize: {group_size: 16, calib_sequences: 16}
objectives: [val_loss:min]
trials: 3
seeds: 2
"""


@pytest.fixture
def one_slot():
    """A local cluster of one CPU: one trial at a time, so ASHA (the space's pruner) has the
    first candidate's rungs when the second comes to them."""
    import ray
    from ray.cluster_utils import Cluster

    c = Cluster(initialize_head=True, head_node_args={"num_cpus": 1})
    c.wait_for_nodes()
    yield c
    ray.shutdown()
    c.shutdown()


def test_a_run_posting_its_evaluations_keeps_its_cpu(one_slot):
    """A run task posts each evaluation to its trial's board (dispatch.post_evaluations) without
    waiting in ray.get, where Ray lends a task's CPU to the next task (Ray's "yielding resources
    while blocked"), which then trains beside it on the same core: on one CPU, two runs posting
    20 evaluations each run one after the other, and each run's evaluations are all on the board
    when its task ends (its trial reads them then: dispatch._wait)."""
    import time
    from types import SimpleNamespace

    import ray

    from benchmark.search import dispatch
    from benchmark.search.progress import start_board

    ray.init(address=one_slot.address)
    board = start_board()
    ctx = SimpleNamespace(progress=board)

    @ray.remote(num_cpus=1)
    def run(name: str) -> tuple[float, float, int]:
        post = dispatch.post_evaluations(ctx, name)
        start = time.time()
        for step in range(20):
            time.sleep(0.1)  # training
            post({"step": step})
        post.flush()
        end = time.time()
        return start, end, len(ray.get(board.news.remote(0, name, 0))["evaluations"])

    (a0, a1, a_evals), (b0, b1, b_evals) = sorted(ray.get([run.remote(n) for n in "ab"]))
    assert (a_evals, b_evals) == (20, 20)
    # waiting for the board at each post instead, they overlap for nearly all of their 2 s
    assert b0 > a1 - 0.5, f"the second run started {a1 - b0:.2f} s before the first ended"


def test_a_trial_asha_stops_cancels_its_runs_and_keeps_their_state(one_slot, corpus, tmp_path):
    """The second candidate, crippled (norm_eps 1e4: near-uniform predictions), is worse than
    the first at ASHA's first rung and stopped there. Its trial cancels its runs' tasks
    (dispatch.run_all): the processes training them are killed, neither seed leaves a row, the
    state they saved is kept for --resume, and the search goes on to the third candidate and
    finishes. The third matters: Tune keeps a stopped trial's actor for the next trial, and
    ends it (and with it the tasks it owns) only when none is to come, so here the runs end
    only if their trial cancels them."""
    from benchmark.trial.runstate import SUFFIX, saved_record

    path = tmp_path / "cancel.yaml"
    path.write_text(CANCEL)
    opts = SearchOptions(
        name="cancel",
        results_dir=tmp_path / "r",
        retries=0,
        data=tiny_search.data(corpus),
        address=one_slot.address,
        cpus_per_trial=1,
        seeds=2,
        checkpoint_every="5",
    )
    summary = run_search(load_space(path), opts, console=None, policy=POLICY)
    study = tmp_path / "r" / "cancel"
    rows = pd.read_parquet(study).set_index("trial_id").sort_index()
    stopped = rows[rows["optuna_trial"] == 1]
    assert summary.ran == 3 and list(rows.loc[["t0000-s0", "t0000-s1"], "status"]) == ["ok"] * 2
    assert list(stopped.index) == ["t0001-s0"] and stopped["status"].iloc[0] == "pruned"
    assert stopped["tokens_trained"].iloc[0] < rows.loc["t0000-s0", "tokens_trained"]
    assert set(rows.loc[rows["optuna_trial"] == 2, "status"]) in ({"ok"}, {"pruned"})
    # the finished runs' states are removed with their rows; the stopped trial's are kept
    states = sorted((study / "_runstate").glob(f"*{SUFFIX}"))
    saved = {s: saved_record(str(s)) for s in states}
    assert saved and all(r["step"] >= 5 for r in saved.values())
    # its tasks were killed (force-cancelled), not left to train on: their processes are gone
    assert tiny_search.gone([r["pid"] for r in saved.values()])
    assert {s: saved_record(str(s))["step"] for s in states} == {
        s: r["step"] for s, r in saved.items()
    }

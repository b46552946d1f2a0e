"""`tune:`: each candidate trained over the same grid on tuning seeds, its final seeds (fresh) at
the point it chose; the curves of every run in the store, in TensorBoard's event files and in
MLflow's store; a killed tuning resumed without training its finished runs again."""

import json
import re
import struct
import time
from dataclasses import replace
from pathlib import Path

import optuna
import pandas as pd
import pytest
import tiny_search

from benchmark.search import SearchOptions, StudyError, run_search
from benchmark.search.context import TrialContext
from benchmark.space.language import load_space
from benchmark.space.source import SpaceError

SPACE = """
name: tuned
budget: 100K
tolerance: 2%
base: {{vocab_size: 320, n_heads: 2, layers: {{begin: 1, middle: 1, end: 1}}}}
axes:
  family: [transformer, looped]
training: {{tokens: 8K, seq_len: 32, batch_size: 8, lr: 3e-3, eval_tokens: 2K}}
quantize: {{group_size: 16, calib_sequences: 16}}
objectives: [val_loss:min]
trials: 2
seeds: 2
pruner: none
tune: {tune}
"""
TUNE = "{grid: {lr: [1e-3, 1e-2]}, seeds: [100], metric: val_loss}"
POLICY = {"compile": False, "precision": "fp32"}


def space_file(root: Path, tune: str = TUNE) -> Path:
    path = root / "tuned.yaml"
    path.write_text(SPACE.format(tune=tune))
    return path


def test_the_tune_section_is_validated_where_it_is_written(tmp_path):
    space = load_space(space_file(tmp_path))
    assert space.tune.points() == [{"lr": 1e-3}, {"lr": 1e-2}] and space.tune.runs == 2
    for tune, message in [
        ("{grid: {lr: [1e-3]}, seeds: [1]}", "tune.seeds: seed 1 is also a final seed (0..1)"),
        (
            "{grid: {lrr: [1e-3]}, seeds: [100]}",
            "tune.grid.lrr: unknown training setting (did you mean 'lr'?)",
        ),
        ("{grid: {lr: [1e-3, -1]}, seeds: [100]}", "tune.grid.lr[1]: must be > 0"),
        (
            "{grid: {tokens: [1M]}, seeds: [100]}",
            "tune.grid.tokens: tokens changes what is trained",
        ),
        ("{grid: {lr: [1e-3]}, seeds: [100], metric: params}", "tune.metric: params is a"),
    ]:
        with pytest.raises(SpaceError, match=re.escape(message)):
            load_space(space_file(tmp_path, tune))
    asha = tmp_path / "asha.yaml"
    asha.write_text(SPACE.format(tune=TUNE).replace("pruner: none", "pruner: asha"))
    with pytest.raises(SpaceError, match="set `pruner: none`"):
        load_space(asha)


def _ctx(study_dir, space, retries=0) -> TrialContext:
    return TrialContext(
        study="tuned",
        study_dir=str(study_dir),
        data=None,
        training=space.training,
        count="total",
        objectives=("val_loss",),
        seeds=2,
        retries=retries,
        tune=space.tune,
    )


def _row(trial_id, seed, lr, loss, status="ok"):
    return {
        "study": "tuned",
        "trial_id": trial_id,
        "status": status,
        "seed": seed,
        "val_loss": loss,
        "phase": "tune",
        "tuned": json.dumps({"lr": lr}),
        "attempt": 0,
        "optuna_trial": 7,
    }


def test_a_candidate_trains_only_the_tuning_runs_it_lacks_and_picks_the_best_point(tmp_path):
    from benchmark.search import tuning
    from benchmark.store.results import write_row

    space = load_space(space_file(tmp_path, "{grid: {lr: [1e-3, 1e-2, 1e-1]}, seeds: [100, 101]}"))
    ctx = _ctx(tmp_path / "s", space)
    write_row(ctx.study_dir, _row("t0007-g0-s100", 100, 1e-3, 5.0))  # finished before a kill
    write_row(ctx.study_dir, _row("t0007-g0-s101", 101, 1e-3, 5.2))
    trained = []

    def train(trial_id, seed, point):
        trained.append(trial_id)
        losses = {(0.01, 100): 4.0, (0.01, 101): 4.4, (0.1, 100): 3.0}  # lr 0.1, seed 101 diverges
        loss = losses.get((point["lr"], seed))
        return _row(trial_id, seed, point["lr"], loss, "ok" if loss else "diverged")

    assert tuning.settle({"optuna_trial": 7}, ctx, 7, train) == {
        "lr": 1e-2
    }  # mean 4.2 < 5.1; 0.1 unstable
    assert trained == ["t0007-g1-s100", "t0007-g1-s101", "t0007-g2-s100", "t0007-g2-s101"]
    # a trial that continues trial 7 (killed while tuning) reads its runs as its own
    trained.clear()
    assert tuning.settle({"optuna_trial": 9, "continues": [7]}, ctx, 9, train) == {"lr": 1e-2}
    assert trained == ["t0009-g1-s100", "t0009-g1-s101", "t0009-g2-s100", "t0009-g2-s101"]


def _settle_with(tmp_path, tune: str, losses, number=7, continues=()):
    """settle() over `losses` ((lr, seed) -> loss; a missing one diverged): (choice, trained ids)."""
    from benchmark.search import tuning

    tmp_path.mkdir(parents=True, exist_ok=True)
    ctx = _ctx(tmp_path / "s", load_space(space_file(tmp_path, tune)))
    trained = []

    def train(trial_id, seed, point):
        from benchmark.store.results import write_row

        trained.append(trial_id)
        loss = losses.get((point["lr"], seed))
        row = _row(trial_id, seed, point["lr"], loss, "ok" if loss else "diverged")
        write_row(ctx.study_dir, row)
        return row

    config = {"optuna_trial": number, "continues": list(continues)}
    return tuning.settle(config, ctx, number, train), trained


def test_an_edge_choice_extends_the_grid_until_it_is_inside_or_at_a_bound(tmp_path):
    # the loss falls with lr up to 0.1: 1e-2 wins the declared grid at its top, so 0.1 (the grid's
    # own ratio, 10) is trained, wins at the new top, and 1.0 is trained: worse, so 0.1 is inside
    losses = {(1e-3, 100): 5.0, (1e-2, 100): 4.0, (0.1, 100): 3.5, (1.0, 100): 6.0}
    tune = "{grid: {lr: [1e-3, 1e-2]}, seeds: [100], extend: {lr: [1e-4, %s]}}"
    choice, trained = _settle_with(tmp_path / "a", tune % "1.0", losses)
    assert choice == {"lr": 0.1}
    assert trained == ["t0007-g0-s100", "t0007-g1-s100", "t0007-g2-s100", "t0007-g3-s100"]
    # a trial that continues it (killed after its extensions) reads them and trains nothing
    choice, again = _settle_with(tmp_path / "a", tune % "1.0", losses, number=9, continues=[7])
    assert choice == {"lr": 0.1} and again == []
    # the declared bound stops it: 1.0 lies beyond 0.5, so 0.1, an edge, is the choice
    choice, trained = _settle_with(tmp_path / "b", tune % "0.5", losses)
    assert choice == {"lr": 0.1} and trained[-1] == "t0007-g2-s100" and len(trained) == 3
    # without `extend`, the declared grid's edge is the choice, as before
    choice, trained = _settle_with(
        tmp_path / "c", "{grid: {lr: [1e-3, 1e-2]}, seeds: [100]}", losses
    )
    assert choice == {"lr": 1e-2} and len(trained) == 2
    # a bottom edge extends downwards by the same ratio
    low = {(1e-3, 100): 4.0, (1e-2, 100): 5.0, (1e-4, 100): 4.5}
    choice, trained = _settle_with(tmp_path / "d", tune % "1.0", low)
    assert choice == {"lr": 1e-3} and trained[-1] == "t0007-g2-s100"


def test_points_within_the_noise_of_the_best_tie_and_the_declared_rule_breaks_the_tie(tmp_path):
    from benchmark.space.tuning import Tune

    # two tuning seeds: seed 101 is 0.1 above seed 100 everywhere but for noise of +-0.01
    values = {
        '{"lr": 0.001}': [3.60, 3.72],
        '{"lr": 0.003}': [3.52, 3.60],
        '{"lr": 0.01}': [3.49, 3.61],  # the best mean (3.55), by 0.01 over 0.003
        '{"lr": 0.03}': [3.70, 3.80],
    }
    tune = Tune(grid=(("lr", (0.001, 0.003, 0.01, 0.03)),), seeds=(100, 101))
    pick, margin, tied = tune.decide(values)
    # residuals of the additive fit: +-0.0075, +-0.0125, +-0.0075, +-0.0025 on 3 degrees of
    # freedom: s^2 = 0.00055 / 3, margin = sqrt(s^2 x 2 / 2) = 0.0135, above 0.01
    assert margin == pytest.approx((0.00055 / 3) ** 0.5, rel=1e-9)
    assert (
        tied == ['{"lr": 0.003}', '{"lr": 0.01}'] and pick == '{"lr": 0.003}'
    )  # middle: lower of 2
    assert tune.decide(values)[0] == replace(tune, ties="middle").decide(values)[0]
    assert replace(tune, ties="higher").decide(values)[0] == '{"lr": 0.01}'
    assert replace(tune, ties="best").decide(values)[0] == '{"lr": 0.01}'
    wide = replace(tune, margin=0.15)  # a declared margin: every point but 0.03 ties
    assert wide.decide(values)[2] == ['{"lr": 0.001}', '{"lr": 0.003}', '{"lr": 0.01}']
    assert wide.decide(values)[0] == '{"lr": 0.003}'
    assert replace(tune, ties="lower", margin=0.15).decide(values)[0] == '{"lr": 0.001}'
    # one tuning seed has no noise: only equal means tie, and the best is chosen as before
    one = Tune(grid=tune.grid, seeds=(100,))
    assert one.decide({k: v[:1] for k, v in values.items()})[:2] == ('{"lr": 0.01}', 0.0)
    # the declaration records the later keys only where the file gave them
    assert (
        "margin" not in one.declared()
        and replace(one, given=("ties",)).declared()["ties"] == "middle"
    )


def test_a_point_whose_seeds_part_is_left_out_of_the_noise(monkeypatch):
    """The third reference study's AbbIE-D tuned on val_loss_r4 (ref3-abbie-r4's rows): at the
    extension 2.4e-2 its seeds parted by 0.40 nats where the other points' differ by 0.04 at
    most. Pooled into the noise, that made a margin of 0.12 nats, in which 1.5e-3 to 1.2e-2 tied
    and `ties: middle` chose 3e-3, though both seeds put 1.2e-2 ahead of it by 0.065 and 0.084.
    Left out (its seed difference's modified z-score is 13.8, above 3.5), the margin is the other
    four points' noise and 1.2e-2 is chosen alone."""
    from benchmark.space import tuning
    from benchmark.space.tuning import Tune

    values = {
        '{"lr": 0.0015}': [3.814570, 3.808682],
        '{"lr": 0.003}': [3.765983, 3.769444],
        '{"lr": 0.006}': [3.705688, 3.742845],
        '{"lr": 0.012}': [3.682263, 3.704355],
        '{"lr": 0.024}': [3.766460, 4.168976],
    }
    tune = Tune(grid=(("lr", (0.0015, 0.003, 0.006, 0.012)),), seeds=(100, 101), ties="middle")
    # the four points' seed differences -0.0059, 0.0035, 0.0372, 0.0221: s^2 = sum of squared
    # deviations from their mean / (2 x 3), the margin s x sqrt(2 / 2)
    d = [b - a for a, b in list(values.values())[:4]]
    assert tune.margin_for(values) == pytest.approx(
        (sum((x - sum(d) / 4) ** 2 for x in d) / 6) ** 0.5, rel=1e-12
    )
    assert tune.decide(values) == (
        '{"lr": 0.012}',
        pytest.approx(0.013590, abs=1e-6),
        ['{"lr": 0.012}'],
    )
    # with it kept (the rule's bound raised past it), the margin is 0.12 and 3e-3 is chosen
    monkeypatch.setattr(tuning, "PARTED", float("inf"))
    assert tune.margin_for(values) == pytest.approx(0.1234, abs=1e-4)
    assert tune.decide(values)[0] == '{"lr": 0.003}'


def test_the_tuning_protocol_keys_are_validated(tmp_path):
    for tune, message in [
        ("{grid: {lr: [1e-3, 1e-2]}, seeds: [100], margin: -1}", "tune.margin: expected noise"),
        (
            "{grid: {lr: [1e-3, 1e-2]}, seeds: [100], ties: left}",
            "tune.ties: expected one of middle",
        ),
        (
            "{grid: {lr: [1e-3, 1e-2]}, seeds: [100], extend: {warmup: [0, 1]}}",
            "tune.extend.warmup: not a key of tune.grid",
        ),
        (
            "{grid: {lr: [1e-3, 1e-2]}, seeds: [100], extend: {lr: [2e-3, 1]}}",
            "tune.extend.lr: expected [lowest, highest] around the grid's values",
        ),
        (
            "{grid: {lr: [1e-3]}, seeds: [100], extend: {lr: [1e-4, 1]}}",
            "tune.extend.lr: a grid is extended along a key of 2 or more",
        ),
    ]:
        with pytest.raises(SpaceError, match=re.escape(message)):
            load_space(space_file(tmp_path, tune))


def test_a_trials_time_inside_counts_its_tuning_runs(tmp_path, monkeypatch):
    """The driver's span of a tuned trial less its time inside is orchestration: the tuning runs
    are inside (left out, a 4-point grid read as 20 minutes of orchestration a trial)."""
    from benchmark.search import trainable, tuning

    space = load_space(space_file(tmp_path))
    ctx = _ctx(tmp_path / "s", space)
    walls = {tuning.TUNE: 30.0, tuning.FINAL: 100.0}
    reports = []

    def attempts(config, ctx, trial_id, seed, data, report, setting=None, phase=tuning.FINAL):
        reports.append(report)
        loss = 4.0 if setting == {"lr": 1e-2} else 4.5
        row = {**_row(trial_id, seed, setting["lr"], loss), "phase": phase}
        return {**row, "wall_s": walls[phase], "val_ppl": 55.0, "tokens_trained": 8192}

    monkeypatch.setattr(trainable, "attempts", attempts)
    monkeypatch.setattr(trainable, "prepare", lambda data: None)
    monkeypatch.setattr(
        trainable.rows, "values", lambda written, names, count, vocab=None: [4.0] * len(names)
    )
    final = trainable._trial({"optuna_trial": 7}, replace(ctx, training={"eval_every": 4}), None)
    # 2 grid points on 1 tuning seed, then 2 final seeds
    assert final["status"] == "ok" and final["trial_wall_s"] == 2 * 30.0 + 2 * 100.0
    assert reports[:2] == [
        None,
        None,
    ]  # ASHA's rungs come from the first final seed, not a tuning run
    assert reports[2] is not None and reports[3] is None


def test_a_trial_killed_while_tuning_is_continued_not_started_again(tmp_path):
    from benchmark.search.resume import close_running
    from benchmark.store.results import write_row

    space = load_space(space_file(tmp_path))
    ctx = _ctx(tmp_path / "s", space)
    study = optuna.create_study()
    for _ in range(2):
        study.ask(
            {"family": optuna.distributions.CategoricalDistribution(["transformer", "looped"])}
        )
    write_row(ctx.study_dir, {**_row("t0001-g0-s100", 100, 1e-3, 5.0), "optuna_trial": 1})
    close_running(study, ctx)
    waiting = [t for t in study.trials if t.state.name == "WAITING"]
    assert sorted(t.user_attrs.get("continues") is not None for t in waiting) == [False, True]
    assert [t.user_attrs["continues"] for t in waiting if t.user_attrs.get("continues")] == [[1]]


def _events(folder: Path) -> dict[str, list[tuple[int, float]]]:
    """Every scalar in the TensorBoard event files under `folder` (TFRecord: length, its CRC,
    the Event proto, its CRC), read with tensorboardX's protos: tag -> [(step, value)]."""
    from tensorboardX.proto import event_pb2

    out: dict[str, list] = {}
    for path in folder.rglob("events.out.tfevents.*"):
        data, at = path.read_bytes(), 0
        while at < len(data):
            (length,) = struct.unpack("<Q", data[at : at + 8])
            event = event_pb2.Event.FromString(data[at + 12 : at + 12 + length])
            at += 16 + length
            for v in event.summary.value:
                out.setdefault(v.tag, []).append((event.step, v.simple_value))
    return out


def _options(corpus, tmp_path, **kw) -> SearchOptions:
    return SearchOptions(
        name="tuned",
        results_dir=tmp_path / "results",
        seeds=2,
        asha=False,
        retries=0,
        concurrency=1,
        cpus_per_trial=tiny_search.CPUS_PER_TRIAL,  # one torch thread a run (tiny_search.py)
        data=tiny_search.data(corpus),
        **kw,
    )


@pytest.mark.slow
def test_tune_end_to_end_each_candidate_at_its_own_setting_on_fresh_seeds(corpus, tmp_path):
    from benchmark.store.curves import read_curves

    space = load_space(space_file(tmp_path))
    results = tmp_path / "results"
    with pytest.raises(StudyError, match="tune.seeds: seed 100 is also a final seed"):
        run_search(space, _options(corpus, tmp_path, seed=99), console=None, policy=POLICY)
    run_search(space, _options(corpus, tmp_path), console=None, policy=POLICY)
    df = pd.read_parquet(results / "tuned")
    assert (
        set(df["status"]) == {"ok"} and len(df) == 8
    )  # 2 candidates x (2 lr x 1 tuning seed + 2 final seeds)
    tune, final = df[df["phase"] == "tune"], df[df["phase"] == "final"]
    assert set(tune["seed"]) == {100} and set(final["seed"]) == {0, 1}  # fresh final seeds
    assert tune.groupby("family").size().to_dict() == {
        "looped": 2,
        "transformer": 2,
    }  # an equal budget
    for family, runs in tune.groupby("family"):
        best = json.loads(runs.loc[runs["val_loss"].idxmin(), "tuned"])
        chosen = final.loc[final["family"] == family]
        assert len(chosen) == 2 and {json.loads(t)["lr"] for t in chosen["tuned"]} == {best["lr"]}
        assert {json.loads(t)["lr"] for t in chosen["training"]} == {best["lr"]}  # it trained at it
    study = optuna.load_study(
        study_name="tuned", storage=f"sqlite:///{results / 'tuned' / '_optuna.db'}"
    )
    for t in study.trials:  # Optuna is told the final seeds' mean, not the tuning runs'
        rows = final[final["optuna_trial"] == t.number]
        assert t.values[0] == pytest.approx(rows["val_loss"].mean())
    curves = pd.read_parquet(results / "tuned" / "_curves")
    assert curves.groupby("trial_id").size().to_dict() == dict.fromkeys(
        df["trial_id"], 32
    )  # 32 steps
    assert set(
        read_curves(str(results / "tuned")).dropna(subset=["val_loss"]).groupby("trial_id").size()
    ) == {4}
    # the board ranks the final rows and reads the tuning runs for the choice and the sensitivity
    from benchmark.leaderboard import build_board, read_results

    board = build_board(read_results([results]))
    assert len(board.trials) == 4 and len(board.tuning) == 4
    assert (
        board.candidates["tuning_runs"].tolist() == [2, 2]
        and board.candidates["lr_sensitivity"].gt(0).all()
    )


@pytest.mark.slow
def test_the_curves_reach_tensorboard_and_mlflow(corpus, tmp_path, monkeypatch):
    """Each point is a result the trial waits on, so one candidate and one seed, 16 steps. Where
    wandb is installed (the `loggers` extra), W&B too, in its offline mode (no network)."""
    import importlib.util

    from mlflow.tracking import MlflowClient

    wandb = importlib.util.find_spec("wandb") is not None
    monkeypatch.setenv("WANDB_MODE", "offline")
    monkeypatch.setenv("WANDB_DIR", str(tmp_path / "wandb"))
    (tmp_path / "wandb").mkdir()

    path = tmp_path / "one.yaml"
    path.write_text(
        SPACE.format(tune="null")
        .replace("tune: null", "")
        .replace("tokens: 8K", "tokens: 4K")
        .replace("trials: 2", "trials: 1")
        .replace("seeds: 2", "seeds: 1")
    )
    opts = _options(
        corpus,
        tmp_path,
        tensorboard=True,
        mlflow=str(tmp_path / "mlflow"),
        wandb="shapebench-test" if wandb else None,
    )
    run_search(load_space(path), replace(opts, seeds=1), console=None, policy=POLICY)
    results = tmp_path / "results" / "tuned"
    curve = pd.read_parquet(results / "_curves")
    (trial,) = set(curve["trial_id"])
    events = _events(results / "_ray")  # TensorBoard: the curve at its steps
    assert [s for s, _ in events[f"ray/tune/curve/{trial}/train_loss"]] == list(range(1, 17))
    assert [v for _, v in events[f"ray/tune/curve/{trial}/train_loss"]] == pytest.approx(
        curve["train_loss"].tolist(), rel=1e-6
    )
    assert [s for s, _ in events[f"ray/tune/curve/{trial}/val_loss"]] == [4, 8, 12]
    client = MlflowClient(
        tracking_uri=f"sqlite:///{tmp_path / 'mlflow' / 'mlflow.db'}"
    )  # MLflow: the same
    (run,) = client.search_runs([client.get_experiment_by_name("tuned").experiment_id])
    history = client.get_metric_history(run.info.run_id, f"curve/{trial}/lr")
    assert sorted(h.step for h in history) == list(range(1, 17))
    assert [h.value for h in sorted(history, key=lambda h: h.step)] == pytest.approx(
        curve["lr"].tolist()
    )
    if wandb:  # W&B: one offline run of the trial, which logged every point of the curve
        (run,) = (tmp_path / "wandb").glob("wandb/offline-run-*/run-*.wandb")
        # its records: protobuf, each value as JSON text (no reader API), written by W&B's own
        # process, which may still be writing the last of them when the search returns
        values = [repr(float(x)).encode() for x in curve["train_loss"]]
        deadline = time.monotonic() + 60
        while not all(v in (logged := run.read_bytes()) for v in values):
            if time.monotonic() > deadline:
                break
            time.sleep(0.5)
        assert f"curve/{trial}".encode() in logged or trial.encode() in logged
        assert [v for v in values if v not in logged] == []

"""Training curves: the points a trial keeps (bounded, spikes kept), the validation points along
the run, the curve file beside the row, loaded with pandas in one line."""

import json
import math

import pandas as pd
import pytest
from tiny_trial import CFG, SPEC

from benchmark.recipe import TrainConfig
from benchmark.trial.curve import Curve, largest_rise


def test_a_curve_has_a_bounded_number_of_points_and_keeps_a_spike():
    curve = Curve(1000, 4096, lambda step: 1e-3 * step, points=200)
    losses = [5.0] * 1000
    losses[501] = 9.0  # one bad step inside a window of 5
    for step, loss in enumerate(losses):
        curve.add(step, loss, 0.5)
    assert curve.every == 5 and len(curve.points) == 200
    at = next(p for p in curve.points if p["step"] == 505)
    assert at["train_loss_max"] == 9.0 and at["train_loss"] == pytest.approx(5.8)
    assert (
        at["tokens"] == 505 * 4096 and at["lr"] == pytest.approx(0.504) and at["grad_norm"] == 0.5
    )
    assert curve.points[-1]["step"] == 1000
    assert largest_rise(losses) == pytest.approx(4.0)
    assert largest_rise([9.0, 8.0, 7.0]) == 0.0 and largest_rise(
        [6.38, 6.5, 10.1, 6.0]
    ) == pytest.approx(3.72)


def test_validation_points_are_spread_over_the_run():
    cfg = TrainConfig(val_points=3)
    assert [s for s in range(1, 101) if cfg.evaluates(s, 100)] == [25, 50, 75]
    assert [s for s in range(1, 101) if TrainConfig(eval_every=40).evaluates(s, 100)] == [40, 80]
    assert not any(TrainConfig(val_points=0).evaluates(s, 100) for s in range(1, 101))


def _context(study_dir):
    """The trial context of a study "s" that writes rows and curves (search/rows.write)."""
    from benchmark.search.context import TrialContext

    return TrialContext(
        study="s",
        study_dir=str(study_dir),
        data=None,
        training={},
        count="total",
        objectives=("val_loss",),
    )


def test_a_trial_writes_its_curve_beside_its_row_and_pandas_reads_it(grammar_corpus, tmp_path):
    from benchmark.search.rows import write
    from benchmark.store.curves import read_curves
    from benchmark.trial.run import run_trial

    row = run_trial(SPEC, TrainConfig(**CFG), data=grammar_corpus, quantize=None)
    assert len(row["curve"]) == 79 and row["loss_spike"] >= 0  # 79 steps: one point each
    assert [e["step"] for e in json.loads(row["evals"])] == [20, 40, 59]  # val_points 3 of 79 steps
    ctx = _context(tmp_path / "s")
    write(ctx, {**row, "study": "s", "trial_id": "t0000", "attempt": 0})
    curves = pd.read_parquet(tmp_path / "s" / "_curves")  # the one line
    assert len(curves) == 79 and set(curves["trial_id"]) == {"t0000"}
    assert (
        list(curves["step"]) == list(range(1, 80))
        and curves["train_loss"].iloc[-1] == row["train_loss"]
    )
    assert curves["lr"].max() == pytest.approx(3e-3, rel=0.05) and (curves["grad_norm"] > 0).all()
    assert len(pd.read_parquet(tmp_path / "s")) == 1  # the rows alone: the curve stays out
    full = read_curves(str(tmp_path / "s"))
    val = full.dropna(subset=["val_loss"])
    assert list(val["step"]) == [20, 40, 59, 79] and val["val_loss"].iloc[-1] == pytest.approx(
        row["val_loss"]
    )
    assert math.isfinite(full["train_loss"].iloc[0])


def test_a_curve_is_named_as_its_row_even_for_an_odd_trial_name(tmp_path):
    """One name for both files (store/results.row_name): a trial name with characters a file name
    cannot hold gives the row and its curve the same safe name."""
    from benchmark.search.rows import write

    ctx = _context(tmp_path / "s")
    point = dict(step=1, tokens=8, train_loss=2.5, train_loss_max=2.5, lr=1e-3, grad_norm=1.0)
    write(
        ctx, {"study": "s", "trial_id": "t0001 b/c", "attempt": 1, "status": "ok", "curve": [point]}
    )
    names = ["t0001-b-c.a1.parquet"]
    assert sorted(p.name for p in (tmp_path / "s" / "trials").iterdir()) == names
    assert sorted(p.name for p in (tmp_path / "s" / "_curves").iterdir()) == names
    assert list(pd.read_parquet(tmp_path / "s" / "_curves")["trial_id"]) == ["t0001 b/c"]

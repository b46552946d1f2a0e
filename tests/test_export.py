"""`shapebench board --export`: a study as a tabular benchmark in Syne Tune's blackbox-repository
layout, loaded back with pandas and numpy alone. Every ok row appears once, at its configuration,
seed and fidelity; failed rows do not; learning curves fill the fidelities they reached."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fixture_studies import fixture_study

from benchmark.leaderboard import (
    build_board,
    export_benchmark,
    find_studies,
    read_declarations,
    read_studies,
)

KEPT = fixture_study("quickstart-faithful-families")  # frozen rows (tests/fixtures/README.md)
SYNE_TUNE = (
    "hyperparameters.parquet",
    "configspace.json",
    "fidelityspace.json",
    "objectives_evaluations.npy",
    "fidelities_values.npy",
    "metadata.json",
)
TOKENS = 800_768


def study_rows(study: str = "demo") -> pd.DataFrame:
    """2 families x 2 depths x 3 seeds, as the search writes them (axes, spec, budget); the
    Hyperloop rows carry a learning curve (two periodic evaluations); one row per family failed."""
    rng = np.random.default_rng(0)
    out = []
    for family in ("looped", "hyperloop"):
        for loops in (2, 3):
            spec = {
                "family": family,
                "d_model": 96 + 8 * loops,
                "layers": {"begin": 1, "middle": 2, "end": 1},
                "loops": loops,
            }
            axes = {
                "family": family,
                "shape.unrolled_layers": 2 + 2 * loops,
                "params_total": 1_499_630,
                "budget": 1_500_000,
                "count": "total",
                "budget_distance": -0.0002,
            }
            for seed in range(3):
                loss = 5.95 + rng.normal(0, 0.01)
                curve = (
                    [
                        {
                            "step": s,
                            "tokens": s * 2048,
                            "val_loss": loss + 1.0 / s,
                            "val_ppl": math.exp(loss + 1.0 / s),
                        }
                        for s in (100, 200)
                    ]
                    if family == "hyperloop"
                    else []
                )
                out.append(
                    {
                        "study": study,
                        "trial_id": f"{family}-{loops}-s{seed}",
                        "status": "ok",
                        "family": family,
                        "spec": json.dumps(spec),
                        "axes": json.dumps(axes),
                        "seed": seed,
                        "val_loss": loss,
                        "val_ppl": math.exp(loss),
                        "params_total": 1_499_630 + loops,
                        "budget": 1_500_000,
                        "flops_per_token_train": 5.1e6,
                        "tokens_per_s": 4000.0 + seed,
                        "wall_s": 150.0 + seed,
                        "tokens_trained": TOKENS,
                        "evals": json.dumps(curve),
                        "code_version": "abc123",
                    }
                )
        out.append(
            {
                **out[-1],
                "trial_id": f"{family}-failed",
                "status": "failed",
                "val_loss": None,
                "val_ppl": None,
                "seed": 7,
            }
        )
    return pd.DataFrame(out)


def load(folder: Path) -> dict:
    """The export, read as an HPO researcher would: pandas, numpy and json, nothing of shapebench."""
    return {
        "hps": pd.read_parquet(folder / "hyperparameters.parquet"),
        "space": json.loads((folder / "configspace.json").read_text()),
        "fidelity_space": json.loads((folder / "fidelityspace.json").read_text()),
        "values": np.load(folder / "objectives_evaluations.npy"),
        "fidelities": np.load(folder / "fidelities_values.npy"),
        "meta": json.loads((folder / "metadata.json").read_text()),
        "trials": pd.read_parquet(folder / "trials.parquet"),
        "architectures": pd.read_parquet(folder / "architectures.parquet"),
    }


@pytest.fixture(scope="module")
def exported(tmp_path_factory):
    root = tmp_path_factory.mktemp("export")
    (root / "results" / "demo" / "trials").mkdir(parents=True)
    rows = study_rows()
    rows.to_parquet(root / "results" / "demo" / "trials" / "rows.parquet", index=False)
    from benchmark.leaderboard import command as cli

    assert (
        cli.main(
            [
                str(root / "results"),
                "--export",
                str(root / "bench"),
                "--format",
                "csv",
                "--out",
                str(root / "site"),
            ]
        )
        == 0
    )
    return rows, load(root / "bench" / "demo"), root / "bench" / "demo"


def test_the_layout_is_syne_tunes(exported):
    rows, got, folder = exported
    assert all((folder / name).stat().st_size for name in SYNE_TUNE)
    # (tasks, configurations, seeds, fidelities, objectives); one task: the study.
    assert got["values"].shape == (1, 4, 3, 3, len(got["meta"]["objectives_names"]))
    assert got["meta"]["task_names"] == ["demo"] and got["meta"]["seeds"] == [0, 1, 2]
    assert (
        list(got["hps"].columns)
        == list(got["space"])
        == ["hp_family", "hp_shape.unrolled_layers", "hp_budget"]
    )
    assert not got["hps"].duplicated().any()
    assert got["space"]["hp_family"] == {
        "domain_cls": "Categorical",
        "domain_kwargs": {"categories": ["hyperloop", "looped"]},
    }
    assert got["fidelities"].tolist() == [204_800, 409_600, TOKENS]
    assert got["fidelity_space"] == {
        "hp_tokens": {"domain_cls": "Integer", "domain_kwargs": {"lower": 204_800, "upper": TOKENS}}
    }
    meta = got["meta"]
    modes = dict(zip(meta["objectives_names"], meta["objectives_modes"]))
    assert modes["metric_val_loss"] == "min" and modes["metric_tokens_per_s"] == "max"
    assert (meta["metric_default"], meta["metric_elapsed_time"], meta["resource_attr"]) == (
        "metric_val_ppl",
        "metric_wall_s",
        "hp_tokens",
    )


def test_every_ok_row_appears_once_with_its_seed_and_fidelity(exported):
    rows, got, _ = exported
    ok = rows[rows["status"] == "ok"]
    index = got["trials"].set_index("trial_id")
    assert sorted(index.index) == sorted(ok["trial_id"])  # once each; the failed rows are not there
    names = got["meta"]["objectives_names"]
    loss, wall = names.index("metric_val_loss"), names.index("metric_wall_s")
    values = got["values"][0]
    for row in ok.itertuples():
        at = index.loc[row.trial_id]
        assert got["meta"]["seeds"][at["seed_index"]] == row.seed == at["seed"]
        assert got["fidelities"][at["fidelity_index"]] == row.tokens_trained
        assert values[at["config"], at["seed_index"], at["fidelity_index"], loss] == row.val_loss
        assert values[at["config"], at["seed_index"], at["fidelity_index"], wall] == row.wall_s
        hp = got["hps"].iloc[at["config"]]
        assert (hp["hp_family"], hp["hp_shape.unrolled_layers"]) == (
            row.family,
            json.loads(row.axes)["shape.unrolled_layers"],
        )
        assert got["architectures"].loc[at["config"], "spec"] == json.dumps(
            json.loads(row.spec), sort_keys=True, separators=(",", ":")
        )
    # Nothing else: one final loss per ok row, plus the Hyperloop rows' 2 periodic evaluations.
    assert np.isfinite(values[..., loss]).sum() == len(ok) + 2 * (ok["family"] == "hyperloop").sum()


def test_learning_curves_fill_the_fidelities_they_reached(exported):
    rows, got, _ = exported
    names = got["meta"]["objectives_names"]
    row = rows[rows["trial_id"] == "hyperloop-3-s1"].iloc[0]
    at = got["trials"].set_index("trial_id").loc["hyperloop-3-s1"]
    curve = got["values"][0, at["config"], at["seed_index"]]  # (fidelities, objectives)
    assert curve[:, names.index("metric_val_loss")].tolist() == pytest.approx(
        [row.val_loss + 0.01, row.val_loss + 0.005, row.val_loss]
    )  # evaluations at steps 100 and 200
    assert curve[:, names.index("metric_params_total")].tolist() == [row.params_total] * 3
    assert curve[:, names.index("metric_wall_s")].tolist() == pytest.approx(
        [row.wall_s * 204_800 / TOKENS, row.wall_s * 409_600 / TOKENS, row.wall_s]
    )
    looped = got["trials"].set_index("trial_id").loc["looped-2-s0"]
    assert np.isnan(
        got["values"][0, looped["config"], looped["seed_index"], :2]
    ).all()  # no curve: the end only


def test_the_kept_quickstart_exports_its_sampled_axes(tmp_path):
    studies = find_studies([KEPT])
    board = build_board(read_studies(studies), declared=read_declarations(studies))
    written = export_benchmark(board, tmp_path)
    assert {p.name for p in written} >= set(SYNE_TUNE)
    got = load(tmp_path / "quickstart-faithful-families")
    assert got["hps"].to_dict("list") == {
        "hp_family": ["transformer", "transformer", "looped", "looped", "hyperloop", "hyperloop"],
        "hp_shape.unrolled_layers": [6, 8, 6, 8, 6, 8],
        "hp_shape.head_dim": [32] * 6,
        "hp_budget": [1_500_000] * 6,
    }
    assert got["values"].shape[:4] == (1, 6, 1, 1) and got["fidelities"].tolist() == [TOKENS]


def test_a_point_run_twice_keeps_the_later_row(tmp_path):
    rows = study_rows().query("status == 'ok'")
    again = rows.iloc[[0]].assign(trial_id="looped-2-s0-again", val_loss=6.5)
    board = build_board(
        pd.concat(
            [
                rows.assign(finished_at="2026-01-01T00:00:00"),
                again.assign(finished_at="2026-01-02T00:00:00"),
            ],
            ignore_index=True,
        )
    )
    export_benchmark(board, tmp_path)
    got = load(tmp_path / "demo")
    assert got["meta"]["repeats_dropped"] == ["looped-2-s0"]
    assert "looped-2-s0-again" in set(got["trials"]["trial_id"]) and len(got["trials"]) == len(rows)

"""Scaling fits over budget ladders on synthetic rows drawn from known laws: the fit recovers the
law, the predictions rank the families as the laws do, the bootstrap intervals cover the truth at
about their rate, and a study that is no ladder says why it has no fit."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

from benchmark.leaderboard import build_board, scaling, stats
from benchmark.leaderboard.scaling import fit, fit_law, fit_points, law

ROOT = Path(__file__).resolve().parents[1]
BUDGETS = (1e6, 2e6, 4e6, 8e6)
# L(N) = 2 (N / 1M)^-0.3 + c: the families differ in their irreducible loss only.
LAWS = {"hyperloop": (2.0, 0.3, 3.00), "looped": (2.0, 0.3, 3.10), "transformer": (2.0, 0.3, 3.20)}
LAYERS = {
    "hyperloop": ({"begin": 1, "middle": 2, "end": 1}, 3),
    "looped": ({"begin": 1, "middle": 2, "end": 1}, 3),
    "transformer": ({"begin": 8}, 1),
}


def truth(family: str, n) -> np.ndarray:
    a, alpha, c = LAWS[family]
    return law(np.asarray(n, dtype=float) / 1e6, a, alpha, c)


def ladder(study="ladder", budgets=BUDGETS, seeds=4, noise=0.01, seed=0) -> pd.DataFrame:
    """Two shapes per family and budget (the second 0.03 nats worse), `seeds` seeds each."""
    rng = np.random.default_rng(seed)
    out = []
    for family, (layers, loops) in LAYERS.items():
        for budget in budgets:
            for shape, penalty in ((0, 0.0), (1, 0.03)):
                spec = {
                    "family": family,
                    "d_model": int(32 * round(math.sqrt(budget) / 32)) + 32 * shape,
                    "layers": layers,
                    "loops": loops,
                }
                for s in range(seeds):
                    loss = float(truth(family, budget)) + penalty + rng.normal(0, noise)
                    out.append(
                        {
                            "study": study,
                            "trial_id": f"{family}-{budget:g}-{shape}-{s}",
                            "status": "ok",
                            "family": family,
                            "spec": json.dumps(spec),
                            "seed": s,
                            "val_loss": loss,
                            "val_ppl": math.exp(loss),
                            "params_total": budget * (1 + 0.001 * shape),
                            "budget": budget,
                            "tokens_trained": 20 * budget,
                        }
                    )
    return pd.DataFrame(out)


def test_the_fit_recovers_a_known_law():
    n = np.array(BUDGETS)
    n0, a, alpha, c = fit_law(n, truth("looped", n))
    assert alpha == pytest.approx(0.3, rel=0.02)  # the grid's step
    assert law(113e6 / n0, a, alpha, c) == pytest.approx(truth("looped", 113e6), abs=2e-3)
    assert c == pytest.approx(3.10, abs=0.02)


def test_a_ladder_is_fitted_per_family_and_ranked_at_the_target():
    board = build_board(ladder())
    result = fit(board, target=113e6)
    assert [f.group for f in result.fits] == [
        "hyperloop",
        "looped",
        "transformer",
    ] and result.notes == ()
    looped = result.fits[1]
    # The best of the two shapes at each budget, averaged over its 4 seeds.
    assert looped.n.tolist() == list(BUDGETS) and looped.seeds.tolist() == [4, 4, 4, 4]
    assert np.allclose(looped.loss, truth("looped", BUDGETS), atol=0.015)
    p = result.predictions.set_index("group")
    assert p["rank"].to_dict() == {"hyperloop": 1, "looped": 2, "transformer": 3}
    assert p["extrapolation"].all()
    for family in LAWS:  # the truth lies inside each interval (this draw; coverage is tested below)
        assert p.loc[family, "lo"] <= truth(family, 113e6) <= p.loc[family, "hi"]
    table = scaling.table(result)
    heads = [c.header for c in table.columns]
    assert heads == [
        "Family",
        "Budgets",
        "Seeds",
        "α",
        "c (loss as N → ∞)",
        "Loss at 113M",
        "Rank at 113M",
        "Prediction",
    ]
    assert table.columns[1].cells[0] == "4: 1M–8M" and set(table.columns[-1].cells) == {
        "extrapolation"
    }
    assert table.columns[6].cells[0].startswith("1 [1–")
    # Four budgets leave the law one point to be tested on; three leave it none, and say so.
    assert "nothing tests its form" not in table.caption
    three = scaling.table(fit(build_board(ladder(budgets=BUDGETS[:3])), target=113e6))
    assert "a fit to 3 budgets has as many points as the law has parameters" in three.caption


def test_fits_per_structure_and_one_seed_without_intervals():
    board = build_board(ladder(seeds=1))
    result = fit(board, by="structure", target=4e6)
    assert [f.group for f in result.fits] == [
        "hyperloop 1L→2L(×3)→1L",
        "looped 1L→2L(×3)→1L",
        "transformer 8L",
    ]
    assert all(f.draws is None for f in result.fits)
    assert result.predictions["lo"].isna().all() and not result.predictions["extrapolation"].any()
    cells = scaling.table(result).columns[3].cells
    assert all("[" not in cell for cell in cells)  # a value, no interval


def test_a_rung_with_fewer_seeds_is_fitted_with_the_seeds_it_has():
    """A ladder whose top rung is still running: 4 seeds at the lower budgets, 1 at the top (the
    fit had stacked the rungs' seeds as if they were equal in number, and failed)."""
    rows = ladder()
    rows = rows[(rows["budget"] < 8e6) | (rows["seed"] == 0)]
    result = fit(build_board(rows), target=113e6)
    looped = result.fits[1]
    assert looped.seeds.tolist() == [4, 4, 4, 1]
    assert np.isnan(looped.se[-1]) and np.isfinite(looped.se[:3]).all()
    assert np.allclose(looped.loss, truth("looped", BUDGETS), atol=0.03)


def test_the_diagnostics_of_a_ladder_name_each_rungs_budget():
    """A ladder's rungs share family and structure: without the budget its diagnostic rows read alike."""
    from benchmark.leaderboard import tables

    rows = ladder().assign(
        stream_cosine=lambda f: np.where(f["family"] == "hyperloop", 0.99, np.nan)
    )
    diag = tables.diagnostics(build_board(rows))
    cells = {c.header: c.cells for c in diag.columns}
    assert cells["Family"] == ["hyperloop"] * 8 and sorted(set(cells["Budget"])) == [
        "1M",
        "2M",
        "4M",
        "8M",
    ]
    one = tables.diagnostics(build_board(rows[rows["budget"] == 1e6]))
    assert "Budget" not in [c.header for c in one.columns]


def test_a_study_with_fewer_than_three_budgets_says_why():
    board = build_board(ladder(budgets=(1e6, 2e6)))
    result = fit(board, target=113e6)
    assert result.fits == () and scaling.table(result) is None
    assert result.notes == (
        "no scaling fit for ladder: 2 budgets (1M, 2M); L(N) = a·N^-α + c needs 3 or more",
        "no prediction at 113M: no scaling fit to predict from",
    )


def test_bootstrap_intervals_cover_the_truth_at_about_their_rate():
    """400 synthetic ladders of 5 seeds a budget: the 95% interval of the fitted loss at an
    interpolated size (3M) covers the law's value about 90% of the time (measured over 1,000
    ladders with the constrained fit: 91.4%, and 90.9% at 113M). With 3 seeds it is 87%: a
    percentile bootstrap knows nothing of t's heavier tails at so few seeds, even with
    stats.bootstrap_means's correction."""
    rng = np.random.default_rng(3)
    n = np.array(BUDGETS)
    hits = []
    for _ in range(400):
        samples = [
            truth("looped", b) + rng.normal(0, 0.02, (1, 5)) for b in BUDGETS
        ]  # 1 candidate x 5 seeds
        n0, _, _, _, draws = fit_points(n, samples, 300, rng)
        lo, hi = stats.percentile_interval(law(3e6 / n0, *draws.T))
        hits.append(lo <= truth("looped", 3e6) <= hi)
    assert 0.87 <= np.mean(hits) <= 0.98  # +-3 s.d. of a rate measured 400 times


def test_cli_draws_the_fits_and_labels_the_extrapolation(tmp_path, capsys):
    folder = tmp_path / "results" / "ladder" / "trials"
    folder.mkdir(parents=True)
    ladder(seeds=2).to_parquet(folder / "rows.parquet", index=False)
    from benchmark.leaderboard import command as cli

    assert (
        cli.main(
            [
                str(tmp_path / "results"),
                "--predict",
                "113M",
                "--format",
                "md",
                "--out",
                str(tmp_path / "site"),
            ]
        )
        == 0
    )
    md = (tmp_path / "site" / "leaderboard.md").read_text()
    assert "## Scaling fits" in md and "| extrapolation |" in md and "Loss at 113M" in md
    assert (tmp_path / "site" / "plots" / "scaling.png").read_bytes()[:4] == b"\x89PNG"
    with pytest.raises(SystemExit):
        cli.main([str(tmp_path / "results"), "--predict", "lots"])
    assert "--predict: expected an amount like 113M" in capsys.readouterr().err


def test_the_law_keeps_a_falling_loss_above_a_non_negative_floor():
    """Three nearly log-linear points (the quickstart ladder's Looped means over 2 seeds at 500K, 1M
    and 2M, results/quickstart-ladder) fit best unconstrained with alpha -> 0 and c near -25; the law's
    meaning (a, c >= 0) forbids it."""
    from benchmark.leaderboard.scaling import fit_law

    n = np.array([500e3, 1e6, 2e6])
    y = np.array([6.6335, 6.4730, 6.2360])
    _, a, alpha, c = fit_law(n, y)
    assert a > 0 and c >= 0 and alpha > 0.02
    fitted = a * (n / np.exp(np.log(n).mean())) ** -alpha + c
    # These points bend the wrong way for any falling law (0.16 from 500K to 1M, 0.24 from 1M to
    # 2M), so the best lawful curve misses the middle one by 0.028: within its seeds' s.d. (0.029).
    assert np.abs(fitted - y).max() < 0.03

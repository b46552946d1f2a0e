"""Decision accuracy over a budget ladder (DataDecide's measure): a hand-made ladder whose flips and
noisy pairs are known pins every share; the committed quickstart ladder pins its measured numbers;
and the measure reaches the Markdown, the page and decision.json."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest
from fixture_studies import fixture_study

from benchmark.leaderboard import (
    Settings,
    build_board,
    decision,
    find_studies,
    publish,
    read_declarations,
    read_studies,
    stats,
)
from benchmark.leaderboard.objectives import objectives

LADDER = fixture_study("quickstart-ladder")  # frozen rows (tests/fixtures/README.md)

# Mean val_loss of each recipe (family, shape.x) at each budget, lower is better:
#   1M:  H < L < T1 < T2        (and L2, a recipe measured at 1M only)
#   2M:  H < T1 < L < T2        L and T1 swap
#   4M:  T1 < H < L < T2        H and T1 swap
MEANS = {
    ("hyperloop", 1): (5.00, 4.80, 4.65),
    ("looped", 1): (5.10, 4.90, 4.70),
    ("transformer", 1): (5.20, 4.85, 4.60),
    ("transformer", 2): (5.30, 4.95, 4.75),
    ("looped", 2): (5.40, None, None),
}
BUDGETS = (1e6, 2e6, 4e6)
COMMON = (0.0, 0.05, -0.05)  # per seed, shared by every recipe: cancels in a paired difference
# A recipe's own seed noise, per budget: each of its pairs there is within noise (T2 everywhere, H at 1M).
NOISY = {
    ("transformer", 2): {b: (0.2, -0.2, 0.0) for b in BUDGETS},
    ("hyperloop", 1): {1e6: (0.3, -0.3, 0.0)},
}


def hand_made() -> pd.DataFrame:
    rows = []
    for (family, x), means in MEANS.items():
        for budget, mean in zip(BUDGETS, means):
            if mean is None:
                continue
            spec = {"family": family, "d_model": int(budget**0.5) // 8 * 8, "x": x}
            axes = {
                "family": family,
                "shape.x": x,
                "budget": budget,
                "params_total": budget,
                "budget_distance": 0.0,
            }
            for seed in range(3):
                loss = mean + COMMON[seed] + NOISY.get((family, x), {}).get(budget, (0, 0, 0))[seed]
                rows.append(
                    {
                        "study": "hand",
                        "trial_id": f"{family}{x}-{budget:g}-{seed}",
                        "status": "ok",
                        "family": family,
                        "spec": json.dumps(spec),
                        "axes": json.dumps(axes),
                        "seed": seed,
                        "val_loss": loss,
                        "val_ppl": np.exp(loss),
                        "params_total": budget,
                        "budget": budget,
                    }
                )
    failed = {
        **rows[0],
        "trial_id": "failed",
        "status": "failed",
        "seed": 3,
        "val_loss": np.nan,
        "val_ppl": np.nan,
    }
    return pd.DataFrame([*rows, failed])


@pytest.fixture(scope="module")
def measured() -> decision.Decision:
    return decision.measure(build_board(hand_made()))


def summary_of(result: decision.Decision, families: str = "all") -> dict:
    s = result.summary[result.summary["families"] == families]
    return {
        (a, b): (n, held, within, beyond, held_beyond)
        for a, b, n, held, within, beyond, held_beyond in s[
            ["from", "to", "pairs", "held", "within_noise", "beyond_noise", "held_beyond_noise"]
        ].itertuples(index=False)
    }


def test_the_shares_of_a_hand_made_ladder(measured):
    result = measured
    assert str(result.metric) == "val_loss:min" and result.notes == ()
    # (pairs, held, within noise, beyond noise, held beyond noise) per transition; each rung to
    # the next and to the top. Four recipes reach every rung: 6 pairs. Within noise: the pairs
    # with T2, and from 1M those with H (noisy there only).
    assert summary_of(result) == {
        (1e6, 2e6): (6, 5, 5, 1, 0),
        (1e6, 4e6): (6, 4, 5, 1, 0),
        (2e6, 4e6): (6, 5, 3, 3, 2),
    }
    s = result.summary.set_index(["from", "to", "families"])
    assert s.loc[(1e6, 4e6, "all"), "share"] == pytest.approx(4 / 6)
    assert s.loc[(2e6, 4e6, "all"), "share_beyond_noise"] == pytest.approx(2 / 3)
    assert s.loc[(1e6, 4e6, "all"), "share_beyond_noise"] == 0.0
    assert s["to_top"].xs("all", level="families").tolist() == [False, True, True]
    assert summary_of(result, "hyperloop vs transformer") == {
        (1e6, 2e6): (2, 2, 2, 0, 0),
        (1e6, 4e6): (2, 1, 2, 0, 0),
        (2e6, 4e6): (2, 1, 1, 1, 0),
    }
    assert summary_of(result, "transformer vs transformer")[(1e6, 4e6)] == (1, 1, 1, 0, 0)
    assert np.isnan(s.loc[(1e6, 4e6, "transformer vs transformer"), "share_beyond_noise"])


def test_each_pair_says_which_flipped_and_which_is_noise(measured):
    p = measured.pairs
    flipped = p.loc[~p["held"], ["from", "to", "a", "b"]].itertuples(index=False, name=None)
    assert sorted(flipped) == [
        (1e6, 2e6, "looped shape.x=1", "transformer shape.x=1"),
        (1e6, 4e6, "hyperloop shape.x=1", "transformer shape.x=1"),
        (1e6, 4e6, "looped shape.x=1", "transformer shape.x=1"),
        (2e6, 4e6, "hyperloop shape.x=1", "transformer shape.x=1"),
    ]
    assert "looped shape.x=2" not in set(p["a"]) | set(p["b"])  # measured at 1M only
    noisy = p["b"].eq("transformer shape.x=2") | (
        p["a"].eq("hyperloop shape.x=1") & p["from"].eq(1e6)
    )
    assert p["within_noise"].tolist() == noisy.tolist()
    assert (p["beyond_noise"] == ~noisy).all()  # every other pair's seeds cancel exactly
    # Seeds shared by every recipe pair up and cancel: L - T1 at 1M is -0.1 exactly, no spread.
    row = p[
        (p["from"] == 1e6)
        & (p["to"] == 2e6)
        & (p["a"] == "looped shape.x=1")
        & (p["b"] == "transformer shape.x=1")
    ]
    assert row[["diff_from", "lo_from", "hi_from", "diff_to"]].iloc[0].tolist() == pytest.approx(
        [-0.1, -0.1, -0.1, 0.05]
    )
    assert row["paired_from"].all()


def test_rows_without_axes_that_one_recipe_cannot_tell_apart_are_said():
    rows = hand_made().drop(columns=["axes"])  # transformer x=1 and x=2: one family and structure
    result = decision.measure(build_board(rows))
    # Transformer at every budget, Looped at 1M (x=1 and x=2) are two candidates each.
    assert result.notes == (
        "decision accuracy for hand: 4 time(s) a recipe is several candidates at one budget, "
        "left out there (rows without `axes` are told apart by family, structure and variant only)",
        "decision accuracy for hand: no two recipes at both budgets of 1M → 2M, 1M → 4M",
    )
    assert result.pairs[["from", "to", "families"]].values.tolist() == [
        [2e6, 4e6, "hyperloop vs looped"]
    ]


def test_one_budget_has_no_decision_and_no_note():
    rows = hand_made()
    result = decision.measure(build_board(rows[rows["budget"] == 1e6]))
    assert result.summary.empty and result.notes == () and decision.tables(result) is None


def test_the_metric_is_the_boards_quality_objective_given_else_val_loss():
    rows = hand_made()
    assert (
        str(decision.measure(build_board(rows)).metric) == "val_loss:min"
    )  # not the default board's val_ppl
    given = build_board(rows, Settings(objectives=objectives("params", "val_ppl")))
    result = decision.measure(given)
    assert str(result.metric) == "val_ppl:min"
    assert summary_of(result)[(1e6, 4e6)][:2] == (6, 4)  # exp keeps each seed's order


def test_differences_pair_by_seed_as_compare_does():
    rng = np.random.default_rng(0)
    a, b = rng.normal(size=(2, 5, 4))
    b[1, 3] = np.nan  # one seed missing on one side: Welch
    est, se, df, same = stats.differences(a, b)
    assert same.tolist() == [True, False, True, True, True]
    for k in range(5):
        d = stats.compare(
            {s: a[k, s] for s in range(4)}, {s: b[k, s] for s in range(4) if np.isfinite(b[k, s])}
        )
        assert (d.method == "paired") == same[k]
        assert [d.estimate, d.se, d.df] == pytest.approx([est[k], se[k], df[k]])


def test_the_committed_quickstart_ladder():
    """The quickstart's three families at 500K, 1M and 2M with 2 seeds (tests/fixtures/README.md):
    the Looped-Transformer order flips between neighbouring rungs, and at 2 seeds (t with 1 degree
    of freedom) every pair is within noise."""
    studies = find_studies([str(LADDER)])
    board = build_board(read_studies(studies), Settings(), read_declarations(studies))
    result = decision.measure(board)
    assert str(result.metric) == "val_loss:min"
    assert summary_of(result) == {
        (5e5, 1e6): (3, 2, 3, 0, 0),
        (5e5, 2e6): (3, 3, 3, 0, 0),
        (1e6, 2e6): (3, 2, 3, 0, 0),
    }
    p = result.pairs.set_index(["from", "to", "a", "b"])
    assert not p.loc[(5e5, 1e6, "looped", "transformer"), "held"]
    assert not p.loc[(1e6, 2e6, "looped", "transformer"), "held"]
    # Looped - Transformer at 1M: (6.4930 + 6.4529) / 2 - (6.4399 + 6.4882) / 2.
    assert p.loc[(1e6, 2e6, "looped", "transformer"), "diff_from"] == pytest.approx(
        0.00895, abs=1e-5
    )
    # It held the tokens fixed (401,408 at every rung), so each rung saw half the previous one's
    # tokens per parameter: the median over each rung's rows (params_total, its count).
    tokens = result.summary[result.summary["families"] == "all"].set_index(["from", "to"])
    assert tokens.loc[(5e5, 2e6), "tokens_per_param_from"] == pytest.approx(401408 / 500148)
    assert tokens.loc[(5e5, 1e6), "tokens_per_param_to"] == pytest.approx(401408 / 999666)
    assert tokens.loc[(1e6, 2e6), "tokens_per_param_to"] == pytest.approx(401408 / 2000424)


def test_markdown_page_and_json(measured, tmp_path):
    board = build_board(hand_made())
    publish(board, ["md", "html"], tmp_path)
    md = (tmp_path / "leaderboard.md").read_text()
    section = md.split("## Decision accuracy\n")[1].split("\n## ")[0]
    assert "| 1M → 4M (top) | all | 6 | 67% (4 of 6) | 5 | 0% (0 of 1) |" in section
    assert (
        "| 1M → 2M | looped shape.x=1 | transformer shape.x=1 | −0.1000 [−0.1000, −0.1000] | +0.0500"
        in section
    )
    page = (tmp_path / "index.html").read_text()
    assert "<h2>Decision accuracy</h2>" in page and "67% (4 of 6)" in page and "flipped" in page
    data = json.loads((tmp_path / "decision.json").read_text())
    assert set(data) == {"metric", "direction", "level", "source", "summary", "pairs", "notes"}
    assert (data["metric"], data["direction"], data["level"]) == ("val_loss", "min", 0.95)
    assert (
        list(data["summary"][0]) == decision.SUMMARY_COLUMNS
        and list(data["pairs"][0]) == decision.PAIR_COLUMNS
    )
    assert len(data["pairs"]) == 18 and sum(not p["held"] for p in data["pairs"]) == 4
    top = next(
        s
        for s in data["summary"]
        if s["families"] == "transformer vs transformer" and s["from"] == 1e6 and s["to"] == 4e6
    )
    assert top["share_beyond_noise"] is None and top["pairs"] == 1


def test_a_ladder_that_scales_its_tokens_says_so_by_the_parameters_its_study_counts():
    """20 tokens per counted parameter at every rung, counted without the embedding: the column
    reads 20 → 20, where params_total (twice the count here) would read 10."""
    rows = hand_made().assign(budget_count="non_embedding")
    rows = rows.assign(
        params_non_embedding=rows["params_total"] / 2, tokens_trained=10 * rows["params_total"]
    )
    result = decision.measure(build_board(rows))
    s = result.summary[result.summary["families"] == "all"]
    assert s["tokens_per_param_from"].tolist() == s["tokens_per_param_to"].tolist() == [20.0] * 3
    summary, _ = decision.tables(result)
    tokens = next(c for c in summary.columns if c.header == "Tokens per parameter")
    assert tokens.cells[0] == "20 → 20"
    # Rows without tokens_trained: no column (the hand-made ladder above).
    plain, _ = decision.tables(decision.measure(build_board(hand_made())))
    assert "Tokens per parameter" not in [c.header for c in plain.columns]


def test_cli_writes_decision_json_for_the_committed_ladder(tmp_path):
    from benchmark.leaderboard import command as cli

    assert cli.main([str(LADDER), "--format", "md", "--out", str(tmp_path)]) == 0
    data = json.loads((tmp_path / "decision.json").read_text())
    assert [(s["held"], s["pairs"]) for s in data["summary"] if s["families"] == "all"] == [
        (2, 3),
        (3, 3),
        (2, 3),
    ]

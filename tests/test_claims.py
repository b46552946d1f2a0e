"""Claims and their statistics on synthetic rows whose true differences are known: a real
difference is reproduced, a reversed one contradicted, a zero one not decided; the intervals cover
the truth at their stated rate; the minimum detectable difference is detected at its stated power;
a claims file's mistakes are named by file, line and key."""

from __future__ import annotations

import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from claim_files import abbie_loops_claim
from synthetic_studies import seed_rows

from benchmark.leaderboard import ClaimsError, claims, stats

ROOT = Path(__file__).resolve().parents[1]
SHIPPED = ROOT / "search_spaces" / "claims" / "quickstart.yaml"

CLAIM = """\
claims:
  - claim: Hyperloop beats Looped at matched parameters
    source: {paper: Hyperloop Transformers, where: "§4.2, Table 1"}
    study: demo
    metric: val_loss
    order: [hyperloop, looped]
    groups:
      hyperloop: {family: hyperloop}
      looped: {family: looped}
"""


def rows(losses: dict[str, dict[int, float | list[float]]], study: str = "demo") -> pd.DataFrame:
    """One ok row per family, seed and value: {family: {seed: loss or [loss per candidate]}}; a
    failed row per family that no claim may count."""
    out = []
    for family, by_seed in losses.items():
        for seed, values in by_seed.items():
            for k, loss in enumerate(values if isinstance(values, list) else [values]):
                out.append(
                    {
                        "study": study,
                        "trial_id": f"{family}-{seed}-{k}",
                        "status": "ok",
                        "family": family,
                        "structure": f"{k + 1}L",
                        "seed": seed,
                        "val_loss": loss,
                        "budget": 1_500_000,
                    }
                )
        out.append(
            {
                "study": study,
                "trial_id": f"{family}-failed",
                "status": "failed",
                "family": family,
                "structure": "1L",
                "seed": 0,
                "val_loss": 0.0,
                "budget": 1_500_000,
            }
        )
    return pd.DataFrame(out)


def check(text: str, trials: pd.DataFrame, tmp_path: Path) -> list[claims.Result]:
    path = tmp_path / "claims.yaml"
    path.write_text(text)
    return claims.evaluate(claims.load(path), trials)


def assert_load_error(text: str, tmp_path: Path, message: str) -> None:
    """Loading `text` as tmp_path/claims.yaml fails with an error that starts with the file and `message`."""
    path = tmp_path / "claims.yaml"
    path.write_text(text)
    with pytest.raises(ClaimsError) as err:
        claims.load(path)
    assert str(err.value).startswith(f"{tmp_path}/{message}"), str(err.value)


# --- verdicts on known differences ---------------------------------------------------------------


def test_a_real_difference_is_reproduced_with_the_paired_interval(tmp_path):
    # Per-seed differences -0.04, -0.05, -0.06: mean -0.05, s.e. 0.01 / sqrt 3, t(0.975, 2) = 4.3027.
    trials = rows({"hyperloop": {0: 5.90, 1: 5.91, 2: 5.92}, "looped": {0: 5.94, 1: 5.96, 2: 5.98}})
    (result,) = check(CLAIM, trials, tmp_path)
    (pair,) = result.pairs
    d = pair.difference
    assert (d.method, d.df) == ("paired", 2.0)
    assert d.estimate == pytest.approx(-0.05) and d.se == pytest.approx(0.01 / math.sqrt(3))
    assert (d.lo, d.hi) == (pytest.approx(-0.0748414), pytest.approx(-0.0251586))
    # (t(0.975, 2) + t(0.8, 2)) x s.e. = (4.3027 + 1.0607) x 0.005774
    assert d.detectable == pytest.approx(0.0309651)
    assert pair.verdict == result.verdict == "reproduced" and pair.expected == "< 0"
    assert [(g.name, round(g.mean, 4), len(g.values)) for g in result.groups] == [
        ("hyperloop", 5.91, 3),
        ("looped", 5.96, 3),
    ]


def test_a_reversed_difference_is_contradicted_and_a_zero_one_not_decided(tmp_path):
    reversed_ = rows(
        {"hyperloop": {0: 5.94, 1: 5.96, 2: 5.98}, "looped": {0: 5.90, 1: 5.91, 2: 5.92}}
    )
    assert check(CLAIM, reversed_, tmp_path)[0].verdict == "contradicted"
    zero = rows({"hyperloop": {0: 5.90, 1: 5.97, 2: 5.93}, "looped": {0: 5.92, 1: 5.95, 2: 5.93}})
    (result,) = check(CLAIM, zero, tmp_path)
    assert (
        result.verdict == "not decided"
        and result.pairs[0].difference.lo < 0 < result.pairs[0].difference.hi
    )


def test_one_seed_gives_no_verdict(tmp_path):
    (result,) = check(CLAIM, rows({"hyperloop": {0: 5.0}, "looped": {0: 6.0}}), tmp_path)
    assert result.verdict == "not decided (1 seed)"
    assert math.isnan(result.pairs[0].difference.lo)
    table = claims.table(claims.load(tmp_path / "claims.yaml"), [result])
    assert "not decided (1 seed)" in next(c for c in table.columns if c.header == "Verdict").cells


def test_unmatched_seeds_take_welch_and_a_groups_candidates_average_per_seed(tmp_path):
    # Looped ran seeds 3-5 only: no pairs, Welch's interval. Hyperloop's two candidates per seed
    # (5.89 and 5.91 at seed 0) count as one value per seed: their mean.
    trials = rows(
        {
            "hyperloop": {0: [5.89, 5.91], 1: [5.90, 5.92], 2: [5.91, 5.93]},
            "looped": {3: 5.94, 4: 5.96, 5: 5.98},
        }
    )
    (result,) = check(CLAIM, trials, tmp_path)
    d = result.pairs[0].difference
    assert result.groups[0].values == {
        0: pytest.approx(5.90),
        1: pytest.approx(5.91),
        2: pytest.approx(5.92),
    }
    assert d.method == "welch" and d.df == pytest.approx(
        2.9411765
    )  # (0.0005/3)^2 / ((1e-4/3)^2/2 + (4e-4/3)^2/2)
    assert (d.lo, d.hi) == (pytest.approx(-0.0915540), pytest.approx(-0.0084460))
    assert result.verdict == "reproduced"


def test_more_groups_hold_when_every_adjacent_pair_does(tmp_path):
    text = CLAIM.replace(
        "order: [hyperloop, looped]", "order: [hyperloop, looped, transformer]"
    ).replace(
        "      looped: {family: looped}\n",
        "      looped: {family: looped}\n      transformer: {family: transformer}\n",
    )
    trials = rows(
        {
            "hyperloop": {0: 5.90, 1: 5.91, 2: 5.92},
            "looped": {0: 5.94, 1: 5.96, 2: 5.98},
            "transformer": {0: 5.95, 1: 5.95, 2: 5.99},
        }
    )
    (result,) = check(text, trials, tmp_path)
    assert [p.verdict for p in result.pairs] == [
        "reproduced",
        "not decided",
    ] and result.verdict == "not decided"


def test_a_claim_without_a_study_is_checked_in_each(tmp_path):
    text = CLAIM.replace("    study: demo\n", "")
    # three seeds each: two pairs of two seeds (p 0.03 each) would not survive Holm over both
    trials = pd.concat(
        [
            rows(
                {"hyperloop": {0: 5.9, 1: 5.91, 2: 5.92}, "looped": {0: 6.0, 1: 6.02, 2: 6.03}}, "a"
            ),
            rows(
                {"hyperloop": {0: 6.0, 1: 6.02, 2: 6.03}, "looped": {0: 5.9, 1: 5.91, 2: 5.92}}, "b"
            ),
        ]
    )
    assert [(r.study, r.verdict) for r in check(text, trials, tmp_path)] == [
        ("a", "reproduced"),
        ("b", "contradicted"),
    ]


# --- the statistics at their stated rates, over many synthetic experiments -------------------------

DRAWS = 1000  # a rate of 0.95 is then measured within +-0.007 (one s.d.)


def test_intervals_cover_the_true_difference_at_95_percent():
    rng = np.random.default_rng(7)
    seeds = rng.normal(0, 0.05, (DRAWS, 5))  # shared by both groups of a seed: pairing removes it
    a, b = seeds + rng.normal(0, 0.01, (DRAWS, 5)), seeds + 0.02 + rng.normal(0, 0.01, (DRAWS, 5))
    lo, hi = stats.interval(*stats.paired(a, b))
    assert 0.93 <= np.mean((lo <= -0.02) & (-0.02 <= hi)) <= 0.97
    # Welch: unequal sizes and spreads.
    a, b = rng.normal(0, 0.01, (DRAWS, 3)), rng.normal(0.01, 0.03, (DRAWS, 6))
    lo, hi = stats.interval(*stats.welch(a, b))
    assert 0.93 <= np.mean((lo <= -0.01) & (-0.01 <= hi)) <= 0.98


def test_verdict_rates_match_the_level_and_the_stated_power():
    rng = np.random.default_rng(11)
    n, sigma = 5, 0.01
    diff_sd = sigma * math.sqrt(2)  # of one seed's a - b
    zero = rng.normal(0, diff_sd, (DRAWS, n))
    verdicts = stats.verdict(*stats.interval(*stats.paired(zero, 0)), -1)
    assert np.mean(verdicts == "inconclusive") >= 0.93  # 5% two-sided, split over both wrong calls
    assert np.mean(verdicts == "contradicted") <= 0.05
    # A true difference of exactly the detectable size is found about 80% of the time.
    mdd = float(stats.detectable(diff_sd / math.sqrt(n), n - 1))
    found = stats.verdict(
        *stats.interval(*stats.paired(rng.normal(-mdd, diff_sd, (DRAWS, n)), 0)), -1
    )
    assert 0.72 <= np.mean(found == "reproduced") <= 0.88


def test_p_values_match_scipys_t_tests():
    """The p-value beside each verdict is scipy's paired t test where the seeds pair, and Welch's
    unequal-variance test where they do not."""
    from scipy import stats as scipy_stats

    rng = np.random.default_rng(3)
    a, b = rng.normal(0, 0.02, 5), rng.normal(0.01, 0.02, 5)
    paired = stats.compare(dict(enumerate(a)), dict(enumerate(b)))
    assert paired.method == "paired" and paired.p == pytest.approx(
        scipy_stats.ttest_rel(a, b).pvalue, rel=1e-9
    )
    c = rng.normal(0.03, 0.05, 7)
    welch = stats.compare(dict(enumerate(a)), {10 + i: v for i, v in enumerate(c)})
    assert welch.method == "welch"
    assert welch.p == pytest.approx(scipy_stats.ttest_ind(a, c, equal_var=False).pvalue, rel=1e-9)


def test_holm_adjusts_by_rank_keeps_order_and_skips_what_was_not_tested():
    # sorted 0.005, 0.01, 0.03, 0.04 (m = 4): x4, x3, x2, x1 = 0.02, 0.03, 0.06, 0.04 -> 0.06 (monotone)
    assert np.allclose(
        stats.holm([0.01, 0.04, np.nan, 0.03, 0.005]),
        [0.03, 0.06, np.nan, 0.06, 0.02],
        equal_nan=True,
    )
    assert stats.holm([0.3, 0.6]).tolist() == [0.6, 0.6] and stats.holm([0.9, 0.8]).tolist() == [
        1.0,
        1.0,
    ]
    # Under the null, the chance of any adjusted p < 0.05 among 10 tests stays near 5% (unadjusted: ~40%).
    rng = np.random.default_rng(5)
    p = rng.uniform(size=(2000, 10))
    assert np.mean((p < 0.05).any(axis=1)) > 0.35
    assert np.mean([(stats.holm(row) < 0.05).any() for row in p]) < 0.065


def test_the_holm_adjustment_runs_over_every_pair_in_the_file(tmp_path):
    """Three claims in one file: each pair's p is adjusted over the two tested (x2 for the smaller,
    x1 for the larger, made monotone); a pair of one seed a side has no standard error, so no p,
    and is not counted."""
    trials = rows(
        {
            "hyperloop": {0: 5.90, 1: 5.91, 2: 5.92},
            "looped": {0: 5.94, 1: 5.96, 2: 5.98},
            "transformer": {0: 5.93, 1: 5.97, 2: 5.95},
            "hc": {0: 5.0},
        }
    )
    second = CLAIM.replace(
        "  - claim: Hyperloop beats Looped at matched parameters", "  - claim: second"
    )
    second = second.split("claims:\n", 1)[1].replace("looped", "transformer")
    third = second.replace("claim: second", "claim: third").replace("transformer", "hc")
    results = check(CLAIM + second + third, trials, tmp_path)
    raw = [r.pairs[0].difference.p for r in results[:2]]
    assert raw[0] < raw[1]
    assert [r.pairs[0].p_adjusted for r in results[:2]] == [
        pytest.approx(2 * raw[0]),
        pytest.approx(max(2 * raw[0], raw[1])),
    ]
    assert math.isnan(results[2].pairs[0].p_adjusted)


# --- the claims file ----------------------------------------------------------------------------


def test_the_shipped_claims_cite_the_papers_sections():
    loaded = claims.load(SHIPPED)
    assert [c.claim for c in loaded.claims] == [
        "Hyperloop beats Looped at matched parameters",
        "Hyperloop beats a depth-matched Transformer",
    ]
    assert all(
        "Table 1" in c.source and c.study == "quickstart" and c.metric.column == "val_loss"
        for c in loaded.claims
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (
            ("    order:", "    oder:"),
            "claims.yaml:6:5: claims[0].oder: unknown key (did you mean 'order'?)",
        ),
        (
            ("order: [hyperloop, looped]", "order: [hyperloop, loped]"),
            "claims.yaml:6:24: claims[0].order[1]: no group 'loped' under groups (hyperloop, looped)",
        ),
        (
            ("metric: val_loss", "metric: bleu"),
            "claims.yaml:5:13: claims[0].metric: unknown metric 'bleu'",
        ),
        (
            ('    source: {paper: Hyperloop Transformers, where: "§4.2, Table 1"}\n', ""),
            "claims.yaml:2:5: claims[0]: missing key 'source'",
        ),
        (
            ("{family: looped}", "{family: [looped, {x: 1}]}"),
            "claims.yaml:9:24: claims[0].groups.looped.family: expected a value or a list of values",
        ),
        (("claims:", "claims: [\n"), "claims.yaml:"),
    ],
)
def test_mistakes_in_a_claims_file_name_the_line_and_key(tmp_path, change, message):
    assert_load_error(CLAIM.replace(*change), tmp_path, message)


def test_a_filter_on_a_column_the_rows_lack_is_named_at_its_key(tmp_path):
    with pytest.raises(
        ClaimsError,
        match=r"claims.yaml:9:16: claims\[0\].groups.looped.famly: no column 'famly' "
        r"in the results \(did you mean 'family'\?\)",
    ):
        check(
            CLAIM.replace("{family: looped}", "{famly: looped}"),
            rows({"looped": {0: 1.0}}),
            tmp_path,
        )


def test_a_budget_filter_takes_an_amount(tmp_path):
    text = CLAIM.replace("    groups:", "    where: {budget: 1.5M}\n    groups:")
    trials = rows({"hyperloop": {0: 5.90, 1: 5.91, 2: 5.92}, "looped": {0: 5.94, 1: 5.96, 2: 5.98}})
    assert check(text, trials, tmp_path)[0].verdict == "reproduced"
    assert check(text.replace("1.5M", "3M"), trials, tmp_path)[0].verdict == "no data"


# --- per-group metrics: one model at two loop counts, or against another model's loss --------------

LOOPS = abbie_loops_claim("AbbIE-D at r = 4 beats itself at r = 2", "demo", better=4, worse=2)


def loop_rows() -> pd.DataFrame:
    """AbbIE-D 0.02 nats better at r = 4 than at r = 2 at each of 3 seeds (r = 2 its val_loss), a
    Transformer without loop counts 0.05 worse than AbbIE-D at r = 2, and a Depth model whose
    loss at r = 4 is 0.1 worse than AbbIE-D's."""
    out = []
    for seed, noise in enumerate((0.0, 0.03, -0.02)):
        r2 = 3.0 + noise
        out += [
            {
                "study": "demo",
                "trial_id": f"abbie-{seed}",
                "status": "ok",
                "family": "abbie-d",
                "seed": seed,
                "val_loss": r2,
                "val_loss_r2": r2,
                "val_loss_r4": r2 - 0.02 - 0.001 * seed,
            },
            {
                "study": "demo",
                "trial_id": f"depth-{seed}",
                "status": "ok",
                "family": "depth",
                "seed": seed,
                "val_loss": r2,
                "val_loss_r2": r2,
                "val_loss_r4": r2 + 0.08 + 0.001 * seed,
            },
            {
                "study": "demo",
                "trial_id": f"std-{seed}",
                "status": "ok",
                "family": "transformer",
                "seed": seed,
                "val_loss": r2 + 0.05 + 0.002 * seed,
                "val_loss_r2": None,
                "val_loss_r4": None,
            },
        ]
    return pd.DataFrame(out)


def test_a_group_metric_compares_one_model_with_itself_paired_by_seed(tmp_path):
    (result,) = check(LOOPS, loop_rows(), tmp_path)
    (pair,) = result.pairs
    assert [g.metric for g in result.groups] == ["val_loss_r4", "val_loss_r2"]
    assert result.groups[0].values == pytest.approx(
        {0: 2.98, 1: 3.009, 2: 2.958}
    )  # the same rows, at r = 4
    assert result.groups[1].values == pytest.approx({0: 3.0, 1: 3.03, 2: 2.98})  # and at r = 2
    # per-seed differences -0.020, -0.021, -0.022: mean -0.021, s.e. 0.001 / sqrt 3
    assert (pair.difference.method, pair.difference.estimate) == ("paired", pytest.approx(-0.021))
    assert pair.difference.se == pytest.approx(0.001 / math.sqrt(3))
    assert result.verdict == "reproduced"
    reversed_ = LOOPS.replace("order: [r4, r2]", "order: [r2, r4]")
    assert check(reversed_, loop_rows(), tmp_path)[0].verdict == "contradicted"
    table = claims.table(claims.load(tmp_path / "claims.yaml"), [result])
    assert next(c for c in table.columns if c.header == "Metric").cells == [
        "val_loss_r4 vs val_loss_r2 (min)"
    ]
    # a group that names a metric needs no filter of its own: here the claim's `where` selects the rows
    shared = LOOPS.replace("    groups:", "    where: {family: abbie-d}\n    groups:").replace(
        "{family: abbie-d, metric:", "{metric:"
    )
    assert check(shared, loop_rows(), tmp_path)[0].pairs[0].difference.estimate == pytest.approx(
        -0.021
    )


def test_a_per_loop_metric_against_another_models_loss_and_at_the_claim_level(tmp_path):
    vs_std = LOOPS.replace(
        "r4: {family: abbie-d, metric: val_loss_r4}", "std: {family: transformer}"
    ).replace("order: [r4, r2]", "order: [r2, std]")
    (result,) = check(
        vs_std, loop_rows(), tmp_path
    )  # AbbIE-D at r = 2 against the Transformer's val_loss
    assert [g.metric for g in result.groups] == ["val_loss_r2", "val_loss"]
    assert result.pairs[0].difference.estimate == pytest.approx(-0.052)
    assert result.verdict == "reproduced"
    claim_level = (
        LOOPS.replace("metric: val_loss\n", "metric: val_loss_r4\n")
        .replace("r4: {family: abbie-d, metric: val_loss_r4}", "r4: {family: abbie-d}")
        .replace("r2: {family: abbie-d, metric: val_loss_r2}", "depth: {family: depth}")
        .replace("[r4, r2]", "[r4, depth]")
    )
    (result,) = check(claim_level, loop_rows(), tmp_path)
    assert [g.metric for g in result.groups] == ["val_loss_r4", "val_loss_r4"]
    assert (
        result.pairs[0].difference.estimate == pytest.approx(-0.102)
        and result.verdict == "reproduced"
    )
    no_loops = claim_level.replace("{family: depth}", "{family: transformer}")
    (result,) = check(no_loops, loop_rows(), tmp_path)  # a Transformer has no loss at r = 4
    assert (
        result.verdict == "no data"
        and result.why == "no ok rows with a finite val_loss_r4 in group depth"
    )


@pytest.mark.parametrize(
    "change, message",
    [
        (
            ("metric: val_loss_r4}", "metric: val_los_r4}"),
            "claims.yaml:8:37: claims[0].groups.r4.metric: unknown metric 'val_los_r4' (did you mean 'val_loss_r4'?)",
        ),
        (
            ("metric: val_loss_r4}", "metric: val_loss_r3}"),
            "claims.yaml:8:37: claims[0].groups.r4.metric: unknown metric 'val_loss_r3': the per-loop losses are "
            "val_loss_r1, val_loss_r2, val_loss_r4, val_loss_r8 (AbbIE's test-time iterations); every other loop count "
            "evaluated is in the row's val_ppl_by_loops",
        ),
        (
            ("metric: val_loss_r4}", "metric: val_ppl}"),
            "claims.yaml:8:37: claims[0].groups.r4.metric: val_ppl:min cannot be compared with the claim's metric "
            "val_loss:min: a group's metric shares its kind, unit and direction",
        ),
        (
            ("metric: val_loss_r4}", "metric: val_loss_r4:max}"),
            "claims.yaml:8:37: claims[0].groups.r4.metric: val_loss_r4:max cannot be compared",
        ),
        (
            ("metric: val_loss_r4}", "metric: [val_loss_r4]}"),
            "claims.yaml:8:37: claims[0].groups.r4.metric: expected text",
        ),
    ],
)
def test_mistakes_in_a_group_metric_name_the_line_and_key(tmp_path, change, message):
    assert_load_error(LOOPS.replace(*change), tmp_path, message)


def test_a_group_metric_the_results_lack_is_named_at_its_key(tmp_path):
    old = loop_rows().drop(columns=["val_loss_r4"])  # a study written before the per-loop columns
    with pytest.raises(
        ClaimsError,
        match=r"claims.yaml:8:37: claims\[0\].groups.r4.metric: "
        r"the results have no column val_loss_r4",
    ):
        check(LOOPS, old, tmp_path)


# --- the command line ---------------------------------------------------------------------------


def study_rows(study: str) -> pd.DataFrame:
    """A small study as the search writes it (specs, so seeds aggregate): Hyperloop better than
    Looped by 0.05 nats at each of 3 seeds, with seed-to-seed noise shared by both."""
    noise = (0.0, 0.02, -0.01)
    return seed_rows(
        study,
        {
            family: [5.9 + offset + n + 0.001 * seed for seed, n in enumerate(noise)]
            for family, offset in (("hyperloop", 0.0), ("looped", 0.05))
        },
        loops=3,
    )


def test_cli_reports_claims_in_markdown_html_and_json(tmp_path, capsys):
    folder = tmp_path / "results" / "quickstart" / "trials"
    folder.mkdir(parents=True)
    study_rows("quickstart").to_parquet(folder / "rows.parquet", index=False)
    from benchmark.leaderboard import command as cli

    assert (
        cli.main(
            [
                str(tmp_path / "results"),
                "--claims",
                str(SHIPPED),
                "--format",
                "md,html",
                "--out",
                str(tmp_path / "site"),
            ]
        )
        == 0
    )
    report = json.loads((tmp_path / "site" / "claims.json").read_text())
    first = report["claims"][0]
    assert (first["verdict"], first["pairs"][0]["difference"]["method"]) == ("reproduced", "paired")
    assert first["pairs"][0]["difference"]["estimate"] == pytest.approx(-0.05)
    assert report["claims"][1]["verdict"] == "no data"  # the study ran no Transformer
    md = (tmp_path / "site" / "leaderboard.md").read_text()
    # the headings name the adjustment and its family: the report's pairs with a p (one claim has none)
    title = "(quickstart.yaml; Holm over all 1 pairs of the report)"
    assert f"## Claims {title}" in md and "| reproduced |" in md
    # the verdicts in brief lead the report, before the first leaderboard
    assert md.index(f"## Verdicts {title}") < md.index("## Budget") < md.index("## Claims")
    html = (tmp_path / "site" / "index.html").read_text()
    assert html.index(f"<h2>Verdicts {title}</h2>") < html.index(f"<h2>Claims {title}</h2>")
    # the claims' sentences wrap, so that the verdict at a row's end shows in the window
    assert (
        html.split(f"<h2>Verdicts {title}</h2>", 1)[1].lstrip().startswith('<div class="fit wrap">')
    )
    assert cli.main([str(tmp_path / "results"), "--claims", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: cannot be read" in capsys.readouterr().err


def test_a_filter_on_a_search_axis_reads_the_rows_axes(tmp_path):
    """`axes.hyper.mixing: sinkhorn` picks the rows whose search point set that axis (the row's
    `axes` JSON), and an axis value no row has leaves its group empty."""
    rows = pd.DataFrame(
        [
            {
                "study": "s",
                "status": "ok",
                "family": "hyperloop",
                "seed": seed,
                "val_loss": loss,
                "axes": json.dumps({"hyper.mixing": mixing, "budget": 1000000}),
            }
            for mixing, base in (("diagonal", 4.00), ("sinkhorn", 4.05))
            for seed, loss in enumerate(base + np.array([0.0, 0.01, -0.01, 0.02]))
        ]
    )
    path = tmp_path / "c.yaml"
    path.write_text(
        "claims:\n  - claim: diagonal beats sinkhorn\n    source: {paper: P, where: T6}\n"
        "    study: s\n    metric: val_loss\n    order: [diagonal, sinkhorn, identity]\n"
        "    groups:\n      diagonal: {axes.hyper.mixing: diagonal}\n"
        "      sinkhorn: {axes.hyper.mixing: sinkhorn}\n      identity: {axes.hyper.mixing: identity}\n"
    )
    (result,) = claims.evaluate(claims.load(path), rows)
    diagonal, sinkhorn, identity = result.groups
    assert diagonal.values == pytest.approx({0: 4.00, 1: 4.01, 2: 3.99, 3: 4.02})
    assert sinkhorn.mean == pytest.approx(4.055)
    assert result.pairs[0].difference.estimate == pytest.approx(-0.05)
    assert result.pairs[0].verdict == "reproduced"
    assert identity.values == {}


@pytest.mark.parametrize(
    "path", sorted((ROOT / "search_spaces" / "claims").glob("*.yaml")), ids=lambda p: p.stem
)
def test_every_shipped_claims_file_loads_and_names_metrics_of_the_registry(path):
    loaded = claims.load(path)
    assert loaded.claims and all(c.order and c.metric for c in loaded.claims)


# --- the paper's own difference, beside what these seeds detect ---------------------------------


def test_a_published_difference_below_the_detectable_is_said_so(tmp_path):
    # The rows of test_a_real_difference_...: detectable 0.0310. The paper's -0.05 is above it, its
    # -0.02 below: the verdict stays the interval's, with the note on the second only.
    trials = rows({"hyperloop": {0: 5.90, 1: 5.91, 2: 5.92}, "looped": {0: 5.94, 1: 5.96, 2: 5.98}})
    above, below = (
        check(CLAIM.replace("    groups:", f"    published: {p}\n    groups:"), trials, tmp_path)[0]
        for p in (-0.05, -0.02)
    )
    assert (above.pairs[0].published, above.pairs[0].below_detectable) == (-0.05, False)
    assert (below.pairs[0].published, below.pairs[0].below_detectable) == (-0.02, True)
    assert below.verdict == "reproduced"
    loaded = claims.load(tmp_path / "claims.yaml")
    brief = claims.verdicts(loaded, [below])
    cells = {c.header: c.cells[0] for c in brief.columns}
    assert cells == {
        "Claim": "Hyperloop beats Looped at matched parameters",
        "Better − worse (metric)": "hyperloop − looped (val_loss)",
        "Difference [95% CI]": "−0.0500 [−0.0748, −0.0252] (paired)",
        "Published": "−0.02",
        "Detectable (80%)": "0.0310",
        "p (Holm)": "0.013",  # t = 8.66 on 2 df, one pair
        "Verdict": "reproduced",
        # -0.02 lies past the interval's end nearer 0 (-0.0252): the effect measured is larger; the
        # power of 3 paired seeds at 0.02 is below a half, which a decided verdict does not say
        "Size": "larger than published",
        "Arms": "—",
    }
    full = {c.header: c.cells[0] for c in claims.table(loaded, [below]).columns}
    assert {
        k: full[k] for k in ("Difference [95% CI]", "Published", "Detectable (80%)", "Verdict")
    } == {k: cells[k] for k in ("Difference [95% CI]", "Published", "Detectable (80%)", "Verdict")}
    pair = claims.to_json(loaded, [below])["claims"][0]["pairs"][0]
    assert (pair["published"], pair["published_below_detectable"]) == (-0.02, True)
    assert (pair["size"], pair["underpowered"], pair["seeds"]) == ("larger", False, 3)
    assert pair["power_at_published"] == pytest.approx(
        float(stats.power(0.02, 0.01 / math.sqrt(3), 2))
    )
    assert (above.pairs[0].size, above.pairs[0].underpowered) == ("consistent", False)
    # the groups' rows swapped: Hyperloop now worse by 0.05 [0.0252, 0.0748] where the paper has it
    # better by 0.02; the whole interval on the other side of 0 is a reversed sign, not a smaller effect
    swapped = rows(
        {"looped": {0: 5.90, 1: 5.91, 2: 5.92}, "hyperloop": {0: 5.94, 1: 5.96, 2: 5.98}}
    )
    (reversed_,) = check(
        CLAIM.replace("    groups:", "    published: -0.02\n    groups:"), swapped, tmp_path
    )
    assert reversed_.verdict == "contradicted" and reversed_.pairs[0].size == "opposite"
    reversed_cells = {c.header: c.cells[0] for c in claims.verdicts(loaded, [reversed_]).columns}
    assert reversed_cells["Size"].startswith("opposite in sign to published")


# --- the verdict rule: one stated error rate -----------------------------------------------------


def test_power_and_the_detectable_are_stated_at_the_adjusted_rate_of_the_declared_family(tmp_path):
    """Four pairs in one file: Holm over the report tests the first at 0.05 / 4, and the detectable
    difference and the power at the paper's are stated at that rate; within each claim the family
    is one pair and the rate 0.05. An undecided pair says it is underpowered, a decided one not;
    an interval that holds the paper's difference and 0 is uninformative, not consistent."""
    base = {s: v for s, v in enumerate([5.02, 4.95, 5.06, 4.99, 5.01])}
    shifts = {
        "a": [-0.10, -0.11, -0.09, -0.10, -0.10],
        "b": [-0.04, -0.02, -0.05, -0.02, -0.03],
        "c": [-0.05, -0.01, -0.04, -0.01, -0.02],
        "d": [0.02, -0.03, 0.01, -0.02, 0.0],  # -0.004 [-0.029, 0.021]: holds 0 and -0.01
    }
    trials = rows(
        {"base": base, **{f: {s: base[s] + d for s, d in enumerate(v)} for f, v in shifts.items()}}
    )
    text = _four_claims().replace("    groups:", "    published: -0.01\n    groups:")
    path = tmp_path / "claims.yaml"
    for within, alpha in (("report", 0.05 / 4), ("claim", 0.05)):
        path.write_text(("" if within == "report" else f"adjust_within: {within}\n") + text)
        loaded = claims.load(path)
        assert loaded.adjust_within == within
        results = claims.evaluate(loaded, trials)
        for r in results:
            p, d = r.pairs[0], r.pairs[0].difference
            assert p.alpha == pytest.approx(alpha) and p.family == (4 if within == "report" else 1)
            assert p.detectable == pytest.approx(float(stats.detectable(d.se, d.df, 1 - alpha)))
            assert p.power == pytest.approx(float(stats.power(0.01, d.se, d.df, 1 - alpha)))
        a, _, _, d = (r.pairs[0] for r in results)
        assert a.verdict == "reproduced" and not a.underpowered  # power 0.03 at 0.01, not said
        assert d.verdict == "not decided" and d.underpowered and d.size == "uninformative"
        heading = claims.verdicts(loaded, results).title
        assert heading == (
            "Verdicts (claims.yaml; Holm over all 4 pairs of the report)"
            if within == "report"
            else "Verdicts (claims.yaml; Holm within each claim: 1 pairs)"
        )
        size = {c.header: c.cells for c in claims.verdicts(loaded, results).columns}["Size"]
        assert size[3].startswith("uninformative at 5 seeds (the interval holds the paper's")
        assert "underpowered at 5 seeds" in size[3] and "underpowered" not in size[0]
    path.write_text("adjust_within: studies\n" + text)
    with pytest.raises(
        ClaimsError, match=r"claims.yaml:1:\d+: adjust_within: expected one of report"
    ):
        claims.load(path)


def _four_claims() -> str:
    """Four claims of one file, each a family against the baseline `base`."""
    one = CLAIM.split("claims:\n", 1)[1]
    return "claims:\n" + "".join(
        one.replace("Hyperloop beats Looped at matched parameters", f"{f} beats base")
        .replace("hyperloop", f)
        .replace("looped", "base")
        for f in ("a", "b", "c", "d")
    )


def test_a_pair_significant_before_adjustment_but_not_after_is_not_decided(tmp_path):
    """Four pairs whose unadjusted p-values are all below 0.05; Holm multiplies the smallest by 4,
    the next by 3: a pair at p = 0.02 alone would be reproduced, among four it is not decided.
    BH (the false discovery rate) decides more of them; none decides each at 5% on its own."""
    base = {
        s: v for s, v in enumerate([5.02, 4.95, 5.06, 4.99, 5.01])
    }  # pairing removes the seeds' spread
    shifts = {
        "a": [-0.10, -0.11, -0.09, -0.10, -0.10],  # p < 0.001
        "b": [-0.04, -0.02, -0.05, -0.02, -0.03],  # p 0.0054
        "c": [-0.05, -0.01, -0.04, -0.01, -0.02],  # p 0.033: Holm x 2 = 0.066
        "d": [-0.04, 0.0, -0.03, -0.01, -0.04],
    }  # p 0.042: Holm 0.066 (made monotone)
    trials = rows(
        {"base": base, **{f: {s: base[s] + d for s, d in enumerate(v)} for f, v in shifts.items()}}
    )
    path = tmp_path / "claims.yaml"
    path.write_text(_four_claims())
    loaded = claims.load(path)
    raw = [r.pairs[0].difference.p for r in claims.evaluate(loaded, trials, "none")]
    assert all(p < 0.05 for p in raw) and raw == sorted(raw)
    verdicts = {
        m: [r.verdict for r in claims.evaluate(loaded, trials, m)] for m in ("none", "holm", "bh")
    }
    assert verdicts["none"] == ["reproduced"] * 4
    holm = stats.holm(raw)
    assert verdicts["holm"] == ["reproduced" if p < 0.05 else "not decided" for p in holm]
    assert verdicts["holm"] == [
        "reproduced",
        "reproduced",
        "not decided",
        "not decided",
    ]  # significant before, not after
    assert (
        verdicts["bh"]
        == ["reproduced" if p < 0.05 else "not decided" for p in stats.bh(raw)]
        == ["reproduced"] * 4
    )
    # The table names the rule it decided by.
    results = claims.evaluate(loaded, trials, "bh")
    brief = claims.verdicts(loaded, results)
    assert [c.header for c in brief.columns][
        5
    ] == "p (BH)" and "Benjamini-Hochberg" in brief.caption
    assert claims.to_json(loaded, results)["claims"][0]["pairs"][0]["adjustment"] == "bh"


def test_a_contradiction_is_decided_by_the_adjusted_p_too(tmp_path):
    trials = rows({"hyperloop": {0: 5.94, 1: 5.96, 2: 5.98}, "looped": {0: 5.90, 1: 5.91, 2: 5.92}})
    (result,) = check(CLAIM, trials, tmp_path)
    assert result.verdict == "contradicted" and result.pairs[0].p_adjusted < 0.05


def test_bh_adjusts_as_benjamini_hochberg():
    # sorted 0.01, 0.03, 0.04, 0.2 -> x 4/1, 4/2, 4/3, 4/4 = 0.04, 0.06, 0.0533, 0.2 -> monotone from the top
    assert stats.bh([0.01, 0.04, 0.03, np.nan, 0.2]) == pytest.approx(
        [0.04, 0.0533333, 0.0533333, np.nan, 0.2], nan_ok=True
    )


def test_published_differences_pair_with_the_orders_adjacent_pairs(tmp_path):
    trials = rows({"a": {0: 5.0, 1: 5.1}, "b": {0: 5.2, 1: 5.3}, "c": {0: 5.4, 1: 5.5}})
    text = (
        "claims:\n  - claim: a beats b beats c\n    source: {paper: P, where: T}\n    study: demo\n"
        "    metric: val_loss\n    order: [a, b, c]\n    published: [-0.01, -0.2]\n"
        "    groups: {a: {family: a}, b: {family: b}, c: {family: c}}\n"
    )
    (result,) = check(text, trials, tmp_path)
    assert [p.published for p in result.pairs] == [-0.01, -0.2]
    assert_load_error(
        text.replace("[-0.01, -0.2]", "-0.01"),
        tmp_path,
        "claims.yaml:7:16: claims[0].published: expected a list of 2 numbers (the paper's better - "
        "worse for each adjacent pair of `order`), got -0.01",
    )
    assert_load_error(
        CLAIM.replace("    groups:", "    published: big\n    groups:"),
        tmp_path,
        "claims.yaml:7:16: claims[0].published: expected a number",
    )


def test_a_missing_group_is_named_only_on_the_pairs_it_leaves_without_data(tmp_path):
    trials = rows({"a": {0: 5.0, 1: 5.1}, "b": {0: 5.2, 1: 5.3}})
    text = (
        "claims:\n  - claim: a beats b beats c\n    source: {paper: P, where: T}\n    study: demo\n"
        "    metric: val_loss\n    order: [a, b, c]\n"
        "    groups: {a: {family: a}, b: {family: b}, c: {family: c}}\n"
    )
    (result,) = check(text, trials, tmp_path)
    verdict = next(
        c
        for c in claims.verdicts(claims.load(tmp_path / "claims.yaml"), [result]).columns
        if c.header == "Verdict"
    )
    assert verdict.cells == ["reproduced", "no data: no ok rows with a finite val_loss in group c"]


def test_a_boolean_axis_filter_matches_the_rows_true_and_false(tmp_path):
    """HC's `hyper.tanh` is decided only for n = 4: `axes.hyper.tanh: false` picks those rows, and a
    row whose point left it unset matches neither true nor false."""
    trials = pd.DataFrame(
        [
            {
                "study": "s",
                "status": "ok",
                "family": "hc",
                "seed": seed,
                "val_loss": base + 0.01 * seed,
                "axes": json.dumps(
                    {"hyper.streams": streams, **({} if tanh is None else {"hyper.tanh": tanh})}
                ),
            }
            for streams, tanh, base in ((4, True, 4.0), (4, False, 4.1), (8, None, 4.2))
            for seed in range(3)
        ]
    )
    path = tmp_path / "c.yaml"
    path.write_text(
        "claims:\n  - claim: tanh\n    source: {paper: P, where: T2}\n    study: s\n"
        "    metric: val_loss\n    order: [tanh, no-tanh]\n    groups:\n"
        "      tanh: {axes.hyper.tanh: true}\n      no-tanh: {axes.hyper.tanh: false}\n"
    )
    (result,) = claims.evaluate(claims.load(path), trials)
    assert [round(g.mean, 4) for g in result.groups] == [4.01, 4.11]
    assert result.pairs[0].difference.estimate == pytest.approx(-0.1)


def test_each_claim_says_which_parameter_count_its_study_matched(tmp_path):
    trials = rows({"hyperloop": {0: 5.90, 1: 5.91}, "looped": {0: 5.94, 1: 5.96}}).assign(
        budget_count="non_embedding_head"
    )
    (result,) = check(CLAIM, trials, tmp_path)
    assert result.count == "non_embedding_head"
    table = claims.table(claims.load(tmp_path / "claims.yaml"), [result])
    assert next(c for c in table.columns if c.header == "Count").cells == ["non_embedding_head"]
    assert (
        claims.to_json(claims.load(tmp_path / "claims.yaml"), [result])["claims"][0]["count"]
        == "non_embedding_head"
    )


def test_each_group_says_the_setting_its_study_tuned_it_at(tmp_path):
    """A tuned study's rows carry the grid point they trained at: the claims table says it beside
    each group's mean (the report's "each arm's tuned setting"), the JSON as the points."""
    trials = rows({"hyperloop": {0: 5.90, 1: 5.91}, "looped": {0: 5.94, 1: 5.96}})
    trials["tuned"] = trials["family"].map(
        {"hyperloop": '{"lr": 0.006}', "looped": '{"lr": 0.003, "warmup": 0.05}'}
    )
    (result,) = check(CLAIM, trials, tmp_path)
    file = claims.load(tmp_path / "claims.yaml")
    cells = {c.header: c.cells for c in claims.table(file, [result]).columns}
    assert cells["Expected better"] == ["hyperloop: 5.9050 ± 0.0050 (2 seeds; tuned: lr 0.006)"]
    assert cells["Expected worse"] == [
        "looped: 5.9500 ± 0.0100 (2 seeds; tuned: lr 0.003, warmup 0.05)"
    ]
    groups = claims.to_json(file, [result])["claims"][0]["groups"]
    assert [g["tuned"] for g in groups] == [[{"lr": 0.006}], [{"lr": 0.003, "warmup": 0.05}]]
    (untuned,) = check(CLAIM, trials.drop(columns="tuned"), tmp_path)
    cells = {c.header: c.cells for c in claims.table(file, [untuned]).columns}
    assert cells["Expected better"] == ["hyperloop: 5.9050 ± 0.0050 (2 seeds)"]


def test_a_zero_standard_error_gives_the_p_its_zero_width_interval_implies():
    assert stats.p_value(-0.05, 0.0, 4) == 0.0 and stats.p_value(0.0, 0.0, 4) == 1.0
    assert np.isnan(stats.p_value(-0.05, np.nan, np.nan))
    same = stats.compare(
        {0: 1.0, 1: 2.0, 2: 3.0}, {0: 1.5, 1: 2.5, 2: 3.5}
    )  # every seed differs by -0.5
    assert (same.lo, same.hi, same.p) == (-0.5, -0.5, 0.0)


def test_a_claim_on_a_study_not_run_keeps_its_pairs_and_published_differences(tmp_path):
    text = CLAIM.replace("study: demo", "study: later").replace(
        "    groups:", "    published: -0.03\n    groups:"
    )
    (result,) = check(text, rows({"hyperloop": {0: 5.9}}), tmp_path)
    assert result.verdict == "no data" and result.why == "no study later here (demo)"
    (pair,) = result.pairs
    assert (pair.better, pair.worse, pair.published, pair.difference) == (
        "hyperloop",
        "looped",
        -0.03,
        None,
    )
    cells = {
        c.header: c.cells[0]
        for c in claims.verdicts(claims.load(tmp_path / "claims.yaml"), [result]).columns
    }
    assert (
        cells["Published"] == "−0.03"
        and cells["Better − worse (metric)"] == "hyperloop − looped (val_loss)"
    )
    assert cells["Verdict"] == "no data: no study later here (demo)"
    # a study under way (declared, no rows judged yet) is told apart from one not run
    path, only = tmp_path / "claims.yaml", rows({"hyperloop": {0: 5.9}})
    for said, why in [
        ({"name": "later"}, "study later has no rows to judge yet"),
        (
            {"tune": {"grid": {"lr": [1e-3]}}},
            "study later has no rows to judge yet (tuning runs are not judged)",
        ),
    ]:
        (begun,) = claims.evaluate(claims.load(path), only, declared={"later": said})
        assert begun.why == why
    full = {
        c.header: c.cells[0]
        for c in claims.table(claims.load(tmp_path / "claims.yaml"), [result]).columns
    }
    assert (full["Expected better"], full["Published"], full["Verdict"]) == (
        "—",
        "−0.03",
        cells["Verdict"],
    )


def test_a_published_difference_on_the_wrong_side_of_the_order_is_refused(tmp_path):
    assert_load_error(
        CLAIM.replace("    groups:", "    published: 0.03\n    groups:"),
        tmp_path,
        "claims.yaml:7:16: claims[0].published: hyperloop - looped = 0.03 is not < 0, the side the order "
        "expects for val_loss:min (hyperloop better): check the sign, or the order",
    )


def test_an_empty_group_says_what_its_rows_were_instead(tmp_path):
    """A candidate cut by ASHA at its first seed leaves its group without ok rows: the verdict says
    it was pruned, so the reader knows to run the study without a pruner."""
    trials = rows({"hyperloop": {0: 5.90, 1: 5.91}})
    trials = pd.concat(
        [
            trials,
            pd.DataFrame(
                [
                    {
                        "study": "demo",
                        "trial_id": "looped-0",
                        "status": "pruned",
                        "family": "looped",
                        "seed": 0,
                        "val_loss": 5.99,
                        "budget": 1_500_000,
                    }
                ]
            ),
        ]
    )
    (result,) = check(CLAIM, trials, tmp_path)
    assert result.why == "no ok rows with a finite val_loss in group looped (pruned 1)"


# --- what the arms differ in ----------------------------------------------------------------------


def _with_specs(trials: pd.DataFrame, specs: dict[str, dict]) -> pd.DataFrame:
    """The rows with each family's spec as the search writes it (resolved, JSON)."""
    from benchmark import ArchSpec

    text = {
        f: ArchSpec.from_dict(
            {"family": f, "vocab_size": 256, "layers": {"begin": 1, "middle": 2, "end": 1}, **s}
        ).to_json()
        for f, s in specs.items()
    }
    return trials.assign(spec=trials["family"].map(text))


def test_arms_that_differ_beyond_the_factor_tested_are_confounded(tmp_path):
    """Hyperloop against Looped: the family (its preset: hyper-connections, injection) is the
    factor tested. Solving d_model (the default) moves d_model and the width with it, not the head
    width or the FFN's ratio to d_model: 4 heads of 30 against 3 of 42 is a confound (ref-hyperloop
    at 1M). The same shape with the FFN width solved (an anchor) is controlled."""
    trials = rows({"hyperloop": {0: 5.90, 1: 5.91, 2: 5.92}, "looped": {0: 5.94, 1: 5.96, 2: 5.98}})
    shapes = {
        "hyperloop": {"d_model": 120, "n_heads": 4, "ffn": {"d_ff": 355}},
        "looped": {"d_model": 126, "n_heads": 3, "ffn": {"d_ff": 315}},
    }
    path = tmp_path / "claims.yaml"
    path.write_text(CLAIM)
    loaded = claims.load(path)
    # shape.head_dim scales the heads with the solved d_model: n_heads follows it, head_dim should not move
    solved = {
        "demo": {"solve": "d_model", "axes": {"shape.head_dim": {"kind": "Fixed", "value": 32}}}
    }
    (result,) = claims.evaluate(loaded, _with_specs(trials, shapes), declared=solved)
    assert result.arms.label == "confounded: head_dim, ffn.width_ratio"
    assert {"family", "d_model", "n_heads", "hyper", "injection"} <= set(result.arms.differ)
    full = {c.header: c.cells[0] for c in claims.table(loaded, [result]).columns}
    assert (
        "head_dim 30 / 42" in full["Arms differ in"]
        and "ffn.width_ratio 2.958 / 2.5" in full["Arms differ in"]
    )
    held = {
        "hyperloop": {"d_model": 128, "n_heads": 4, "ffn": {"d_ff": 330}},
        "looped": {"d_model": 128, "n_heads": 4, "ffn": {"d_ff": 352}},
    }
    (result,) = claims.evaluate(
        loaded, _with_specs(trials, held), declared={"demo": {"solve": "ffn", "anchor": {}}}
    )
    assert result.arms.label == "controlled" and "ffn.d_ff" in result.arms.differ
    (result,) = claims.evaluate(loaded, _with_specs(trials, held), declared=solved)
    assert (
        result.arms.label == "confounded: ffn.width_ratio"
    )  # d_model solved: the ratio was the shape asked for
    assert claims.to_json(loaded, [result])["claims"][0]["arms"]["confounded"] == [
        "ffn.width_ratio"
    ]


def test_arms_that_trained_otherwise_are_confounded_on_their_recipe(tmp_path):
    """The arms' runs must have trained alike: tokens by the claim's rule (same by default; `own`,
    the same tokens per counted parameter; a group's), and every other training setting, the
    precision, and the hardware and threads of final and tuning runs, the tuned setting aside."""
    trials = rows({"hyperloop": {0: 5.90, 1: 5.91, 2: 5.92}, "looped": {0: 5.94, 1: 5.96, 2: 5.98}})
    held = {
        "hyperloop": {"d_model": 128, "n_heads": 4, "ffn": {"d_ff": 330}},
        "looped": {"d_model": 128, "n_heads": 4, "ffn": {"d_ff": 352}},
    }
    trials = _with_specs(trials, held)
    xeon, epyc = "Intel(R) Xeon(R) (2 cpus, 1 torch threads)", "AMD EPYC (2 cpus, 1 torch threads)"
    recipe = {"batch_size": 32, "seq_len": 128, "warmup": 0.05, "schedule": "cosine"}
    looped = (trials["family"] == "looped").to_numpy()
    trials = trials.assign(
        # ref2-twice: 20 tokens per each arm's own count, 1.33x apart
        tokens_trained=np.where(looped, 6_660_096, 5_005_312),
        params_total=np.where(looped, 333_000, 250_266),
        training=[json.dumps({**recipe, "lr": 3e-3 if lp else 6e-3}) for lp in looped],
        hardware=xeon,
        precision="bf16",
        tuned=[json.dumps({"lr": 3e-3 if lp else 6e-3}) for lp in looped],
    )
    declared = {"demo": {"solve": "ffn", "anchor": {}, "tune": {"grid": {"lr": [3e-3, 6e-3]}}}}
    path = tmp_path / "claims.yaml"

    def arms_of(text, rows_, tuning=None):
        path.write_text(text)
        (result,) = claims.evaluate(claims.load(path), rows_, declared=declared, tuning=tuning)
        return result.arms

    # the default rule (same) flags the tokens; the tuned lr is no confound
    same = arms_of(CLAIM, trials)
    assert same.label == "confounded: tokens" and "recipe.lr" in same.differ
    # `own`: 20 tokens per parameter each (5,005,312 / 250,266 = 20.0 and 6,660,096 / 333,000 = 20.0)
    own = CLAIM.replace("    metric:", "    tokens: own\n    metric:")
    assert arms_of(own, trials).label == "controlled"
    # a group's tokens: every arm at the Hyperloop's
    named = CLAIM.replace("    metric:", "    tokens: hyperloop\n    metric:")
    assert arms_of(named, trials).label == "confounded: tokens"
    equal = trials.assign(tokens_trained=5_005_312)
    assert (
        arms_of(named, equal).label == "controlled" and arms_of(CLAIM, equal).label == "controlled"
    )
    # within twice the budget's tolerance (0.5% each side) matched arms' 20x their own counts pass
    near = trials.assign(tokens_trained=np.where(looped, 5_030_000, 5_005_312))
    assert arms_of(CLAIM, near).label == "controlled"
    # another schedule, precision or final CPU for one arm is a confound, each named
    other = equal.assign(
        training=[
            json.dumps({**recipe, "schedule": "wsd" if lp else "cosine", "lr": 3e-3})
            for lp in looped
        ],
        precision=np.where(looped, "fp32", "bf16"),
        hardware=np.where(looped, epyc, xeon),
    )
    assert arms_of(CLAIM, other).confounded == (
        "recipe.schedule",
        "recipe.precision",
        "recipe.hardware",
    )
    # tuning runs on other CPUs in other shares (ref2-hourglass: 2 of 4 on the EPYC, 1 of 4)
    tuning = pd.concat(
        [equal.iloc[:0]]
        + [
            pd.DataFrame(
                [{"study": "demo", "spec": spec, "hardware": hw, "phase": "tune"} for hw in hws]
            )
            for spec, hws in (
                (equal[looped]["spec"].iloc[0], [epyc, epyc, xeon, xeon]),
                (equal[~looped]["spec"].iloc[0], [epyc, xeon, xeon, xeon]),
            )
        ]
    )
    mixed = arms_of(CLAIM, equal, tuning)
    assert mixed.label == "confounded: recipe.tuning_hardware"
    cells = {
        c.header: c.cells[0]
        for c in claims.table(
            claims.load(path),
            [claims.evaluate(claims.load(path), equal, declared=declared, tuning=tuning)[0]],
        ).columns
    }
    assert (
        "recipe.tuning_hardware AMD EPYC (2 cpus, 1 torch threads) 1/4; Intel Xeon (2 cpus, 1 torch "
        "threads) 3/4 / AMD EPYC (2 cpus, 1 torch threads) 1/2; Intel Xeon (2 cpus, 1 torch threads) 1/2"
    ) in cells["Arms differ in"]
    # shares, not counts: on one CPU for every run, an arm a final seed short is alike (not
    # "confounded: recipe.hardware ... 8/8 / ... 7/7"), and so are 2 of 4 and 1 of 2 on each CPU
    one_cpu = equal.assign(hardware=epyc)
    short = one_cpu.drop(one_cpu.index[~looped][-1])
    assert arms_of(CLAIM, short).label == "controlled"
    half = tuning.iloc[:6]  # EPYC, EPYC, Xeon, Xeon / EPYC, Xeon: half on each, 4 and 2 runs
    assert arms_of(CLAIM, short, half).label == "controlled"

"""Claims and their statistics on synthetic rows whose true differences are known: a real
difference is reproduced, a reversed one contradicted, a zero one inconclusive; the intervals cover
the truth at their stated rate; the minimum detectable difference is detected at its stated power;
a claims file's mistakes are named by file, line and key."""

from __future__ import annotations

import importlib.util
import json
import math
from pathlib import Path

import numpy as np
import pandas as pd
import pytest

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
                out.append({"study": study, "trial_id": f"{family}-{seed}-{k}", "status": "ok", "family": family,
                            "structure": f"{k + 1}L", "seed": seed, "val_loss": loss, "budget": 1_500_000})
        out.append({"study": study, "trial_id": f"{family}-failed", "status": "failed", "family": family,
                    "structure": "1L", "seed": 0, "val_loss": 0.0, "budget": 1_500_000})
    return pd.DataFrame(out)


def check(text: str, trials: pd.DataFrame, tmp_path: Path) -> list[claims.Result]:
    path = tmp_path / "claims.yaml"
    path.write_text(text)
    return claims.evaluate(claims.load(path), trials)


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
    assert [(g.name, round(g.mean, 4), len(g.values)) for g in result.groups] == [("hyperloop", 5.91, 3),
                                                                                 ("looped", 5.96, 3)]


def test_a_reversed_difference_is_contradicted_and_a_zero_one_inconclusive(tmp_path):
    reversed_ = rows({"hyperloop": {0: 5.94, 1: 5.96, 2: 5.98}, "looped": {0: 5.90, 1: 5.91, 2: 5.92}})
    assert check(CLAIM, reversed_, tmp_path)[0].verdict == "contradicted"
    zero = rows({"hyperloop": {0: 5.90, 1: 5.97, 2: 5.93}, "looped": {0: 5.92, 1: 5.95, 2: 5.93}})
    (result,) = check(CLAIM, zero, tmp_path)
    assert result.verdict == "inconclusive" and result.pairs[0].difference.lo < 0 < result.pairs[0].difference.hi


def test_one_seed_gives_no_verdict(tmp_path):
    (result,) = check(CLAIM, rows({"hyperloop": {0: 5.0}, "looped": {0: 6.0}}), tmp_path)
    assert result.verdict == "inconclusive (1 seed)"
    assert math.isnan(result.pairs[0].difference.lo)
    assert "inconclusive (1 seed)" in claims.table(claims.load(tmp_path / "claims.yaml"), [result]).columns[-1].cells


def test_unmatched_seeds_take_welch_and_a_groups_candidates_average_per_seed(tmp_path):
    # Looped ran seeds 3-5 only: no pairs, Welch's interval. Hyperloop's two candidates per seed
    # (5.89 and 5.91 at seed 0) count as one value per seed: their mean.
    trials = rows({"hyperloop": {0: [5.89, 5.91], 1: [5.90, 5.92], 2: [5.91, 5.93]},
                   "looped": {3: 5.94, 4: 5.96, 5: 5.98}})
    (result,) = check(CLAIM, trials, tmp_path)
    d = result.pairs[0].difference
    assert result.groups[0].values == {0: pytest.approx(5.90), 1: pytest.approx(5.91), 2: pytest.approx(5.92)}
    assert d.method == "welch" and d.df == pytest.approx(2.9411765)   # (0.0005/3)^2 / ((1e-4/3)^2/2 + (4e-4/3)^2/2)
    assert (d.lo, d.hi) == (pytest.approx(-0.0915540), pytest.approx(-0.0084460))
    assert result.verdict == "reproduced"


def test_more_groups_hold_when_every_adjacent_pair_does(tmp_path):
    text = CLAIM.replace("order: [hyperloop, looped]", "order: [hyperloop, looped, transformer]").replace(
        "      looped: {family: looped}\n", "      looped: {family: looped}\n      transformer: {family: transformer}\n")
    trials = rows({"hyperloop": {0: 5.90, 1: 5.91, 2: 5.92}, "looped": {0: 5.94, 1: 5.96, 2: 5.98},
                   "transformer": {0: 5.95, 1: 5.95, 2: 5.99}})
    (result,) = check(text, trials, tmp_path)
    assert [p.verdict for p in result.pairs] == ["reproduced", "inconclusive"] and result.verdict == "inconclusive"


def test_a_claim_without_a_study_is_checked_in_each(tmp_path):
    text = CLAIM.replace("    study: demo\n", "")
    trials = pd.concat([rows({"hyperloop": {0: 5.9, 1: 5.91}, "looped": {0: 6.0, 1: 6.02}}, "a"),
                        rows({"hyperloop": {0: 6.0, 1: 6.02}, "looped": {0: 5.9, 1: 5.91}}, "b")])
    assert [(r.study, r.verdict) for r in check(text, trials, tmp_path)] == [("a", "reproduced"), ("b", "contradicted")]


# --- the statistics at their stated rates, over many synthetic experiments -------------------------

DRAWS = 1000  # a rate of 0.95 is then measured within +-0.007 (one s.d.)


def test_intervals_cover_the_true_difference_at_95_percent():
    rng = np.random.default_rng(7)
    seeds = rng.normal(0, 0.05, (DRAWS, 5))   # shared by both groups of a seed: pairing removes it
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
    diff_sd = sigma * math.sqrt(2)   # of one seed's a - b
    zero = rng.normal(0, diff_sd, (DRAWS, n))
    verdicts = stats.verdict(*stats.interval(*stats.paired(zero, 0)), -1)
    assert np.mean(verdicts == "inconclusive") >= 0.93           # 5% two-sided, split over both wrong calls
    assert np.mean(verdicts == "contradicted") <= 0.05
    # A true difference of exactly the detectable size is found about 80% of the time.
    mdd = float(stats.detectable(diff_sd / math.sqrt(n), n - 1))
    found = stats.verdict(*stats.interval(*stats.paired(rng.normal(-mdd, diff_sd, (DRAWS, n)), 0)), -1)
    assert 0.72 <= np.mean(found == "reproduced") <= 0.88


# --- the claims file ----------------------------------------------------------------------------

def test_the_shipped_claims_cite_the_papers_sections():
    loaded = claims.load(SHIPPED)
    assert [c.claim for c in loaded.claims] == ["Hyperloop beats Looped at matched parameters",
                                                "Hyperloop beats a depth-matched Transformer"]
    assert all("Table 1" in c.source and c.study == "quickstart" and c.metric.column == "val_loss"
               for c in loaded.claims)


@pytest.mark.parametrize("change, message", [
    (("    order:", "    oder:"), "claims.yaml:6:5: claims[0].oder: unknown key (did you mean 'order'?)"),
    (("order: [hyperloop, looped]", "order: [hyperloop, loped]"),
     "claims.yaml:6:24: claims[0].order[1]: no group 'loped' under groups (hyperloop, looped)"),
    (("metric: val_loss", "metric: bleu"), "claims.yaml:5:13: claims[0].metric: unknown metric 'bleu'"),
    (("    source: {paper: Hyperloop Transformers, where: \"§4.2, Table 1\"}\n", ""),
     "claims.yaml:2:5: claims[0]: missing key 'source'"),
    (("{family: looped}", "{family: [looped, {x: 1}]}"),
     "claims.yaml:9:24: claims[0].groups.looped.family: expected a value or a list of values"),
    (("claims:", "claims: [\n"), "claims.yaml:"),
])
def test_mistakes_in_a_claims_file_name_the_line_and_key(tmp_path, change, message):
    path = tmp_path / "claims.yaml"
    path.write_text(CLAIM.replace(*change))
    with pytest.raises(ClaimsError) as err:
        claims.load(path)
    assert str(err.value).startswith(f"{tmp_path}/{message}"), str(err.value)


def test_a_filter_on_a_column_the_rows_lack_is_named_at_its_key(tmp_path):
    with pytest.raises(ClaimsError, match=r"claims.yaml:9:16: claims\[0\].groups.looped.famly: no column 'famly' "
                                          r"in the results \(did you mean 'family'\?\)"):
        check(CLAIM.replace("{family: looped}", "{famly: looped}"), rows({"looped": {0: 1.0}}), tmp_path)


def test_a_budget_filter_takes_an_amount(tmp_path):
    text = CLAIM.replace("    groups:", "    where: {budget: 1.5M}\n    groups:")
    trials = rows({"hyperloop": {0: 5.90, 1: 5.91, 2: 5.92}, "looped": {0: 5.94, 1: 5.96, 2: 5.98}})
    assert check(text, trials, tmp_path)[0].verdict == "reproduced"
    assert check(text.replace("1.5M", "3M"), trials, tmp_path)[0].verdict == "no data"


# --- the command line ---------------------------------------------------------------------------

def study_rows(study: str) -> pd.DataFrame:
    """A small study as the search writes it (specs, so seeds aggregate): Hyperloop better than
    Looped by 0.05 nats at each of 3 seeds, with seed-to-seed noise shared by both."""
    out = []
    for family, offset in (("hyperloop", 0.0), ("looped", 0.05)):
        spec = {"family": family, "d_model": 96, "layers": {"begin": 1, "middle": 2, "end": 1}, "loops": 3}
        for seed, noise in enumerate((0.0, 0.02, -0.01)):
            loss = 5.9 + offset + noise + 0.001 * seed
            out.append({"study": study, "trial_id": f"{family}-s{seed}", "status": "ok", "family": family,
                        "spec": json.dumps(spec), "seed": seed, "val_loss": loss, "val_ppl": math.exp(loss),
                        "params_total": 1_500_000, "budget": 1_500_000, "tokens_trained": 800_768})
    return pd.DataFrame(out)


def test_cli_reports_claims_in_markdown_html_and_json(tmp_path, capsys):
    folder = tmp_path / "results" / "quickstart" / "trials"
    folder.mkdir(parents=True)
    study_rows("quickstart").to_parquet(folder / "rows.parquet", index=False)
    spec = importlib.util.spec_from_file_location("leaderboard_cli", ROOT / "leaderboard.py")
    cli = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(cli)
    assert cli.main([str(tmp_path / "results"), "--claims", str(SHIPPED), "--format", "md,html",
                     "--out", str(tmp_path / "site")]) == 0
    report = json.loads((tmp_path / "site" / "claims.json").read_text())
    first = report["claims"][0]
    assert (first["verdict"], first["pairs"][0]["difference"]["method"]) == ("reproduced", "paired")
    assert first["pairs"][0]["difference"]["estimate"] == pytest.approx(-0.05)
    assert report["claims"][1]["verdict"] == "no data"   # the study ran no Transformer
    md = (tmp_path / "site" / "leaderboard.md").read_text()
    assert "## Claims (quickstart.yaml)" in md and "| reproduced |" in md
    assert "<h2>Claims (quickstart.yaml)</h2>" in (tmp_path / "site" / "index.html").read_text()
    assert cli.main([str(tmp_path / "results"), "--claims", str(tmp_path / "nope.yaml")]) == 2
    assert "nope.yaml: cannot be read" in capsys.readouterr().err

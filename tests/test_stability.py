"""The instability rule on planted rows (a spike, a laggard), each verdict again without the runs it
marks; a tuned study's tuning runs kept off the ranks and read for the chosen setting, the budget
and the learning-rate sensitivity."""

from __future__ import annotations

import io
import json
import math

import pandas as pd
import pytest

from benchmark.leaderboard import ClaimsError, build_board, claims
from benchmark.leaderboard.claims import stability

CLAIMS = """\
{rule}claims:
  - claim: A beats B
    source: {{paper: planted, where: "§1"}}
    study: s
    metric: val_loss
    order: [a, b]
    groups: {{a: {{family: transformer}}, b: {{family: looped}}}}
"""
SPEC = {
    "transformer": {"family": "transformer", "d_model": 64, "vocab_size": 320},
    "looped": {"family": "looped", "d_model": 64, "vocab_size": 320, "loops": 2},
}


def trials(a: list[float], b: list[float], spikes: dict[int, float] = {}) -> pd.DataFrame:
    out = []
    for family, losses in (("transformer", a), ("looped", b)):
        for seed, loss in enumerate(losses):
            out.append(
                {
                    "study": "s",
                    "trial_id": f"{family[0]}-s{seed}",
                    "attempt": 0,
                    "status": "ok",
                    "family": family,
                    "spec": json.dumps(SPEC[family]),
                    "seed": seed,
                    "val_loss": loss,
                    "val_ppl": math.exp(loss),
                    "params_total": 100_000,
                    "loss_spike": spikes.get(seed, 0.1) if family == "transformer" else 0.1,
                }
            )
    return pd.DataFrame(out)


def checked(tmp_path, rows: pd.DataFrame, rule: str = ""):
    path = tmp_path / "claims.yaml"
    path.write_text(CLAIMS.format(rule=rule))
    file = claims.load(path)
    board = build_board(rows)
    return file, claims.evaluate(file, board.trials), board


A = [4.00, 4.01, 4.02, 4.01, 4.31]  # seed 4 falls 0.30 nats behind its candidate's median
B = [4.10, 4.11, 4.12, 4.10, 4.11]


def test_a_planted_spike_and_a_planted_laggard_are_marked_and_the_verdict_is_read_without_them(
    tmp_path,
):
    file, results, board = checked(tmp_path, trials(A, B, spikes={2: 3.72}))
    rule, assessed, why = stability.assess(file, results, board.trials)
    assert rule == stability.Rule()  # none declared: the defaults
    marked = dict(zip(board.trials["trial_id"], why))
    assert marked["t-s2"] == "spike 3.72"
    assert marked["t-s4"].startswith("laggard +0.30 (z ")
    assert {k for k, v in marked.items() if v} == {
        "t-s2",
        "t-s4",
    }  # nothing else, and never dropped
    (s,) = assessed
    assert s.runs == {"a": 5, "b": 5} and [len(m) for m in s.marked.values()] == [2, 0]
    assert s.verdict == results[0].verdict == "not decided"  # the laggard hides the difference
    assert s.without == "reproduced"  # without it A is ahead
    table = stability.table(rule, assessed)
    cells = {c.header: c.cells[0] for c in table.columns}
    assert cells["Marked runs per arm"] == "a 2 of 5, b 0 of 5"
    assert cells["Without marked runs"] == "reproduced (changes)"
    assert (
        "t-s4: laggard +0.30" in cells["Marked runs"] and "t-s2: spike 3.72" in cells["Marked runs"]
    )


def test_the_rule_is_declared_in_the_claims_file(tmp_path):
    file, results, board = checked(
        tmp_path,
        trials(A, B, spikes={2: 3.72}),
        rule="instability: {spike: 5, laggard: 5, laggard_min: 0.5}\n",
    )
    rule, (s,), why = stability.assess(file, results, board.trials)
    assert rule == stability.Rule(spike=5.0, laggard=5.0, laggard_min=0.5)
    assert not (why != "").any() and s.without == s.verdict == "not decided"
    for bad, message in [
        ("instability: {spike: -1}\n", "instability.spike: expected a number >= 0"),
        ("instability: {spikes: 1}\n", "instability.spikes: unknown key"),
    ]:
        (tmp_path / "claims.yaml").write_text(CLAIMS.format(rule=bad))
        with pytest.raises(ClaimsError, match=message):
            stability.rule_of(claims.load(tmp_path / "claims.yaml"))


def test_seeds_that_agree_exactly_do_not_mark_a_seed_a_hair_behind(tmp_path):
    rows = trials([4.0, 4.0, 4.0, 4.0, 4.01], B)
    why = stability.mark(build_board(rows).trials, stability.Rule())
    assert not (why != "").any()  # 0.01 nats < laggard_min, though its robust z is infinite


def test_tuning_runs_are_not_ranked_and_give_the_choice_the_budget_and_the_sensitivity():
    from benchmark.leaderboard import report, tables, tuning

    final = trials([4.0, 4.02], [4.1, 4.12]).assign(phase="final")
    final["tuned"] = final["family"].map({"transformer": '{"lr": 0.01}', "looped": '{"lr": 0.001}'})
    final["training"] = final["tuned"]  # each trained at its own point (the rows' full settings)
    final["budget_count"] = "non_embedding"
    runs = []
    for family, losses in (
        ("transformer", {1e-3: 4.5, 1e-2: 4.0, 1e-1: None}),
        ("looped", {1e-3: 4.1, 1e-2: 4.2, 1e-1: 4.3}),
    ):
        for lr, loss in losses.items():
            runs.append(
                {
                    "study": "s",
                    "trial_id": f"{family[0]}-g{lr}",
                    "attempt": 0,
                    "family": family,
                    "status": "ok" if loss else "diverged",
                    "spec": json.dumps(SPEC[family]),
                    "seed": 100,
                    "val_loss": loss if loss else math.nan,
                    "val_ppl": math.exp(loss) if loss else math.nan,
                    "params_total": 100_000,
                    "phase": "tune",
                    "tuned": json.dumps({"lr": lr}),
                }
            )
    board = build_board(pd.concat([final, pd.DataFrame(runs)], ignore_index=True))
    assert (
        len(board.trials) == 4 and len(board.tuning) == 6
    )  # tuning runs are neither ranked nor judged
    c = board.candidates.set_index("family")
    assert c.loc["transformer", "n_seeds"] == 2 and c.loc["transformer", "tuning_runs"] == 3
    cap = math.log(320)  # a diverged point counts as a uniform guess
    assert c.loc["transformer", "lr_sensitivity"] == pytest.approx((0.5 + 0 + (cap - 4.0)) / 3)
    assert c.loc["looped", "lr_sensitivity"] == pytest.approx((0 + 0.1 + 0.2) / 3)
    assert c.loc["transformer", "tuned"] == '{"lr": 0.01}'
    table = tuning.table(board)
    cells = {col.header: col.cells for col in table.columns}
    assert cells["Tuning runs"] == ["3 (3 points)", "3 (3 points)"]
    # printed as the claims table prints it, not as the rows' JSON
    assert cells["Chosen setting"] == ["lr 0.001", "lr 0.01"]
    # looped chose the grid's smallest lr (0.1 nats better than the next): its best may lie below;
    # the transformer's best is inside (its top point diverged)
    assert cells["At the grid's edge"] == ["lr bottom, 0.100 below 0.01", "—"]
    # the two arms, at different points of one grid, rank in one table, each with its point
    (ranked,) = tables.leaderboard(board)
    cells = {col.header: col.cells for col in ranked.columns}
    assert ranked.title == "Budget 100K" and cells["Tuned"] == ["lr 0.01", "lr 0.001"]
    # and the CSV says each one's point beside its rank
    written = pd.read_csv(io.StringIO(report.csv(board)))
    assert written[["rank", "tuned"]].values.tolist() == [[1, '{"lr": 0.01}'], [2, '{"lr": 0.001}']]


def test_each_arm_is_read_on_the_points_it_trained_when_extensions_differ():
    """An edge choice extends the grid for that arm alone (space/tuning.py): ref3-abbie-r4's Depth
    trained 7.5e-4 and AbbIE-D 2.4e-2 besides the shared four. Each arm's points, and whether its
    choice is at an edge, are of its own runs, not of the study's union of them."""
    from benchmark.leaderboard import tuning

    final = trials([4.0, 4.02], [4.1, 4.12]).assign(phase="final")
    final["tuned"] = '{"lr": 0.001}'
    final["training"] = final["tuned"]
    runs = [
        {
            "study": "s",
            "trial_id": f"{family[0]}-g{lr}",
            "attempt": 0,
            "family": family,
            "status": "ok",
            "spec": json.dumps(SPEC[family]),
            "seed": 100,
            "val_loss": loss,
            "val_ppl": math.exp(loss),
            "params_total": 100_000,
            "phase": "tune",
            "tuned": json.dumps({"lr": lr}),
        }
        for family, losses in (
            ("transformer", {1e-3: 4.0, 1e-2: 4.2, 1e-1: 4.4}),  # best at its own bottom
            ("looped", {1e-4: 4.3, 1e-3: 4.1, 1e-2: 4.2, 1e-1: 4.3}),  # extended down: inside
        )
        for lr, loss in losses.items()
    ]
    board = build_board(pd.concat([final, pd.DataFrame(runs)], ignore_index=True))
    cells = {col.header: col.cells for col in tuning.table(board).columns}
    assert cells["Family"] == ["looped", "transformer"]
    assert cells["Tuning runs"] == ["4 (4 points)", "3 (3 points)"]
    assert cells["At the grid's edge"] == ["—", "lr bottom, 0.200 below 0.01"]


def test_the_tuning_table_tells_variants_of_one_shape_apart_and_lists_only_tuned_candidates():
    from types import SimpleNamespace

    from benchmark.leaderboard import tuning

    def cand(study, variant, tuned, runs):
        return {
            "study": study,
            "family": "hyperloop",
            "structure": "1L→2L(×2)→1L",
            "variant": variant,
            "tuned": tuned,
            "tuning_runs": runs,
            "tuning_points": runs / 2,  # two tuning seeds
            "lr_sensitivity": 0.05 if runs else math.nan,
            "tuning_edge": "",
        }

    candidates = pd.DataFrame(
        [
            cand("t", "4× sinkhorn", '{"lr": 0.006}', 4),
            cand("t", "4× diagonal", '{"lr": 0.003}', 4),
            cand("u", "LoRA r=8", None, math.nan),  # an untuned study's: not in the table
        ]
    )
    tuning_runs = pd.DataFrame({"study": ["t"] * 2, "tuned": ['{"lr": 0.003}', '{"lr": 0.006}']})
    table = tuning.table(SimpleNamespace(candidates=candidates, tuning=tuning_runs))
    cells = {col.header: col.cells for col in table.columns}
    assert cells["Variant"] == ["4× diagonal", "4× sinkhorn"]
    assert cells["Chosen setting"] == ["lr 0.003", "lr 0.006"]
    # no Variant column where only the untuned candidates have variants
    plain = candidates.assign(variant=[None, None, "LoRA r=8"])
    table = tuning.table(SimpleNamespace(candidates=plain, tuning=tuning_runs))
    assert "Variant" not in [col.header for col in table.columns]


def test_the_tuning_table_names_the_spaces_variants_that_one_shape_description_cannot_tell_apart():
    """Hourglass FFNs declared as a space's `variants:` (K4-L12, conventional) are one family,
    structure and no hyper-connection variant: the space's own name (the trial's `variant` axis,
    as claims name them) is what tells their rows apart."""
    from types import SimpleNamespace

    from benchmark.leaderboard import tuning

    def cand(named, lr):
        return {
            "study": "h",
            "family": "transformer",
            "structure": "12L",
            "variant": None,
            "space_variant": named,
            "tuned": f'{{"lr": {lr}}}',
            "tuning_runs": 8,
            "tuning_points": 4,
            "lr_sensitivity": 0.06,
            "tuning_edge": "",
        }

    candidates = pd.DataFrame([cand("conventional", 0.006), cand("K4-L12", 0.003)])
    tuning_runs = pd.DataFrame({"study": ["h"], "tuned": ['{"lr": 0.003}']})
    cells = {
        col.header: col.cells
        for col in tuning.table(SimpleNamespace(candidates=candidates, tuning=tuning_runs)).columns
    }
    assert cells["Space variant"] == ["K4-L12", "conventional"]
    assert cells["Chosen setting"] == ["lr 0.003", "lr 0.006"]
    assert "Variant" not in cells  # no hyper-connection or LoRA variant among them


def test_the_page_shows_the_unstable_runs_and_each_claims_learning_curves(tmp_path):
    from benchmark.leaderboard import publish

    rows = trials(A, B, spikes={2: 3.72})
    file, results, board = checked(tmp_path, rows)
    curves = pd.DataFrame(
        [
            {
                "study": "s",
                "trial_id": t,
                "attempt": 0,
                "step": step,
                "train_loss": 6 - step / 10,
                "val_loss": 6 - step / 10 if step % 10 == 0 else math.nan,
            }
            for t in rows["trial_id"]
            for step in range(1, 31)
        ]
    )
    written = publish(
        board, ["html", "md"], tmp_path / "site", checked=(file, results), curves=curves
    )
    assert tmp_path / "site" / "plots" / "curves-00.svg" in written
    page = (tmp_path / "site" / "index.html").read_text()
    assert "<h2>Unstable runs</h2>" in page and "<h2>Learning curves</h2>" in page
    assert "a 2 of 5, b 0 of 5" in page
    assert page.index("Learning curves") < page.index("<h2>Frontiers</h2>")
    md = (tmp_path / "site" / "leaderboard.md").read_text()
    assert "## Learning curves\n\n![Learning curves: A beats B (s)](plots/curves-00.png)" in md
    assert (
        json.loads((tmp_path / "site" / "stability.json").read_text())["claims"][0]["without"]
        == "reproduced"
    )


def test_the_grid_edge_is_read_along_each_key_with_the_others_held():
    """lr x warmup: the best point at the largest lr is compared with the next lr at its own
    warmup (not the other warmup's better loss); a key of 2 values has no inside and is not said."""
    from benchmark.leaderboard import tuning

    losses = {
        (1e-3, 0.02): 3.70, (3e-3, 0.02): 3.58, (6e-3, 0.02): 3.55,
        (1e-3, 0.05): 3.69, (3e-3, 0.05): 3.60, (6e-3, 0.05): 3.54,
    }  # fmt: skip
    runs = pd.DataFrame(
        [
            {"status": "ok", "val_loss": v, "tuned": json.dumps({"lr": lr, "warmup": w})}
            for (lr, w), v in losses.items()
        ]
    )
    grid = tuning.grid_of(runs)
    assert grid == {"lr": [1e-3, 3e-3, 6e-3], "warmup": [0.02, 0.05]}
    assert tuning.edge(tuning.per_point(runs, 1024), grid) == "lr top, 0.060 below 0.003"
    inside = runs.assign(val_loss=[3.7, 3.5, 3.6, 3.7, 3.6, 3.6])
    assert tuning.edge(tuning.per_point(inside, 1024), grid) == ""

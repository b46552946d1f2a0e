"""Leaderboard end to end on synthetic studies: reading, bands, tables in every format, plots, the
page, study comparison and the CLI's plain errors."""

from __future__ import annotations

import faulthandler
import json
import math
import multiprocessing
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
from fixture_studies import fixture_study
from rich.console import Console
from synthetic_studies import LAYOUTS, synthetic_trials, write_study

from benchmark import ArchSpec
from benchmark.arch.describe import describe
from benchmark.arch.spec import FAMILIES, format_structure
from benchmark.leaderboard import (
    LeaderboardError,
    NoResults,
    Objective,
    Settings,
    build_board,
    find_studies,
    formats,
    page,
    publish,
    read_declarations,
    read_results,
    read_studies,
    report,
    skipped_notes,
    tables,
)
from benchmark.leaderboard.bands import bands, cluster, cohorts
from benchmark.leaderboard.objectives import DEFAULT, objectives
from benchmark.leaderboard.report import FILES
from benchmark.store import ResultsWarning
from benchmark.store.declaration import write_study_info

ROOT = Path(__file__).resolve().parents[1]
KEPT = fixture_study("quickstart-faithful-families")  # frozen rows (tests/fixtures/README.md)

# --- fixtures -----------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def results(tmp_path_factory) -> Path:
    """A results root with two studies: a broad one and a training-loop sweep (Hyperloop Fig. 2)."""
    root = tmp_path_factory.mktemp("results")
    write_study(root, synthetic_trials("broad", shapes=3, seeds=3))
    write_study(
        root,
        synthetic_trials(
            "sweep", shapes=1, seeds=2, budgets=(113e6,), vary_loops=(2, 3, 4, 6), seed=1
        ),
    )
    return root


@pytest.fixture(scope="module")
def board(results):
    return build_board(read_results([results / "broad"]), Settings())


# --- reading ------------------------------------------------------------------------------------


def test_finds_studies_in_a_root_or_a_study_folder(results):
    assert list(find_studies([results])) == ["broad", "sweep"]
    assert list(find_studies([results / "sweep"])) == ["sweep"]
    assert list(find_studies([results], names=["sweep"])) == ["sweep"]
    with pytest.raises(NoResults, match="no study named nope; found: broad, sweep"):
        find_studies([results], names=["nope"])


def test_reads_every_trial_file_and_skips_temporary_ones(results):
    trials = read_results([results / "broad"])
    assert len(trials) == len(
        synthetic_trials("broad", shapes=3, seeds=3)
    )  # the .tmp file is not read
    assert set(trials["study"]) == {"broad"}


def test_an_unreadable_trial_file_is_skipped_and_named(tmp_path):
    trials = synthetic_trials("torn", shapes=1, seeds=1, budgets=(30e6,))
    folder = write_study(tmp_path, trials)
    (folder / "trials" / "torn.parquet").write_bytes(b"not parquet")
    with pytest.warns(
        ResultsWarning, match=r"torn.parquet: not a readable Parquet file \(.*\); skipped"
    ):
        assert len(read_results([folder])) == len(trials)
    skipped = {}
    assert len(read_studies(find_studies([folder]), skipped)) == len(trials)
    assert skipped == {"torn": [str(folder / "trials" / "torn.parquet")]}
    assert skipped_notes(find_studies([folder]), skipped, {"torn": {}}) == [
        (
            "torn: 1 unreadable trial file skipped (torn.parquet); redo with: shapebench search SPACE.yaml "
            f"--name torn --results {tmp_path} --resume"
        )
    ]


def test_reading_tolerates_columns_that_come_and_go(tmp_path):
    # An older trial file without int4 columns, and a failed one whose metric columns are all null.
    trials = synthetic_trials("drift", shapes=1, seeds=1, budgets=(30e6,))
    folder = write_study(tmp_path, trials.iloc[:3]) / "trials"
    trials.iloc[3:4].drop(columns=["val_ppl_int4", "int4_bytes"]).to_parquet(folder / "old.parquet")
    failed = trials.iloc[4:5].assign(
        status="failed", val_ppl=None, val_loss=None, val_ppl_by_loops=None
    )
    failed.to_parquet(folder / "failed.parquet")
    read = read_results([tmp_path / "drift"])
    assert len(read) == 5 and read["val_ppl_int4"].isna().sum() >= 1


# --- the board ----------------------------------------------------------------------------------


def test_structure_and_shape_columns_follow_the_papers():
    assert format_structure(2, 4, 2, 3, looped=True) == "2L→4L(×3)→2L"  # Hyperloop Table 1
    assert format_structure(0, 4, 0, 2, looped=True) == "4L(×2)"
    assert format_structure(12, 0, 0, 1, looped=False) == "12L"
    looped = describe(
        {
            "d_model": 768,
            "layers": {"begin": 2, "middle": 4, "end": 2},
            "loops": 3,
            "ffn": {"kind": "swiglu", "ratio": 2.75},
            "hyper": {"streams": 4, "read": "block", "init": "home"},
        }
    )
    assert looped == {
        "structure": "2L→4L(×3)→2L",
        "variant": "4× diagonal / loop",
        "d_model": 768,
        "d_h": 2112,
        "K": 1,
        "L": 8,
        "depth": 16,
        "loops": 3,
        "streams": 4,
    }
    # What the HC, LoRA and initialisation ablations vary shows in `variant`.
    assert (
        describe(
            {
                "hyper": {
                    "streams": 2,
                    "every": "sublayer",
                    "mixing": "dynamic",
                    "tanh": False,
                    "init": "home",
                }
            }
        )["variant"]
        == "2× dynamic w/o tanh / sublayer"
    )
    assert (
        describe(
            {
                "lora_rank": 8,
                "hyper": {"streams": 4, "loop_embedding": True, "read": "block", "init": "home"},
            }
        )["variant"]
        == "4× diagonal / loop + loop emb., LoRA r=8"
    )
    # Rows from before `hyper.read` and `hyper.init` existed are labelled with what that code ran.
    assert (
        describe({"hyper": {"streams": 4, "loop_embedding": True}})["variant"]
        == "4× diagonal / loop + loop emb., F(u) - u, symmetric init"
    )
    assert describe({"layers": {"n": 12}})["variant"] is None
    # Hourglass paper Table 3, 113M hourglass row: d_model 1032, d_h 418, L 12, K 4.
    hourglass = describe(
        {"d_model": 1032, "layers": {"n": 12}, "ffn": {"kind": "hourglass", "K": 4, "d_h": 418}}
    )
    assert (hourglass["d_h"], hourglass["K"], hourglass["L"], hourglass["structure"]) == (
        418,
        4,
        12,
        "12L",
    )


@pytest.mark.parametrize(
    "raw",
    [{"family": f} for f in FAMILIES]
    + [
        {
            "family": "hyperloop",
            "layers": {"begin": 1, "middle": 1, "end": 1},
            "loops": 1,
        },  # one loop of a one-layer middle
        {"family": "looped", "loops": 1},
        {"family": "looped", "layers": {"middle": 4}, "loops": 2},
    ],
)
def test_the_page_and_the_rows_write_one_structure(raw):
    """The row's `structure` (ArchSpec.structure, also the search's summary and the plan) and the
    leaderboard's, read back from the row's spec, are one string."""
    spec = ArchSpec.from_dict(raw)
    assert describe(json.loads(spec.to_json()))["structure"] == spec.structure()


def test_params_cluster_into_budget_bands():
    # Tolerance 0.5%: a band opened at 100 reaches 100 x 1.005 / 0.995 = 101.005.
    assert cluster(np.array([100, 100.9, 200, 100.4, 101.2, np.nan])).tolist()[:5] == [
        100.4,
        100.4,
        200,
        100.4,
        101.2,
    ]
    assert math.isnan(cluster(np.array([np.nan]))[0])
    frame = pd.DataFrame({"budget": [113e6, np.nan], "params_total": [50e6, 30e6]})
    assert bands(frame).tolist() == [113e6, 30e6]  # the recorded budget wins; params fill the gaps


def test_rows_rank_together_only_when_counted_and_trained_alike_tuned_ones_by_their_grid():
    def row(count, lr, schedule="cosine", study="hand", tuned=None):
        training = {"lr": lr, "schedule": schedule, "warmup": 0.05, "seed": 1, "device": "cpu"}
        return {
            "budget_count": count,
            "training": json.dumps(training),
            "study": study,
            "tuned": tuned,
        }

    frame = pd.DataFrame(
        [
            row("non_embedding", 3e-3),  # the common recipe
            row("non_embedding", 3e-3),
            row("non_embedding", 3e-3),
            row("non_embedding", 6e-3),  # a learning rate set by hand: another recipe
            row("non_embedding", 3e-3, schedule="wsd"),  # another schedule
            row("non_embedding_head", 3e-3),  # another count rule
            # a tuned study's arms at the points its grid chose for each: one recipe, the grid's
            row("non_embedding", 3e-3, study="a", tuned='{"lr": 0.003}'),
            row("non_embedding", 1.2e-2, study="a", tuned='{"lr": 0.012}'),
            # another study on another grid: another recipe, though it chose 3e-3 as well
            row("non_embedding", 3e-3, study="b", tuned='{"lr": 0.003}'),
        ]
    )
    grids = {"a": {"lr": "0.003, 0.012"}, "b": {"lr": "0.001, 0.003"}}  # tuning.grids
    assert cohorts(frame, grids).tolist() == [
        "non_embedding",
        "non_embedding",
        "non_embedding",
        "non_embedding · lr 0.006",
        "non_embedding · schedule wsd",
        "non_embedding_head",
        "non_embedding · lr tuned over 0.003, 0.012",
        "non_embedding · lr tuned over 0.003, 0.012",
        "non_embedding · lr tuned over 0.001, 0.003",
    ]
    # without the grids (rows read alone), a tuned setting is still never a hand-set one
    assert cohorts(frame).tolist()[6:] == ["non_embedding · lr tuned"] * 3
    # a setting the common recipe has and a row lacks sets it apart too
    lacking = pd.DataFrame(
        [row("non_embedding", 3e-3)] * 2 + [{**row("x", 3e-3), "training": "{}"}]
    )
    assert cohorts(lacking.assign(budget_count="non_embedding")).tolist()[2] == (
        "non_embedding · lr — · schedule — · warmup —"
    )


def test_seeds_of_one_spec_become_one_candidate(board):
    trials = synthetic_trials("broad", shapes=3, seeds=3)
    ok = trials[trials["status"] == "ok"]
    assert len(board.candidates) == ok["spec"].nunique()
    assert board.candidates["n_seeds"].sum() == len(ok)
    one = board.candidates.loc[board.candidates["n_seeds"].idxmax()]
    spec = json.loads(one["spec"])
    seeds = ok[[json.loads(s) == spec for s in ok["spec"]]]["val_ppl"]
    assert one["val_ppl"] == pytest.approx(seeds.mean())
    assert one["val_ppl_se"] == pytest.approx(seeds.std() / math.sqrt(len(seeds)))


def test_spec_key_order_does_not_split_a_candidate():
    trials = synthetic_trials("order", shapes=1, seeds=2, budgets=(30e6,), statuses={"ok": 1.0})
    spec = json.loads(trials["spec"].iloc[1])
    trials.loc[1, "spec"] = json.dumps(
        dict(reversed(list(spec.items())))
    )  # seed 1 of row 0's model
    board = build_board(trials)
    assert len(board.candidates) == len(LAYOUTS) and (board.candidates["n_seeds"] == 2).all()


def test_family_comes_from_the_spec_and_a_missing_spec_is_said():
    trials = synthetic_trials("bare", shapes=1, seeds=2, budgets=(30e6,), statuses={"ok": 1.0})
    board = build_board(trials.drop(columns=["family"]))
    assert sorted(board.candidates["family"]) == sorted(LAYOUTS)
    board = build_board(trials.drop(columns=["spec"]))
    assert len(board.candidates) == len(trials) and board.notes == (
        "no spec column: seeds are not aggregated",
    )


def tie_trials(
    seeds_per_candidate: dict[str, list[float]], families: tuple[str, ...] = ("transformer",)
) -> pd.DataFrame:
    """One band of models of different widths, the families taken in turn (Transformers by
    default); val_ppl per seed for each candidate."""
    rows = []
    for k, (name, ppls) in enumerate(seeds_per_candidate.items()):
        family = families[k % len(families)]
        spec = {"family": family, "d_model": 64 + 32 * k, "layers": {"begin": 4}}
        rows += [
            {
                "study": "ties",
                "trial_id": f"{name}-{s}",
                "status": "ok",
                "family": family,
                "spec": json.dumps(spec),
                "seed": s,
                "val_ppl": ppl,
                "params_total": 1.5e6,
                "budget": 1.5e6,
            }
            for s, ppl in enumerate(ppls)
        ]
    return pd.DataFrame(rows)


def test_ranks_whose_intervals_overlap_are_marked_as_ties(tmp_path):
    # 95% t intervals (t(0.975, 2) = 4.303, s.e. 0.0577): a [9.85, 10.35] and b [10.15, 10.65]
    # overlap; c [11.85, 12.35] stands clear of b; d has one seed and no interval.
    board = build_board(
        tie_trials(
            {"a": [10.0, 10.1, 10.2], "b": [10.3, 10.4, 10.5], "c": [12.0, 12.1, 12.2], "d": [13.0]}
        )
    )
    (table,) = tables.leaderboard(board)
    assert table.columns[0].cells == ["=1", "=2", "3", "4"] and table.columns[0].keys.tolist() == [
        1,
        2,
        3,
        4,
    ]
    assert table.caption.endswith("; " + tables.TIE_NOTE)
    publish(board, ["md", "html"], out=tmp_path)
    md = (tmp_path / "leaderboard.md").read_text()
    assert (
        "| =1 | transformer |" in md
        and "| =2 | transformer |" in md
        and "| 3 | transformer |" in md
    )
    assert '"cells":[["=1","=2","3","4"]' in (tmp_path / "index.html").read_text()
    console = Console(record=True, width=250)
    report.terminal(board, tables.document(board), [], console)
    assert "│ =1 │" in console.export_text()


def test_rows_of_several_families_are_listed_in_rank_order(tmp_path):
    # The families alternate down the ranking: grouped by family, the rows would read =1, 3, =2, 4.
    board = build_board(
        tie_trials(
            {
                "a": [10.0, 10.1, 10.2],
                "b": [10.3, 10.4, 10.5],
                "c": [12.0, 12.1, 12.2],
                "d": [13.0],
            },
            families=("transformer", "looped"),
        )
    )
    (table,) = tables.leaderboard(board)
    assert table.columns[0].cells == ["=1", "=2", "3", "4"]
    assert table.columns[1].cells == ["transformer", "looped", "transformer", "looped"]
    (top,) = tables.leaderboard(board, top=3)
    assert top.columns[0].cells == ["=1", "=2", "3"]
    publish(board, ["md", "html"], out=tmp_path)
    md = (tmp_path / "leaderboard.md").read_text()
    ranked = [
        line.split(" | ")[0]
        for line in md.splitlines()
        if line.startswith(("| =", "| 1", "| 2", "| 3", "| 4"))
    ]
    assert ranked == ["| =1", "| =2", "| 3", "| 4"]
    assert (
        '"cells":[["=1","=2","3","4"],["transformer","looped","transformer","looped"]'
        in (tmp_path / "index.html").read_text()
    )
    console = Console(record=True, width=250)
    report.terminal(board, tables.document(board), [], console)
    text = console.export_text()
    assert (
        text.index("│ =1 │ transformer")
        < text.index("│ =2 │ looped")
        < text.index("│  3 │ transformer")
    )


def test_one_seed_marks_no_ties():
    board = build_board(tie_trials({"a": [10.0], "b": [10.0001], "c": [10.0002]}))
    (table,) = tables.leaderboard(board)
    assert table.columns[0].cells == ["1", "2", "3"] and tables.TIE_NOTE not in table.caption


def test_failed_trials_are_listed_and_never_ranked(board):
    trials = synthetic_trials("broad", shapes=3, seeds=3)
    bad = trials[trials["status"] != "ok"]
    assert sorted(board.excluded["trial_id"]) == sorted(bad["trial_id"])
    assert set(board.excluded["reason"]) == set(bad["status"])
    assert (
        board.excluded["error"].str.startswith(tuple(bad["status"])).all()
    )  # first line of the error
    assert board.candidates["val_ppl"].notna().all()


def test_ok_trial_without_a_metric_is_kept_off_with_its_reason():
    trials = synthetic_trials("nan", shapes=1, seeds=1, budgets=(30e6,), statuses={"ok": 1.0})
    trials.loc[0, "val_ppl"] = float("nan")
    board = build_board(trials)
    assert board.excluded["reason"].tolist() == ["ok, but val_ppl is not finite"]
    assert len(board.candidates) == len(trials) - 1


def test_ranks_and_frontier_flags(board):
    c = board.candidates
    for _, band in c.groupby("band"):
        assert band.loc[band["val_ppl"].idxmin(), "rank"] == 1
        assert sorted(band["rank"]) == list(range(1, len(band) + 1))
    # The extremes of each objective cannot be dominated; the overall front lies on family fronts.
    assert c.loc[c["val_ppl"].idxmin(), "front"] and c.loc[c["params_total"].idxmin(), "front"]
    assert (c["family_front"] | ~c["front"]).all() and not c["front"].all()


def test_missing_objective_and_only_failed_trials_are_plain_errors():
    trials = synthetic_trials("x", shapes=1, seeds=1, budgets=(30e6,))
    with pytest.raises(LeaderboardError, match="results lack column"):
        build_board(trials.drop(columns=["val_ppl"]))
    with pytest.raises(
        NoResults, match=r"none of the \d+ trials finished with finite params_total and val_ppl"
    ):
        build_board(trials.assign(status="failed"))


# --- hypervolume and comparison -----------------------------------------------------------------


def test_two_studies_share_one_reference_point(results):
    board = build_board(read_results([results / "broad", results / "sweep"]))
    hv = board.hypervolumes
    primary = hv[(hv["objectives"] == "params_total:min vs val_ppl:min") & (hv["family"] == "all")]
    assert list(primary["study"]) == ["broad", "sweep"]
    assert primary["reference"].nunique() == 1
    assert (primary["hypervolume"] > 0).all()


def test_user_reference_point_is_used_for_the_primary_objectives(board):
    ref = (2e8, 50.0)
    again = build_board(board.trials, Settings(ref=ref))
    row = again.hypervolumes.iloc[0]
    assert row["reference"] == ref and row["family"] == "all"


def test_a_better_study_has_the_larger_hypervolume():
    worse = synthetic_trials("worse", shapes=2, seeds=2, statuses={"ok": 1.0})
    better = worse.assign(study="better", val_ppl=worse["val_ppl"] * 0.95)
    board = build_board(pd.concat([worse, better], ignore_index=True))
    hv = (
        board.hypervolumes.query("family == 'all'")
        .drop_duplicates("study")
        .set_index("study")["hypervolume"]
    )
    assert hv["better"] > hv["worse"]


# --- the objectives the studies declared ----------------------------------------------------------


def declared_board(root: Path, **declarations) -> object:
    """A board of one small study per declaration (as the search writes it: _study.json beside
    the trials), read the way `shapebench board` reads them."""
    for i, (name, info) in enumerate(declarations.items()):
        folder = write_study(
            root,
            synthetic_trials(
                name, shapes=1, seeds=2, budgets=(30e6,), seed=i, statuses={"ok": 1.0}
            ),
        )
        if info is not None:
            write_study_info(folder, info)
    studies = find_studies([root])
    return build_board(read_studies(studies), Settings(), read_declarations(studies))


def test_the_board_ranks_by_the_objectives_the_study_declared(tmp_path):
    board = declared_board(
        tmp_path, quick={"objectives": [["val_loss", "min"], ["params", "min"]], "count": "total"}
    )
    # Cost first (x, the first plotted), quality last (y, what the board ranks by).
    assert (
        board.objectives == objectives("params_total", "val_loss")
        and board.metric.column == "val_loss"
    )
    for _, band in board.candidates.groupby("band"):
        assert band.sort_values("rank")["val_loss"].is_monotonic_increasing
    assert board.notes == ()
    assert board.hypervolumes["objectives"].iloc[0] == "params_total:min vs val_loss:min"
    # The other frontiers put their costs against the declared quality too.
    assert [" vs ".join(map(str, p)) for p in board.pairs] == [
        "params_total:min vs val_loss:min",
        "flops_per_token_train:min vs val_loss:min",
        "int4_bytes:min vs val_ppl_int4:min",
    ]
    line = tables.objectives_line(board)
    assert line.startswith(
        "Objectives parameters (params_total:min) vs validation loss (val_loss:min); "
        "ranked by validation loss within"
    )


def test_params_means_what_the_study_counts_and_one_objective_is_paired_with_it(tmp_path):
    board = declared_board(
        tmp_path, lean={"objectives": [["val_ppl", "min"]], "count": "non_embedding"}
    )
    assert board.objectives == (
        Objective(column="params_non_embedding"),
        Objective(column="val_ppl"),
    )


@pytest.mark.parametrize(
    "declarations, note",
    [
        (
            {"old": None, "older": None},
            "objectives params_total:min vs val_ppl:min, the default: no study declares "
            "its objectives (results written before _study.json)",
        ),
        (
            {
                "a": {"objectives": [["val_loss", "min"], ["params", "min"]]},
                "b": {"objectives": [["val_ppl", "min"], ["flops", "min"]]},
            },
            "objectives params_total:min vs val_ppl:min, the default: the studies declare different ones "
            "(a: params_total:min vs val_loss:min; b: flops_per_token_train:min vs val_ppl:min)",
        ),
        (
            {"a": {"objectives": [["val_loss", "min"], ["params", "min"]]}, "old": {}},
            "old declare(s) no objectives: ranked by those a declare(s)",
        ),
        (
            {"odd": {"objectives": [["bleu", "max"], ["params", "min"]]}},
            "odd declares objectives the leaderboard cannot use (unknown metric 'bleu'",
        ),
    ],
)
def test_studies_that_declare_none_or_differ_are_said(tmp_path, declarations, note):
    board = declared_board(tmp_path, **declarations)
    declared_loss = "old" in declarations and "a" in declarations
    assert board.objectives == (
        objectives("params_total", "val_loss") if declared_loss else DEFAULT
    )
    assert any(n.startswith(note) for n in board.notes), board.notes


def test_given_objectives_override_the_declared_ones(tmp_path):
    for_study = {"objectives": [["val_loss", "min"], ["params", "min"]]}
    board = declared_board(tmp_path, quick=for_study)
    again = build_board(
        board.trials.drop(columns=["candidate"]),
        Settings(objectives=objectives("flops", "val_ppl")),
        {"quick": for_study},
    )
    assert again.objectives == objectives("flops", "val_ppl") and again.metric.column == "val_ppl"
    with pytest.raises(
        LeaderboardError,
        match=r"--ref has 3 values for 2 objectives \(params_total:min vs val_loss:min\)",
    ):
        build_board(
            board.trials.drop(columns=["candidate"]),
            Settings(ref=(1.0, 2.0, 3.0)),
            {"quick": for_study},
        )


# --- the kept study: the page shows the search's structure strings --------------------------------


def test_the_page_shows_each_rows_structure_as_the_search_wrote_it():
    """Every row of a committed study (written by the search, whose summary and plan print
    ArchSpec.structure): the board's trials and candidates, and the page's table of trials,
    show the row's own `structure` string."""
    rows = pd.read_parquet(KEPT)
    assert len(rows) == 6 and rows["structure"].notna().all()
    for row in rows.itertuples():
        assert ArchSpec.from_dict(json.loads(row.spec)).structure() == row.structure
    studies = find_studies([KEPT])
    board = build_board(read_studies(studies), Settings(), read_declarations(studies))
    by_trial = dict(zip(rows["trial_id"], rows["structure"]))
    assert dict(zip(board.trials["trial_id"], board.trials["structure"])) == by_trial
    per_candidate = board.trials.groupby("candidate")["structure"].agg(set)
    assert all(
        per_candidate[c] == {s}
        for c, s in zip(board.candidates["candidate"], board.candidates["structure"])
    )
    html = page.page(board, tables.document(board), [], [])
    data = json.loads(html.split('id="trials"')[1].split('class="rows">')[1].split("</script>")[0])
    heads = [c.header for c in tables.trials(board).columns]
    shown = dict(zip(data["cells"][heads.index("Trial")], data["cells"][heads.index("Structure")]))
    assert shown == by_trial


# --- formats ------------------------------------------------------------------------------------


def test_every_format_is_written(board, tmp_path):
    written = publish(board, ["md", "csv", "latex", "html"], out=tmp_path)
    for fmt, name in FILES.items():
        assert tmp_path / name in written
    md = (tmp_path / "leaderboard.md").read_text()
    assert "## Budget 30M" in md and "## Budget 113M" in md and "2L→4L(×3)→2L" in md
    assert (
        "![Pareto frontier: validation perplexity vs parameters](plots/frontier_params_total_val_ppl.png)"
        in md
    )
    assert (
        "Objectives parameters (params_total:min) vs validation perplexity (val_ppl:min); ranked by validation "
        "perplexity within each budget band"
    ) in md
    csv = pd.read_csv(tmp_path / "leaderboard.csv")
    assert len(csv) == len(board.candidates) and {"val_ppl", "val_ppl_se", "front", "spec"} <= set(
        csv.columns
    )
    tex = (tmp_path / "leaderboard.tex").read_text()
    assert (
        tex.count(r"\toprule") == 3 and r"2L$\to$4L($\times$3)$\to$2L" in tex and "val\\_ppl" in tex
    )
    page = (tmp_path / "index.html").read_text()
    assert (
        all(t in page for t in board.trials["trial_id"])
        and "http://" not in page
        and "https://" not in page
    )
    for plot in (
        "frontier_params_total_val_ppl",
        "frontier_flops_per_token_train_val_ppl",
        "frontier_int4_bytes_val_ppl_int4",
        "frontier_by_family_params_total_val_ppl",
        "loops_eval",
    ):
        assert (tmp_path / "plots" / f"{plot}.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
        assert b"<svg" in (tmp_path / "plots" / f"{plot}.svg").read_bytes()[:2000]


def test_the_studies_table_counts_seeds():
    """One seed used to read "Seeds 0" (the seed's value under a header that reads as a count)."""
    one = build_board(synthetic_trials(seeds=1, statuses={"ok": 1.0}))
    three = build_board(synthetic_trials(seeds=3, statuses={"ok": 1.0}))
    cell = lambda b: tables.provenance(b).columns[4].cells[0]  # noqa: E731
    assert tables.provenance(one).columns[4].header == "Seeds"
    assert cell(one) == "1 (seed 0)" and cell(three) == "3 (seeds 0, 1, 2)"


def test_hyper_connection_diagnostics_are_shown_for_the_families_that_have_them(board, tmp_path):
    diag = tables.diagnostics(board)
    families = set(diag.columns[[c.header for c in diag.columns].index("Family")].cells)
    assert families == {"hyperloop", "mhc", "hc"}
    headers = [c.header for c in diag.columns]
    # Headed by the registry's labels and units.
    assert {
        "Stream cosine",
        "|H_res − I|",
        "Loop-embedding norm",
        "Saturated gates (fraction)",
    } <= set(headers)
    publish(board, ["md", "html"], out=tmp_path)
    md = (tmp_path / "leaderboard.md").read_text()
    assert "## Hyper-connection diagnostics" in md
    head, rule = md.split("## Hyper-connection diagnostics")[1].split("\n\n")[1].splitlines()[:2]
    assert "\\|H_res − I\\|" in head  # a header's pipes do not split columns
    assert head.replace("\\|", "").count("|") == rule.count("|")
    assert "<h2>Hyper-connection diagnostics</h2>" in (tmp_path / "index.html").read_text()
    plain = build_board(synthetic_trials().query("family in ['transformer', 'looped']"))
    assert len(tables.diagnostics(plain)) == 0
    publish(plain, ["html"], out=tmp_path / "plain")
    assert "Hyper-connection diagnostics" not in (tmp_path / "plain" / "index.html").read_text()


def test_plots_drawn_in_a_child_process_are_those_drawn_here(board, tmp_path, monkeypatch):
    """On Linux with two cores or more the plots are drawn in a forked process while the documents
    are written; on one core, in this process. The two must write the same files byte for byte."""
    forked = publish(board, ["md", "html"], out=tmp_path / "forked")
    monkeypatch.setattr(os, "cpu_count", lambda: 1)
    here = publish(board, ["md", "html"], out=tmp_path / "here")
    assert [p.relative_to(tmp_path / "forked") for p in forked] == [
        p.relative_to(tmp_path / "here") for p in here
    ]
    assert len(forked) == 2 + 2 * 5  # md, html, and 5 plots as PNG and SVG
    for a, b in zip(forked, here):
        assert a.read_bytes() == b.read_bytes(), a.name
    assert b'src="data:image/svg+xml;base64,' in (tmp_path / "here" / "index.html").read_bytes()
    assert (
        b'src="plots/' not in (tmp_path / "here" / "index.html").read_bytes()
    )  # every figure embedded


def test_a_plot_that_fails_in_the_child_is_reported_and_nothing_is_left_running(
    board, tmp_path, monkeypatch
):
    def broken(planned):
        raise ValueError("no such colour: mauve")

    monkeypatch.setattr(report.plots, "render_all", broken)
    with pytest.raises(
        RuntimeError,
        match=r"(?s)broken failed in a child process \(exit code 0\).*"
        r"ValueError: no such colour: mauve",
    ):
        publish(board, ["html"], out=tmp_path)
    assert multiprocessing.active_children() == []


def test_a_child_killed_by_a_signal_has_its_plots_drawn_here(board, tmp_path, monkeypatch):
    """A fork of a process whose thread pools do not survive fork can crash in them (seen:
    SIGSEGV in every drawing child under pytest-xdist): the plots are then drawn in this process."""
    drawn_here = report.plots.render_all

    def crashes_in_a_child(planned):
        if multiprocessing.parent_process() is not None:
            faulthandler.disable()  # pytest's handler would print the child's stack to the log
            os.kill(os.getpid(), signal.SIGSEGV)
        return drawn_here(planned)

    monkeypatch.setattr(report.plots, "render_all", crashes_in_a_child)
    written = publish(board, ["html"], out=tmp_path)
    assert len(written) == 1 + 2 * 5 and multiprocessing.active_children() == []


def test_a_document_that_fails_first_stops_the_drawing(board, tmp_path, monkeypatch):
    monkeypatch.setattr(report, "csv", lambda board: 1 / 0)
    with pytest.raises(ZeroDivisionError):
        publish(board, ["csv", "html"], out=tmp_path)
    assert multiprocessing.active_children() == []


def test_training_loop_sweep_gets_its_plot(results, tmp_path):
    board = build_board(read_results([results / "sweep"]))
    publish(board, ["md"], out=tmp_path)
    assert (tmp_path / "plots" / "loops_train.png").stat().st_size > 10_000


def test_missing_optional_columns_are_named(tmp_path):
    trials = synthetic_trials("lean", shapes=1, seeds=1, statuses={"ok": 1.0})
    trials = trials.drop(columns=["val_ppl_int4", "int4_bytes", "val_ppl_by_loops", "tokens_per_s"])
    publish(build_board(trials), ["md"], out=tmp_path)
    md = (tmp_path / "leaderboard.md").read_text()
    assert "frontier int4_bytes vs val_ppl_int4 skipped: no int4_bytes, val_ppl_int4" in md
    assert "loop-scaling plot (test-time loops) skipped: no val_ppl_by_loops in the results" in md
    assert "column Tok/s skipped: no tokens_per_s in the results" in md
    assert "| PPL (INT4) |" not in md


def test_table_renderers_escape_their_syntax():
    table = formats.Table(
        title="t",
        columns=[
            formats.Column(header="name", cells=["a|b", "x_1 & 50%"]),
            formats.Column(header="v", cells=["1", "—"], keys=[1.0, float("nan")]),
        ],
    )
    assert formats.markdown(table).splitlines()[2] == "| a\\|b | 1 |"
    assert r"x\_1 \& 50\% & ---" in formats.latex(table)
    html = formats.html_table(
        formats.Table(
            title="t",
            columns=[
                formats.Column(header="name", cells=["</script><script>alert(1)", "b", "c", "d"]),
                formats.Column(
                    header="v",
                    cells=["2.5", "—", "-1", "2.5"],
                    keys=np.array([2.5, np.nan, -1, 2.5]),
                ),
            ],
        ),
        "t1",
    )
    rows = html.split('<script type="application/json" class="rows">')[1].removesuffix("</script>")
    assert "</script>" not in rows
    assert json.loads(rows) == {
        "cells": [["</script><script>alert(1)", "b", "c", "d"], ["2.5", "—", "-1", "2.5"]],
        "keys": [None, [1, None, 0, 1]],
    }  # sort keys: dense ranks, null when missing


def test_numbers_print_as_papers_print_them():
    values = np.array([135.7e6, 1.0745e9, 786e3, 12, float("nan")])
    assert tables.counts(values) == ["135.7M", "1.075B", "786K", "12", "—"]


# --- the command line ---------------------------------------------------------------------------


def run_cli(*args, cwd=ROOT):
    return subprocess.run(
        [sys.executable, str(ROOT / "leaderboard.py"), *map(str, args)],
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=120,
    )


@pytest.mark.parametrize("case", ["missing", "empty", "no_trials", "only_failed"])
def test_cli_says_plainly_when_there_is_nothing_to_show(tmp_path, case):
    folder = tmp_path / "results"
    if case == "empty":
        folder.mkdir()
    if case == "no_trials":
        (folder / "study" / "trials").mkdir(parents=True)
    if case == "only_failed":
        write_study(folder, synthetic_trials("dead", shapes=1, seeds=1, statuses={"failed": 1.0}))
    done = run_cli(folder)
    assert done.returncode == 2
    assert len(done.stderr.strip().splitlines()) == 1 and "Traceback" not in done.stderr
    assert done.stderr.startswith("shapebench board: no results")


def load_cli():
    """`shapebench board`, run in-process (the subprocess tests above already pay the start-up)."""
    from benchmark.leaderboard import command as cli

    return cli


def test_cli_prints_markdown_and_writes_a_site(results, tmp_path, capsys):
    cli = load_cli()
    assert cli.main([str(results), "--study", "broad", "--format", "md", "--top", "2"]) == 0
    out = capsys.readouterr().out
    assert out.startswith("# Leaderboard: broad")
    bands = [section.split("\n\n_")[0] for section in out.split("## Budget ")[1:]]
    ranks = {
        line.split("|")[1].strip().lstrip("=") for band in bands for line in band.splitlines()[4:]
    }
    assert len(bands) == 2 and ranks == {"1", "2"}  # --top 2 (a tie marked "=2" is rank 2)
    assert (
        cli.main(
            [
                str(results),
                "--x",
                "flops",
                "--y",
                "val_ppl",
                "--format",
                "html",
                "--out",
                str(tmp_path),
            ]
        )
        == 0
    )
    assert (tmp_path / "index.html").exists() and not (tmp_path / "leaderboard.md").exists()
    with pytest.raises(SystemExit):
        cli.main([str(results), "--format", "pdf"])


@pytest.mark.parametrize(
    "args, expect",
    [
        ([KEPT], "Budget 1.5M"),  # the README's first command
        (
            [KEPT, "--x", "params", "--y", "val_ppl", "--format", "md"],
            "ranked by validation perplexity",
        ),
        (
            [KEPT, "--objectives", "flops,ppl", "--format", "md"],
            "Objectives training FLOPs per token (flops_per_token_train:min) vs validation perplexity",
        ),
        (
            [
                fixture_study("quickstart-original-families"),
                KEPT,
                "--format",
                "md",
            ],
            "# Leaderboard: quickstart-original-families, quickstart-faithful-families",
        ),
    ],
)
def test_the_readme_commands_run_on_the_kept_studies(args, expect, capsys):
    assert load_cli().main(list(map(str, args))) == 0
    assert expect in capsys.readouterr().out


def test_format_all_writes_every_file(tmp_path, capsys):
    assert load_cli().main([str(KEPT), "--format", "all", "--out", str(tmp_path)]) == 0
    assert all((tmp_path / name).stat().st_size for name in FILES.values())
    assert (tmp_path / "plots" / "frontier_by_family_params_total_val_ppl.png").exists()


def test_an_unknown_metric_is_refused_with_the_registrys_choices(capsys):
    with pytest.raises(SystemExit):
        load_cli().main([str(KEPT), "--y", "perplexity"])
    assert "unknown metric 'perplexity'; choose one of val_loss" in capsys.readouterr().err


# --- speed --------------------------------------------------------------------------------------


@pytest.mark.bench
def test_100k_rows_in_1000_files_every_format_under_5s(tmp_path):
    """100,000 trials (25,000 candidates x 4 seeds) in 1,000 files: read, rank, plot, write all."""
    budgets = (20e6, 30e6, 60e6, 113e6)
    trials = synthetic_trials("big", shapes=700, seeds=4, budgets=budgets).iloc[:100_000]
    write_study(tmp_path / "results", trials, rows_per_file=100)
    start, cpu = time.perf_counter(), time.process_time()
    board = build_board(read_results([tmp_path / "results"]))
    publish(board, ["md", "csv", "latex", "html"], out=tmp_path / "site")
    elapsed, cpu = time.perf_counter() - start, time.process_time() - cpu
    print(
        f"100k rows / 1000 files -> every format: {elapsed:.2f} s wall, {cpu:.2f} s CPU, "
        f"{len(board.candidates)} candidates"
    )
    assert elapsed < 5.0

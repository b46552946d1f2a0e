"""Leaderboard: finished studies -> seed-aggregated candidates ranked per budget band, Pareto
frontiers and hypervolumes, tables in every format, plots, and a self-contained page.

    studies = find_studies(["results"])             # label -> folder (a path, or a URI: s3://bucket/results)
    trials = read_studies(studies)                  # every trial of every study
    board = build_board(trials, Settings(), read_declarations(studies))  # ranked by the declared objectives
    publish(board, ["md", "html"], out=Path("site"))
    checked = load_claims("search_spaces/claims/quickstart.yaml")   # orderings the papers report
    publish(board, ["md"], predict=113e6, checked=(checked, evaluate_claims(checked, board.trials)))
    export_benchmark(board, Path("bench"))          # Syne Tune blackbox-repository layout
"""

from benchmark.leaderboard.board import Board, Settings
from benchmark.leaderboard.board import build as build_board
from benchmark.leaderboard.claims import ClaimsError
from benchmark.leaderboard.claims import evaluate as evaluate_claims
from benchmark.leaderboard.claims import load as load_claims
from benchmark.leaderboard.export import write as export_benchmark
from benchmark.leaderboard.loading import (
    LeaderboardError,
    NoResults,
    find_studies,
    read_declarations,
    read_results,
    read_studies,
    skipped_notes,
)
from benchmark.leaderboard.objectives import Objective
from benchmark.leaderboard.report import FORMATS, publish

__all__ = [
    "Board",
    "ClaimsError",
    "FORMATS",
    "LeaderboardError",
    "NoResults",
    "Objective",
    "Settings",
    "build_board",
    "evaluate_claims",
    "export_benchmark",
    "find_studies",
    "load_claims",
    "publish",
    "read_declarations",
    "read_results",
    "read_studies",
    "skipped_notes",
]

"""Leaderboard: finished studies -> seed-aggregated candidates ranked per budget band, Pareto
frontiers and hypervolumes, tables in every format, plots, and a self-contained page.

    studies = find_studies(["results"])             # label -> folder (a path, or a URI: s3://bucket/results)
    trials = read_studies(studies)                  # every trial of every study
    board = build_board(trials, Settings(), read_declarations(studies))  # ranked by the declared objectives
    publish(board, ["md", "html"], out=Path("site"))
"""

from benchmark.leaderboard.board import Board, Settings
from benchmark.leaderboard.board import build as build_board
from benchmark.leaderboard.objectives import Objective
from benchmark.leaderboard.report import FORMATS, publish
from benchmark.leaderboard.studies import (
           LeaderboardError,
           NoResults,
           find_studies,
           read_declarations,
           read_results,
           read_studies,
           skipped_notes,
)

__all__ = ["Board", "FORMATS", "LeaderboardError", "NoResults", "Objective", "Settings", "build_board",
           "find_studies", "publish", "read_declarations", "read_results", "read_studies",
           "skipped_notes"]

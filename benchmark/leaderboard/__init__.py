"""Leaderboard: finished studies -> seed-aggregated candidates ranked per budget band, Pareto
frontiers and hypervolumes, tables in every format, plots, and a self-contained page.

    trials = read_results(["results"])              # every trial of every study
    board = build_board(trials, Settings())         # candidates, bands, ranks, frontiers
    publish(board, ["md", "html"], out=Path("site"))
"""

from benchmark.leaderboard.board import Board, Settings
from benchmark.leaderboard.board import build as build_board
from benchmark.leaderboard.report import FORMATS, publish
from benchmark.leaderboard.studies import (
           LeaderboardError,
           NoResults,
           find_studies,
           read_results,
)

__all__ = ["Board", "FORMATS", "LeaderboardError", "NoResults", "Settings", "build_board", "find_studies",
           "publish", "read_results"]

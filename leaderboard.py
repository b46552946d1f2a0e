#!/usr/bin/env python
"""Frontiers, tables, plots and a published page from finished studies.

    python leaderboard.py                              every study under results/, in the terminal
    python leaderboard.py results/my-study --format md Markdown on stdout
    python leaderboard.py --format html --out site/    one self-contained page: site/index.html
    python leaderboard.py results/a results/b --out cmp/   two studies side by side, every format
    python leaderboard.py --objectives params,flops,val_ppl --ref 2e8,2e9,40
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmark.leaderboard import (
    FORMATS,
    LeaderboardError,
    Settings,
    build_board,
    publish,
    read_results,
)
from benchmark.leaderboard.frontier import Objective

FILE_FORMATS = [f for f in FORMATS if f != "terminal"]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    p = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("results", nargs="*", default=["results"], metavar="RESULTS_DIR",
                   help="a results root holding studies, or study folders (default: results)")
    p.add_argument("--study", action="append", default=[], metavar="NAME", help="only this study (repeatable)")
    p.add_argument("--x", default="params", help="first objective, COLUMN[:min|max] (default: params = params_total)")
    p.add_argument("--y", default="val_ppl", help="second objective, the ranking metric (default: val_ppl)")
    p.add_argument("--objectives", metavar="A,B[,C]", help="2 or 3 objectives; overrides --x/--y, ranks by the last")
    p.add_argument("--ref", metavar="V,V[,V]", help="hypervolume reference point for the objectives "
                   "(default: 1.1 x the worst value of each over all studies)")
    p.add_argument("--format", metavar="F[,F]", help=f"{', '.join(FORMATS)} or all "
                   "(default: terminal; with --out: every file format)")
    p.add_argument("--out", type=Path, metavar="DIR", help="write files (and plots/*.png, *.svg) here")
    p.add_argument("--tolerance", default="0.5%", help="params clustering into budget bands when the "
                   "results have no budget column (default: 0.5%%)")
    p.add_argument("--top", type=int, metavar="N", help="show the N best ranks per budget band")
    args = p.parse_args(argv)
    try:
        args.settings = Settings(
            objectives=tuple(map(Objective.parse, args.objectives.split(",") if args.objectives else [args.x, args.y])),
            ref=tuple(float(v) for v in args.ref.split(",")) if args.ref else None,
            tolerance=float(args.tolerance.rstrip("%")) / (100 if args.tolerance.endswith("%") else 1),
        )
    except (ValueError, LeaderboardError) as err:
        p.error(str(err))
    chosen = args.format.split(",") if args.format else (FILE_FORMATS if args.out else ["terminal"])
    args.formats = FILE_FORMATS if chosen == ["all"] else chosen
    if unknown := set(args.formats) - set(FORMATS):
        p.error(f"unknown format {', '.join(sorted(unknown))}; choose from {', '.join(FORMATS)} or all")
    return args


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        board = build_board(read_results(args.results, args.study), args.settings)
    except LeaderboardError as err:
        print(f"leaderboard: {err}", file=sys.stderr)
        return 2
    for path in publish(board, args.formats, args.out, args.top):
        print(f"wrote {path}", file=sys.stderr)
    return 0


if __name__ == "__main__":
    sys.exit(main())

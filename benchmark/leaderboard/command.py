"""The leaderboard's command line: `shapebench board`.

shapebench board                                 every study under results/, in the terminal,
                                                 ranked by the objectives the studies declared
shapebench board results/my-study --format md    Markdown on stdout
shapebench board --format html --out site/       one self-contained page: site/index.html
shapebench board results/a results/b --out cmp/  two studies side by side, every format
shapebench board --objectives params,flops,val_ppl --ref 2e8,2e9,40
shapebench board s3://bucket/results --format md studies under a URI pyarrow.fs opens
                                                 (credentials, endpoint: AWS_* environment)
shapebench board results/ladder --predict 113M   scaling fits over a budget ladder, predicted
                                                 (with intervals) at 113M parameters
shapebench board results/ladder --out site/      a ladder's decision accuracy (DataDecide): which pairs'
                                                 order at one budget holds at the next and the top, by
                                                 the declared loss (--y val_ppl: another) (+ decision.json)
shapebench board --claims search_spaces/claims/quickstart.yaml --out site/
                                                 the papers' orderings: reproduced, contradicted
                                                 or not decided at Holm-adjusted p < 0.05 (--adjust
                                                 bh | none), what each claim's arms differ in (+ claims.json)
shapebench board results/quickstart --export bench/   a tabular benchmark (Syne Tune's
                                                 blackbox-repository layout) in bench/quickstart/
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

from benchmark.leaderboard.bands import DEFAULT_TOLERANCE
from benchmark.leaderboard.board import Settings
from benchmark.leaderboard.board import build as build_board
from benchmark.leaderboard.claims import evaluate as evaluate_claims
from benchmark.leaderboard.claims import load as load_claims
from benchmark.leaderboard.curves import read_study_curves
from benchmark.leaderboard.export import write as export_benchmark
from benchmark.leaderboard.loading import (
    LeaderboardError,
    find_studies,
    read_declarations,
    read_studies,
    skipped_notes,
)
from benchmark.leaderboard.objectives import Objective, counted
from benchmark.leaderboard.report import FORMATS, publish
from benchmark.leaderboard.scaling import BY
from benchmark.leaderboard.stats import ADJUSTMENTS, DEFAULT_ADJUSTMENT
from benchmark.recipe import parse_amount
from benchmark.store import RESULTS_ROOT

FILE_FORMATS = [f for f in FORMATS if f != "terminal"]


def build_parser(prog: str = "shapebench board") -> argparse.ArgumentParser:
    p = argparse.ArgumentParser(
        prog=prog, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    p.add_argument(
        "results",
        nargs="*",
        default=[RESULTS_ROOT],
        metavar="RESULTS_DIR",
        help=f"a results root holding studies, or study folders; paths or URIs (default: {RESULTS_ROOT})",
    )
    p.add_argument(
        "--study", action="append", default=[], metavar="NAME", help="only this study (repeatable)"
    )
    p.add_argument(
        "--x",
        help="first objective, METRIC[:min|max], a metric registry name or alias "
        "(default: the studies' declared objectives; with --y only: params, the parameters the budget counts)",
    )
    p.add_argument("--y", help="second objective, the ranking metric (with --x only: val_ppl)")
    p.add_argument(
        "--objectives",
        metavar="A,B[,C]",
        help="2 or 3 objectives; overrides --x/--y, ranks by the last "
        "(default: those the studies declared, else params,val_ppl)",
    )
    p.add_argument(
        "--ref",
        metavar="V,V[,V]",
        help="hypervolume reference point for the objectives "
        "(default: 1.1 x the worst value of each over all studies)",
    )
    p.add_argument(
        "--format",
        metavar="F[,F]",
        help=f"{', '.join(FORMATS)} or all (default: terminal; with --out: every file format)",
    )
    p.add_argument(
        "--out", type=Path, metavar="DIR", help="write files (and plots/*.png, *.svg) here"
    )
    p.add_argument(
        "--tolerance",
        default=f"{DEFAULT_TOLERANCE:.1%}",
        help="params clustering into budget bands "
        "when the results have no budget column (default: %(default)s)",
    )
    p.add_argument("--top", type=int, metavar="N", help="show the N best ranks per budget band")
    p.add_argument(
        "--predict",
        metavar="PARAMS",
        help="predict each scaling fit's loss and rank at this many "
        "parameters, e.g. 113M (fits need a study with 3 or more budgets)",
    )
    p.add_argument(
        "--fit-by",
        choices=list(BY),
        default="family",
        help="one scaling fit per family, or per family and structure (default: family)",
    )
    p.add_argument(
        "--claims",
        type=Path,
        metavar="FILE",
        help="check the orderings a claims file lists "
        "(search_spaces/claims/*.yaml); with --out, also claims.json",
    )
    p.add_argument(
        "--adjust",
        choices=list(ADJUSTMENTS),
        default=DEFAULT_ADJUSTMENT,
        help="how the claims' p-values are "
        "adjusted for their number before a verdict is decided at 5%%: holm (the family-wise error "
        "rate), bh (Benjamini-Hochberg: the false discovery rate) or none (default: %(default)s)",
    )
    p.add_argument(
        "--export",
        type=Path,
        metavar="DIR",
        help="write each study as a tabular benchmark in "
        "Syne Tune's blackbox-repository layout to DIR/<study>/",
    )
    return p


def parse_args(argv: list[str] | None = None, prog: str = "shapebench board") -> argparse.Namespace:
    p = build_parser(prog)
    args = p.parse_args(argv)
    try:
        args.target = float(parse_amount(args.predict)) if args.predict else None
    except ValueError as err:
        p.error(f"--predict: {err}")
    given = (
        args.objectives.split(",") if args.objectives else [args.x or "params", args.y or "val_ppl"]
    )
    args.objective_texts = given if args.objectives or args.x or args.y else None
    try:
        settings(args)  # the names are checked now; `params` is resolved once the studies are read
    except (ValueError, LeaderboardError) as err:
        p.error(str(err))
    chosen = args.format.split(",") if args.format else (FILE_FORMATS if args.out else ["terminal"])
    args.formats = FILE_FORMATS if chosen == ["all"] else chosen
    if unknown := set(args.formats) - set(FORMATS):
        p.error(
            f"unknown format {', '.join(sorted(unknown))}; choose from {', '.join(FORMATS)} or all"
        )
    return args


def settings(args: argparse.Namespace, count: str = "total") -> Settings:
    """`count`: which parameters `params` names (the studies' budget count)."""
    texts = args.objective_texts
    return Settings(
        objectives=tuple(Objective.parse(t, count) for t in texts) if texts else None,
        ref=tuple(float(v) for v in args.ref.split(",")) if args.ref else None,
        tolerance=float(args.tolerance.rstrip("%")) / (100 if args.tolerance.endswith("%") else 1),
    )


def main(argv: list[str] | None = None, prog: str = "shapebench board") -> int:
    args = parse_args(argv, prog)
    try:
        claims = (
            load_claims(args.claims) if args.claims else None
        )  # a broken file fails before any reading
        studies = find_studies(args.results, args.study)
        declared = read_declarations(studies)
        skipped: dict[str, list[str]] = {}
        trials = read_studies(studies, skipped)
        for path in (p for files in skipped.values() for p in files):
            print(f"{prog}: {path}: not a readable Parquet file; skipped", file=sys.stderr)
        board = build_board(
            trials,
            settings(args, counted(declared)[0]),
            declared,
            skipped_notes(studies, skipped, declared),
        )
        checked = (
            (claims, evaluate_claims(claims, board.trials, args.adjust, declared, board.tuning))
            if claims
            else None
        )
        curves = (
            read_study_curves(studies, board.trials)
            if claims and (args.out or "html" in args.formats)
            else None
        )
        exported = export_benchmark(board, args.export) if args.export else []
    except LeaderboardError as err:
        print(f"{prog}: {err}", file=sys.stderr)
        return 2
    for path in [
        *exported,
        *publish(
            board,
            args.formats,
            args.out,
            args.top,
            predict=args.target,
            fit_by=args.fit_by,
            checked=checked,
            curves=curves,
        ),
    ]:
        print(f"wrote {path}", file=sys.stderr)
    return 0

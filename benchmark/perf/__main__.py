"""`shapebench perf`'s command line (the package docstring says what it measures); `python -m
benchmark.perf` runs it too."""

from __future__ import annotations

import argparse

import benchmark.perf as perf
from benchmark.arch import FAMILIES, STREAM_DTYPES
from benchmark.recipe import PRECISIONS

# `scale` times each path at the execution policy's own choice ("default") or at a fixed precision.
SCALE_PRECISIONS = ("default", *(p for p in PRECISIONS if p != "auto"))


def _setting(text: str) -> tuple[str, object]:
    import yaml

    key, sep, value = text.partition("=")
    if not sep or not key.strip():
        raise argparse.ArgumentTypeError(
            f"expected KEY=VALUE such as shape.layers=12, got {text!r}"
        )
    return key.strip(), yaml.safe_load(value)


def main(argv: list[str] | None = None, prog: str = "shapebench perf") -> int:
    ap = argparse.ArgumentParser(
        prog=prog, description=perf.__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    ap.add_argument("what", choices=["models", "scale"])
    ap.add_argument(
        "space",
        nargs="?",
        default="search_spaces/default.yaml",
        help="scale: the space (default: %(default)s)",
    )
    ap.add_argument(
        "--steps",
        type=int,
        help="timed steps per family and path (models: at most, default 60; scale: 8)",
    )
    ap.add_argument(
        "--minutes",
        type=float,
        default=9.0,
        help="models: time budget; 0 times every step (default: %(default)s)",
    )
    ap.add_argument(
        "--families", help="comma-separated families (models: all; scale: transformer,hyperloop)"
    )
    ap.add_argument("--budget", help="scale: the budget (default: the space's)")
    ap.add_argument(
        "--set",
        type=_setting,
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="scale: an axis value, e.g. shape.layers=12 (default: each range's middle, each choice's first)",
    )
    ap.add_argument(
        "--precisions",
        default="default",
        help=f"scale: comma-separated: {', '.join(SCALE_PRECISIONS)}",
    )
    ap.add_argument(
        "--stream-dtypes",
        default="auto",
        help=f"scale: comma-separated hyper.stream_dtype values a hyper family runs at ({', '.join(STREAM_DTYPES)}; "
        "default: %(default)s)",
    )
    ap.add_argument("--seq-len", type=int, help="scale: sequence length (default: the space's)")
    ap.add_argument("--batch-size", type=int, help="scale: micro-batch (default: the space's)")
    args = ap.parse_args(argv)
    default = FAMILIES if args.what == "models" else ("transformer", "hyperloop")
    families = [f.strip() for f in (args.families or ",".join(default)).split(",") if f.strip()]
    unknown = set(families) - set(FAMILIES)
    if unknown:
        ap.error(f"unknown families: {', '.join(sorted(unknown))}")
    if args.what == "models":
        perf.run_models(families, args.steps or 60, args.minutes)
        return 0
    precisions = [p.strip() for p in args.precisions.split(",") if p.strip()]
    bad = set(precisions) - set(SCALE_PRECISIONS)
    if bad:
        ap.error(f"unknown precisions: {', '.join(sorted(bad))} ({', '.join(SCALE_PRECISIONS)})")
    streams = [s.strip() for s in args.stream_dtypes.split(",") if s.strip()]
    bad = set(streams) - set(STREAM_DTYPES)
    if bad or not streams:
        ap.error(f"unknown stream dtypes: {', '.join(sorted(bad))} ({', '.join(STREAM_DTYPES)})")
    perf.run_scale(
        args.space,
        args.budget,
        families,
        dict(args.set),
        precisions,
        args.steps or 8,
        args.seq_len,
        args.batch_size,
        streams,
    )
    return 0


if __name__ == "__main__":
    raise SystemExit(main())

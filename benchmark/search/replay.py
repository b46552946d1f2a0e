"""`shapebench replay ROW`: train one measured run again from its row alone and print its metrics
beside the row's. A row holds everything that decides its run (search/reuse.py's KEY: the model,
every training setting with its seed and tuned values, the quantisation, the data's and
tokenizer's identities, how batches drew, the hardware and its torch threads), so a run trained
again from it on the same machine and code gives the same numbers to the last digit, and one on
another CPU shows how far that machine's rounding moves it (fp32 kernels of another vector width
sum in another order). It answers a reviewer's "does this row reproduce?" and measures what a
change of machine does to a comparison, one run at a time.

The corpus and tokenizer are named as for the search that trained the row (--data, --tokenizer);
their identities must be the row's, else it trains nothing and says which differs. It trains at
the row's torch threads, in one process: a run of several workers is refused (its rounding
depends on their number). It writes nothing: --json prints the comparison for a script."""

from __future__ import annotations

import argparse
import json
import math
import sys
from pathlib import Path
from typing import Any, Mapping

from benchmark.data import DataConfig
from benchmark.search.preflight import OLD_SAMPLING

# what a replay compares: the row's measured results, where the row has them
METRICS = (
    "train_loss",
    "val_loss",
    "val_loss_r1",
    "val_loss_r2",
    "val_loss_r4",
    "val_loss_r8",
    "val_ppl_int4",
    "int4_ppl_increase",
    "tokens_trained",
)


class ReplayError(ValueError):
    """A row that cannot be trained again here as it was: the message says which column and why."""


def read_row(path: str | Path) -> dict[str, Any]:
    from benchmark.store import read_files

    rows = read_files([str(path)], skipped=[])
    if len(rows) != 1:
        raise ReplayError(f"{path}: expected one row (a study's trials/<name>.a<N>.parquet)")
    row = rows[0]
    if (row.get("world_size") or 1) > 1:
        raise ReplayError(
            f"{path}: world_size {row['world_size']}: a run of several workers, which a replay "
            "in one process would not be"
        )
    for column in ("spec", "training", "dataset_id", "tokenizer_id", "hardware"):
        if not row.get(column):
            raise ReplayError(f"{path}: column {column!r} is empty; its run cannot be made again")
    return row


def threads(row: Mapping[str, Any]) -> int:
    """The torch threads the row's run trained with, from its `hardware`."""
    from benchmark.store.provenance import machine_threads

    found = machine_threads(row["hardware"])
    if found is None:
        raise ReplayError(f"hardware {row['hardware']!r} does not say its torch threads")
    return found


def data_config(
    row: Mapping[str, Any], path: str | Path, source: str, tokenizer: str, cache: str | None
):
    """The DataConfig the row's run read: the corpus and tokenizer named, the row's sampling (a row
    from before the column drew with replacement, as search/reuse.py's KEY reads it) and the
    document cap its study declared."""
    from benchmark.store.declaration import read_study_info

    declared = read_study_info(str(Path(path).parent.parent)).get("data") or {}
    return DataConfig(
        source=source,
        tokenizer=tokenizer,
        cache_dir=cache,
        max_docs=declared.get("max_docs"),
        sampling=row.get("sampling") or OLD_SAMPLING,
    )


def check_data(row: Mapping[str, Any], data) -> None:
    for column, here in (
        ("dataset_id", data.dataset_id),
        ("tokenizer_id", data.tokenizer.tokenizer_id),
    ):
        if row[column] != here:
            raise ReplayError(
                f"{column}: the row's is {row[column]!r}, --data/--tokenizer give {here!r}: "
                "name the corpus and tokenizer its search trained on"
            )


def replay(row: Mapping[str, Any], data) -> dict[str, Any]:
    """The row's run trained again here (trial/run.py run_trial): its new row."""
    import torch

    from benchmark.arch import ArchSpec
    from benchmark.recipe import QuantizeConfig, TrainConfig
    from benchmark.trial.run import run_trial

    check_data(row, data)
    spec = ArchSpec.from_dict(json.loads(row["spec"]))
    cfg = TrainConfig(**json.loads(row["training"]))
    quantize = QuantizeConfig(**json.loads(row["quantize"])) if row.get("quantize") else None
    before = torch.get_num_threads()
    torch.set_num_threads(threads(row))
    try:
        return run_trial(spec, cfg, data=data, quantize=quantize)
    finally:
        torch.set_num_threads(before)


def compared(row: Mapping[str, Any], new: Mapping[str, Any]) -> list[dict[str, Any]]:
    """One line per metric the row has: its value, the replay's, their difference."""
    lines = []
    for metric in METRICS:
        was, now = row.get(metric), new.get(metric)
        if was is None or (isinstance(was, float) and math.isnan(was)):
            continue
        diff = None if now is None else now - was
        lines.append({"metric": metric, "row": was, "replay": now, "difference": diff})
    return lines


def sides(row: Mapping[str, Any], new: Mapping[str, Any]) -> dict[str, dict[str, Any]]:
    """What trained each: the row's hardware, code and status, and the replay's."""
    keys = ("hardware", "code_version", "status")
    return {"trained": {k: row.get(k) for k in keys}, "replayed": {k: new.get(k) for k in keys}}


def report(row: Mapping[str, Any], new: Mapping[str, Any]) -> str:
    who = sides(row, new)
    head = [
        f"{row['study']} {row['trial_id']} (attempt {row['attempt']}), trained again",
        *(
            f"  {label:<8}{side['hardware']}, code {side['code_version']}, {side['status']}"
            for label, side in (("row:", who["trained"]), ("replay:", who["replayed"]))
        ),
        f"  {'metric':<18} {'row':>20} {'replay':>20} {'replay - row':>14}",
    ]
    lines = compared(row, new)
    body = [
        f"  {c['metric']:<18} {c['row']!r:>20} {c['replay']!r:>20} "
        + ("" if c["difference"] is None else f"{c['difference']:>+14.3g}")
        for c in lines
    ]
    same = all(c["difference"] == 0 for c in lines)
    tail = ["  the same to the last digit" if same else "  not the same run to the last digit"]
    return "\n".join(head + body + tail)


def parse(argv: list[str], prog: str) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=prog, description=__doc__.split("\n\n")[0])
    parser.add_argument("row", help="a row's file: RESULTS/STUDY/trials/<name>.a<N>.parquet")
    parser.add_argument(
        "--data", default=DataConfig.source, help="the corpus its search trained on (as search's)"
    )
    parser.add_argument(
        "--tokenizer", default=DataConfig.tokenizer, help="its tokenizer (as search's --tokenizer)"
    )
    parser.add_argument("--cache", default=None, help="where tokenised data is cached")
    parser.add_argument("--json", action="store_true", help="print the comparison as JSON")
    return parser.parse_args(argv)


def main(argv: list[str], prog: str = "shapebench replay") -> int:
    from benchmark.data import prepare

    args = parse(argv, prog)
    try:
        row = read_row(args.row)
        data = prepare(data_config(row, args.row, args.data, args.tokenizer, args.cache))
        new = replay(row, data)
    except (ReplayError, OSError) as e:
        print(f"{prog}: {e}", file=sys.stderr)
        return 2
    if args.json:
        print(json.dumps({"row": args.row, **sides(row, new), "metrics": compared(row, new)}))
    else:
        print(report(row, new))
    return 0

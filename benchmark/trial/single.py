"""`shapebench search --spec ARCH.yaml`: train and evaluate one architecture, with a progress bar,
and print its row."""

from __future__ import annotations

import sys

from rich.console import Console
from rich.progress import BarColumn, Progress, TextColumn, TimeElapsedColumn, TimeRemainingColumn
from rich.table import Table

from benchmark.data import DataConfig, prepare
from benchmark.recipe import QuantizeConfig, TrainConfig
from benchmark.space.archfile import load_arch
from benchmark.space.source import SpaceError
from benchmark.store.metrics import LOOP_LOSSES, PARAM_COLUMNS
from benchmark.trial.run import run_trial


def run_single(
    path: str,
    *,
    tokens: str | None,
    seed: int,
    policy: dict,
    data: DataConfig,
    checkpoint: str | None,
) -> int:
    """Train `path`'s architecture; `tokens` and `policy` (the command line's) over its `training:`.
    Exit code: 0 trained, 1 the trial failed (its row says why), 2 a problem with the file or flags."""
    try:
        arch = load_arch(path)
    except SpaceError as e:
        print(e, file=sys.stderr)
        return 2
    spec, training = arch.spec, dict(arch.training)
    try:
        if tokens:
            training["tokens"] = tokens
        cfg = TrainConfig.from_dict({**training, "seed": seed, **policy})
        quant = QuantizeConfig.from_dict(arch.quantize)
    except (ValueError, TypeError) as e:
        print(f"shapebench search: {e}", file=sys.stderr)
        return 2
    console = Console()
    console.print(
        f"{spec.family} {spec.structure()} d_model {spec.d_model}: preparing data ({data.source}, {data.tokenizer})"
    )
    prepared = prepare(data)
    cols = (
        TextColumn("{task.description}"),
        BarColumn(),
        TextColumn("{task.completed}/{task.total} steps"),
        TextColumn("loss {task.fields[loss]:.3f}"),
        TimeElapsedColumn(),
        TimeRemainingColumn(),
    )
    with Progress(*cols, console=console) as bar:
        task = bar.add_task("training", total=None, loss=float("nan"))
        row = run_trial(
            spec,
            cfg,
            data=prepared,
            checkpoint_dir=checkpoint,
            quantize=quant,
            on_step=lambda step, total, loss: bar.update(
                task, completed=step, total=total, loss=loss
            ),
        )
    _print_row(console, row)
    return 0 if row["status"] == "ok" else 1


def _print_row(console, row: dict) -> None:
    t = Table(
        title=f"{row['family']} {row.get('structure', '')}: {row['status']}", show_header=False
    )
    for key in (
        *PARAM_COLUMNS,
        "tokens_trained",
        "train_loss",
        "val_loss",
        "val_ppl",
        "val_ppl_unigram",
        "val_loss_by_source",
        "val_ppl_by_loops",
        *LOOP_LOSSES,
        "val_ppl_int8",
        "val_ppl_int4",
        "val_ppl_int4_rtn",
        "int4_ppl_increase",
        "int4_rtn_ppl_increase",
        "bf16_bytes",
        "int4_bytes",
        "tokens_per_s",
        "flops_per_s",
        "peak_mem_bytes",
        "wall_s",
        "dataset_id",
        "tokenizer_id",
        "code_version",
        "error",
    ):
        if row.get(key) is not None:
            v = row[key]
            t.add_row(
                key,
                f"{v:,.4g}" if isinstance(v, float) else f"{v:,}" if isinstance(v, int) else str(v),
            )
    console.print(t)

"""What a search keeps of its runs besides their rows, and its flags: each run's whole state
part-way (`--checkpoint-every`, trial/runstate.py), so that a run stopped by a lost worker, a
preempted node, Ctrl-C or `--time-budget` continues from its last save, removed once its row is
written unless `--keep-checkpoints`; the watchdog that ends a run making no step
(`--step-timeout`, trial/watchdog.py); and each run's final weights (`--save-weights`)."""

from __future__ import annotations

import argparse
from typing import Any, Callable

from benchmark.trial.runstate import DEFAULT_EVERY, parse_every, parse_limit

# a search's only (a plan refuses them); a plan has --runs-as-tasks of its own, for --workers
FLAGS = ("checkpoint_every", "keep_checkpoints", "save_weights", "step_timeout")


def checked(parse):
    """An argparse type that reports the parser's own message (the search's flags: command.py)."""

    def convert(text: str) -> str:
        try:
            parse(text)
        except ValueError as e:
            raise argparse.ArgumentTypeError(str(e)) from None
        return text

    return convert


def add_flags(add: Callable[..., None], runs_as_tasks: bool = True) -> None:
    """The flags, through the search parser's `add` (command._search_flags); `runs_as_tasks`
    False leaves out --runs-as-tasks (a plan's is schedule.add_flag's)."""
    add(
        "--checkpoint-every",
        type=checked(parse_every),
        help="each run saves its whole state this often, in steps (500) or time (10m), and a run "
        f"stopped part-way continues from it; off: never (default {DEFAULT_EVERY}; docs/clusters.md)",
    )
    add(
        "--step-timeout",
        type=checked(parse_limit),
        help="end a run that makes no step for this long (10m), to run again from its last save; "
        "off: never (default: 100 of its own steps, at least 10m; docs/clusters.md)",
    )
    add(
        "--keep-checkpoints",
        action="store_true",
        help="keep a finished run's saved state (<study>/_runstate/)",
    )
    add(
        "--save-weights",
        action="store_true",
        help="keep each run's final weights as safetensors (<study>/_checkpoints/<run>/)",
    )
    if runs_as_tasks:
        add(
            "--runs-as-tasks",
            action=argparse.BooleanOptionalAction,
            help="train each run (tuning run, final seed) as its own Ray task, side by side on as many "
            "GPUs as are free (the default where no run reports to Tune as it trains); "
            "--no-runs-as-tasks: a candidate's runs in turn inside its trial (docs/clusters.md)",
        )


def options(args: argparse.Namespace) -> dict[str, Any]:
    """SearchOptions' fields the flags set (runs as tasks only when given: its default is theirs)."""
    given = getattr(args, "runs_as_tasks", None)
    return {
        "checkpoint_every": getattr(args, "checkpoint_every", None),
        "keep_checkpoints": bool(getattr(args, "keep_checkpoints", False)),
        "checkpoints": bool(getattr(args, "save_weights", False)),
        "step_timeout": getattr(args, "step_timeout", None),
        **({"runs_as_tasks": given} if given is not None else {}),
    }

"""`shapebench`: one command for every tool of the benchmark.

    shapebench plan [SPACE.yaml] --budget 113M [--json]   the candidates a search would train; trains nothing
    shapebench search [SPACE.yaml] --budget 113M          run (or --resume) the search; --spec ARCH.yaml: one model
    shapebench board [RESULTS_DIR ...] --out site/        ranked tables, frontiers and the page of finished studies
    shapebench replay STUDY/trials/ROW.parquet            train a measured run again from its row; compare
    shapebench perf models|scale ...                      speed of the training path on this machine
    shapebench tasks OUT_DIR                              write the offline held-out tasks for lm-eval
    shapebench lmeval --model shapebench ...              lm-evaluation-harness on a saved checkpoint

`shapebench COMMAND --help` lists a command's flags. Each command's line lives beside what it
drives (search/command.py, search/replay.py, leaderboard/command.py, perf/__main__.py, tasks/__main__.py, lmeval.py),
which parses it once. `python run_search.py` and `python leaderboard.py` are aliases of `shapebench
search` (`plan` with --plan) and `shapebench board`; `python -m benchmark.perf|tasks|lmeval` run the
same commands as modules (lm-eval's own name for its model, `--model shapebench`, needs no script).
"""

from __future__ import annotations

import argparse
import sys
from collections.abc import Callable, Sequence
from dataclasses import dataclass

PROG = "shapebench"


@dataclass(frozen=True)
class Command:
    summary: str  # the line `shapebench --help` shows
    run: Callable[[list[str], str], int | None]  # (its arguments, its prog) -> exit code


# Each command imports its module when it runs, so that `shapebench plan` imports neither the
# leaderboard nor lm-eval (nor torch).
def _plan(argv: list[str], prog: str) -> int:
    from benchmark.search.command import plan_main

    return plan_main(argv, prog)


def _search(argv: list[str], prog: str) -> int:
    from benchmark.search.command import search_main

    return search_main(argv, prog)


def _board(argv: list[str], prog: str) -> int:
    from benchmark.leaderboard.command import main

    return main(argv, prog)


def _perf(argv: list[str], prog: str) -> int:
    from benchmark.perf.__main__ import main

    return main(argv, prog)


def _replay(argv: list[str], prog: str) -> int:
    from benchmark.search.replay import main

    return main(argv, prog)


def _tasks(argv: list[str], prog: str) -> int:
    from benchmark.tasks.__main__ import main

    main(argv, prog)
    return 0


def _lmeval(argv: list[str], prog: str) -> int:
    """lm-eval's own command line, which reads sys.argv itself, with the shapebench model registered."""
    from benchmark.lmeval import main

    saved = sys.argv
    sys.argv = [prog, *argv]
    try:
        main()
    finally:
        sys.argv = saved
    return 0


COMMANDS = {
    "plan": Command(
        "resolve a search space into candidates at a budget and print them; train nothing", _plan
    ),
    "search": Command("run or resume a search, or train one architecture with --spec", _search),
    "board": Command(
        "leaderboard: ranked tables, frontiers, scaling fits, claims, the HTML page", _board
    ),
    "replay": Command("train a measured run again from its row and compare the two", _replay),
    "perf": Command("speed of the training path on this machine", _perf),
    "tasks": Command("write the offline held-out lm-eval tasks", _tasks),
    "lmeval": Command("lm-evaluation-harness on a checkpoint; its flags are lm-eval's", _lmeval),
}


def build_parser() -> argparse.ArgumentParser:
    """The top level only: which command. Each command's own parser reads the rest."""
    parser = argparse.ArgumentParser(
        prog=PROG, description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter
    )
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        commands.add_parser(name, help=command.summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        args = build_parser().parse_args(
            argv
        )  # prints the help, or says which commands there are, and exits
        argv = argv[argv.index(args.command) :]  # unless the command came after a `--`
    name, rest = argv[0], argv[1:]
    return COMMANDS[name].run(rest, f"{PROG} {name}") or 0


if __name__ == "__main__":
    sys.exit(main())

"""`shapebench`: one command for every tool of the benchmark.

    shapebench plan [SPACE.yaml] --budget 113M [--json]   the candidates a search would train; trains nothing
    shapebench search [SPACE.yaml] --budget 113M          run (or --resume) the search; --spec ARCH.yaml: one model
    shapebench board [RESULTS_DIR ...] --out site/        ranked tables, frontiers and the page of finished studies
    shapebench perf models|scale ...                      speed of the training path on this machine
    shapebench tasks OUT_DIR                              write the offline held-out tasks for lm-eval
    shapebench lmeval --model shapebench ...              lm-evaluation-harness on a saved checkpoint

`shapebench COMMAND --help` lists a command's flags. Each command is parsed by the parser of the
entry point it stands for, which keeps working under its older name: `python run_search.py
[--plan]`, `python leaderboard.py`, `python -m benchmark.perf`, `python -m benchmark.tasks`,
`python -m benchmark.lmeval`.
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


def _plan(argv: list[str], prog: str) -> int:
    from benchmark import cli

    _search_parser(prog, plan=True).parse_args(argv)  # --help and flag errors under this command's name
    return cli.main([*argv, "--plan"])


def _search(argv: list[str], prog: str) -> int:
    from benchmark import cli

    _search_parser(prog, plan=False).parse_args(argv)
    return cli.main(argv)


def _search_parser(prog: str, plan: bool) -> argparse.ArgumentParser:
    """run_search.py's parser, showing only the flags that apply: a plan refuses the search's own."""
    from benchmark import cli

    parser = cli.build_parser()
    parser.prog = prog
    hidden = {"plan", *(cli.SEARCH_ONLY + ("spec", "checkpoint") if plan else ("json",))}
    for action in parser._actions:  # argparse has no public way to hide an inherited flag
        if action.dest in hidden:
            action.help = argparse.SUPPRESS
    if plan:
        parser.description = "Resolve and print the candidates a search would train; train nothing."
    return parser


def _board(argv: list[str], prog: str) -> int:
    from benchmark.leaderboard.command import main

    return main(argv, prog)


def _perf(argv: list[str], prog: str) -> int:
    from benchmark.perf.__main__ import main

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
    "plan": Command("resolve a search space into candidates at a budget and print them (run_search.py --plan)",
                    _plan),
    "search": Command("run or resume a search, or train one architecture with --spec (run_search.py)", _search),
    "board": Command("leaderboard: ranked tables, frontiers, scaling fits, claims, the HTML page (leaderboard.py)",
                     _board),
    "perf": Command("speed of the training path on this machine (python -m benchmark.perf)", _perf),
    "tasks": Command("write the offline held-out lm-eval tasks (python -m benchmark.tasks)", _tasks),
    "lmeval": Command("lm-evaluation-harness on a checkpoint; its flags are lm-eval's (python -m benchmark.lmeval)",
                      _lmeval),
}


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    commands = parser.add_subparsers(dest="command", metavar="COMMAND", required=True)
    for name, command in COMMANDS.items():
        commands.add_parser(name, help=command.summary, add_help=False)
    return parser


def main(argv: Sequence[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] not in COMMANDS:
        args = build_parser().parse_args(argv)  # prints the help, or says which commands there are, and exits
        argv = argv[argv.index(args.command):]  # unless the command came after a `--`
    name, rest = argv[0], argv[1:]
    return COMMANDS[name].run(rest, f"{PROG} {name}") or 0


if __name__ == "__main__":
    sys.exit(main())

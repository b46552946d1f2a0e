#!/usr/bin/env python
"""Frontiers, tables, plots and a published page from finished studies: `shapebench board`
under its older name (the flags and examples: benchmark/leaderboard/command.py, or --help).

    python leaderboard.py                              every study under results/, in the terminal
    python leaderboard.py --format html --out site/    one self-contained page: site/index.html
"""

import sys

from benchmark.leaderboard.command import main

if __name__ == "__main__":
    sys.exit(main())

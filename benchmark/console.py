"""The console every command prints its tables to."""

from __future__ import annotations

import sys

from rich.console import Console

PIPE_WIDTH = 200  # columns when not on a terminal


def console() -> Console:
    """A terminal's own width; piped or logged, PIPE_WIDTH columns, since rich would otherwise wrap
    every table to 80 and a log of a long run should keep each row on one line. Asked of stdout
    itself, not of rich's `is_terminal`, which FORCE_COLOR (colour in a CI log) turns on."""
    return Console() if sys.stdout.isatty() else Console(width=PIPE_WIDTH)

"""The console every command prints its tables to."""

from __future__ import annotations

from rich.console import Console

PIPE_WIDTH = 200  # columns when not on a terminal


def console() -> Console:
    """A terminal's own width; piped or logged, PIPE_WIDTH columns, since rich would otherwise wrap
    every table to 80 and a log of a long run should keep each row on one line."""
    out = Console()
    return out if out.is_terminal else Console(width=PIPE_WIDTH)

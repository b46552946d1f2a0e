"""Offline lm-eval tasks generated from held-out text (see heldout.py); `shapebench tasks`."""

from benchmark.tasks.heldout import make_tasks

__all__ = ["make_tasks"]

"""Why a search stopped before its trials were done, as one value every part of the search passes
on (the Tune callback, the searcher, the driver) and the command line turns into its message and
exit code. Finished rows are always kept; the message says how to go on."""

from __future__ import annotations

from dataclasses import dataclass

# kind -> the exit code of `shapebench search`: 3 the machine or the store failed (resume once it is
# fixed), 2 what was asked cannot run (change the flags), 130 the user stopped it (Ctrl-C: 128 +
# SIGINT, the shell's code for a command ended by it; so a loop over spaces stops there too).
EXIT_CODES = {"store_full": 3, "ray": 3, "storage": 3, "resources": 2, "interrupted": 130}
INTERRUPTED = "the user stopped it (Ctrl-C); the running trials were ended, finished rows are kept"


@dataclass(frozen=True)
class Halt:
    kind: str  # "store_full": the results disk is full; "resources": no trial can start on the
    message: str  # cluster; "ray": Ray could not start or lost its head node; "storage": the Optuna
    # study's database did not answer for --storage-wait, or no longer holds what the search wrote
    # (search/storage.py); "interrupted": the user stopped it (Ctrl-C), Ray Tune ending the running
    # trials

    def __post_init__(self):
        if self.kind not in EXIT_CODES:
            raise ValueError(f"unknown halt {self.kind!r}; one of {', '.join(EXIT_CODES)}")

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.kind]

    @property
    def resumable(self) -> bool:
        """Whether the same command with --resume goes on (once the cause, if any, is fixed)."""
        return self.kind != "resources"


class SearchHalted(RuntimeError):
    """run_search's way of saying it stopped early: carries the Halt, and the search's summary of
    what ran until then (a SearchSummary; None where it stopped before its trials)."""

    def __init__(self, halt: Halt, summary=None):
        super().__init__(halt.message)
        self.halt = halt
        self.summary = summary

    @property
    def kind(self) -> str:
        return self.halt.kind

"""Why a search stopped before its trials were done, as one value every part of the search passes
on (the Tune callback, the searcher, the driver) and the command line turns into its message and
exit code. Finished rows are always kept; the message says how to go on."""

from __future__ import annotations

from dataclasses import dataclass

# kind -> the exit code of `shapebench search`: 3 the machine or the store failed (resume once it is
# fixed), 2 what was asked cannot run (change the flags).
EXIT_CODES = {"store_full": 3, "ray": 3, "storage": 3, "resources": 2}


@dataclass(frozen=True)
class Halt:
    kind: str  # "store_full": the results disk is full; "resources": no trial can start on the
    message: str  # cluster; "ray": Ray could not start or lost its head node; "storage": the Optuna
    # study's database did not answer for --storage-wait (search/storage.py)

    def __post_init__(self):
        if self.kind not in EXIT_CODES:
            raise ValueError(f"unknown halt {self.kind!r}; one of {', '.join(EXIT_CODES)}")

    @property
    def exit_code(self) -> int:
        return EXIT_CODES[self.kind]

    @property
    def resumable(self) -> bool:
        """Whether the same command with --resume goes on once the cause is fixed."""
        return self.exit_code == 3


class SearchHalted(RuntimeError):
    """run_search's way of saying it stopped early: carries the Halt."""

    def __init__(self, halt: Halt):
        super().__init__(halt.message)
        self.halt = halt

    @property
    def kind(self) -> str:
        return self.halt.kind

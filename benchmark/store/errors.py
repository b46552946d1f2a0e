"""What can go wrong with results, in one place: the store's modules raise these, and the search and
the leaderboard catch them to say one plain line. Each message starts with the path or URI it is
about."""

from __future__ import annotations


class ResultsError(ValueError):
    """A result row or file that is not what the store writes."""


class ResultsPathError(ResultsError):
    """The results location cannot take results: missing, not a folder, read-only, unreachable."""


class ResultsWarning(UserWarning):
    """A file skipped while reading a study (damaged: truncated, emptied, overwritten)."""


class StoreFull(ResultsError):
    """A row could not be written because the disk (or quota) is full. `saved`: where the same
    bytes were kept instead (the fallback folder), or None: the row exists nowhere."""

    def __init__(self, path: str, needed: int, saved: str | None, detail: str = ""):
        self.path, self.needed, self.saved = path, needed, saved
        kept = f"the row was saved to {saved}" if saved else "the row was not saved anywhere"
        super().__init__(f"{path}: the disk is full ({needed} bytes needed); {kept}{detail}")

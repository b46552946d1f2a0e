"""Frozen studies the leaderboard tests read (imported as `fixture_studies`: pytest puts tests/ on
the path): verbatim copies of kept studies' rows under tests/fixtures/studies/, listed with their
origin in tests/fixtures/README.md. A record under results/ is a publication that may be
regenerated, extended or renamed; a test's input must not move when it does."""

from __future__ import annotations

from pathlib import Path

FIXTURES = Path(__file__).resolve().parent / "fixtures" / "studies"


def fixture_study(name: str) -> Path:
    """The folder of the frozen study `name` (its rows under trials/), as the leaderboard reads a
    study folder; the folder's name is the study's name."""
    folder = FIXTURES / name
    if not (folder / "trials").is_dir():
        known = ", ".join(sorted(p.name for p in FIXTURES.iterdir()))
        raise FileNotFoundError(f"{folder}: no such fixture study; there are {known}")
    return folder

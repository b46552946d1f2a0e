"""Find studies on disk and read their trials into one table.

A study is a folder holding `trials/*.parquet`, one file per finished trial attempt, as the
results store writes it (benchmark.store.results, which also reads a study), and, since studies
declare their objectives, `_study.json` (benchmark.store.study).
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd

from benchmark.store import results
from benchmark.store.study import read_study_info


class LeaderboardError(Exception):
    """A problem with the input that the user can fix; the CLI prints it as one line."""


class NoResults(LeaderboardError):
    pass


def find_studies(paths: Sequence[str | Path], names: Sequence[str] = ()) -> dict[str, Path]:
    """Study label -> folder. Each path is a study folder or a results root holding several."""
    found: dict[str, Path] = {}
    for root in map(Path, paths):
        if not root.is_dir():
            raise NoResults(f"no results: {root} does not exist")
        studies = [root] if results.trials_dir(root).is_dir() else sorted(
            p for p in root.iterdir() if results.trials_dir(p).is_dir())
        if not studies:
            raise NoResults(f"no results: {root} holds no study (expected {root}/<study>/trials/*.parquet)")
        for study in studies:
            found[_label(study, found)] = study
    if names:
        missing = [n for n in names if n not in found]
        if missing:
            raise NoResults(f"no study named {', '.join(missing)}; found: {', '.join(found)}")
        found = {n: found[n] for n in names}
    return found


def _label(study: Path, taken: dict[str, Path]) -> str:
    # Two roots may hold studies of the same name (a rerun); the parent folder tells them apart.
    return study.name if study.name not in taken else f"{study.parent.name}/{study.name}"


def read_studies(studies: dict[str, Path]) -> pd.DataFrame:
    """All trials of all studies; `study` is set to the study's label (its folder name)."""
    frames = []
    for label, folder in studies.items():
        try:
            table = results.read_table(folder)
        except results.ResultsError as err:
            raise LeaderboardError(str(err)) from err
        if table.num_rows:
            frame = table.to_pandas()
            frame["study"] = label
            frames.append(frame)
    if not frames:
        raise NoResults(f"no results: no finished trial in {', '.join(map(str, studies.values()))}")
    return pd.concat(frames, ignore_index=True)


def read_results(paths: Sequence[str | Path], names: Sequence[str] = ()) -> pd.DataFrame:
    """Every trial of the studies found under `paths` (see find_studies), as one table."""
    return read_studies(find_studies(paths, names))


def read_declarations(studies: dict[str, Path]) -> dict[str, dict]:
    """Study label -> what the study declared (its objectives, its parameter count); {} for a
    study written before studies declared anything."""
    return {label: read_study_info(folder) for label, folder in studies.items()}

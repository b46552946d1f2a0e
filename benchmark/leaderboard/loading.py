"""Find studies and read their trials into one table.

A study is a folder (local, or under a URI such as s3://bucket/results) holding `trials/*.parquet`,
one file per finished trial attempt, as the results store writes it (benchmark.store.results,
which also reads a study), and, since studies declare their objectives, `_study.json`
(benchmark.store.declaration). A damaged trial file does not hide its study: it is skipped, and the
board says which files and how to redo them (skipped_notes).
"""

from __future__ import annotations

import os
from collections.abc import Mapping, Sequence

import pandas as pd

from benchmark.store import ResultsError, location, read_study_info, results


class LeaderboardError(Exception):
    """A problem with the input that the user can fix; the CLI prints it as one line."""


class NoResults(LeaderboardError):
    pass


def find_studies(paths: Sequence[str | os.PathLike], names: Sequence[str] = ()) -> dict[str, str]:
    """Study label -> location. Each path (or URI) is a study folder or a results root holding
    several."""
    found: dict[str, str] = {}
    for root in map(_text, paths):
        try:
            if not location.is_dir(root):
                raise NoResults(f"no results: {root} does not exist")
            studies = (
                [root]
                if location.is_dir(results.trials_dir(root))
                else [
                    location.join(root, n)
                    for n in sorted(location.folders(root))
                    if location.is_dir(results.trials_dir(location.join(root, n)))
                ]
            )
        except OSError as err:
            raise LeaderboardError(f"{root}: {location.reason(err)}") from err
        if not studies:
            raise NoResults(
                f"no results: {root} holds no study (expected {root}/<study>/trials/*.parquet)"
            )
        for study in studies:
            found[_label(study, found)] = study
    if names:
        missing = [n for n in names if n not in found]
        if missing:
            raise NoResults(f"no study named {', '.join(missing)}; found: {', '.join(found)}")
        found = {n: found[n] for n in names}
    return found


def _text(path: str | os.PathLike) -> str:
    return path if location.is_uri(path) else os.fspath(path)


def _label(study: str, taken: dict[str, str]) -> str:
    # Two roots may hold studies of the same name (a rerun); the parent folder tells them apart.
    name = location.basename(study)
    return name if name not in taken else f"{location.basename(location.parent(study))}/{name}"


def read_studies(
    studies: Mapping[str, str], skipped: dict[str, list[str]] | None = None
) -> pd.DataFrame:
    """All trials of all studies; `study` is set to the study's label (its folder name). Damaged
    trial files are skipped: listed per study label in `skipped`, or, with no dict, warned of
    (ResultsWarning)."""
    frames = []
    for label, folder in studies.items():
        lost: list[str] | None = [] if skipped is not None else None
        try:
            table = results.read_table(folder, lost)
        except (ResultsError, OSError) as err:
            raise LeaderboardError(
                str(err) if isinstance(err, ResultsError) else f"{folder}: {location.reason(err)}"
            ) from err
        if lost:
            skipped[label] = lost
        if table.num_rows:
            frame = table.to_pandas()
            frame["study"] = label
            frames.append(frame)
    if not frames:
        raise NoResults(
            f"no results: no finished trial in {', '.join(map(str, studies.values()))}"
            + (f" ({sum(map(len, skipped.values()))} damaged files skipped)" if skipped else "")
        )
    return pd.concat(frames, ignore_index=True)


def skipped_notes(
    studies: Mapping[str, str], skipped: Mapping[str, list[str]], declared: Mapping[str, dict]
) -> list[str]:
    """One note per study with skipped files: how many, and the command that trains them again
    (a resumed search redoes the trials whose rows it cannot read)."""
    notes = []
    for label, files in skipped.items():
        folder = studies[label]
        space = declared.get(label, {}).get("space_file") or "SPACE.yaml"
        named = declared.get(label, {}).get("space")
        notes.append(
            f"{label}: {len(files)} unreadable trial file{'s' * (len(files) != 1)} skipped "
            f"({', '.join(location.basename(f) for f in files[:3])}{', ...' if len(files) > 3 else ''}); "
            f"redo with: shapebench search {space} --name {location.basename(folder)} "
            f"--results {location.parent(folder)} --resume"
            + (
                f" (SPACE.yaml: the file of space '{named}')"
                if named and space == "SPACE.yaml"
                else ""
            )
        )
    return notes


def read_results(paths: Sequence[str | os.PathLike], names: Sequence[str] = ()) -> pd.DataFrame:
    """Every trial of the studies found under `paths` (see find_studies), as one table."""
    return read_studies(find_studies(paths, names))


def read_declarations(studies: Mapping[str, str]) -> dict[str, dict]:
    """Study label -> what the study declared (its objectives, its parameter count); {} for a
    study written before studies declared anything."""
    return {label: read_study_info(folder) for label, folder in studies.items()}

"""Find studies on disk and read their trials into one table.

A study is a folder holding `trials/*.parquet`, one file per finished trial, written atomically:
names starting with `.` (temporary files mid-write) or `_` are skipped, as pyarrow's own dataset
reader does. Files are read one by one and concatenated with permissive schema promotion, so a
column missing from older files (or all-null in a failed trial) does not break the read.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path

import pandas as pd
import pyarrow as pa
import pyarrow.parquet as pq


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
        studies = [root] if (root / "trials").is_dir() else sorted(
            p for p in root.iterdir() if (p / "trials").is_dir())
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


def trial_files(study: Path) -> list[Path]:
    return sorted(p for p in (study / "trials").glob("*.parquet") if not p.name.startswith((".", "_")))


def read_study(study: Path) -> pa.Table | None:
    tables = [_read_trial(f) for f in trial_files(study)]
    return pa.concat_tables(tables, promote_options="permissive") if tables else None


def _read_trial(path: Path) -> pa.Table:
    # For files of a few kB, pyarrow's defaults cost more than the reading: read_table's dataset
    # discovery (2x), and pre-buffering, which hands each file to the IO thread pool (1.5x).
    try:
        return pq.ParquetFile(path, pre_buffer=False).read(use_threads=False)
    except (pa.ArrowInvalid, OSError) as err:
        raise LeaderboardError(f"{path}: not a readable Parquet file ({err})") from err


def read_studies(studies: dict[str, Path]) -> pd.DataFrame:
    """All trials of all studies; `study` is set to the study's label (its folder name)."""
    frames = []
    for label, folder in studies.items():
        table = read_study(folder)
        if table is not None:
            frame = table.to_pandas()
            frame["study"] = label
            frames.append(frame)
    if not frames:
        raise NoResults(f"no results: no finished trial in {', '.join(map(str, studies.values()))}")
    return pd.concat(frames, ignore_index=True)


def read_results(paths: Sequence[str | Path], names: Sequence[str] = ()) -> pd.DataFrame:
    """Every trial of the studies found under `paths` (see find_studies), as one table."""
    return read_studies(find_studies(paths, names))

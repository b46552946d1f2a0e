"""What a study declared, kept beside its rows: `<results>/<study>/_study.json`.

The search writes it when a study starts (and again on resume); the leaderboard reads it to rank
and label by the objectives the study declared, in the metric registry's names. The leading "_"
keeps it out of `pandas.read_parquet(<study>)`, as pyarrow skips such names.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from benchmark.store.atomic import atomic_open

STUDY_FILE = "_study.json"


def write_study_info(study_dir: str | Path, info: dict[str, Any]) -> Path:
    path = Path(study_dir) / STUDY_FILE
    with atomic_open(path) as f:
        json.dump(info, f, indent=1, sort_keys=True, default=str)
    return path


def read_study_info(study_dir: str | Path) -> dict[str, Any]:
    """The study's declaration, or {} for a folder without one (rows written by older versions)."""
    path = Path(study_dir) / STUDY_FILE
    try:
        return json.loads(path.read_text())
    except (OSError, ValueError):
        return {}

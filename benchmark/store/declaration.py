"""What a study declared, kept beside its rows: `<results>/<study>/_study.json`.

The search writes it when a study starts (and again on resume); the leaderboard reads it to rank
and label by the objectives the study declared, in the metric registry's names. The leading "_"
keeps it out of `pandas.read_parquet(<study>)`, as pyarrow skips such names. The study is a local
folder or a URI (store.location); either way the file is written whole.
"""

from __future__ import annotations

import json
import os
from typing import Any

from benchmark.store import location

STUDY_FILE = "_study.json"


def write_study_info(study_dir: str | os.PathLike, info: dict[str, Any]) -> str:
    path = location.join(study_dir, STUDY_FILE)
    location.write_bytes(path, json.dumps(info, indent=1, sort_keys=True, default=str).encode())
    return path


def read_study_info(study_dir: str | os.PathLike) -> dict[str, Any]:
    """The study's declaration, or {} for a folder without one (rows written by older versions)."""
    try:
        return json.loads(location.read_bytes(location.join(study_dir, STUDY_FILE)))
    except (OSError, ValueError):
        return {}

"""The `data:` settings of a trial: DataConfig, validated when it is made so that a bad source,
tokenizer or split names its key before any text is read, and `cache_root` and `cache_uri`, where
its cache_dir setting points."""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.data.sources import _local_files, source_kind
from benchmark.data.tokenizer import parse_spec
from benchmark.recipe import SAMPLINGS
from benchmark.store import ResultsPathError, check_results, is_uri

CACHE_ENV = "SHAPEBENCH_CACHE"
DEFAULT_CACHE = "~/.cache/shapebench"


@dataclass(frozen=True, kw_only=True)
class DataConfig:
    source: str = "embedded"  # see benchmark.data.sources
    tokenizer: str = "bpe"  # see benchmark.data.tokenizer
    # 2%: the smallest embedded part (bible, 1189 chapters) still gets ~25 held-out chapters.
    val_fraction: float = 0.02
    # Read only the first N documents of each part; None: the whole split (the space's
    # `data.max_docs`; an hf: source is read to its end, however long, unless this says otherwise).
    max_docs: int | None = None
    # A folder (default: $SHAPEBENCH_CACHE, else ~/.cache/shapebench), or a URI, the cache's copy
    # in the study's storage that each node downloads into its own (data/mirror.py).
    cache_dir: str | None = None
    # How training batches draw their windows (data/sampling.py): the space's `data.sampling`.
    sampling: str = "permutation"

    def __post_init__(self) -> None:
        if not isinstance(self.source, str):
            raise ValueError(f"data.source must be a string, got {self.source!r}")
        source_kind(self.source)
        parse_spec(self.tokenizer)
        if not _is_number(self.val_fraction) or not 0 < self.val_fraction <= 0.5:
            raise ValueError(f"data.val_fraction must be in (0, 0.5], got {self.val_fraction!r}")
        if self.sampling not in SAMPLINGS:
            raise ValueError(
                f"data.sampling must be one of {', '.join(SAMPLINGS)}, got {self.sampling!r}"
            )
        if self.max_docs is not None and not (
            _is_number(self.max_docs, int) and self.max_docs >= 1
        ):
            raise ValueError(
                f"data.max_docs must be a positive integer or null, got {self.max_docs!r}"
            )

    def checked(self) -> DataConfig:
        """Itself, or ValueError (one line) for a local source that matches no .txt/.jsonl/.parquet
        file. Asked where a command starts (a plan, a search), before anything is written; not in
        __post_init__, as a config is also made where the files are not (a worker reading the cache)."""
        if source_kind(self.source) == "local":
            try:
                _local_files(self.source)
            except FileNotFoundError as e:
                raise ValueError(str(e)) from None
        if cache_uri(self.cache_dir) is not None:
            try:  # a bucket that is missing or refuses writes, said now rather than after a build
                check_results(self.cache_dir)
            except ResultsPathError as e:
                raise ValueError(f"--cache {e}") from None
        return self


def _is_number(value: Any, kind: type | tuple[type, ...] = (int, float)) -> bool:
    return isinstance(value, kind) and not isinstance(value, bool)  # YAML `true` is not 1


def cache_root(override: str | os.PathLike | None = None) -> Path:
    """Where this node caches tokenizers, token arrays and Hub downloads: the argument, else
    $SHAPEBENCH_CACHE, else ~/.cache/shapebench. A URI is no folder: the node's own cache is then
    the default, and the URI its copy in the study's storage (cache_uri)."""
    if cache_uri(override) is not None:
        override = None
    return Path(override or os.environ.get(CACHE_ENV) or DEFAULT_CACHE).expanduser()


def cache_uri(override: str | os.PathLike | None) -> str | None:
    """The cache_dir setting when it is a URI (s3://, gs://, file://): the token cache every node
    downloads from (data/mirror.py); None for a folder."""
    return override if is_uri(override) else None

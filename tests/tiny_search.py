"""The tiny searches of the search, cluster, tuning and fault tests (imported as `tiny_search`:
pytest puts tests/ on the path): the `corpus` fixture (conftest.py) tokenised by a small BPE, as
`SearchOptions.data` and as the command line's flags, trained eagerly in float32."""

from __future__ import annotations

from pathlib import Path

from benchmark.data import DataConfig

TOKENIZER = "bpe:320"


def data(corpus: Path) -> DataConfig:
    """The corpus as a search's data, its token cache beside it (shared by the session's tests)."""
    return DataConfig(
        source=str(corpus / "text.txt"), tokenizer=TOKENIZER, cache_dir=str(corpus / "cache")
    )


def cli(corpus: Path) -> list[str]:
    """The same data and a fast, exact training policy as `shapebench search` flags."""
    return [
        "--data",
        str(corpus / "text.txt"),
        "--tokenizer",
        TOKENIZER,
        "--no-compile",
        "--precision",
        "fp32",
    ]

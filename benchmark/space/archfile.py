"""One architecture in a YAML file (`shapebench search --spec ARCH.yaml`): its keys as an ArchSpec,
and the optional `training:` and `quantize:` sections a space would hold, read by the same strict
loader and checked as a space's are, every error `path:line:col: key.path: what is wrong`."""

from __future__ import annotations

from dataclasses import dataclass
from pathlib import Path
from typing import Any

from benchmark.arch.spec import ArchSpec, SpecError
from benchmark.space.language import _Reader
from benchmark.space.source import Source, read_document


@dataclass(frozen=True)
class ArchFile:
    spec: ArchSpec
    training: dict[str, Any]  # as written; the trial fills its defaults
    quantize: dict[str, Any]


def load_arch(path: str | Path) -> ArchFile:
    """Read and validate an architecture file; raises SpaceError."""
    file = str(path)
    doc = read_document(path)
    src = Source(file, doc)
    if not isinstance(doc.data, dict):
        raise src.error(
            (),
            f"expected a mapping of architecture keys (family: ..., d_model: ...), "
            f"got a {type(doc.data).__name__}",
        )
    keys = {k: v for k, v in doc.data.items() if k not in ("training", "quantize")}
    try:
        spec = ArchSpec.from_dict(keys)
    except SpecError as e:
        raise src.error(tuple(e.key.split(".")) if e.key else (), e.reason, value=False) from None
    sections = _Reader(src, {k: doc.data.get(k) or {} for k in ("training", "quantize")})
    return ArchFile(spec, sections.training(), sections.quantize())

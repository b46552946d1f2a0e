"""Checkpoints: safetensors weights plus the spec and metadata as JSON (never pickles).

A checkpoint is a directory:
    model.safetensors   the state dict (tied weights stored once)
    spec.json           the resolved ArchSpec
    meta.json           training settings, step, tokenizer id, data id, anything the caller adds
    tokenizer.json      optional: the tokenizer, so the checkpoint is self-contained
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from safetensors.torch import load_file, save_file

from benchmark.arch import ArchSpec
from benchmark.models import LanguageModel, build_model
from benchmark.store import atomic_dir

WEIGHTS, SPEC, META, TOKENIZER = "model.safetensors", "spec.json", "meta.json", "tokenizer.json"


class CheckpointError(ValueError):
    pass


def save_checkpoint(
    path: str | Path,
    model: LanguageModel,
    meta: dict[str, Any] | None = None,
    tokenizer_json: str | None = None,
) -> Path:
    """Write atomically (store.atomic): a reader sees the whole checkpoint or none."""
    state = {k: v.detach().contiguous().cpu() for k, v in model.state_dict().items()}
    with atomic_dir(path) as tmp:
        save_file(state, str(tmp / WEIGHTS), metadata={"format": "pt"})
        (tmp / SPEC).write_text(model.spec.to_json())
        (tmp / META).write_text(json.dumps(meta or {}, indent=1, sort_keys=True, default=str))
        if tokenizer_json is not None:  # the serialised `tokenizers.Tokenizer`
            (tmp / TOKENIZER).write_text(tokenizer_json)
    return Path(path)


def load_checkpoint(
    path: str | Path, spec: ArchSpec | dict | None = None, device: str | torch.device = "cpu"
) -> tuple[LanguageModel, dict[str, Any]]:
    """Load a checkpoint; if `spec` is given it must match the stored one (else CheckpointError)."""
    path = Path(path)
    if not (path / WEIGHTS).is_file() or not (path / SPEC).is_file():
        raise CheckpointError(f"{path}: not a shapebench checkpoint (needs {WEIGHTS} and {SPEC})")
    stored = ArchSpec.from_dict(json.loads((path / SPEC).read_text()))
    if spec is not None:
        wanted = ArchSpec.from_dict(spec) if not isinstance(spec, ArchSpec) else spec
        if wanted != stored:
            diff = _diff(stored.to_dict(), wanted.to_dict())
            raise CheckpointError(
                f"{path}: checkpoint spec does not match the requested spec: {diff}"
            )
    model = build_model(stored)
    state = load_file(str(path / WEIGHTS))
    missing, unexpected = model.load_state_dict(state, strict=False)
    if missing or unexpected:
        raise CheckpointError(
            f"{path}: weights do not fit the spec (missing {missing[:3]}, unexpected {unexpected[:3]})"
        )
    meta = json.loads((path / META).read_text()) if (path / META).is_file() else {}
    return model.to(device).eval(), meta


def _diff(a: dict, b: dict, prefix: str = "") -> str:
    out = []
    for k in sorted(set(a) | set(b)):
        va, vb = a.get(k), b.get(k)
        if isinstance(va, dict) and isinstance(vb, dict):
            sub = _diff(va, vb, f"{prefix}{k}.")
            if sub:
                out.append(sub)
        elif va != vb:
            out.append(f"{prefix}{k} is {va!r} in the checkpoint, {vb!r} requested")
    return "; ".join(out)

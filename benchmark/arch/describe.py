"""An architecture spec, read back from a results row, as the columns papers tabulate (the
leaderboard's tables and the Optuna trial attributes both read it).

Hyperloop (Zeitoun et al., Table 1) writes a looped model as `2L→4L(×3)→2L`: begin layers, middle
layers times loops, end layers. The hourglass paper (Liao et al., Table 3) lists d_model, the FFN
hidden width d_h (the SwiGLU width for conventional FFNs), its sub-block count K and layers L.
"""

from __future__ import annotations

from dataclasses import fields

from benchmark.arch.presets import PRESETS
from benchmark.arch.spec import HyperSpec, LayerSplit, format_structure, is_looped

# Descriptor columns, in table order; every spec yields all of them (None where unknown).
COLUMNS = ("structure", "variant", "d_model", "d_h", "K", "L", "depth", "loops", "streams")
_HYPER_KEYS = {f.name for f in fields(HyperSpec)}


def describe(spec: dict) -> dict:
    layers = spec.get("layers") or {}
    begin, middle, end = (int(layers.get(k) or 0) for k in ("begin", "middle", "end"))
    if not (begin or middle or end):
        begin = int(layers.get("n") or 0)
    loops = int(spec.get("loops") or 1)
    d_model = spec.get("d_model")
    ffn = spec.get("ffn") or {}
    hourglass = ffn.get("kind") == "hourglass"
    return {
        "structure": format_structure(
            begin, middle, end, loops, _looped(spec, begin, middle, end, loops)
        ),
        "variant": variant(spec),
        "d_model": d_model,
        "d_h": _width(
            ffn, "d_h" if hourglass else "d_ff", "dh_ratio" if hourglass else "ratio", d_model
        ),
        "K": int(ffn.get("K") or 1) if hourglass else 1,
        "L": begin + middle + end,
        "depth": begin + middle * loops + end,
        "loops": loops,
        "streams": int((spec.get("hyper") or {}).get("streams") or 1),
    }


def _looped(spec: dict, begin: int, middle: int, end: int, loops: int) -> bool:
    """As ArchSpec.looped, from a row's spec (a resolved spec names its injection; a partial one
    takes its family preset's)."""
    injection = spec.get("injection") or PRESETS.get(spec.get("family"), {}).get(
        "injection", "none"
    )
    return is_looped(LayerSplit(begin=begin, middle=middle, end=end), loops, injection)


def variant(spec: dict) -> str | None:
    """What sets a model apart beyond its layers and widths: its hyper-connections (streams,
    mixing, placement) and per-loop LoRA, e.g. `4× diagonal / loop + loop emb.`, `LoRA r=8`."""
    hyper = spec.get("hyper")
    if hyper:
        # Rows written before `hyper.init` existed ran every stream alike (and, without
        # `hyper.read`, the delta read, HyperSpec's default): label them as what they ran.
        hyper = {"init": "symmetric", **hyper}
    parts = (
        [HyperSpec(**{k: v for k, v in hyper.items() if k in _HYPER_KEYS}).label] if hyper else []
    )
    if spec.get("lora_rank"):
        parts.append(f"LoRA r={spec['lora_rank']}")
    return ", ".join(parts) or None


def _width(ffn: dict, key: str, ratio_key: str, d_model) -> int | None:
    # A resolved spec carries the width; a preset may only carry its ratio to d_model.
    if ffn.get(key) is not None:
        return int(ffn[key])
    if ffn.get(ratio_key) is not None and d_model:
        return round(float(ffn[ratio_key]) * d_model)
    return None

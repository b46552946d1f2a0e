"""Derived-shape axes (`shape.*` in a search space): the layer count, its begin/middle/end split,
the unrolled depth, the width/depth ratio or the head width of a candidate, set on its ArchSpec
mapping before (or, for `shape.head_dim`, during) the budget solve.
"""

from __future__ import annotations

import math
from dataclasses import asdict
from typing import Any, Callable, Mapping

from benchmark.arch import SPEC_KEYS, ArchSpec, Key, LayerSplit, SpecError, is_looped
from benchmark.space.budget import BudgetError, Solution


def _even(head_dim: int) -> int:
    if head_dim % 2:
        raise ValueError(
            f"must be even (rotary embeddings turn pairs of dimensions), got {head_dim}"
        )
    return head_dim


SHAPE_KEYS = {
    key.name: key
    for key in (
        # Unique layers n, split by shape.middle_frac (default: the family preset's split, e.g.
        # Hyperloop's 2/4/2 = 25% / 50% / 25%, §4.1); begin takes the odd layer.
        Key(name="shape.layers", types=(int,), at_least=1),
        # The fraction of unique layers in the looped middle block.
        Key(name="shape.middle_frac", types=(float,), above=0, at_most=1),
        # The depth a token passes through (begin + middle x loops + end): a looped candidate gets
        # `loops` from it, a non-looped one that many layers. This is how the Hyperloop paper
        # depth-matches its Transformer baselines (Table 1, "Unrolled Depth") and keeps depth fixed
        # while restructuring the loop (Table 3).
        Key(name="shape.unrolled_layers", types=(int,), at_least=1),
        # d_model / L, L the unrolled depth (the layer count of a non-looped model, as in the hourglass
        # paper's Fig. 4 sweep): the layer count is searched so that the budget-solved d_model over L
        # lands nearest the target (fit_width_depth).
        Key(name="shape.d_model_per_layer", types=(float,), above=0),
        # Heads scale with the solved d_model (n_heads = d_model / head_dim, rounded; n_heads /
        # n_kv_heads keeps the GQA group). The papers fix head_dim = 64 at every scale; a fixed n_heads
        # would leave a 2M-parameter model 16 heads of width 6. Applied by the solver (budget.py).
        Key(name="shape.head_dim", types=(int,), at_least=1, parse=_even),
    )
}
_DEFAULT_LAYERS = asdict(SPEC_KEYS["layers"].default)


def layer_split(raw: Mapping[str, Any]) -> dict[str, int]:
    """The (preset-merged) layer split as begin/middle/end, accepting `layers: 12` and `layers.n`."""
    layers = raw.get("layers", _DEFAULT_LAYERS)
    if isinstance(layers, int):
        layers = {"n": layers}
    if "n" in layers:
        layers = {"begin": layers["n"]}
    return {k: layers.get(k, default) for k, default in asdict(LayerSplit()).items()}


def _loops_in_middle(raw: Mapping[str, Any]) -> bool:
    """Does the middle block repeat (ArchSpec.looped, before validation)?"""
    split = LayerSplit(**layer_split(raw))
    return is_looped(
        split, raw.get("loops", ArchSpec.loops), raw.get("injection", ArchSpec.injection)
    )


def split_layers(n: int, middle_frac: float) -> dict[str, int]:
    """n unique layers -> begin/middle/end with `middle_frac` of them (at least one) in the middle."""
    if middle_frac <= 0:
        return {"begin": n, "middle": 0, "end": 0}
    middle = min(n, max(1, math.floor(middle_frac * n + 0.5)))
    rest = n - middle
    return {"begin": rest - rest // 2, "middle": middle, "end": rest // 2}


def apply_shape(raw: Mapping[str, Any], shape: Mapping[str, Any]) -> dict[str, Any]:
    """`raw` (already merged over its family preset) with `shape.layers`, `shape.middle_frac` and
    `shape.unrolled_layers` applied as explicit layers / loops."""
    out = dict(raw)
    split = layer_split(raw)
    if "shape.layers" in shape or "shape.middle_frac" in shape:
        unique = sum(split.values())
        frac = shape.get("shape.middle_frac", split["middle"] / unique)
        out["layers"] = split = split_layers(shape.get("shape.layers", unique), frac)
    if "shape.unrolled_layers" in shape:
        depth = shape["shape.unrolled_layers"]
        if _loops_in_middle(out):
            b, m, e = split["begin"], split["middle"], split["end"]
            loops, left = divmod(depth - b - e, m)
            if left or loops < 1:
                raise SpecError(
                    "shape.unrolled_layers",
                    f"{depth} unrolled layers is not begin {b} + middle {m} "
                    f"x loops + end {e} for any whole number of loops",
                )
            out["loops"] = loops
        else:
            out["layers"] = {"begin": depth, "middle": 0, "end": 0}
    return out


def fit_width_depth(
    raw: Mapping[str, Any], shape: Mapping[str, Any], solve: Callable[[dict[str, Any]], Solution]
) -> Solution:
    """Search the unique layer count n so that the solved d_model / unrolled depth is nearest
    `shape.d_model_per_layer`. That ratio falls as n grows (more layers, narrower model), so a
    doubling bracket and bisection find the crossing; the nearer of its two sides wins."""
    target = shape["shape.d_model_per_layer"]
    if "shape.layers" in shape or "shape.unrolled_layers" in shape:
        raise SpecError(
            "shape.d_model_per_layer",
            "sets the number of layers itself; it cannot be combined "
            "with shape.layers or shape.unrolled_layers",
        )
    tried: dict[int, Solution | BudgetError] = {}

    def at(n: int) -> Solution | BudgetError:
        if n not in tried:
            try:
                tried[n] = solve(apply_shape(raw, {**shape, "shape.layers": n}))
            except BudgetError as e:  # too deep for the budget: treat as below any target
                tried[n] = e
        return tried[n]

    def ratio(s: Solution) -> float:
        return s.spec.d_model / s.spec.unrolled_layers()

    def narrow_enough(n: int) -> bool:
        s = at(n)
        return isinstance(s, BudgetError) or ratio(s) <= target

    hi = 1
    while not narrow_enough(hi):
        hi *= 2
    lo = hi // 2  # narrow_enough(lo) is False, or lo == 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if narrow_enough(mid) else (mid, hi)
    fits = [s for s in (at(hi), at(hi - 1) if hi > 1 else None) if isinstance(s, Solution)]
    if not fits:
        raise at(1)
    return min(fits, key=lambda s: abs(math.log(ratio(s) / target)))

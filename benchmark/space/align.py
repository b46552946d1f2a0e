"""Hardware-friendly shapes: a space's `align:`, read here and applied by the budget
solver (budget.py), which keeps d_model, head_dim and the FFN width on these multiples."""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class Align:
    """Hardware-friendly shapes (a space's `align:`): d_model, the FFN hidden width and head_dim
    as multiples of these. Tensor cores and flash attention serve multiples of 8 to 64 fast; a
    head_dim of 82 (what 113M solves to unaligned) is padded or sent to a slower kernel (measured
    on an H100: benchmarks/2026-11-24-perf-h100.md). The budget is still met within the tolerance: the solver
    searches the aligned lattice of (d_model, width) and the width absorbs the rounding."""

    d_model: int = 1
    ffn: int = 1
    head_dim: int = 2  # RoPE rotates pairs: an even head_dim in any case

    def __post_init__(self):
        for key in ALIGN_KEYS:
            v = getattr(self, key)
            if isinstance(v, bool) or not isinstance(v, int) or v < 1:
                raise ValueError(
                    f"align.{key}: expected a positive whole number such as 64, got {v!r}"
                )
        object.__setattr__(self, "head_dim", math.lcm(self.head_dim, 2))


ALIGN_KEYS = ("d_model", "ffn", "head_dim")


def parse_align(value: Any) -> Align:
    """`{d_model: 64, ffn: 64, head_dim: 8}` (any subset) -> Align; ValueError naming the key."""
    if not isinstance(value, Mapping):
        raise ValueError(
            f"expected a mapping such as {{d_model: 64, ffn: 64, head_dim: 8}}, got {value!r}"
        )
    unknown = [k for k in value if k not in ALIGN_KEYS]
    if unknown:
        raise ValueError(f"unknown key {unknown[0]!r}; align takes {', '.join(ALIGN_KEYS)}")
    return Align(**value)

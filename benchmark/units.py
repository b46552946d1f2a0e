"""Counts written the way people write them: 113M, 1.2B, 500K, 113_000_000, and multiples (20x)."""

from __future__ import annotations

import re

_SUFFIX = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}
_COUNT = re.compile(r"^\s*([0-9][0-9_]*(?:\.[0-9_]+)?)\s*([KMBGT]?)\s*$", re.IGNORECASE)
_MULTIPLE = re.compile(r"^\s*([0-9]+(?:\.[0-9]+)?)\s*x\s*$", re.IGNORECASE)


def parse_count(value: str | int | float, allow_multiple: bool = False) -> tuple[float, bool]:
    """'113M' -> (113e6, False); '20x' -> (20.0, True) when multiples are allowed."""
    if isinstance(value, bool):
        raise ValueError(f"expected a count like 113M, 1.2B, 500K or 113_000_000, got {value!r}")
    if isinstance(value, (int, float)):
        if value <= 0:
            raise ValueError(f"a count must be positive, got {value}")
        return float(value), False
    text = str(value)
    m = _MULTIPLE.match(text)
    if m and allow_multiple:
        return float(m.group(1)), True
    m = _COUNT.match(text)
    if not m:
        forms = "113M, 1.2B, 500K, 113_000_000" + (" or a multiple like 20x" if allow_multiple else "")
        raise ValueError(f"'{text}' is not a count (expected {forms})")
    n = float(m.group(1).replace("_", "")) * _SUFFIX[m.group(2).upper()]
    if n <= 0:
        raise ValueError(f"a count must be positive, got '{text}'")
    return n, False


def format_count(n: float) -> str:
    """113_000_000 -> '113M'; 1_234_567 -> '1.23M'."""
    for suffix, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.3g}{suffix}"
    return f"{n:g}"

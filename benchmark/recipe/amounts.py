"""Amounts: parameter and token counts as people write them (`113M`, `1.2B`, `113_000_000`), a
tolerance (`0.5%`), and training tokens as a multiple of a parameter count (`20x`) or an absolute
amount; and the short forms they print as. Torch-free, below the space language and the trial,
which both read them.
"""

from __future__ import annotations

from dataclasses import dataclass
from decimal import Decimal, InvalidOperation
from typing import Any

_SUFFIX = {"": 1, "K": 10**3, "M": 10**6, "B": 10**9, "T": 10**12}


def parse_amount(value: Any) -> int:
    """`113M`, `1.2B`, `500K`, `113_000_000`, 113000000 -> a positive int (exact: no float rounding)."""
    if isinstance(value, bool):
        raise ValueError(f"expected an amount like 113M, 1.2B or 500K, got {value!r}")
    text = str(value).strip().replace("_", "").upper()
    suffix = text[-1:] if text[-1:] in _SUFFIX else ""
    try:
        amount = Decimal(text[: len(text) - len(suffix)]) * _SUFFIX[suffix]
    except InvalidOperation:
        raise ValueError(f"expected an amount like 113M, 1.2B or 500K, got {value!r}") from None
    if amount != amount.to_integral_value() or amount <= 0:
        raise ValueError(f"expected a positive whole number, got {value!r}")
    return int(amount)


def parse_tolerance(value: Any) -> float:
    """`0.5%` or a fraction (0.005) -> 0.005; must be in (0, 1)."""
    text = str(value).strip()
    try:
        tol = float(text[:-1]) / 100 if text.endswith("%") else float(text)
    except ValueError:
        raise ValueError(
            f"expected a percentage like 0.5% or a fraction like 0.005, got {value!r}"
        ) from None
    if isinstance(value, bool) or not 0 < tol < 1:
        raise ValueError(f"must be between 0% and 100% (exclusive), got {value!r}")
    return tol


def parse_duration(text: str) -> float:
    """'30m' -> 1800.0; plain numbers are seconds."""
    units = {"s": 1, "m": 60, "h": 3600}
    t = text.strip().lower()
    try:
        return float(t[:-1]) * units[t[-1]] if t and t[-1] in units else float(t)
    except (ValueError, KeyError):
        raise ValueError(f"expected a duration like 90s, 30m or 2h, got {text!r}") from None


def fmt_count(n: float) -> str:
    """113_900_000 -> '113.9M' (four significant digits)."""
    for suffix, scale in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if abs(n) >= scale:
            return f"{n / scale:.4g}{suffix}"
    return f"{n:.0f}"


def fmt_fraction(x: float) -> str:
    return f"{x * 100:g}%"


@dataclass(frozen=True, kw_only=True)
class Tokens:
    """Training tokens: a multiple of a parameter count (`20x`, Chinchilla's 20 tokens per
    parameter as in AbbIE §3.2) or an absolute amount (`5M`)."""

    per_param: float | None = None
    absolute: int | None = None

    def resolve(self, params: int) -> int:
        return self.absolute if self.absolute is not None else int(round(self.per_param * params))

    def __str__(self) -> str:
        return f"{self.per_param:g}x" if self.absolute is None else fmt_count(self.absolute)


def parse_tokens(value: Any) -> Tokens:
    text = str(value).strip()
    if text.lower().endswith("x") and not isinstance(value, bool):
        try:
            mult = float(text[:-1])
        except ValueError:
            mult = -1.0
        if mult <= 0:
            raise ValueError(f"expected a multiple of the parameters like 20x, got {value!r}")
        return Tokens(per_param=mult)
    try:
        return Tokens(absolute=parse_amount(value))
    except ValueError:
        raise ValueError(
            f"expected 20x (tokens per parameter) or an amount like 5M, got {value!r}"
        ) from None

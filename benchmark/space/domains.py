"""Domains of a search space's axes (Syne Tune style: plain data): a choice, an integer or float
range, or a fixed value, each able to `suggest` itself to an Optuna trial (define-by-run) and to
list its `grid`; and how an axis entry of the file is read into one, with its `when` condition.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from benchmark.arch import did_you_mean
from benchmark.space.expr import Condition, ExprError, parse_condition
from benchmark.space.keys import checked, value_kind
from benchmark.space.source import Source

DOMAIN_KEYS = ("choice", "int", "float", "logfloat", "value", "step", "log", "when")


def _label(value: Any) -> Any:
    """Optuna's categorical choices are scalars; other values (lists) travel as their text."""
    return value if value is None or isinstance(value, (bool, int, float, str)) else repr(value)


@dataclass(frozen=True, kw_only=True)
class Choice:
    values: tuple[Any, ...]

    def suggest(self, trial, name: str) -> Any:
        labels = [_label(v) for v in self.values]
        return self.values[labels.index(trial.suggest_categorical(name, labels))]

    def grid(self) -> list[Any]:
        return list(self.values)


@dataclass(frozen=True, kw_only=True)
class IntRange:
    lo: int
    hi: int
    step: int = 1
    log: bool = False

    def suggest(self, trial, name: str) -> int:
        return trial.suggest_int(name, self.lo, self.hi, step=self.step, log=self.log)

    def grid(self) -> list[int]:
        return list(range(self.lo, self.hi + 1, self.step))


@dataclass(frozen=True, kw_only=True)
class FloatRange:
    lo: float
    hi: float
    log: bool = False

    def suggest(self, trial, name: str) -> float:
        return trial.suggest_float(name, self.lo, self.hi, log=self.log)

    def grid(self) -> None:
        return None  # infinite: a float axis makes the space sampled, not enumerated


@dataclass(frozen=True, kw_only=True)
class Fixed:
    value: Any

    def suggest(self, trial, name: str) -> Any:
        return self.value  # not a decision: Optuna never sees it

    def grid(self) -> list[Any]:
        return [self.value]


Domain = Choice | IntRange | FloatRange | Fixed


@dataclass(frozen=True, kw_only=True)
class Axis:
    key: str  # a dotted ArchSpec key, a shape.* key, or "variant"
    domain: Domain
    when: Condition | None = None


# ---- reading an axis entry ----------------------------------------------------------------


def read_domain(src: Source, path: tuple, key: str, spec: Any) -> tuple[Domain, Condition | None]:
    """`[a, b]`, a scalar, or `{choice | int | float | logfloat | value: .., step, log, when}`."""
    if isinstance(spec, list):
        return _choice(src, path, key, spec), None
    if not isinstance(spec, dict):
        return Fixed(value=checked(src, path, key, spec)), None
    for k in spec:
        if k not in DOMAIN_KEYS:
            raise src.error(path + (k,), f"unknown key{did_you_mean(k, DOMAIN_KEYS)}", value=False)
    kinds = [k for k in ("choice", "int", "float", "logfloat", "value") if k in spec]
    if len(kinds) != 1:
        also = f", not {' and '.join(kinds)}" if kinds else ""
        raise src.error(path, f"give exactly one of choice, int, float, logfloat or value{also}")
    kind = kinds[0]
    for extra, allowed in (("step", ("int",)), ("log", ("int", "float"))):
        if extra in spec and kind not in allowed:
            raise src.error(
                path + (extra,),
                f"`{extra}` applies to {' and '.join(allowed)} ranges, not {kind}",
                value=False,
            )
    when = _condition(src, path + ("when",), spec["when"]) if "when" in spec else None
    if kind == "choice":
        return _choice(src, path + ("choice",), key, spec["choice"]), when
    if kind == "value":
        return Fixed(value=checked(src, path + ("value",), key, spec["value"])), when
    if kind == "int":
        return _int_range(src, path, key, spec), when
    return _float_range(src, path, key, spec, kind), when


def _condition(src: Source, path: tuple, text: Any) -> Condition:
    try:
        return parse_condition(text)
    except ExprError as e:
        raise src.error(
            path, f"{e.reason} (at character {e.offset + 1} of the condition)"
        ) from None


def _choice(src: Source, path: tuple, key: str, values: Any) -> Choice:
    if not isinstance(values, list) or not values:
        raise src.error(path, f"expected a non-empty list of values, got {values!r}")
    for i, v in enumerate(values):
        checked(src, path + (i,), key, v)
        if v in values[:i]:
            raise src.error(path + (i,), f"{v!r} is listed twice")
    return Choice(values=tuple(values))


def _bounds(src: Source, path: tuple, key: str, pair: Any) -> tuple[Any, Any]:
    if not (isinstance(pair, list) and len(pair) == 2):
        raise src.error(path, f"expected [lo, hi], got {pair!r}")
    lo, hi = (checked(src, path + (i,), key, v) for i, v in enumerate(pair))
    if lo >= hi:
        raise src.error(
            path, f"lo must be < hi, got [{lo}, {hi}] (for one value use `value: {lo}`)"
        )
    return lo, hi


def _int_range(src: Source, path: tuple, key: str, spec: dict[str, Any]) -> IntRange:
    if value_kind(key) != "int":
        raise src.error(
            path + ("int",), f"{key} does not take a range of integers; use choice", value=False
        )
    lo, hi = _bounds(src, path + ("int",), key, spec["int"])
    step, log = spec.get("step", 1), spec.get("log", False)
    if isinstance(step, bool) or not isinstance(step, int) or step < 1:
        raise src.error(path + ("step",), f"expected a positive integer, got {step!r}")
    if (hi - lo) % step:
        raise src.error(path + ("step",), f"hi - lo ({hi - lo}) must be a multiple of step {step}")
    if not isinstance(log, bool) or (log and step != 1):
        raise src.error(
            path + ("log",), f"expected true or false (and log needs step 1), got {log!r}"
        )
    return IntRange(lo=lo, hi=hi, step=step, log=log)


def _float_range(src: Source, path: tuple, key: str, spec: dict[str, Any], kind: str) -> FloatRange:
    if value_kind(key) != "float":
        raise src.error(
            path + (kind,), f"{key} takes whole numbers; use int: [lo, hi] or choice", value=False
        )
    lo, hi = _bounds(src, path + (kind,), key, spec[kind])
    log = spec.get("log", kind == "logfloat")
    if not isinstance(log, bool):
        raise src.error(path + ("log",), f"expected true or false, got {log!r}")
    return FloatRange(lo=float(lo), hi=float(hi), log=log)

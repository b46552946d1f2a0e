"""Parameter budgets: solve the free dimension of a candidate so that its parameter count lands on
the budget (amounts such as `113M` are parsed by recipe/amounts.py). count_params is
exact and cheap, so the solver (`solve_budget`) is an integer search over the valid settings; its
errors say why a budget cannot be met, and what the nearest feasible budget or setting is.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field
from typing import Any, Callable, Mapping

from benchmark.arch import COUNTS, FFN_WIDTHS, ArchSpec, FFNSpec, count_params
from benchmark.recipe import fmt_count, fmt_fraction
from benchmark.space.align import Align

SOLVES = (
    "d_model",
    *(f"ffn.{width}" for width, _, _ in FFN_WIDTHS.values()),
    "ffn",
)  # ffn: whichever width
SOLVE_NONE = (
    "none"  # a space's `solve:` that solves nothing: every candidate keeps its anchor's shape
)
# A space's `tolerance:` when it gives none: every candidate within 0.5% of the budget.
DEFAULT_TOLERANCE = 0.005
PRECISION = 0.0005  # 0.05%: the solver widens its d_model window until a setting lands this close
_WIDEN = 4  # at most this many extra d_model values either side
HEAD_BAND = 1.25  # shape.head_dim: head_dim may sit within this factor of its target
# No candidate gets fewer attention heads than this from a head-width target (a 500K model of one
# 70-wide head compares attention patterns with none); a space that wants one head says n_heads: 1.
MIN_HEADS = 2
# The widest d_model and FFN width the solver tries: about 50x the widest published dense models
# (d_model 18,432), so that an absurd budget (1e30) is an error in milliseconds, not an endless
# search through head counts.
MAX_WIDTH = 1 << 20


class BudgetError(ValueError):
    """No candidate of this shape meets the budget within tolerance; the message says why."""


@dataclass(frozen=True, kw_only=True)
class Solution:
    spec: ArchSpec
    params: dict[str, int] = field(compare=False)
    budget: int
    count: str
    solved: dict[str, int] = field(compare=False)  # the values the solver chose, by dotted key

    @property
    def distance(self) -> float:
        """Signed distance from the budget: (params - budget) / budget."""
        return (self.params[self.count] - self.budget) / self.budget


def _ffn(raw: Mapping[str, Any], key: str) -> Any:
    """An ffn key of the candidate, or its FFNSpec default."""
    return raw.get("ffn", {}).get(key, getattr(FFNSpec, key))


def _width_key(raw: Mapping[str, Any]) -> tuple[str, str]:
    """(absolute key, ratio key) of the candidate's FFN hidden width."""
    width, ratio, _ = FFN_WIDTHS[_ffn(raw, "kind")]
    return width, ratio


def _ratio_width(raw: Mapping[str, Any]) -> bool:
    """Is the FFN width derived from d_model (a ratio, or the default ratio)?"""
    key, ratio_key = _width_key(raw)
    ffn = raw.get("ffn", {})
    return ffn.get(ratio_key) is not None or ffn.get(key) is None


class _Ladder:
    """The valid d_model values of a candidate, and the head counts each implies.

    n_heads fixed: multiples of 2 x n_heads (an even head_dim, for RoPE), or any integer when
    head_dim is given. With a target head size (`shape.head_dim`) heads scale with width: at each
    d_model, n_heads is the count (a multiple of the GQA group n_heads / n_kv_heads) whose even
    head_dim = d_model / n_heads is nearest the target, with head_dim within a factor HEAD_BAND of
    the target (the band rounded outward to whole head counts, so a small model may have one wide
    head). That makes valid d_model values dense (every few units at d_model ~ 1000, like the
    hourglass paper's 1032 = 12 x 86), so the FFN width rarely moves far off its ratio."""

    def __init__(
        self,
        raw: Mapping[str, Any],
        head_dim: int | None,
        align: Align = Align(),
        exact: bool = False,
    ):
        heads = raw.get("n_heads", ArchSpec.n_heads)
        self.target, self.heads, self.align, self.exact = head_dim, heads, align, exact
        self.group = heads // (raw.get("n_kv_heads") or heads)
        self.any = head_dim is None and raw.get("head_dim") is not None

    def keys(self, d_model: int) -> dict[str, int]:
        """The head keys to set at this d_model ({} when n_heads is fixed or d_model is invalid)."""
        if self.target is None:
            return {}
        g = self.group
        if self.exact:  # controlled: head_dim is the target itself, n_heads = d_model / head_dim
            n, left = divmod(d_model, self.target)
            ok = (
                not left
                and n >= MIN_HEADS
                and n % g == 0
                and self.target % self.align.head_dim == 0
            )
            return {"n_heads": n, "n_kv_heads": n // g} if ok else {}
        fewest = max(
            MIN_HEADS, math.floor(d_model / (self.target * HEAD_BAND))
        )  # the band, rounded outward
        most = max(fewest, math.ceil(d_model * HEAD_BAND / self.target))  # to whole head counts
        h = self.align.head_dim
        counts = [
            n
            for n in range(-(-fewest // g) * g, most + 1, g)
            if d_model % n == 0 and d_model // n % h == 0
        ]
        if not counts:
            return {}
        n = min(counts, key=lambda n: abs(math.log(d_model / n / self.target)))
        return {"n_heads": n, "n_kv_heads": n // g}

    def valid(self, d_model: int) -> bool:
        if d_model < 1 or d_model % self.align.d_model:
            return False
        if self.target is not None:
            return bool(self.keys(d_model))
        return (
            self.any
            or d_model % self.heads == 0
            and d_model // self.heads % self.align.head_dim == 0
        )

    def up(self, d_model: int) -> int:
        d_model = max(d_model, 1)
        while not self.valid(d_model):
            d_model += 1
        return d_model

    def down(self, d_model: int) -> int | None:
        while d_model >= 1 and not self.valid(d_model):
            d_model -= 1
        return d_model if d_model >= 1 else None

    def why(self) -> str:
        a, h = self.align, self.align.head_dim
        aligned = f"a multiple of {a.d_model} (align.d_model), " if a.d_model > 1 else ""
        head = "an even head_dim" if h == 2 else f"a head_dim that is a multiple of {h}"
        if self.target is not None and self.exact:
            return (
                aligned
                + f"a multiple of shape.head_dim={self.target} with {MIN_HEADS} heads or more"
            )
        if self.target is not None:
            return aligned + f"n_heads giving {head} within {HEAD_BAND}x of {self.target}"
        return aligned + (
            "any integer, since head_dim is given"
            if self.any
            else f"a multiple of {h} x n_heads={self.heads}, for {head}"
        )


def _with(
    raw: Mapping[str, Any],
    d_model: int | None = None,
    width: int | None = None,
    heads: Mapping[str, int] | None = None,
) -> dict[str, Any]:
    out = {**raw, **(heads or {})}
    if d_model is not None:
        out["d_model"] = d_model
    if width is not None:
        key, _ = _width_key(raw)
        ratios = [ratio for _, ratio, _ in FFN_WIDTHS.values()]
        ffn = {k: v for k, v in raw.get("ffn", {}).items() if k not in ratios}
        out["ffn"] = {**ffn, key: width}
    return out


class _Counter:
    """Memoised parameter count of `raw` at (d_model, width), heads set by the ladder."""

    def __init__(self, raw: Mapping[str, Any], count: str, ladder: _Ladder):
        self.raw, self.count, self.ladder, self.cache = raw, count, ladder, {}

    def mapping(self, d_model: int | None, width: int | None = None) -> dict[str, Any]:
        heads = self.ladder.keys(d_model) if d_model is not None else {}
        return _with(self.raw, d_model, width, heads)

    def __call__(self, d_model: int | None, width: int | None = None) -> int:
        key = (d_model, width)
        if key not in self.cache:
            self.cache[key] = count_params(self.mapping(d_model, width))[self.count]
        return self.cache[key]


def _first_at_least(
    f: Callable[[int], int], target: int, snap: Callable[[int], int], what: str
) -> int:
    """The smallest snapped value where the increasing f reaches `target` (a doubling bracket,
    then bisection; `snap` rounds up to the next valid value). BudgetError past MAX_WIDTH."""

    def reaches(x: int) -> bool:
        return f(snap(x)) >= target

    hi = 1
    while not reaches(hi):
        if hi >= MAX_WIDTH:
            raise BudgetError(
                f"{fmt_count(target)} parameters would need {what} above {MAX_WIDTH:,}; "
                "is the budget's unit right (113M, 1.2B)?"
            )
        hi *= 2
    lo = hi // 2  # does not reach, or is 0
    while hi - lo > 1:
        mid = (lo + hi) // 2
        lo, hi = (lo, mid) if reaches(mid) else (mid, hi)
    return snap(hi)


def _nearest_width(n: _Counter, d_model: int | None, budget: int, multiple: int) -> int:
    def snap(w: int) -> int:
        return -(-w // multiple) * multiple

    w = _first_at_least(lambda w: n(d_model, w), budget, snap, "an FFN width")
    if w > multiple and budget - n(d_model, w - multiple) < n(d_model, w) - budget:
        return w - multiple
    return w


def solve_budget(
    raw: Mapping[str, Any],
    *,
    budget: int,
    count: str = "total",
    tolerance: float = DEFAULT_TOLERANCE,
    solve: str = "d_model",
    head_dim: int | None = None,
    align: Align | None = None,
    exact: bool = False,
) -> Solution:
    """Set the free dimension of `raw` (an ArchSpec mapping) so that its `count` parameters are
    within `tolerance` of `budget`; `head_dim` (with solve: d_model) scales n_heads with d_model.
    Raises BudgetError, or SpecError for an invalid mapping. The rule:

    * `solve: d_model` (the default). d_model runs over its valid values (`_Ladder`): multiples of
      2 x n_heads (an even head_dim for RoPE); any integer when `head_dim` is given; or, with a
      `shape.head_dim` target, every d_model that splits into heads of an even width near it.
      Widths given as ratios (`ffn.ratio`, `ffn.dh_ratio`, or the default ratio) re-derive from d_model,
      so parameters grow with d_model and a doubling bracket plus bisection find the two valid
      d_model values around the budget. Then the FFN hidden width (`d_ff`, or `d_h` for an hourglass
      FFN; a multiple of `ffn.multiple_of`) absorbs the remainder: for each d_model the width
      nearest the budget is found the same way. Two knobs are how the hourglass paper matches
      budgets within 0.001% (Liao et al. §4.1). If neither setting lands within PRECISION (0.05%),
      the next valid d_model on each side is tried, up to _WIDEN more; of the settings within
      PRECISION the one nearest the asked-for shape wins (FFN width nearest its ratio, to 1%, then
      head_dim nearest its target), else the one nearest the budget, if within `tolerance`.
      With the width given absolutely (`ffn.d_ff` / `ffn.d_h`) only d_model moves: the nearer of
      the two valid values.
    * `align` (a space's `align:`) keeps d_model, head_dim and the FFN width on multiples: d_model's
      ladder holds only aligned values, `ffn.multiple_of` becomes the alignment, and since such a
      coarse lattice rarely lands within PRECISION, every setting within `tolerance` counts as
      precise, so the shape asked for decides among them (one aligned d_model either side at most).
      Where the FFN lattice is too coarse for that, its multiple halves (to 1 at the smallest budgets).
    * `solve: ffn.d_ff`, `ffn.d_h` or `ffn` (whichever width the candidate's FFN kind has): d_model
      stays as given and the width nearest the budget wins (hourglass paper Table 1: fixed attention).
    * `exact` (`controlled: true`): head_dim is `head_dim` itself, and a ratio the candidate gives
      sets the FFN width, so d_model alone meets the budget. Any head-width target: MIN_HEADS or more.
    `count` is one of COUNTS (arch/counting.py): each is exact and grows with d_model and the FFN
    width, so every rule is solved the same way.
    """
    if count not in COUNTS:
        raise ValueError(f"count: {count!r} is not one of {', '.join(COUNTS)}")
    if align is not None:
        # The FFN width on align.ffn where the budget allows; where that lattice is too coarse to
        # land within tolerance near the shape asked for (a 64-wide step of a K=4 hourglass FFN at
        # d_model 1536 is 4% of 113M), on the next power-of-two divisor, then on any width (at
        # budgets of a few million, where one 8-wide step can exceed the tolerance).
        steps = [align.ffn]
        while steps[-1] % 2 == 0:
            steps.append(steps[-1] // 2)
        steps += [1] if steps[-1] != 1 else []
        for i, step in enumerate(steps):
            ffn = dict(raw.get("ffn", {}))
            ffn["multiple_of"] = math.lcm(ffn.get("multiple_of", FFNSpec.multiple_of), step)
            try:
                return _solve(
                    raw | {"ffn": ffn}, budget, count, tolerance, solve, head_dim, align, exact
                )
            except BudgetError:
                if i == len(steps) - 1:
                    raise
    return _solve(raw, budget, count, tolerance, solve, head_dim, None, exact)


def _solve(
    raw: Mapping[str, Any],
    budget: int,
    count: str,
    tolerance: float,
    solve: str,
    head_dim: int | None,
    align: Align | None,
    exact: bool = False,
) -> Solution:
    _probe(raw)
    ladder = _Ladder(raw, head_dim, align or Align(), exact)
    n = _Counter(raw, count, ladder)
    multiple = _ffn(raw, "multiple_of")
    key, _ = _width_key(raw)
    if solve == "d_model":
        # Aligned: anything within tolerance is precise enough, and one aligned d_model either side
        # at most, so the shape stays near the one asked for.
        # So too when controlled: the shape is the point, and d_model's steps are a head wide.
        precision, widen = (PRECISION, _WIDEN) if align is None and not exact else (tolerance, 1)
        d_model, width = _solve_d_model(
            raw, n, ladder, budget, tolerance, multiple, precision, widen, exact
        )
    else:
        if solve in ("ffn.d_ff", "ffn.d_h") and solve != f"ffn.{key}":
            kind = _ffn(raw, "kind")
            raise BudgetError(
                f"solve: {solve} needs an FFN with that width, but this candidate's ffn.kind is "
                f"{kind} (width ffn.{key}); use solve: ffn to solve whichever width it has"
            )
        d_model, width = _solve_width(n, key, budget, tolerance, multiple)
    spec = ArchSpec.from_dict(n.mapping(d_model, width))
    solved = {k: v for k, v in (("d_model", d_model), (f"ffn.{key}", width)) if v is not None}
    return Solution(spec=spec, params=count_params(spec), budget=budget, count=count, solved=solved)


def _probe(raw: Mapping[str, Any]) -> None:
    """Validate everything but the free dimension, so spec errors surface before the search."""
    heads = raw.get("n_heads", ArchSpec.n_heads)
    ok_heads = isinstance(heads, int) and not isinstance(heads, bool) and heads > 0
    ArchSpec.from_dict(_with(raw, d_model=64 * heads) if ok_heads else raw)


def _off_shape(n: _Counter, d_model: int, width: int | None) -> tuple[int, float]:
    """How far a setting sits from the shape asked for: first the tuned FFN width from the width
    its ratio gives (in whole percent: the papers sweep that ratio), then head_dim from its
    `shape.head_dim` target (the hourglass paper's own heads range from 86 to 178 wide)."""
    spec = ArchSpec.from_dict(n.mapping(d_model))
    ffn = abs(math.log(width / spec.ffn.width)) if width is not None else 0.0
    return round(100 * ffn), abs(
        math.log(spec.head_dim / n.ladder.target)
    ) if n.ladder.target else 0.0


def _floor(smallest: int, tol: float) -> str:
    return f"the smallest feasible budget at tolerance {fmt_fraction(tol)} is {math.ceil(smallest / (1 + tol)):,}"


def _solve_d_model(
    raw,
    n: _Counter,
    ladder: _Ladder,
    budget: int,
    tol: float,
    multiple: int,
    precision: float = PRECISION,
    widen: int = _WIDEN,
    exact: bool = False,
) -> tuple[int, int | None]:
    # A ratio the space gives is held under `exact`: the width follows d_model, nothing tunes it.
    _, ratio = _width_key(raw)
    tune = _ratio_width(raw) and not (exact and raw.get("ffn", {}).get(ratio) is not None)
    above = _first_at_least(n, budget, ladder.up, "d_model")
    below = ladder.down(above - 1)
    seen: list[tuple[int, int | None]] = []
    # The two valid d_model values around the budget; with a tunable width, more either side until
    # one lands within PRECISION. Of those that do, the one nearest the shape asked for.
    for ring in range(1 + (widen if tune else 0)):
        if ring:
            above, below = ladder.up(above + 1), below and ladder.down(below - 1)
        for d in (above, below):
            if d is not None:
                seen.append((d, _nearest_width(n, d, budget, multiple) if tune else None))
        precise = [p for p in seen if abs(n(*p) - budget) <= precision * budget]
        if precise:
            return min(precise, key=lambda p: (*_off_shape(n, *p), abs(n(*p) - budget)))
    nearest = min(seen, key=lambda p: abs(n(*p) - budget))
    if abs(n(*nearest) - budget) <= tol * budget:
        return nearest
    smallest = n(ladder.up(1), multiple if tune else None)
    if smallest > budget * (1 + tol):
        raise BudgetError(
            f"at d_model={ladder.up(1)} (the smallest valid: {ladder.why()}) this candidate already has "
            f"{smallest:,} parameters; {_floor(smallest, tol)}"
        )
    d, w = nearest
    got = n(d, w)
    setting = f"d_model={d}" + (f" with ffn.{_width_key(raw)[0]}={w}" if tune else "")
    advice = (
        "widen tolerance, or set shape.head_dim or head_dim so d_model has finer steps"
        if tune
        else "widen tolerance, or give the FFN width as a ratio (ffn.ratio / ffn.dh_ratio) so it can absorb "
        "the remainder"
    )
    raise BudgetError(
        f"the nearest valid setting ({setting}) gives {fmt_count(got)} "
        f"({(got - budget) / budget:+.2%}), outside tolerance {fmt_fraction(tol)}; {advice}"
    )


def _solve_width(n: _Counter, key: str, budget: int, tol: float, multiple: int) -> tuple[None, int]:
    smallest = n(None, multiple)
    if smallest > budget * (1 + tol):
        raise BudgetError(
            f"at ffn.{key}={multiple} (the smallest valid) this candidate already has {smallest:,} parameters; "
            f"{_floor(smallest, tol)} (or lower d_model or the layer count)"
        )
    w = _nearest_width(n, None, budget, multiple)
    got = n(None, w)
    if abs(got - budget) > tol * budget:
        unit = n(None, w + multiple) - got
        raise BudgetError(
            f"the nearest valid ffn.{key}={w} gives {fmt_count(got)} ({(got - budget) / budget:+.2%}), outside "
            f"tolerance {fmt_fraction(tol)}: one step of ffn.{key} moves {fmt_count(unit)} parameters here; "
            "widen tolerance" + (" or lower ffn.multiple_of" if multiple > 1 else "")
        )
    return None, w

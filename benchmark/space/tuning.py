"""The space's `tune:` section: each candidate at its own tuned recipe, with an equal tuning budget.

    tune:
      grid: {lr: [1e-3, 3e-3], warmup: [0.05, 0.25]}   # training settings -> the values tried
      seeds: [100, 101]                                # tuning seeds, none of them a final seed
      metric: val_loss                                 # how a setting is chosen (its direction: the metric's)
    margin: noise                                    # points this close to the best are ties (nats, or noise)
    ties: middle                                     # which tied point is chosen: middle, lower, higher, best
    extend: {lr: [3e-4, 4.8e-2]}                     # an edge choice adds the next value, within these bounds

Every candidate trains every point of the grid with every tuning seed (the same number of runs
each: AlgoPerf's equal tuning budget, Dahl et al. 2023, arXiv 2306.07179, §4), takes the point
whose mean metric over those seeds is best, then trains its final seeds at that point. The final
seeds are fresh, so the choice's luck on its tuning seeds does not carry into the verdicts. A
recipe shared blindly favours the arm it happens to suit (Wen, Hall, Liang et al. 2025, arXiv
2509.02046, §3). The grid's losses also give each candidate's learning-rate sensitivity
(leaderboard/tuning.py).

Noise must not choose: points whose mean lies within `margin` of the best are ties, and `ties`
picks among them by the grid's order, the same rule for every candidate of the space (so for every
arm of a claim). The default margin, `noise`, is the standard error of the difference of two
points' means, from the tuning seeds' spread around an additive point + seed fit (several seeds
needed: with one there is no noise to measure and only equal means tie), a point whose seeds part
far more than the others' left out of it (a setting near divergence). A choice on an edge of a
key that `extend` names trains the next value past that edge (the grid's own ratio between its two
outermost values of that key), and chooses again, until the choice is inside the grid or the next
value would leave the declared bounds: a best that lies beyond the grid is found, not assumed."""

from __future__ import annotations

import itertools
import json
import math
import statistics
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from benchmark.arch import did_you_mean
from benchmark.recipe import DEFAULTS, TrainConfig, TrainConfigError
from benchmark.store import MetricError, objective

KEYS = ("grid", "seeds", "metric", "margin", "ties", "extend")
NOISE = "noise"  # the default margin: the tuning seeds' own noise (Tune.margin_for)
# How a tie is broken, over the tied points in the grid's order (each key's values ascending, the
# first key slowest): the middle one (the lower of two), the first, the last, or the best mean.
TIES = ("middle", "lower", "higher", "best")
# Settings a grid may not vary: they change what is trained or measured, not how well.
FIXED = (
    "tokens",
    "tokens_per",
    "seq_len",
    "eval_every",
    "val_points",
    "eval_tokens",
    "seed",
    "device",
    "precision",
    "compile",
)


@dataclass(frozen=True, kw_only=True)
class Tune:
    grid: tuple[tuple[str, tuple], ...]  # (training setting, the values tried), in file order
    seeds: tuple[int, ...]
    metric: str = "val_loss"
    direction: str = "min"
    margin: float | str = NOISE  # nats of the metric, or NOISE
    ties: str = "middle"  # TIES
    extend: tuple[tuple[str, tuple[float, float]], ...] = ()  # key -> (lowest, highest) value
    given: tuple[str, ...] = ()  # the keys the file gave (the declaration records only those)

    def points(self, grid=None) -> list[dict[str, Any]]:
        """Every setting of the grid (or of `grid`, the same form), in a fixed order (the first key
        varies slowest)."""
        grid = self.grid if grid is None else grid
        keys = [k for k, _ in grid]
        return [dict(zip(keys, values)) for values in itertools.product(*(v for _, v in grid))]

    @property
    def runs(self) -> int:
        """Tuning runs per candidate before any extension: the budget every candidate gets."""
        return len(self.points()) * len(self.seeds)

    def beyond(self, grid, key: str, value: Any) -> Any | None:
        """The next value of `key` past `value`, an edge of `grid`'s values for it (the ratio of the
        two outermost values on that side), or None: not extended, or past its declared bounds."""
        bounds = dict(self.extend).get(key)
        values = sorted(dict(grid).get(key, ()))
        if bounds is None or len(values) < 2 or value not in (values[0], values[-1]):
            return None
        near, far = (values[1], values[0]) if value == values[0] else (values[-2], values[-1])
        nxt = far * (far / near)
        nxt = float(f"{nxt:.6g}")  # 6e-3 * 2 -> 0.012, not 0.012000000000000002
        return nxt if bounds[0] <= nxt <= bounds[1] else None

    def order(self, setting: Mapping[str, Any]) -> tuple:
        """A point's place in the grid's order: each key's value, the first key first."""
        return tuple(_sortable(setting.get(k)) for k, _ in self.grid)

    def margin_for(self, values: Mapping[str, Sequence[float]]) -> float:
        """The margin a choice among `values` (point -> its metric on each tuning seed, in the
        seeds' order) is made at: the declared one, or the noise: the standard error of the
        difference of two points' means, s x sqrt(2 / n), s the residual standard deviation of an
        additive point + seed fit (the seeds pair across points: the same data order and
        initialisation), on (points - 1)(seeds - 1) degrees of freedom; 0 without them. A point
        whose seeds part far more than the others' is left out of it (_settings_that_train)."""
        if self.margin != NOISE:
            return float(self.margin)
        n = len(self.seeds)
        rows = _settings_that_train([list(v) for v in values.values()], n)
        p = len(rows)
        if p < 2 or n < 2:
            return 0.0
        grand = sum(map(sum, rows)) / (p * n)
        point = [sum(r) / n for r in rows]
        seed = [sum(r[i] for r in rows) / p for i in range(n)]
        ss = sum(
            (r[i] - point[j] - seed[i] + grand) ** 2 for j, r in enumerate(rows) for i in range(n)
        )
        return math.sqrt(ss / ((p - 1) * (n - 1)) * 2 / n)

    def decide(self, values: Mapping[str, Sequence[float]]) -> tuple[str | None, float, list[str]]:
        """(the chosen point, the margin, the points tied with the best) among `values` (a point's
        JSON setting -> its metric on each tuning seed): a point short of a seed or with a value
        that is not finite is no recipe to trust and is not chosen."""
        full = {
            p: list(v)
            for p, v in values.items()
            if len(v) == len(self.seeds) and all(math.isfinite(x) for x in v)
        }
        if not full:
            return None, math.nan, []
        sign = 1 if self.direction == "min" else -1
        means = {p: sign * sum(v) / len(v) for p, v in full.items()}
        best = min(means, key=means.get)
        margin = self.margin_for(full)
        tied = sorted(
            (p for p in means if means[p] - means[best] <= margin),
            key=lambda p: self.order(json.loads(p)),
        )
        pick = {
            "best": best,
            "lower": tied[0],
            "higher": tied[-1],
            "middle": tied[(len(tied) - 1) // 2],
        }[self.ties]
        return pick, margin, tied

    def shared(self, final: Sequence[int]) -> list[int]:
        """The tuning seeds that are also final seeds (there must be none)."""
        return sorted(set(self.seeds) & set(final))

    def declared(self) -> dict[str, Any]:
        """As _study.json records it: the protocol's later keys only where the file gives them, so
        a study begun before they existed keeps its declaration (and its choice: one tuning seed
        has no noise, and its exact ties were broken by the best mean, as `middle` breaks them)."""
        out = {
            "grid": {k: list(v) for k, v in self.grid},
            "seeds": list(self.seeds),
            "metric": self.metric,
            "direction": self.direction,
        }
        later = {
            "margin": self.margin,
            "ties": self.ties,
            "extend": {k: list(b) for k, b in self.extend},
        }
        return {**out, **{k: v for k, v in later.items() if k in self.given}}


def read_tune(src, raw: Any, training: Mapping[str, Any], final: Sequence[int]) -> Tune:
    """The section validated against TrainConfig's rules (each value of the grid set over the
    space's `training:`) and the space's final seeds; SpaceError located in the file."""
    if not isinstance(raw, dict):
        raise src.error(
            ("tune",), "expected a mapping like {grid: {lr: [1e-3, 3e-3]}, seeds: [100, 101]}"
        )
    for key in raw:
        if key not in KEYS:
            raise src.error(("tune", key), f"unknown key{did_you_mean(key, KEYS)}", value=False)
    grid = raw.get("grid")
    if not isinstance(grid, dict) or not grid:
        raise src.error(
            ("tune", "grid"),
            "expected a mapping of training settings to lists of values, "
            "e.g. {lr: [1e-3, 3e-3], warmup: [0.05, 0.25]}",
        )
    pairs = []
    for key, values in grid.items():
        at = ("tune", "grid", key)
        name = key.removeprefix("training.")
        if name not in DEFAULTS:
            raise src.error(
                at, f"unknown training setting{did_you_mean(name, tuple(DEFAULTS))}", value=False
            )
        if name in FIXED:
            raise src.error(
                at,
                f"{name} changes what is trained or measured, not how well: it cannot be tuned",
                value=False,
            )
        if not isinstance(values, list) or not values or len(set(map(repr, values))) != len(values):
            raise src.error(at, f"expected a list of distinct values, got {values!r}")
        for i, value in enumerate(values):
            try:
                TrainConfig.from_dict({**training, name: value})
            except (
                TrainConfigError
            ) as e:  # this value, or (a schedule key) with the space's `training:`
                raise src.error((*at, i), e.reason if e.key == name else str(e)) from None
        pairs.append((name, tuple(values)))
    seeds = raw.get("seeds")
    if (
        not isinstance(seeds, list)
        or not seeds
        or not all(isinstance(s, int) and not isinstance(s, bool) and s >= 0 for s in seeds)
        or len(set(seeds)) != len(seeds)
    ):
        raise src.error(
            ("tune", "seeds"), f"expected a list of distinct seeds (integers >= 0), got {seeds!r}"
        )
    tune = Tune(
        grid=tuple(pairs),
        seeds=tuple(seeds),
        **_metric(src, raw.get("metric", "val_loss")),
        margin=_margin(src, raw.get("margin", NOISE)),
        ties=_ties(src, raw.get("ties", "middle")),
        extend=_extend(src, raw.get("extend", {}), dict(pairs), training),
        given=tuple(k for k in ("margin", "ties", "extend") if k in raw),
    )
    if shared := tune.shared(final):
        raise src.error(("tune", "seeds"), seeds_message(shared, final))
    return tune


def seeds_message(shared: Sequence[int], final: Sequence[int]) -> str:
    return (
        f"seed {', '.join(map(str, shared))} is also a final seed ({final[0]}..{final[-1]}): a setting "
        "chosen on a seed and judged on the same seed is favoured by its luck; give tuning seeds outside "
        "the final ones (e.g. from 100)"
    )


def _metric(src, text: Any) -> dict[str, str]:
    try:
        m, direction = objective(text)
    except MetricError as e:
        raise src.error(("tune", "metric"), str(e)) from None
    if not m.intermediate and m.kind != "quality":
        raise src.error(
            ("tune", "metric"),
            f"{m.name} is a {m.kind} column: a setting is chosen by what it trains "
            "to (val_loss, val_ppl)",
        )
    return {"metric": m.name, "direction": direction}


def _margin(src, value: Any) -> float | str:
    if value == NOISE:
        return NOISE
    if isinstance(value, bool) or not isinstance(value, int | float) or value < 0:
        raise src.error(
            ("tune", "margin"),
            f"expected {NOISE} (the tuning seeds' noise) or a number >= 0 in the metric's units, "
            f"got {value!r}",
        )
    return float(value)


def _ties(src, value: Any) -> str:
    if value not in TIES:
        raise src.error(("tune", "ties"), f"expected one of {', '.join(TIES)}, got {value!r}")
    return value


def _extend(src, raw: Any, grid: Mapping[str, tuple], training: Mapping[str, Any]) -> tuple:
    """key -> (lowest, highest): a key of the grid with 2 or more positive numbers, bounds that hold
    its values and that TrainConfig accepts."""
    if not isinstance(raw, dict):
        raise src.error(("tune", "extend"), "expected a mapping like {lr: [3e-4, 4.8e-2]}")
    out = []
    for key, bounds in raw.items():
        at = ("tune", "extend", key)
        values = grid.get(key.removeprefix("training."))
        if values is None:
            raise src.error(
                at, f"not a key of tune.grid{did_you_mean(key, tuple(grid))}", value=False
            )
        if len(values) < 2 or not all(
            isinstance(v, int | float) and not isinstance(v, bool) and v > 0 for v in values
        ):
            raise src.error(
                at, "a grid is extended along a key of 2 or more positive numbers", value=False
            )
        if (
            not isinstance(bounds, list)
            or len(bounds) != 2
            or not all(isinstance(b, int | float) and not isinstance(b, bool) for b in bounds)
            or not 0 < bounds[0] <= min(values) <= max(values) <= bounds[1]
        ):
            raise src.error(
                at,
                f"expected [lowest, highest] around the grid's values {list(values)}, got {bounds!r}",
            )
        for i, b in enumerate(bounds):
            try:
                TrainConfig.from_dict({**training, key.removeprefix("training."): b})
            except TrainConfigError as e:
                raise src.error((*at, i), e.reason) from None
        out.append((key.removeprefix("training."), (float(bounds[0]), float(bounds[1]))))
    return tuple(out)


# A point whose seeds disagree more than this many times as much as the median point's is left out
# of the noise: with two seeds, the modified z-score's 3.5 (0.6745 |x - median| / MAD of the
# points' seed differences; Iglewicz and Hoaglin 1993, "How to Detect and Handle Outliers").
PARTED = 3.5 / 0.6745


def _settings_that_train(rows: list[list[float]], n: int) -> list[list[float]]:
    """`rows` (a point's metric on each tuning seed) less those whose seeds part: at a setting
    near divergence the seeds go different ways, which measures that setting's instability, not
    the noise between settings that train; pooled into the margin, it can make points that every
    seed orders alike a tie. A point's spread: the root mean square of its residuals about its
    mean and the seeds' median offsets; left out above PARTED times the median point's (with 3
    points or more and a median above 0)."""
    if len(rows) < 3 or n < 2:
        return rows
    centred = [[x - sum(r) / n for x in r] for r in rows]
    offset = [statistics.median(c[i] for c in centred) for i in range(n)]
    spread = [math.sqrt(sum((c[i] - offset[i]) ** 2 for i in range(n)) / (n - 1)) for c in centred]
    typical = statistics.median(spread)
    if typical <= 0:
        return rows
    return [r for r, s in zip(rows, spread) if s <= PARTED * typical]


def _sortable(v: Any) -> tuple:
    """Numbers before text, each in its own order (a grid key may hold either)."""
    return (0, v, "") if isinstance(v, int | float) and not isinstance(v, bool) else (1, 0, str(v))

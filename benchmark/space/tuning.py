"""The space's `tune:` section: each candidate at its own tuned recipe, with an equal tuning budget.

    tune:
      grid: {lr: [1e-3, 3e-3], warmup: [0.05, 0.25]}   # training settings -> the values tried
      seeds: [100, 101]                                # tuning seeds, none of them a final seed
      metric: val_loss                                 # how a setting is chosen (its direction: the metric's)

Every candidate trains every point of the grid with every tuning seed (the same number of runs
each: AlgoPerf's equal tuning budget, Dahl et al. 2023, arXiv 2306.07179, §4), takes the point
whose mean metric over those seeds is best, then trains its final seeds at that point. The final
seeds are fresh, so the choice's luck on its tuning seeds does not carry into the verdicts. A
recipe shared blindly favours the arm it happens to suit (Wen, Hall, Liang et al. 2025, arXiv
2509.02046, §3). The grid's losses also give each candidate's learning-rate sensitivity
(leaderboard/tuning.py)."""

from __future__ import annotations

import itertools
from dataclasses import dataclass
from typing import Any, Mapping, Sequence

from benchmark.arch import did_you_mean
from benchmark.recipe import DEFAULTS, TrainConfig, TrainConfigError
from benchmark.store import MetricError, objective

KEYS = ("grid", "seeds", "metric")
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

    def points(self) -> list[dict[str, Any]]:
        """Every setting of the grid, in a fixed order (the first key varies slowest)."""
        keys = [k for k, _ in self.grid]
        return [dict(zip(keys, values)) for values in itertools.product(*(v for _, v in self.grid))]

    @property
    def runs(self) -> int:
        """Tuning runs per candidate: the budget every candidate gets."""
        return len(self.points()) * len(self.seeds)

    def shared(self, final: Sequence[int]) -> list[int]:
        """The tuning seeds that are also final seeds (there must be none)."""
        return sorted(set(self.seeds) & set(final))

    def declared(self) -> dict[str, Any]:
        return {
            "grid": {k: list(v) for k, v in self.grid},
            "seeds": list(self.seeds),
            "metric": self.metric,
            "direction": self.direction,
        }


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
        grid=tuple(pairs), seeds=tuple(seeds), **_metric(src, raw.get("metric", "val_loss"))
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

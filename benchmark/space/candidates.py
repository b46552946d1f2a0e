"""Points of a search space -> budget-matched candidates.

`define_by_run(space)` is the Optuna define-by-run function the search hands to Ray Tune's
`OptunaSearch(space=...)`; `grid(space, limit)` enumerates a finite space in file order; both walk
the axes with `choose`, which skips an axis whose `when` is false, and end in `resolve`: base +
variant + axis values over the family preset, `shape.*` applied (shape.py), the free dimension
solved to the budget (budget.py).
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, Callable, Iterator, Mapping

from benchmark.arch import (
    FFN_WIDTHS,
    PRESETS,
    SPEC_KEYS,
    ArchSpec,
    SpecError,
    count_params,
    deep_merge,
    set_dotted,
)
from benchmark.space.budget import SOLVE_NONE, BudgetError, Solution, solve_budget
from benchmark.space.domains import Axis
from benchmark.space.expr import ExprError
from benchmark.space.language import BUDGET_AXIS, SearchSpace
from benchmark.space.shape import SHAPE_KEYS, apply_shape, fit_width_depth, layer_split
from benchmark.space.source import SpaceError
from benchmark.store import count_columns


@dataclass(frozen=True, kw_only=True)
class Candidate:
    """One resolved point: the axis values it was given and its budget solution."""

    values: dict[str, Any]
    solution: Solution
    anchor: Solution | None = (
        None  # the space's anchor at this candidate's budget, where it has one
    )

    @property
    def spec(self) -> ArchSpec:
        return self.solution.spec

    @property
    def anchor_ratio(self) -> float | None:
        """Its parameters over the anchor's, both under the space's count (solve: none reports it)."""
        if self.anchor is None:
            return None
        return self.solution.params[self.solution.count] / self.anchor.params[self.anchor.count]

    @property
    def distance(self) -> float:
        return self.solution.distance

    def config(self) -> dict[str, Any]:
        """Flat constants, JSON-able: the axis values plus the resolved spec and its counts."""
        p = self.solution.params
        return {
            **self.values,
            "family": self.spec.family,
            "spec": self.spec.to_dict(),
            **count_columns(p),
            "budget": self.solution.budget,
            "count": self.solution.count,
            "budget_distance": self.distance,
        }


# ---- conditions and the walk over axes ------------------------------------------------------


def _get(frag: Any, key: str) -> Any:
    for part in key.split("."):
        if not isinstance(frag, Mapping) or part not in frag:
            return None
        frag = frag[part]
    return frag


def _fragment(
    space: SearchSpace, values: Mapping[str, Any]
) -> tuple[dict[str, Any], dict[str, Any]]:
    """(ArchSpec mapping, shape values) of base + the chosen variant + the axis values."""
    variant = space.variants.get(values.get("variant"))
    raw = deep_merge(space.base, variant.arch if variant else {})
    shape = dict(variant.shape if variant else {})
    for key, value in values.items():
        if key in SHAPE_KEYS:
            shape[key] = value
        elif key not in ("variant", BUDGET_AXIS):
            set_dotted(raw, key, value)
    return raw, shape


# ArchSpec's own defaults, for keys nothing sets (ffn.kind -> swiglu, loops -> 1, ...).
_DEFAULTS = {name: key.default for name, key in SPEC_KEYS.items() if key.section is None}


def _lookup(space: SearchSpace, values: Mapping[str, Any]) -> Callable[[str], Any]:
    """Name -> value as a condition reads it: the candidate so far over its family preset, then
    ArchSpec's defaults; null when unset (hyper.* of a model without hyper-connections)."""
    raw, shape = _fragment(space, values)
    merged = deep_merge(PRESETS.get(raw.get("family", ArchSpec.family), {}), raw)

    def get(name: str) -> Any:
        if name == "variant":
            return values.get("variant")
        if name in SHAPE_KEYS:
            return shape.get(name)
        if name in ("layers.begin", "layers.middle", "layers.end"):
            return layer_split(merged)[name.split(".")[1]]
        if name.startswith("hyper.") and merged.get("hyper") is None:
            return None
        found = _get(merged, name)
        return _DEFAULTS.get(name) if found is None else found

    return get


def _active(space: SearchSpace, axis: Axis, values: Mapping[str, Any]) -> bool:
    if axis.when is None:
        return True
    try:
        return axis.when(_lookup(space, values))
    except ExprError as e:
        raise space.source.error(("axes", axis.key, "when"), e.reason) from None


def choose(space: SearchSpace, pick: Callable[[Axis], Any]) -> dict[str, Any]:
    """Walk the axes in file order, asking `pick` for the value of every active axis."""
    values: dict[str, Any] = {}
    for axis in space.axes:
        if _active(space, axis, values):
            values[axis.key] = pick(axis)
    return values


def define_by_run(space: SearchSpace) -> Callable[[Any], dict[str, Any]]:
    """`sample(trial) -> dict`, an Optuna define-by-run function: suggests every active axis (an
    axis whose `when` is false is not suggested at all), solves the budget, and returns the
    candidate as a flat dict of constants (`Candidate.config`). That is the form Ray Tune's
    `OptunaSearch(space=sample)` accepts: it merges the returned constants into the trial's
    config. Raises SpaceError when a point cannot be built or cannot meet the budget."""

    def sample(trial) -> dict[str, Any]:
        return resolve(
            space, choose(space, lambda axis: axis.domain.suggest(trial, axis.key))
        ).config()

    return sample


class _Infinite(Exception):
    """An active float axis: the space cannot be enumerated."""


def grid(space: SearchSpace, limit: int) -> list[dict[str, Any]] | None:
    """Every point of a finite space (conditions respected), in file order; None if an active
    axis is a float range or there are more than `limit` points."""

    def expand(i: int, values: dict[str, Any]) -> Iterator[dict[str, Any]]:
        if i == len(space.axes):
            yield values
        elif not _active(space, space.axes[i], values):
            yield from expand(i + 1, values)
        else:
            axis = space.axes[i]
            options = axis.domain.grid()
            if options is None:
                raise _Infinite
            for v in options:
                yield from expand(i + 1, {**values, axis.key: v})

    points = []
    try:
        for point in expand(0, {}):
            points.append(point)
            if len(points) > limit:
                return None
    except _Infinite:
        return None
    return points


# ---- resolving one point --------------------------------------------------------------------


def resolve(space: SearchSpace, values: Mapping[str, Any]) -> Candidate:
    """The budget-matched candidate for `values` (axis key -> value); raises SpaceError pointing
    at the axis, variant or base key behind a spec error, or at `budget` for a budget error."""
    values = dict(values)
    if space.budget is None:
        raise space.source.error(
            ("budget",), "none given: set `budget:` in the file or pass --budget"
        )
    try:
        return Candidate(values=values, **_solve(space, values))
    except SpecError as e:
        raise _locate(space, values, e.key, f"{e.reason}{_about(values)}") from None
    except BudgetError as e:
        raise space.source.error(
            ("budget",), f"{e}{_locks(space, values)}{_about(values)}"
        ) from None


def _locks(space: SearchSpace, values: Mapping[str, Any]) -> str:
    """What a controlled space holds that left the budget unmet, and what to relax; under solve:
    none, that the budget sizes the anchor alone."""
    raw, shape = _fragment(space, values)
    none = space.solve == SOLVE_NONE
    raw = deep_merge(raw, space.anchor or {}) if none else raw
    head_dim = shape.get("shape.head_dim")
    held = (
        [f"shape.head_dim {head_dim} exactly (d_model in steps of {head_dim})"]
        if head_dim and space.controlled and (none or not space.anchor)
        else []
    )
    held += [
        f"{k} {v:g} exactly"
        for k, v in (
            ("ffn.ratio", _get(raw, "ffn.ratio")),
            ("ffn.dh_ratio", _get(raw, "ffn.dh_ratio")),
        )
        if v is not None and space.controlled
    ]
    if none:
        return (
            "; under solve: none the budget and its tolerance size the anchor alone (every candidate keeps "
            "its shape with its own count)"
            + (f", held at {' and '.join(held)}" if held else "")
            + ": give the budget the anchor's size at the shape wanted, relax a lock, or widen tolerance"
        )
    if not space.controlled:
        return ""
    return (
        f"; under controlled: true the space holds {' and '.join(held) or 'the shape'}: relax a lock (a smaller "
        "shape.head_dim, or no FFN ratio so that the width absorbs the remainder), hold the shape with an "
        "anchor and solve: ffn, or widen tolerance"
    )


def _solve(space: SearchSpace, values: dict[str, Any]) -> dict[str, Solution | None]:
    """The candidate's `solution` and, in a space with one, its `anchor`."""
    raw, shape = _fragment(space, values)
    family = ArchSpec.from_dict(
        {"family": raw.get("family", ArchSpec.family)}
    ).family  # SpecError if misspelt
    merged = apply_shape(deep_merge(PRESETS[family], raw), shape)

    budget = values.get(BUDGET_AXIS, space.budget)  # a ladder's rung, or the one budget
    head_dim = shape.get("shape.head_dim")
    if head_dim is not None and merged.get("head_dim") is not None:
        raise SpecError(
            "shape.head_dim", "sets n_heads from d_model; it cannot be combined with head_dim"
        )
    anchor = None
    if (
        space.anchor is not None
    ):  # hourglass paper Table 1: every candidate keeps the anchor's width and heads
        anchor = _anchor(space, budget, head_dim, shape)
        merged.update(
            d_model=anchor.spec.d_model,
            n_heads=anchor.spec.n_heads,
            n_kv_heads=anchor.spec.n_kv_heads,
        )
        head_dim = None
        if space.solve == SOLVE_NONE:
            return {"solution": _held(merged, anchor), "anchor": anchor}
    elif head_dim is not None and space.solve != "d_model":
        raise SpecError(
            "shape.head_dim",
            f"scales n_heads with a solved d_model; it needs solve: d_model or an "
            f"anchor, not solve: {space.solve}",
        )

    def solve(r: dict[str, Any]) -> Solution:
        return solve_budget(
            r,
            budget=budget,
            count=space.count,
            tolerance=space.tolerance,
            solve=space.solve,
            head_dim=head_dim,
            align=space.align,
            exact=space.controlled,
        )

    if "shape.d_model_per_layer" in shape:
        return {"solution": fit_width_depth(merged, shape, solve), "anchor": anchor}
    return {"solution": solve(merged), "anchor": anchor}


def _anchor(
    space: SearchSpace, budget: int, head_dim: int | None, shape: Mapping[str, Any]
) -> Solution:
    """The anchor solved to the budget: d_model (with controlled: true, heads of exactly head_dim).
    Under solve: ffn it trains nowhere, and its own FFN width moves so that a d_model on that coarse
    lattice lands on the budget. Under solve: none its whole shape is every candidate's and it is
    one of them, so its preset and the candidate's shape.* apply and a ratio it gives holds."""
    raw = deep_merge(space.base, space.anchor or {})
    if space.solve == SOLVE_NONE:
        family = ArchSpec.from_dict({"family": raw.get("family", ArchSpec.family)}).family
        raw = apply_shape(deep_merge(PRESETS[family], raw), shape)
    return solve_budget(
        raw,
        budget=budget,
        count=space.count,
        tolerance=space.tolerance,
        head_dim=head_dim,
        align=space.align,
        exact=space.controlled,
    )


def _held(merged: dict[str, Any], anchor: Solution) -> Solution:
    """solve: none: the candidate at the anchor's d_model, heads (set by the caller) and FFN width,
    with its own parameter count; nothing is solved, so its distance from the budget is its own."""
    kind = anchor.spec.ffn.kind
    width, ratio, _ = FFN_WIDTHS[kind]
    ffn = dict(merged.get("ffn") or {})
    if ffn.get("kind", kind) != kind:
        raise SpecError(
            "ffn.kind",
            f"solve: none keeps the anchor's FFN ({kind}, ffn.{width} "
            f"{getattr(anchor.spec.ffn, width)}) for every candidate; this one's is {ffn['kind']}",
        )
    ffn.update({width: getattr(anchor.spec.ffn, width), ratio: None})
    spec = ArchSpec.from_dict({**merged, "head_dim": anchor.spec.head_dim, "ffn": ffn})
    return Solution(
        spec=spec, params=count_params(spec), budget=anchor.budget, count=anchor.count, solved={}
    )


def _about(values: Mapping[str, Any]) -> str:
    what = ", ".join(
        f"{k}={v:.4g}" if isinstance(v, float) else f"{k}={v}" for k, v in values.items()
    )
    return f" (candidate: {what})" if what else ""


def _locate(space: SearchSpace, values: Mapping[str, Any], key: str, reason: str) -> SpaceError:
    """Point an error about `key` at the entry that set it: an axis, the variant, base or anchor;
    else (a preset or default value) an axis of the same section, else where the family is chosen."""
    chosen = [a.key for a in space.axes if a.key in values]
    exact = [a for a in chosen if a == key or key.startswith(a + ".") or a.startswith(key + ".")]
    if exact:
        return space.source.error(("axes", exact[0]), reason)
    name = values.get("variant")
    variant = space.variants.get(name)
    if variant and (_get(variant.arch, key) is not None or key in variant.shape):
        return space.source.error(("variants", name, *key.split(".")), reason)
    for where, frag in (("base", space.base), ("anchor", space.anchor or {})):
        if _get(frag, key) is not None:
            return space.source.error((where, *key.split(".")), reason)
    same_section = [a for a in chosen if a.split(".")[0] == key.split(".")[0]]
    if same_section:
        return space.source.error(("axes", same_section[0]), reason)
    family_at = (
        ("axes", "family")
        if "family" in values
        else ("base", "family")
        if "family" in space.base
        else None
    )
    if family_at:
        return space.source.error(family_at, f"{key} (from the family preset): {reason}")
    return space.source.error((key,), reason)

"""What a claim's arms differ in: every spec key whose value is not the same in each group, and
which of those differences the claim does not account for (its arms are then *confounded*).

A comparison is controlled when its arms differ only in the factor it tests and in the one
dimension its space declares to absorb the budget (Hyperloop App. A holds d_model 1024, 16 heads and
d_ff 2.75 x d_model across the arms of Table 1; the shape paper's Table 1 holds the attention and
solves the FFN). A key the claim's groups name is the factor tested: a spec key (`axes.hyper.mixing`,
`streams`), a family (its preset's keys and its layer structure), a variant of the space (the keys
the variant sets), a budget (what the solver sets from it). The solved dimension is the space's
`solve:` (d_model, and with `shape.head_dim` the head count that follows from it; or the FFN
width, and so its ratio to d_model; or, under `solve: none`, nothing: every arm keeps the anchor's
shape and its own parameter count). Anything else that differs is a confound: a head width, an FFN
ratio, a loop embedding the claim does not test.

The arms must also have trained alike: each candidate's runs carry their recipe (`recipe.*`: the
batch, sequence length, accumulation, schedule, warmup, decay, optimiser and evaluation settings of
its rows' `training`, the precision they ran at, and the hardware and thread count of its final and
of its tuning runs, as shares); any of these that differs between groups is a confound, the setting
the study tuned aside. Tokens follow the claim's declared rule (`tokens:` in the claims file): the
same for every arm (`same`, the default: the Hyperloop paper trains a size class on one token
count, §4.1), the tokens of a named group, or each arm at the same multiple of its own count
(`own`: AbbIE's 20 tokens per parameter, §3.2); arms that break it are confounded on `tokens`.

Both the plan (arms_of_candidates) and the report (arms_of_groups) go through `compare`.
"""

from __future__ import annotations

import json
from collections import Counter
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, fields
from fractions import Fraction
from typing import Any

import pandas as pd

from benchmark.arch import PRESETS, ArchSpec, HyperSpec, SpecError
from benchmark.arch.describe import describe
from benchmark.space import SOLVE_NONE

# Keys that are bookkeeping of the solver or the preset rather than the model's shape: ratios are
# compared as the derived `ffn.width_ratio` of the trained width, multiple_of is the width's lattice.
_IGNORED = {"ffn.ratio", "ffn.dh_ratio", "ffn.multiple_of"}
_STRUCTURE = ("layers.begin", "layers.middle", "layers.end", "loops", "depth")
_WIDTHS = ("ffn.d_ff", "ffn.d_h", "ffn.width_ratio")
_HEADS = ("n_heads", "n_kv_heads")
HYPER_KEYS = tuple(f"hyper.{f.name}" for f in fields(HyperSpec))
# A run's recipe as the arms check compares it: its `training` keys (the tuned ones aside) and, from
# its row, the precision it ran at and its hardware; tokens are checked by the claim's rule instead.
RECIPE = (
    "batch_size",
    "seq_len",
    "grad_accum",
    "schedule",
    "warmup",
    "decay",
    "min_lr",
    "lr",
    "weight_decay",
    "beta1",
    "beta2",
    "grad_clip",
    "eval_tokens",
)
TOKENS = "tokens"  # a candidate's tokens trained (facts), checked by the claim's token rule
# Results columns a claim may filter on, as the spec keys they stand for.
_COLUMNS = {
    "streams": ("hyper.streams",),
    "loops": ("loops",),
    "d_model": ("d_model",),
    "K": ("ffn.K",),
    "L": ("layers.begin", "layers.middle", "layers.end"),
    "depth": _STRUCTURE,
    "structure": _STRUCTURE,
    "variant": ("hyper", "lora_rank"),
}
# The arms table: the shape a reader checks first, in this order (facts() names).
SHOWN = (
    "family",
    "d_model",
    "n_heads",
    "head_dim",
    "ffn.kind",
    "ffn.K",
    "ffn.width",
    "ffn.width_ratio",
    "structure",
    "hyper",
    "tie_embeddings",
)


def _flatten(d: Mapping[str, Any], prefix: str = "") -> dict[str, Any]:
    out: dict[str, Any] = {}
    for k, v in d.items():
        if isinstance(v, Mapping) and k in ("ffn", "layers", "hyper"):
            out.update(_flatten(v, f"{prefix}{k}."))
        else:
            out[f"{prefix}{k}"] = v
    return out


def facts(spec: Mapping[str, Any] | str) -> dict[str, Any]:
    """A resolved spec as flat keys (`ffn.d_ff`, `hyper.mixing`), with what its shape implies:
    head_dim, the FFN width and its ratio to d_model (3 decimals), the unrolled depth and the
    structure. A spec that does not validate gives its keys as written."""
    raw = json.loads(spec) if isinstance(spec, str) else dict(spec)
    try:
        s = ArchSpec.from_dict(raw)
    except (SpecError, TypeError, ValueError):
        return {k: v for k, v in _flatten(raw).items() if k not in _IGNORED}
    out = {k: v for k, v in _flatten(s.to_dict()).items() if k not in _IGNORED}
    out.update(
        {
            "head_dim": s.head_dim,
            "ffn.width": s.ffn.width,
            "ffn.width_ratio": round(s.ffn.width / s.d_model, 3),
            "depth": s.unrolled_layers(),
            "structure": s.structure(),
            "hyper": "none" if s.hyper is None else s.hyper.label,
        }
    )
    for k in ("ffn.d_ff", "ffn.d_h"):
        if out.get(k) is None:
            out.pop(k, None)
    return out


@dataclass(frozen=True, kw_only=True)
class Arms:
    """One claim's arms: each group's candidates as facts(), what differs and what is unaccounted."""

    groups: dict[str, list[dict[str, Any]]]  # group -> its candidates' facts (and `params`)
    differ: tuple[str, ...]  # every key whose values are not the same in each group
    confounded: tuple[str, ...]  # the differing keys neither tested nor solved
    not_as_set: tuple[str, ...] = ()  # "ffn.dh_ratio 0.405 → 0.236": a key set, trained otherwise

    @property
    def label(self) -> str:
        """'controlled', or 'confounded: head_dim, n_heads'."""
        bad = [*self.confounded, *self.not_as_set]
        return f"confounded: {', '.join(bad)}" if bad else "controlled"


def _text(v: Any) -> str:
    return json.dumps(v, sort_keys=True, default=str)


def differing(groups: Mapping[str, Sequence[Mapping[str, Any]]]) -> tuple[str, ...]:
    """The keys whose set of values is not the same in every group (a group holds one or more
    candidates: the same two depths in each group differ in nothing)."""
    keys = dict.fromkeys(k for cands in groups.values() for f in cands for k in f if k != "params")
    # a section one arm lacks differs whole (`hyper`), not key by key
    lacking = any(f.get("hyper") == "none" for cands in groups.values() for f in cands)
    keys = {k: None for k in keys if not (lacking and k.startswith("hyper.")) and k != TOKENS}
    out = []
    for k in keys:
        seen = {frozenset(_text(f.get(k)) for f in cands) for cands in groups.values() if cands}
        if len(seen) > 1:
            out.append(k)
    return tuple(out)


def tested(
    filters: Iterable[str], declared: Mapping[str, Any], values: Mapping[str, Iterable[Any]]
) -> set[str]:
    """The spec keys a claim's group filters account for. `values`: filter -> the values its groups
    take (a variant's keys are those it sets in the space, from the study's declaration)."""
    out: set[str] = set()
    for column in filters:
        key = column.removeprefix("axes.")
        if key == "family":
            # a family is its preset and its structure; a section one arm lacks (hyper) differs whole
            out |= {
                "family",
                "structure",
                "hyper",
                "eval_loops",
                "injection",
                "loop_residual_from",
                "lora_rank",
                *_STRUCTURE,
                *HYPER_KEYS,
            }
            for fam in values.get(column, ()):
                out |= set(_flatten(PRESETS.get(str(fam), {})))
        elif key == "variant" and column.startswith("axes."):
            for name in values.get(column, ()):
                v = (declared.get("variants") or {}).get(str(name)) or {}
                out |= _set_by(_flatten(v.get("arch") or {}), v.get("shape") or {})
        elif key == "budget":
            # what the solver sets from it; head_dim and the FFN ratio are the shape it holds
            out |= {"d_model", *_HEADS, "ffn.d_ff", "ffn.d_h", "ffn.width"}
        elif key.startswith("shape."):
            out |= _set_by({}, {key: None})
        else:
            out |= {key, *_COLUMNS.get(key, ())}
            if key.startswith("hyper."):
                out.add("hyper")
    return out


def _set_by(arch: Mapping[str, Any], shape: Mapping[str, Any]) -> set[str]:
    """The keys an ArchSpec fragment and its shape.* values move."""
    out = {k for k in arch if k not in _IGNORED}
    if any(k.startswith("ffn.") for k in arch):
        out |= {*_WIDTHS, "ffn.width"}
    if any(k.startswith("layers.") or k == "loops" for k in arch) or set(shape) & {
        "shape.layers",
        "shape.middle_frac",
        "shape.unrolled_layers",
        "shape.d_model_per_layer",
    }:
        out |= {*_STRUCTURE, "structure"}
    if "shape.d_model_per_layer" in shape:
        out |= {"d_model", *_HEADS}
    if "shape.head_dim" in shape:
        out |= {*_HEADS, "head_dim"}
    if any(k.startswith("hyper.") for k in arch):
        out.add("hyper")
    return out


def solved(declared: Mapping[str, Any]) -> set[str]:
    """The keys the space's declared budget dimension moves (`solve:`, d_model by default; the
    head count with it when the space sets shape.head_dim, since n_heads = d_model / head_dim)."""
    solve = declared.get("solve") or "d_model"
    if solve == SOLVE_NONE:  # one shape for every arm: nothing moves with the budget
        return set()
    if solve != "d_model" or declared.get("anchor"):
        return {*_WIDTHS, "ffn.width"}
    heads = "shape.head_dim" in (declared.get("axes") or {})
    # The FFN width follows d_model through its ratio; the ratio itself is the shape asked for.
    return {"d_model", "ffn.d_ff", "ffn.d_h", "ffn.width", *(_HEADS if heads else ())}


def tokens_broken(
    groups: Mapping[str, Sequence[Mapping[str, Any]]], rule: str, tolerance: float
) -> bool:
    """Whether the groups' tokens break the claim's rule: `same` (or a group's name: every arm at
    its tokens) within twice the budget's tolerance (two arms each within it of the budget);
    `own`, the same tokens per counted parameter to within 0.1%."""
    cands = [f for fs in groups.values() for f in fs if f.get(TOKENS)]
    if len(cands) < 2:
        return False
    if rule == "own":
        per = [f[TOKENS] / f["params"] for f in cands if f.get("params")]
        return bool(per) and max(per) / min(per) - 1 > 1e-3
    ref = [f[TOKENS] for f in groups.get(rule, ())] if rule in groups else None
    values = [f[TOKENS] for f in cands]
    lo, hi = (min(ref), max(ref)) if ref else (min(values), max(values))
    return max(hi, *values) / min(lo, *values) - 1 > 2 * tolerance


def compare(
    groups: Mapping[str, list[dict[str, Any]]],
    filters: Mapping[str, Mapping[str, Sequence[Any]]],
    declared: Mapping[str, Any],
    tokens: str = "same",
) -> Arms:
    """The arms of one claim: `groups` name -> its candidates' facts; `filters` name -> the group's
    column filters (with the claim's `where`); `declared` the study's declaration (_study.json);
    `tokens` the claim's token rule (TOKEN_RULES or a group's name)."""
    # A filter every group shares (the claim's `where: {budget: 1M}`) tests nothing.
    columns = dict.fromkeys(c for f in filters.values() for c in f)
    values = {
        c: {str(v) for f in filters.values() for v in f.get(c, ())}
        for c in columns
        if len({tuple(sorted(map(str, f.get(c, ())))) for f in filters.values()}) > 1
    }
    differ = differing(groups)
    if tokens_broken(groups, tokens, float(declared.get("tolerance") or 0.005)):
        differ = (*differ, TOKENS)
    tuned = {f"recipe.{k}" for k in ((declared.get("tune") or {}).get("grid") or {})}
    accounted = tested(values, declared, values) | solved(declared) | tuned
    not_set = _not_as_set(groups, filters, declared)
    return Arms(
        groups=dict(groups),
        differ=differ,
        confounded=tuple(k for k in differ if k not in accounted),
        not_as_set=not_set,
    )


def _not_as_set(groups, filters, declared) -> tuple[str, ...]:
    """Ratios a group's variant sets that its trained model does not have (the solver moved them
    to meet the budget): d_h = round(dh_ratio x d_model) to within one unit of the lattice."""
    out = []
    for name, cands in groups.items():
        for variant in filters.get(name, {}).get("axes.variant", ()):
            arch = ((declared.get("variants") or {}).get(str(variant)) or {}).get("arch") or {}
            ffn = arch.get("ffn") or {}
            for ratio in ("ratio", "dh_ratio"):
                if ffn.get(ratio) is None:
                    continue
                for f in cands:
                    trained = f.get("ffn.width_ratio")
                    if (
                        trained is not None
                        and abs(trained * f["d_model"] - ffn[ratio] * f["d_model"]) > 1.5
                    ):
                        out.append(f"{variant} ffn.{ratio} {ffn[ratio]:g} → {trained:g}")
    return tuple(dict.fromkeys(out))


def candidates_of(
    rows: pd.DataFrame, count: str | None, tuning: pd.DataFrame | None = None
) -> list[dict[str, Any]]:
    """A group's distinct candidates (by spec) as facts(), each with its parameters under `count`,
    its tokens and its runs' recipe (recipe_of; `tuning`: the study's tuning runs, by spec)."""
    out = []
    if "spec" not in rows:
        return out
    for spec, part in rows.groupby("spec", sort=False):
        f = facts(spec)
        column = f"params_{count}" if count else "params_total"
        if column in part:
            f["params"] = int(part[column].iloc[0])
        tuned = tuning[tuning["spec"] == spec] if tuning is not None and "spec" in tuning else None
        out.append({**f, **recipe_of(part, tuned)})
    return out


def _shares(values: pd.Series) -> str:
    """Each value's share of the runs, as a fraction in lowest terms ('AMD EPYC (2 cpus, 1 torch
    threads) 1/4; Intel Xeon ... 3/4'), or the value alone when every run had it: arms of 7 and 8
    seeds on one CPU are alike, 2 of 4 and 1 of 4 on it are not."""
    seen = Counter(str(v).replace("(R)", "").replace("(TM)", "") for v in values.dropna())
    if len(seen) == 1:
        return next(iter(seen))
    n = sum(seen.values())
    return "; ".join(f"{k} {Fraction(c, n)}" for k, c in sorted(seen.items()))


def recipe_of(rows: pd.DataFrame, tuning: pd.DataFrame | None = None) -> dict[str, Any]:
    """How a candidate's runs trained: `recipe.<key>` for each RECIPE key of their `training` (the
    distinct values, ", " between several), the precision they ran at, the hardware of its final
    runs and of its tuning runs (each value's share), and TOKENS, its final runs' tokens trained."""
    out: dict[str, Any] = {}
    if "training" in rows:
        settings = [json.loads(t) for t in rows["training"].dropna()]
        for key in RECIPE:
            seen = dict.fromkeys(_text(t.get(key)) for t in settings if key in t)
            if seen:
                out[f"recipe.{key}"] = ", ".join(seen)
    if "precision" in rows and rows["precision"].notna().any():
        out["recipe.precision"] = ", ".join(sorted(set(map(str, rows["precision"].dropna()))))
    if "hardware" in rows and rows["hardware"].notna().any():
        out["recipe.hardware"] = _shares(rows["hardware"])
    if tuning is not None and "hardware" in tuning and tuning["hardware"].notna().any():
        out["recipe.tuning_hardware"] = _shares(tuning["hardware"])
    if "tokens_trained" in rows and rows["tokens_trained"].notna().any():
        out[TOKENS] = int(rows["tokens_trained"].dropna().max())
    return out


# --- the arms of a plan, before anything is trained ----------------------------------------------


def declaration(space) -> dict[str, Any]:
    """What a study of `space` (a SearchSpace) declares about its shape, as _study.json holds it."""
    return {
        "tolerance": space.tolerance,
        "tune": space.tune.declared() if space.tune is not None else None,
        "solve": space.solve,
        "anchor": space.anchor,
        "axes": {a.key: None for a in space.axes},
        "variants": {n: {"arch": v.arch, "shape": v.shape} for n, v in space.variants.items()},
    }


def plan_rows(plan) -> pd.DataFrame:
    """A plan's candidates (space.plan.Plan) as the rows their trials would write: the columns a
    claim's groups filter on (family, budget, axes, streams, ...), the spec and the counts."""
    rows = []
    for c in plan.candidates:
        config = c.config()
        spec = config.pop("spec")
        params = c.solution.params
        rows.append(
            {
                "study": plan.space.name,
                "status": "ok",
                "tokens_trained": plan.space.tokens_for(params, budget=c.solution.budget),
                "training": json.dumps(plan.space.trial_training, default=str),
                **describe(spec),
                **config,
                "budget_count": plan.space.count,
                "axes": json.dumps(config, default=str),
                "spec": json.dumps(spec, sort_keys=True),
            }
        )
    return pd.DataFrame(rows)

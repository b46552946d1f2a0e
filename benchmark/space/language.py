"""The search-space language (docs/search-spaces.md, search_spaces/ for real ones): a YAML file
-> a validated `SearchSpace`: a budget and how it is met, a fixed ArchSpec fragment (`base`), named
`variants` or an `anchor`, `axes` (ArchSpec or `shape.*` keys -> domains, decided in file order),
`training:` and `objectives`. Names resolve only to allow-lists read off the configs (keys.py,
TrainConfig's fields, the metric registry), never to code; every error reads `path:line:col:
key.path: what is wrong`, with a "did you mean". Candidates of a space are candidates.py.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping, Sequence

from benchmark.arch import COUNTS, FFN_WIDTHS, PRESETS, SPEC_KEYS, did_you_mean, one_of, set_dotted
from benchmark.recipe import DEFAULTS as TRAINING_DEFAULTS
from benchmark.recipe import (
    QUANTIZE_DEFAULTS,
    QuantizeConfig,
    QuantizeConfigError,
    TrainConfig,
    TrainConfigError,
    fmt_count,
    parse_amount,
    parse_tokens,
    parse_tolerance,
)
from benchmark.space.align import Align, parse_align
from benchmark.space.budget import DEFAULT_TOLERANCE, SOLVE_NONE, SOLVES
from benchmark.space.domains import Axis, Choice, read_domain
from benchmark.space.expr import Condition
from benchmark.space.keys import LEAF_KEYS, SECTIONS, checked, first_key
from benchmark.space.shape import SHAPE_KEYS
from benchmark.space.source import Override, Source, SpaceError, apply_overrides, read_document
from benchmark.space.tuning import Tune, read_tune
from benchmark.store import (
    LOOP_COUNTS,
    LOOP_LOSSES,
    SEARCHABLE,
    MetricError,
    check_study_name,
    metric,
    objective,
)

TOP_KEYS = (
    "name",
    "description",
    "budget",
    "count",
    "tolerance",
    "solve",
    "align",
    "anchor",
    "base",
    "variants",
    "axes",
    "training",
    "quantize",
    "objectives",
    "trials",
    "seeds",
    "pruner",
    "controlled",
    "tune",
)
# What may stop a trial early: ASHA's successive halving over training tokens (when the space has
# one objective measured during training), or nothing, which a study of claims needs: a candidate
# pruned at its first seed never trains the others, and its claims have no pairs.
PRUNERS = ("asha", "none")
DEFAULT_TRIALS = 16
_WIDTH_KEYS = tuple(f"ffn.{width}" for width, _, _ in FFN_WIDTHS.values())  # what `solve: ffn` sets
_RATIO_KEYS = tuple(f"ffn.{ratio}" for _, ratio, _ in FFN_WIDTHS.values())
# What `solve: none` holds from the anchor for every candidate (a model against one of twice its
# parameters at one width: Hyperloop §4.2, Table 1, App. A); the budget sizes the anchor alone.
_HELD_KEYS = (
    "d_model",
    "n_heads",
    "n_kv_heads",
    "head_dim",
    *_WIDTH_KEYS,
    *_RATIO_KEYS,
    "shape.d_model_per_layer",
)


# ---- top-level values (ValueError carries the message) --------------------------------------


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected text, got {v!r}")
    return v


def _flag(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def _positive_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"expected a positive integer, got {v!r}")
    return v


def parse_budgets(v: Any) -> tuple[int, ...]:
    """`113M`, or a ladder `[0.5M, 1M, 2M]` (also the text `1M,2M,4M` of --budget) -> ascending,
    distinct budgets."""
    items = v.split(",") if isinstance(v, str) and "," in v else v if isinstance(v, list) else [v]
    if not items:
        raise ValueError("expected a budget like 113M or a ladder like [0.5M, 1M, 2M], got []")
    budgets = [parse_amount(item.strip() if isinstance(item, str) else item) for item in items]
    if len(set(budgets)) != len(budgets):
        raise ValueError(f"a budget is listed twice: {v!r}")
    return tuple(sorted(budgets))


def _objectives(v: Any) -> tuple[tuple[str, str], ...]:
    """[val_loss:min, params] -> ((name, direction), ...) with names from the metric registry."""
    if not isinstance(v, list) or not v:
        raise ValueError(f"expected a list like [val_loss:min, params:min], got {v!r}")
    out = []
    for item in v:
        name = str(item).partition(":")[0].strip()
        try:
            metric(name)
        except MetricError:
            raise ValueError(
                f"'{name}' is not one of {', '.join(SEARCHABLE)}{did_you_mean(name, SEARCHABLE)}"
            ) from None
        try:
            m, direction = objective(item)
        except MetricError as e:
            raise ValueError(str(e)) from None
        out.append((m.name, direction))
    if len({name for name, _ in out}) != len(out):
        raise ValueError(f"an objective is listed twice: {v!r}")
    return tuple(out)


# ---- the space ----------------------------------------------------------------------------


@dataclass(frozen=True, kw_only=True)
class Variant:
    arch: dict[str, Any]  # a nested ArchSpec fragment
    shape: dict[str, Any]  # shape.* values


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    name: str
    description: str = ""
    budget: int | None = None  # the budget; with a ladder, its largest (for estimates and gates)
    ladder: tuple[
        int, ...
    ] = ()  # `budget: [0.5M, 1M, 2M]`: every candidate at every budget (the `budget` axis)
    count: str = "total"
    tolerance: float = DEFAULT_TOLERANCE
    solve: str = "d_model"
    align: Align | None = None  # hardware-friendly multiples of d_model, FFN width, head_dim
    anchor: dict[str, Any] | None = None
    base: dict[str, Any] = field(default_factory=dict)
    variants: dict[str, Variant] = field(default_factory=dict)
    axes: tuple[Axis, ...] = ()  # with variants, the first axis is "variant"
    training: dict[str, Any] = field(
        default_factory=dict
    )  # as written; TrainConfig fills its defaults
    quantize: dict[str, Any] = field(
        default_factory=dict
    )  # as written; QuantizeConfig fills its defaults
    objectives: tuple[tuple[str, str], ...] = (("val_loss", "min"),)
    trials: int = DEFAULT_TRIALS
    seeds: int = 1  # every candidate trained with this many seeds (--seeds overrides)
    pruner: str = "asha"  # PRUNERS
    # The shape held across candidates, not preferred: shape.head_dim exact, an FFN ratio the space
    # gives exact, so that a claim's arms differ only in what it tests and in the solved dimension.
    controlled: bool = False
    tune: Tune | None = None  # each candidate's training settings tuned over a grid (tuning.py)
    source: Source = field(default=Source("<space>"), compare=False, repr=False)

    @property
    def budgets(self) -> tuple[int, ...]:
        """Every budget of the space: the ladder, or the one budget."""
        return self.ladder or ((self.budget,) if self.budget is not None else ())

    @property
    def trial_training(self) -> dict[str, Any]:
        """The `training:` section as a trial of this space reads it: per-parameter tokens (`20x`)
        multiply the parameters the budget counts unless `tokens_per` says otherwise."""
        return {"tokens_per": self.count, **self.training}

    def training_value(self, key: str) -> Any:
        """A training setting as the harness will see it (TrainConfig's default when the file gives none)."""
        return self.trial_training.get(key, TRAINING_DEFAULTS[key])

    def tokens_for(self, params: Mapping[str, int], budget: int | None = None) -> int:
        """Training tokens for a candidate with these parameter counts and budget
        (TrainConfig.total_tokens; `tokens_per: budget` multiplies the budget)."""
        return TrainConfig.from_dict(self.trial_training).total_tokens(_counts(params, budget))

    @property
    def overrides(self) -> tuple[str, ...]:
        """What the command line set over the file, as given: `--set training.seq_len=128`, `--budget 600K`."""
        return tuple(o.given for o in self.source.overrides)

    def schedule(
        self, params: Mapping[str, int], about: str = "", budget: int | None = None
    ) -> tuple[int, int]:
        """(steps, warmup steps) of a candidate with these parameter counts, as its trial trains
        (TrainConfig.steps and lr_at). SpaceError when the schedule cannot fit: fewer tokens than
        one step, a warmup that does not end before the run does, or (wsd) a warmup that runs into
        the decay. `about` names the candidate, whose size sets the steps of per-parameter tokens."""
        cfg = TrainConfig.from_dict(self.trial_training)
        params = _counts(params, budget)
        tokens, steps, per_step = cfg.total_tokens(params), cfg.steps(params), cfg.tokens_per_step
        warm = cfg.warmup_steps(steps)
        amount = parse_tokens(cfg.tokens)
        who = f"{about} trains " if about and not amount.absolute else ""
        whose = (
            ""
            if amount.absolute
            else f" = {amount} its {fmt_count(params[cfg.tokens_per])} {cfg.tokens_per} parameters"
        )
        accum = f" x grad_accum {cfg.grad_accum}" if cfg.grad_accum > 1 else ""
        run = (
            f"{who}{fmt_count(tokens)} tokens{whose} at {per_step:,} a step (batch_size {cfg.batch_size} x "
            f"seq_len {cfg.seq_len}{accum})"
        )
        fix = "set a smaller training.batch_size or training.seq_len, or train more tokens"
        if tokens < per_step:
            raise self.source.error(("training", "tokens"), f"less than one step: {run}; {fix}")
        if warm >= steps:
            raise self.source.error(
                ("training", "warmup"),
                f"{warm:,} warmup steps do not end before the run's "
                f"{steps:,} steps: {run}; give warmup as a fraction of the run (e.g. 0.05), "
                f"or {fix}",
            )
        decay = cfg.decay_steps(steps)
        if cfg.schedule == "wsd" and warm + decay > steps:
            raise self.source.error(
                ("training", "warmup"),
                f"{warm:,} warmup steps run into the last {decay:,} "
                f"steps of decay (decay: {cfg.decay}) of the run's {steps:,} steps: {run}; "
                f"give warmup as a fraction of the run (e.g. 0.05), or {fix}",
            )
        return steps, warm

    def check_objectives(self, spec, about: str = "") -> None:
        """SpaceError when an objective is a per-loop loss (val_loss_r4) this candidate's spec does not
        evaluate (its `eval_loops`): every one of its trials would have no value to optimise."""
        loops_of = dict(zip(LOOP_LOSSES, LOOP_COUNTS))
        for i, (name, _) in enumerate(self.objectives):
            column = metric(name).column
            r = loops_of.get(column)
            if r is not None and r not in spec.eval_loops:
                evaluated = ", ".join(map(str, spec.eval_loops)) or "none"
                families = ", ".join(f for f, p in PRESETS.items() if r in p.get("eval_loops", ()))
                raise self.source.error(
                    ("objectives", i),
                    f"{column} is the loss at {r} loops, which {about or 'a candidate'} "
                    f"({spec.family}) does not evaluate (its eval_loops: {evaluated}); give the "
                    f"family eval_loops with {r}, or keep this objective to families that "
                    f"evaluate it ({families})",
                )


BUDGET_AXIS = "budget"


def with_ladder(axes: tuple[Axis, ...], budgets: tuple[int, ...]) -> tuple[Axis, ...]:
    """The axes with a ladder's `budget` axis first (replacing any earlier one): the budget is
    decided like any axis, so a finite space enumerates every candidate at every budget and a
    sampled one lets the sampler weigh it (the driver enqueues each budget once first)."""
    rest = tuple(a for a in axes if a.key != BUDGET_AXIS)
    return (
        (Axis(key=BUDGET_AXIS, domain=Choice(values=budgets)),) if len(budgets) > 1 else ()
    ) + rest


# ---- loading ------------------------------------------------------------------------------


def load_space(path: str | Path, overrides: Sequence[Override] = ()) -> SearchSpace:
    """Read and validate a search-space file, with `overrides` (`--set KEY=VALUE`: source.py) set
    over it before it is validated as a whole, as if the file said so; raises SpaceError."""
    file = str(path)
    doc = read_document(path)
    src = Source(file, doc, tuple(overrides))
    if not isinstance(doc.data, dict):
        raise src.error(
            (),
            f"a search space is a mapping (name, budget, base, axes, ...), "
            f"got {type(doc.data).__name__}",
        )
    data = apply_overrides(doc.data, overrides)
    for k in data:
        if k not in TOP_KEYS:
            raise src.error((k,), f"unknown key{did_you_mean(k, TOP_KEYS)}", value=False)
    return _Reader(src, data).space()


def _flatten(frag: Mapping[str, Any], prefix: str = "") -> Iterator[tuple[str, Any]]:
    """Nested or dotted fragment keys -> (dotted key, value); sections are walked into."""
    for k, v in frag.items():
        key = f"{prefix}{k}"
        if isinstance(v, dict) and (key in SECTIONS or key == "shape"):
            yield from _flatten(v, key + ".")
        else:
            yield key, v


class _Reader:
    """Validates the sections of one file, raising SpaceErrors located in it."""

    def __init__(self, src: Source, top: dict[str, Any]):
        self.src, self.top = src, top

    def fail(self, path: tuple, reason: str, value: bool = True) -> SpaceError:
        return self.src.error(path, reason, value=value)

    def parsed(self, key: str, parse: Callable[[Any], Any], default: Any) -> Any:
        if key not in self.top:
            return default
        try:
            return parse(self.top[key])
        except ValueError as e:
            raise self.fail((key,), str(e)) from None

    def space(self) -> SearchSpace:
        self.solve = self.parsed("solve", lambda v: one_of(v, (*SOLVES, SOLVE_NONE)), "d_model")
        self.anchored = "anchor" in self.top
        self.controlled = self.parsed("controlled", _flag, False)
        if self.solve == SOLVE_NONE and not self.anchored:
            raise self.fail(
                ("solve",),
                "none keeps every candidate at the anchor's shape (d_model, heads, FFN "
                "width) with its own parameter count; it needs an `anchor:`, the model whose size "
                "`budget` sets within `tolerance`",
            )
        if self.anchored and self.solve == "d_model":
            raise self.fail(
                ("anchor",),
                "anchor holds one solved d_model for every candidate, so `solve` must "
                "be an FFN width (ffn, ffn.d_ff or ffn.d_h), not d_model",
                value=False,
            )
        anchor = self.fragment(("anchor",), self.top["anchor"]).arch if self.anchored else None
        variants = self.variants()
        budgets = self.parsed("budget", parse_budgets, ())
        seeds, pruner = (
            self.parsed("seeds", _positive_int, 1),
            self.parsed("pruner", lambda v: one_of(v, PRUNERS), "asha"),
        )
        tune = (
            read_tune(self.src, self.top["tune"], self.training(), range(seeds))
            if "tune" in self.top
            else None
        )
        if (
            tune and pruner != "none"
        ):  # ASHA would stop some of a candidate's tuning runs: unequal budgets
            raise self.fail(
                ("tune",), "every candidate trains the whole grid: set `pruner: none`", value=False
            )
        return SearchSpace(
            name=self.parsed(
                "name", lambda v: check_study_name(_text(v)), Path(self.src.file).stem
            ),
            description=self.parsed("description", _text, ""),
            budget=budgets[-1] if budgets else None,
            ladder=budgets if len(budgets) > 1 else (),
            count=self.parsed("count", lambda v: one_of(v, COUNTS), "total"),
            tolerance=self.parsed("tolerance", parse_tolerance, DEFAULT_TOLERANCE),
            solve=self.solve,
            align=self.parsed("align", parse_align, None),
            anchor=anchor,
            base=self.fragment(("base",), self.top.get("base", {})).arch,
            variants=variants,
            axes=with_ladder(self.axes(variants), budgets),
            training=self.training(),
            quantize=self.quantize(),
            objectives=self.parsed("objectives", _objectives, (("val_loss", "min"),)),
            trials=self.parsed("trials", _positive_int, DEFAULT_TRIALS),
            seeds=seeds,
            pruner=pruner,
            tune=tune,
            controlled=self.controlled,
            source=self.src,
        )

    def fragment(self, path: tuple, frag: Any, shape_ok: bool = False) -> Variant:
        """An ArchSpec fragment (nested or dotted keys; shape.* keys where allowed)."""
        if not isinstance(frag, dict):
            raise self.fail(path, f"expected a mapping of ArchSpec keys, got {frag!r}")
        arch: dict[str, Any] = {}
        shape: dict[str, Any] = {}
        for key, value in _flatten(frag):
            where = path + tuple(key.split("."))
            if path == ("anchor",):
                solved = "d_model is solved for the anchor" if key == "d_model" else ""
            else:
                solved = self.solved(key)
            if solved:
                raise self.fail(where, f"{solved}; it cannot also be given", value=False)
            held = (
                path == ("anchor",) and self.solve == SOLVE_NONE
            )  # the anchor's ratio is everyone's width
            if self.controlled and self.solve != "d_model" and key in _RATIO_KEYS and not held:
                raise self.fail(
                    where,
                    f"{key} has no effect when the FFN width is solved (solve: {self.solve}): "
                    "under controlled: true every key a space sets is what the model trains with",
                    value=False,
                )
            if key in SHAPE_KEYS and shape_ok:
                shape[key] = checked(self.src, where, key, value)
            elif key in SPEC_KEYS:
                set_dotted(arch, key, checked(self.src, where, key, value))
            elif key in SHAPE_KEYS:
                raise self.fail(
                    where,
                    f"{key} is applied per candidate: give it under axes (a plain value "
                    f"there is fixed, e.g. {key}: {value})",
                    value=False,
                )
            else:
                options = LEAF_KEYS + (tuple(SHAPE_KEYS) if shape_ok else ())
                raise self.fail(where, f"unknown key{did_you_mean(key, options)}", value=False)
        return Variant(arch=arch, shape=shape)

    def variants(self) -> dict[str, Variant]:
        if "variants" not in self.top:
            return {}
        raw = self.top["variants"]
        if not isinstance(raw, dict) or not raw:
            raise self.fail(
                ("variants",), "expected a mapping of variant names to ArchSpec fragments"
            )
        return {
            name: self.fragment(("variants", name), frag, shape_ok=True)
            for name, frag in raw.items()
        }

    def solved(self, key: str) -> str:
        """Why the solver sets `key` (so the file may not), or ""."""
        if self.solve == SOLVE_NONE and key in _HELD_KEYS:
            return (
                f"{key} is held from the anchor (solve: none: every candidate keeps the anchor's d_model, "
                "heads and FFN width); set the shape in `anchor:`"
            )
        if key == "d_model" and self.anchored:
            return "d_model is held from the anchor"
        width = {"ffn": _WIDTH_KEYS, "d_model": ()}.get(self.solve, (self.solve,))
        if key == "d_model" and self.solve == "d_model" or key in width:
            return f"{key} is solved to meet the budget (solve: {self.solve})"
        return ""

    def axes(self, variants: dict[str, Variant]) -> tuple[Axis, ...]:
        raw = self.top.get("axes", {})
        if not isinstance(raw, dict):
            raise self.fail(("axes",), f"expected a mapping of keys to domains, got {raw!r}")
        axes = [Axis(key="variant", domain=Choice(values=tuple(variants)))] if variants else []
        for key, spec in raw.items():
            self.check_axis_key(key)
            domain, when = read_domain(self.src, ("axes", key), key, spec)
            if when is not None:
                self.check_names(("axes", key, "when"), when, axes)
            axes.append(Axis(key=key, domain=domain, when=when))
        return tuple(axes)

    def check_axis_key(self, key: str) -> None:
        path = ("axes", key)
        if key in SECTIONS:
            raise self.fail(
                path,
                f"`{key}` is a section; name a key inside it, e.g. {first_key(key)}",
                value=False,
            )
        if key not in LEAF_KEYS and key not in SHAPE_KEYS:
            raise self.fail(
                path, f"unknown key{did_you_mean(key, LEAF_KEYS + tuple(SHAPE_KEYS))}", value=False
            )
        if self.solved(key):
            raise self.fail(path, f"{self.solved(key)}; it cannot also be an axis", value=False)
        if self.solve != "d_model" and key in _RATIO_KEYS:
            raise self.fail(
                path,
                f"{key} has no effect when the FFN width is solved (solve: {self.solve})",
                value=False,
            )

    def check_names(self, path: tuple, when: Condition, before: list[Axis]) -> None:
        """A condition reads ArchSpec keys, shape keys and `variant`; an axis it reads must be
        declared above it, since axes are decided in file order."""
        declared = {a.key for a in before}
        names = sorted(set(LEAF_KEYS) | set(SHAPE_KEYS) | ({"variant"} & declared))
        for name in when.names:
            if name not in names:
                raise self.fail(path, f"unknown name '{name}'{did_you_mean(name, names)}")
            if name in self.top["axes"] and name not in declared:
                raise self.fail(
                    path,
                    f"reads axis '{name}', which is decided at or after this one; declare it above",
                )

    def training(self) -> dict[str, Any]:
        """The section as written, once TrainConfig accepts it (the harness fills its defaults)."""
        raw = self.top.get("training", {})
        if not isinstance(raw, dict):
            raise self.fail(("training",), f"expected a mapping, got {raw!r}")
        try:
            TrainConfig.from_dict(raw)
        except TrainConfigError as e:
            raise self.fail(
                ("training", e.key), e.reason, value=e.key in TRAINING_DEFAULTS
            ) from None
        return dict(raw)

    def quantize(self) -> dict[str, Any]:
        """The section as written, once QuantizeConfig accepts it (the trial fills its defaults)."""
        raw = self.top.get("quantize", {})
        if not isinstance(raw, dict):
            raise self.fail(
                ("quantize",),
                f"expected a mapping like {{group_size: 128, calib_sequences: 1024}}, got {raw!r}",
            )
        try:
            QuantizeConfig.from_dict(raw)
        except QuantizeConfigError as e:
            raise self.fail(
                ("quantize", e.key), e.reason, value=e.key in QUANTIZE_DEFAULTS
            ) from None
        return dict(raw)


def _counts(params: Mapping[str, int], budget: int | None) -> Mapping[str, int]:
    """A candidate's counts, with its budget where there is one (`tokens_per: budget`)."""
    return params if budget is None else {**params, "budget": budget}

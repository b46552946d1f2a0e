"""The search-space language (SPEC.md "A search space"): a YAML file -> a validated `SearchSpace`.

```yaml
name: hyperloop-vs-looped
description: one line shown in plans and leaderboards
budget: 113M                 # run_search.py --budget overrides
count: total                 # or non_embedding
tolerance: 0.5%
solve: d_model               # or ffn.d_ff, ffn.d_h, ffn (whichever width the FFN kind has)
anchor: {ffn: {ratio: 4}}    # optional: d_model solved once for base + anchor, then held for all
base: {n_heads: 16}          # a fixed ArchSpec fragment
variants:                    # optional named ArchSpec fragments; each candidate takes one
  conventional: {ffn: {kind: swiglu, ratio: 4}, shape.layers: 12}
axes:                        # decided in file order; `when` reads ArchSpec keys and earlier axes
  family: [looped, hyperloop]                       # a bare list is a choice
  layers.middle: {int: [2, 6], step: 2}
  hyper.streams: {choice: [2, 4, 8], when: "family == 'hyperloop'"}
  ffn.dh_ratio: {float: [0.1, 0.9]}                 # or {logfloat: [a, b]}, {float: .., log: true}
  shape.unrolled_layers: 16                         # a scalar (or {value: 16}) is fixed
training: {tokens: 20x, seq_len: 256}               # for the trial harness; keys in TRAINING_KEYS
objectives: [val_loss:min, params:min]
trials: 32
```

Names resolve only to an allow-list (ArchSpec keys, `shape.*` keys, registered training keys and
metrics), never to code. Every error is a `SpaceError` reading `path:line:col: key.path: what is
wrong`, with a "did you mean" for misspelt keys and values. Turning points of a space into
budget-matched candidates is candidates.py.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, field, fields, replace
from pathlib import Path
from typing import Any, Callable, Iterator, Mapping

from benchmark.arch.spec import (
    EVERY_NAMES,
    FAMILIES,
    FFN_KINDS,
    HYPER_INITS,
    INJECTIONS,
    MIXINGS,
    READS,
    ArchSpec,
    FFNSpec,
    HyperSpec,
    LayerSplit,
    did_you_mean,
    set_dotted,
)
from benchmark.space.budget import (
    COUNTS,
    SOLVES,
    parse_amount,
    parse_tokens,
    parse_tolerance,
)
from benchmark.space.expr import Condition, ExprError, parse_condition
from benchmark.space.shape import SHAPE_KEYS
from benchmark.space.yamlsafe import Document, YamlError, dotted, load_yaml
from benchmark.store.metrics import MetricError, objective
from benchmark.store.results import check_study_name

TOP_KEYS = ("name", "description", "budget", "count", "tolerance", "solve", "anchor", "base", "variants",
            "axes", "training", "objectives", "trials")
DOMAIN_KEYS = ("choice", "int", "float", "logfloat", "value", "step", "log", "when")
DEFAULT_TRIALS = 16


# ---- small value parsers (ValueError carries the message) -----------------------------------

def _one_of(v: Any, options) -> Any:
    if v not in options:
        raise ValueError(f"'{v}' is not one of {', '.join(map(str, options))}{did_you_mean(v, options)}")
    return v


def _text(v: Any) -> str:
    if not isinstance(v, str):
        raise ValueError(f"expected text, got {v!r}")
    return v


def _positive_int(v: Any) -> int:
    if isinstance(v, bool) or not isinstance(v, int) or v < 1:
        raise ValueError(f"expected a positive integer, got {v!r}")
    return v


def _number(low: float, high: float = math.inf, *, open_low: bool = False) -> Callable[[Any], float]:
    def check(v: Any) -> float:
        if isinstance(v, bool) or not isinstance(v, (int, float)):
            raise ValueError(f"expected a number, got {v!r}")
        if v < low or (open_low and v == low) or v > high:
            if high == math.inf:
                raise ValueError(f"must be {'>' if open_low else '>='} {low:g}, got {v}")
            raise ValueError(f"must be in {'(' if open_low else '['}{low:g}, {high:g}], got {v}")
        return float(v)
    return check


def _bool(v: Any) -> bool:
    if not isinstance(v, bool):
        raise ValueError(f"expected true or false, got {v!r}")
    return v


def _int(low: int) -> Callable[[Any], int]:
    def check(v: Any) -> int:
        if isinstance(v, bool) or not isinstance(v, int) or v < low:
            raise ValueError(f"expected an integer >= {low}, got {v!r}")
        return v
    return check


# The one allow-list of `training:` keys: exactly the fields of the trial harness's
# training.TrainConfig (a test keeps the two equal), each with a check that can point at the file.
TRAINING_KEYS: dict[str, Callable[[Any], Any]] = {
    "tokens": parse_tokens,                               # 20x (per parameter, see tokens_per) or 5M
    "tokens_per": lambda v: _one_of(v, COUNTS),           # the parameter count that "20x" multiplies
    "seq_len": _positive_int,
    "batch_size": _positive_int,                          # sequences per step
    "lr": _number(0, open_low=True),                      # peak learning rate
    "min_lr": _number(0),                                 # end of the decay (Hyperloop App. A: lr / 10)
    "schedule": lambda v: _one_of(v, ("cosine", "wsd")),  # wsd: warmup-stable-decay (AbbIE §3.2)
    "warmup": _number(0),                                 # a fraction of the steps (< 1) or a number of steps
    "decay": _number(0, 1),                               # wsd: fraction of the steps in the final decay
    "weight_decay": _number(0),
    "beta1": _number(0, 1),
    "beta2": _number(0, 1),
    "grad_clip": _number(0, open_low=True),
    "eval_every": _int(0),                                # steps between evaluations; 0 = at the end
    "eval_tokens": parse_amount,                          # held-out tokens per source
    "precision": lambda v: _one_of(v, ("auto", "bf16", "fp32")),
    "compile": _bool,
    "seed": _int(0),
    "device": _text,                                      # auto, cpu, cuda, cuda:1, ...
}
TRAINING_DEFAULTS = {"tokens": "20x", "tokens_per": "total", "seq_len": 256}  # TrainConfig's, for planning

def _objectives(v: Any) -> tuple[tuple[str, str], ...]:
    """[val_loss:min, params] -> ((name, direction), ...) with names from the metric registry."""
    if not isinstance(v, list) or not v:
        raise ValueError(f"expected a list like [val_loss:min, params:min], got {v!r}")
    out = []
    for item in v:
        try:
            m, direction = objective(item)
        except MetricError as e:
            raise ValueError(str(e)) from None
        out.append((m.name, direction))
    if len({name for name, _ in out}) != len(out):
        raise ValueError(f"an objective is listed twice: {v!r}")
    return tuple(out)


# ---- the ArchSpec schema as dotted keys --------------------------------------------------------

SECTIONS = {"ffn": FFNSpec, "layers": LayerSplit, "hyper": HyperSpec}
_ENUMS = {"family": FAMILIES, "ffn.kind": FFN_KINDS, "injection": INJECTIONS, "hyper.mixing": MIXINGS,
          "hyper.every": EVERY_NAMES, "hyper.read": READS, "hyper.init": HYPER_INITS}
_MIN_ZERO = {"layers.begin", "layers.middle", "layers.end", "lora_rank", "loop_residual_from"}


def _schema() -> dict[str, str]:
    """Dotted key -> its type annotation ('int | None', ...), 'section', or the shape key's type."""
    out = {}
    for f in fields(ArchSpec):
        if f.name in SECTIONS:
            out[f.name] = "section"
            out.update({f"{f.name}.{g.name}": str(g.type) for g in fields(SECTIONS[f.name])})
        else:
            out[f.name] = str(f.type)
    out["layers.n"] = "int"
    return out


SCHEMA = _schema()
LEAF_KEYS = tuple(k for k, t in SCHEMA.items() if t != "section")


def value_kind(key: str) -> str:
    """int | float | fraction | bool | enum | list | section, for an ArchSpec or shape key."""
    if key in _ENUMS:
        return "enum"
    if key in SHAPE_KEYS:
        return SHAPE_KEYS[key]
    annotation = SCHEMA[key].replace(" | None", "")
    return {"tuple[int, ...]": "list"}.get(annotation, annotation)


def check_value(key: str, value: Any) -> None:
    """Raise ValueError if `value` cannot be the value of `key` (an ArchSpec dotted key or a shape
    key). Combinations (e.g. every 5 layers of a 12-layer loop) are checked by ArchSpec itself."""
    kind = value_kind(key)
    is_int = isinstance(value, int) and not isinstance(value, bool)
    if value is None and (" | None" in SCHEMA.get(key, "") or key == "hyper"):
        return  # an explicit null: "use the default" (or, for hyper, "no hyper-connections")
    if kind == "enum":
        if not (key == "hyper.every" and is_int and value >= 1):
            _one_of(value, _ENUMS[key])
    elif kind == "list":
        if not isinstance(value, list) or not all(isinstance(r, int) and not isinstance(r, bool) and r >= 1
                                                  for r in value):
            raise ValueError(f"expected a list of loop counts like [1, 2, 4, 8], got {value!r}")
    elif kind == "bool":
        if not isinstance(value, bool):
            raise ValueError(f"expected true or false, got {value!r}")
    elif kind == "int":
        if not is_int:
            raise ValueError(f"expected an integer, got {value!r}")
        _number(0 if key in _MIN_ZERO else 1)(value)
        if key == "shape.head_dim" and value % 2:
            raise ValueError(f"must be even (rotary embeddings turn pairs of dimensions), got {value}")
    elif kind == "fraction":
        _number(0, 1, open_low=True)(value)
    elif kind == "float":
        _number(0, open_low=True)(value)
    elif kind == "section" and not isinstance(value, Mapping) and not (key == "layers" and is_int):
        raise ValueError(f"expected a mapping of {key} keys, got {value!r}")


# ---- errors -------------------------------------------------------------------------------

class SpaceError(ValueError):
    """A search space the user must fix: `file:line:col: key: reason`."""

    def __init__(self, file: str, line: int | None, col: int | None, key: str, reason: str):
        self.file, self.line, self.col, self.key, self.reason = file, line, col, key, reason
        where = f"{file}:{line}:{col}" if line is not None else file
        super().__init__(f"{where}: {key}: {reason}" if key else f"{where}: {reason}")


@dataclass(frozen=True)
class Source:
    """Where a space came from, to point errors at the file, line and column."""

    file: str
    doc: Document | None = None

    def error(self, path: tuple, reason: str, *, value: bool = True) -> SpaceError:
        """An error at `path` (its value, or its key when `value` is false). A dotted key may be
        written nested (`ffn: {kind: ..}`) or as one key (`ffn.kind: ..`); either is found."""
        line, col = (None, None)
        if self.doc:
            spellings = [path[:i] + (".".join(map(str, path[i:])),) for i in range(len(path) - 1, -1, -1)]
            found = next((p for p in spellings if p in self.doc.key_marks or p in self.doc.value_marks), path)
            line, col = self.doc.where(found, value=value)
        return SpaceError(self.file, line, col, dotted(path), reason)


# ---- domains, axes, the space ---------------------------------------------------------------

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
    key: str                        # a dotted ArchSpec key, a shape.* key, or "variant"
    domain: Domain
    when: Condition | None = None


@dataclass(frozen=True, kw_only=True)
class Variant:
    arch: dict[str, Any]            # a nested ArchSpec fragment
    shape: dict[str, Any]           # shape.* values


@dataclass(frozen=True, kw_only=True)
class SearchSpace:
    name: str
    description: str = ""
    budget: int | None = None
    count: str = "total"
    tolerance: float = 0.005
    solve: str = "d_model"
    anchor: dict[str, Any] | None = None
    base: dict[str, Any] = field(default_factory=dict)
    variants: dict[str, Variant] = field(default_factory=dict)
    axes: tuple[Axis, ...] = ()     # with variants, the first axis is "variant"
    training: dict[str, Any] = field(default_factory=dict)   # as written; the harness fills its defaults
    objectives: tuple[tuple[str, str], ...] = (("val_loss", "min"),)
    trials: int = DEFAULT_TRIALS
    source: Source = field(default=Source("<space>"), compare=False, repr=False)

    def with_overrides(self, *, budget: Any = None, count: str | None = None, trials: int | None = None,
                       tokens: Any = None) -> SearchSpace:
        """Command-line overrides; raises ValueError for a malformed budget or token amount."""
        changes: dict[str, Any] = {}
        if budget is not None:
            changes["budget"] = parse_amount(budget)
        if count is not None:
            changes["count"] = _one_of(count, COUNTS)
        if trials is not None:
            changes["trials"] = _positive_int(trials)
        if tokens is not None:
            parse_tokens(tokens)
            changes["training"] = {**self.training, "tokens": tokens}
        return replace(self, **changes)

    def training_value(self, key: str) -> Any:
        """A training setting as the harness will see it (its default when the file gives none)."""
        return self.training.get(key, TRAINING_DEFAULTS.get(key))

    def tokens_for(self, params: Mapping[str, int]) -> int:
        """Training tokens for a candidate with these parameter counts (TrainConfig.total_tokens)."""
        return parse_tokens(self.training_value("tokens")).resolve(params[self.training_value("tokens_per")])


# ---- loading ------------------------------------------------------------------------------

def load_space(path: str | Path) -> SearchSpace:
    """Read and validate a search-space file; raises SpaceError."""
    file = str(path)
    try:
        doc = load_yaml(path)
    except YamlError as e:
        raise SpaceError(file, e.line, e.col, e.key, e.reason) from None
    except OSError as e:
        raise SpaceError(file, None, None, "", f"cannot read: {e.strerror or e}") from None
    src = Source(file, doc)
    if not isinstance(doc.data, dict):
        raise src.error((), f"a search space is a mapping (name, budget, base, axes, ...), "
                            f"got {type(doc.data).__name__}")
    for k in doc.data:
        if k not in TOP_KEYS:
            raise src.error((k,), f"unknown key{did_you_mean(k, TOP_KEYS)}", value=False)
    return _Reader(src, doc.data).space()


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

    def checked(self, path: tuple, key: str, value: Any) -> Any:
        try:
            check_value(key, value)
        except ValueError as e:
            raise self.fail(path, str(e)) from None
        return value

    def space(self) -> SearchSpace:
        self.solve = self.parsed("solve", lambda v: _one_of(v, SOLVES), "d_model")
        self.anchored = "anchor" in self.top
        if self.anchored and self.solve == "d_model":
            raise self.fail(("anchor",), "anchor holds one solved d_model for every candidate, so `solve` must "
                            "be an FFN width (ffn, ffn.d_ff or ffn.d_h), not d_model", value=False)
        anchor = self.fragment(("anchor",), self.top["anchor"]).arch if self.anchored else None
        variants = self.variants()
        return SearchSpace(
            name=self.parsed("name", lambda v: check_study_name(_text(v)), Path(self.src.file).stem),
            description=self.parsed("description", _text, ""),
            budget=self.parsed("budget", parse_amount, None),
            count=self.parsed("count", lambda v: _one_of(v, COUNTS), "total"),
            tolerance=self.parsed("tolerance", parse_tolerance, 0.005),
            solve=self.solve,
            anchor=anchor,
            base=self.fragment(("base",), self.top.get("base", {})).arch,
            variants=variants,
            axes=self.axes(variants),
            training=self.training(),
            objectives=self.parsed("objectives", _objectives, (("val_loss", "min"),)),
            trials=self.parsed("trials", _positive_int, DEFAULT_TRIALS),
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
            if key in SHAPE_KEYS and shape_ok:
                shape[key] = self.checked(where, key, value)
            elif key in SCHEMA:
                set_dotted(arch, key, self.checked(where, key, value))
            elif key in SHAPE_KEYS:
                raise self.fail(where, f"{key} is applied per candidate: give it under axes (a plain value "
                                f"there is fixed, e.g. {key}: {value})", value=False)
            else:
                options = LEAF_KEYS + (tuple(SHAPE_KEYS) if shape_ok else ())
                raise self.fail(where, f"unknown key{did_you_mean(key, options)}", value=False)
        return Variant(arch=arch, shape=shape)

    def variants(self) -> dict[str, Variant]:
        if "variants" not in self.top:
            return {}
        raw = self.top["variants"]
        if not isinstance(raw, dict) or not raw:
            raise self.fail(("variants",), "expected a mapping of variant names to ArchSpec fragments")
        return {name: self.fragment(("variants", name), frag, shape_ok=True) for name, frag in raw.items()}

    def solved(self, key: str) -> str:
        """Why the solver sets `key` (so the file may not), or ""."""
        if key == "d_model" and self.anchored:
            return "d_model is held from the anchor"
        width = {"ffn": ("ffn.d_ff", "ffn.d_h"), "d_model": ()}.get(self.solve, (self.solve,))
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
            domain, when = self.domain(("axes", key), key, spec)
            if when is not None:
                self.check_names(("axes", key, "when"), when, axes)
            axes.append(Axis(key=key, domain=domain, when=when))
        return tuple(axes)

    def check_axis_key(self, key: str) -> None:
        path = ("axes", key)
        if key in SECTIONS:
            first = fields(SECTIONS[key])[0].name
            raise self.fail(path, f"`{key}` is a section; name a key inside it, e.g. {key}.{first}", value=False)
        if key not in LEAF_KEYS and key not in SHAPE_KEYS:
            raise self.fail(path, f"unknown key{did_you_mean(key, LEAF_KEYS + tuple(SHAPE_KEYS))}", value=False)
        if self.solved(key):
            raise self.fail(path, f"{self.solved(key)}; it cannot also be an axis", value=False)
        if self.solve != "d_model" and key in ("ffn.ratio", "ffn.dh_ratio"):
            raise self.fail(path, f"{key} has no effect when the FFN width is solved (solve: {self.solve})",
                            value=False)

    def domain(self, path: tuple, key: str, spec: Any) -> tuple[Domain, Condition | None]:
        if isinstance(spec, list):
            return self.choice(path, key, spec), None
        if not isinstance(spec, dict):
            return Fixed(value=self.checked(path, key, spec)), None
        for k in spec:
            if k not in DOMAIN_KEYS:
                raise self.fail(path + (k,), f"unknown key{did_you_mean(k, DOMAIN_KEYS)}", value=False)
        kinds = [k for k in ("choice", "int", "float", "logfloat", "value") if k in spec]
        if len(kinds) != 1:
            also = f", not {' and '.join(kinds)}" if kinds else ""
            raise self.fail(path, f"give exactly one of choice, int, float, logfloat or value{also}")
        kind = kinds[0]
        for extra, allowed in (("step", ("int",)), ("log", ("int", "float"))):
            if extra in spec and kind not in allowed:
                raise self.fail(path + (extra,), f"`{extra}` applies to {' and '.join(allowed)} ranges, not {kind}",
                                value=False)
        when = None
        if "when" in spec:
            try:
                when = parse_condition(spec["when"])
            except ExprError as e:
                where = f"at character {e.offset + 1} of the condition"
                raise self.fail(path + ("when",), f"{e.reason} ({where})") from None
        if kind == "choice":
            return self.choice(path + ("choice",), key, spec["choice"]), when
        if kind == "value":
            return Fixed(value=self.checked(path + ("value",), key, spec["value"])), when
        if kind == "int":
            return self.int_range(path, key, spec), when
        return self.float_range(path, key, spec, kind), when

    def choice(self, path: tuple, key: str, values: Any) -> Choice:
        if not isinstance(values, list) or not values:
            raise self.fail(path, f"expected a non-empty list of values, got {values!r}")
        for i, v in enumerate(values):
            self.checked(path + (i,), key, v)
            if v in values[:i]:
                raise self.fail(path + (i,), f"{v!r} is listed twice")
        return Choice(values=tuple(values))

    def bounds(self, path: tuple, key: str, pair: Any) -> tuple[Any, Any]:
        if not (isinstance(pair, list) and len(pair) == 2):
            raise self.fail(path, f"expected [lo, hi], got {pair!r}")
        lo, hi = (self.checked(path + (i,), key, v) for i, v in enumerate(pair))
        if lo >= hi:
            raise self.fail(path, f"lo must be < hi, got [{lo}, {hi}] (for one value use `value: {lo}`)")
        return lo, hi

    def int_range(self, path: tuple, key: str, spec: dict[str, Any]) -> IntRange:
        if value_kind(key) != "int":
            raise self.fail(path + ("int",), f"{key} does not take a range of integers; use choice", value=False)
        lo, hi = self.bounds(path + ("int",), key, spec["int"])
        step, log = spec.get("step", 1), spec.get("log", False)
        if isinstance(step, bool) or not isinstance(step, int) or step < 1:
            raise self.fail(path + ("step",), f"expected a positive integer, got {step!r}")
        if (hi - lo) % step:
            raise self.fail(path + ("step",), f"hi - lo ({hi - lo}) must be a multiple of step {step}")
        if not isinstance(log, bool) or (log and step != 1):
            raise self.fail(path + ("log",), f"expected true or false (and log needs step 1), got {log!r}")
        return IntRange(lo=lo, hi=hi, step=step, log=log)

    def float_range(self, path: tuple, key: str, spec: dict[str, Any], kind: str) -> FloatRange:
        if value_kind(key) not in ("float", "fraction"):
            raise self.fail(path + (kind,), f"{key} takes whole numbers; use int: [lo, hi] or choice",
                            value=False)
        lo, hi = self.bounds(path + (kind,), key, spec[kind])
        log = spec.get("log", kind == "logfloat")
        if not isinstance(log, bool):
            raise self.fail(path + ("log",), f"expected true or false, got {log!r}")
        return FloatRange(lo=float(lo), hi=float(hi), log=log)

    def check_names(self, path: tuple, when: Condition, before: list[Axis]) -> None:
        """A condition reads ArchSpec keys, shape keys and `variant`; an axis it reads must be
        declared above it, since axes are decided in file order."""
        declared = {a.key for a in before}
        names = sorted(set(LEAF_KEYS) | set(SHAPE_KEYS) | ({"variant"} & declared))
        for name in when.names:
            if name not in names:
                raise self.fail(path, f"unknown name '{name}'{did_you_mean(name, names)}")
            if name in self.top["axes"] and name not in declared:
                raise self.fail(path, f"reads axis '{name}', which is decided at or after this one; "
                                "declare it above")

    def training(self) -> dict[str, Any]:
        raw = self.top.get("training", {})
        if not isinstance(raw, dict):
            raise self.fail(("training",), f"expected a mapping, got {raw!r}")
        for k, v in raw.items():
            if k not in TRAINING_KEYS:
                raise self.fail(("training", k), f"unknown key{did_you_mean(k, TRAINING_KEYS)}", value=False)
            try:
                TRAINING_KEYS[k](v)
            except ValueError as e:
                raise self.fail(("training", k), str(e)) from None
        return dict(raw)

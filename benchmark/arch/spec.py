"""The architecture spec: one plain mapping (YAML or dict) -> a validated, frozen `ArchSpec`.

`family` is a shorthand that fills defaults (presets.py reproduces the seed papers); explicit keys
override it. Every key of docs/reference.md ("Architecture spec keys") is a field here, declared
with its default and the values it takes (`setting`, fields.py); `SPEC_KEYS` lists them as dotted
keys for the search space. Unknown keys are rejected with a "did you mean".

Validation happens once, at the edge (`ArchSpec.from_dict`). Errors are `SpecError`s that carry
the dotted key, so a YAML loader can point at the file, line and column of the offending key.
"""

from __future__ import annotations

import json
from dataclasses import asdict, dataclass, fields
from functools import cache
from typing import Any, Mapping

from benchmark.arch.fields import (
    Key,
    deep_merge,
    did_you_mean,
    keys,
    set_dotted,
    setting,
)
from benchmark.arch.presets import FAMILIES, PRESETS

INJECTIONS = ("none", "residual", "concat", "hyper")
MIXINGS = ("identity", "diagonal", "sinkhorn", "static", "dynamic")
EVERY_NAMES = ("sublayer", "layer", "loop")
# How a connection around whole layers reads its span F (Hyperloop eq. 3): `block` adds F(u), the
# span's output (the paper's literal recurrence); `delta` adds F(u) - u, the change the span makes.
READS = ("block", "delta")
# Gate initialisation (models/hyper.py): `home` breaks the symmetry of the n copied streams as the
# public implementations do; `symmetric` is every stream alike (the collapsed ablation).
HYPER_INITS = ("home", "symmetric")
# The n streams' storage precision (models/hyper.py, resolve_stream_dtype): `auto` stores them in
# bf16 when the steps run under bf16 autocast on CUDA (mHC eq. 10-19: bf16 streams, the gates,
# Sinkhorn and the accumulations in fp32), in fp32 elsewhere.
STREAM_DTYPES = ("auto", "bf16", "fp32")
# Each FFN kind's hidden width, that width's ratio to d_model, and the ratio taken when a spec gives
# neither: Hyperloop App. A's SwiGLU 2.75, and the hourglass bottleneck's best ratio at K = 4 (0.4,
# hourglass paper Fig. 3).
FFN_WIDTHS = {"swiglu": ("d_ff", "ratio", 2.75), "hourglass": ("d_h", "dh_ratio", 0.4)}
FFN_KINDS = tuple(FFN_WIDTHS)


class SpecError(ValueError):
    """An invalid architecture spec. `key` is the dotted path of the offending key."""

    def __init__(self, key: str, reason: str):
        self.key = key
        self.reason = reason
        super().__init__(f"{key}: {reason}" if key else reason)


@dataclass(frozen=True, kw_only=True)
class FFNSpec:
    """Feed-forward shape. `swiglu`: narrow-wide-narrow of width d_ff. `hourglass` (shape paper
    eq. 3-5): K residual SwiGLU sub-blocks of bottleneck width d_h, each with its own norm."""

    kind: str = setting("swiglu", choices=FFN_KINDS)
    d_ff: int | None = setting(None, at_least=1)  # resolved hidden width (swiglu)
    ratio: float | None = setting(None, above=0)  # d_ff / d_model (FFN_WIDTHS when unset)
    K: int = setting(1, at_least=1)
    d_h: int | None = setting(None, at_least=1)  # resolved bottleneck width (hourglass)
    dh_ratio: float | None = setting(None, above=0)  # d_h / d_model (FFN_WIDTHS when unset)
    multiple_of: int = setting(1, at_least=1)  # round resolved widths to a multiple of this

    @property
    def width(self) -> int:
        """The hidden width of one SwiGLU (sub-)block."""
        return self.d_ff if self.kind == "swiglu" else self.d_h

    @property
    def depth(self) -> int:
        return self.K if self.kind == "hourglass" else 1


def layer_counts(raw: Any) -> dict[str, Any]:
    """The layers section as begin/middle/end keys: `layers: 12` and `layers: {n: 12}` are a
    plain stack of 12 layers (layers.begin)."""
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = {"n": raw}
    if not isinstance(raw, Mapping):
        raise ValueError(f"expected a mapping of layers keys or a layer count, got {raw!r}")
    _check_keys("layers.", raw, [*_layout("layers.", LayerSplit)[0], "n"])
    if "n" not in raw:
        return dict(raw)
    if "begin" in raw:
        raise SpecError("layers.n", "give layers.n or layers.begin, not both")
    return {**{k: v for k, v in raw.items() if k != "n"}, "begin": _checked("layers.n", raw["n"])}


@dataclass(frozen=True, kw_only=True)
class LayerSplit:
    """The middle-cycle split (Hyperloop §2.1; AbbIE head/body/tail)."""

    begin: int = setting(0, at_least=0)
    middle: int = setting(0, at_least=0)
    end: int = setting(0, at_least=0)

    @property
    def unique(self) -> int:
        return self.begin + self.middle + self.end


@dataclass(frozen=True, kw_only=True)
class HyperSpec:
    """Hyper-connections: `streams` parallel residual streams; `every` places them
    (sublayer | layer | k layers | loop); `mixing` parameterises H_res (and for HC's
    static/dynamic, the whole connection matrix)."""

    streams: int = setting(4, at_least=1)
    every: str | int = setting("loop", choices=EVERY_NAMES, at_least=1)  # or a number of layers
    mixing: str = setting("diagonal", choices=MIXINGS)
    sinkhorn_iters: int = setting(20, at_least=1)
    loop_embedding: bool = False
    # HC's dynamic part passes through tanh (Zhu et al. eq. 10-13); false gives the paper's
    # "W/O tanh" rows (Tables 1-2).
    tanh: bool = True
    read: str = setting(
        "delta", choices=READS
    )  # whole-layer spans only (a sublayer's F is its branch)
    init: str = setting("home", choices=HYPER_INITS)
    stream_dtype: str = setting("auto", choices=STREAM_DTYPES)

    @property
    def label(self) -> str:
        """How plans and leaderboards name it: `4× diagonal / loop + loop emb.`,
        `2× dynamic w/o tanh / sublayer`, `4× diagonal / loop, F(u) - u, symmetric init`."""
        return (
            f"{self.streams}× {self.mixing}{'' if self.tanh else ' w/o tanh'} / {self.every}"
            + (" + loop emb." if self.loop_embedding else "")
            + (", F(u) - u" if self.read == "delta" and self.every == "loop" else "")
            + (", symmetric init" if self.init == "symmetric" else "")
        )

    @property
    def span_layers(self) -> int | None:
        """Layers covered by one connection; None for sublayer or loop placement."""
        if self.every == "layer":
            return 1
        return self.every if isinstance(self.every, int) else None


@dataclass(frozen=True, kw_only=True)
class ArchSpec:
    family: str = setting("transformer", choices=FAMILIES)
    vocab_size: int = setting(8192, at_least=2)
    d_model: int = setting(256, at_least=1)
    n_heads: int = setting(4, at_least=1)
    n_kv_heads: int | None = setting(
        None, at_least=1
    )  # resolved: defaults to n_heads (multi-head attention)
    head_dim: int | None = setting(None, at_least=1)  # resolved: defaults to d_model // n_heads
    tie_embeddings: bool = True
    rope_theta: float = setting(10000.0, above=0)
    norm_eps: float = setting(1e-5, above=0)
    ffn: FFNSpec = setting(factory=FFNSpec)
    layers: LayerSplit = setting(factory=lambda: LayerSplit(begin=4), parse=layer_counts)
    loops: int = setting(1, at_least=1)
    eval_loops: tuple[int, ...] = setting((), at_least=1)
    injection: str = setting("none", choices=INJECTIONS)
    # AbbIE-D (injection: residual): the first iteration k that adds h_k after the block (eq. 4
    # has 0; 1 makes one iteration the plain Transformer).
    loop_residual_from: int = setting(0, at_least=0)
    hyper: HyperSpec | None = None
    lora_rank: int = setting(0, at_least=0)

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "ArchSpec":
        """Validate a plain mapping (docs/reference.md keys; `family` fills defaults) into an ArchSpec."""
        if isinstance(raw, ArchSpec):
            return raw
        if not isinstance(raw, Mapping):
            raise SpecError("", f"expected a mapping of spec keys, got {type(raw).__name__}")
        _check_keys("", raw, _layout("", cls)[0])
        family = _checked("family", raw.get("family", cls.family))
        return _build(deep_merge(PRESETS[family], raw))

    def to_dict(self) -> dict[str, Any]:
        """The fully resolved spec as plain data (round-trips through `from_dict`)."""
        d = asdict(self)
        d["eval_loops"] = list(self.eval_loops)
        if self.hyper is None:
            d.pop("hyper")
        return d

    def to_json(self) -> str:
        return json.dumps(self.to_dict(), sort_keys=True)

    def replace(self, **changes: Any) -> "ArchSpec":
        """A re-validated copy with dotted-key overrides, e.g. replace(**{'layers.middle': 2})."""
        raw = self.to_dict()
        # Resolved defaults are re-derived from the new shape unless they were set apart from it.
        if self.head_dim * self.n_heads == self.d_model:
            raw["head_dim"] = None
        if self.n_kv_heads == self.n_heads:
            raw["n_kv_heads"] = None
        for key, value in changes.items():
            set_dotted(raw, key, value)
        # Widths given as ratios are re-derived (d_model may have changed).
        for width, ratio, _ in FFN_WIDTHS.values():
            if raw["ffn"].get(ratio) is not None:
                raw["ffn"][width] = None
        return ArchSpec.from_dict(raw)

    # ---- derived shape ------------------------------------------------------------------
    @property
    def looped(self) -> bool:
        return is_looped(self.layers, self.loops, self.injection)

    def unrolled_layers(self, loops: int | None = None) -> int:
        r = self.loops if loops is None else loops
        return self.layers.begin + self.layers.middle * r + self.layers.end

    @property
    def q_dim(self) -> int:
        return self.n_heads * self.head_dim

    @property
    def kv_dim(self) -> int:
        return self.n_kv_heads * self.head_dim

    def structure(self) -> str:
        """Compact structure in the Hyperloop paper's notation, e.g. '2L→4L(×3)→2L'."""
        s = self.layers
        return format_structure(s.begin, s.middle, s.end, self.loops, self.looped)


# Every key a spec (or a search space over specs) may name, with its rule. `layers.n` is the
# shorthand for a plain stack (layer_counts).
SPEC_KEYS: dict[str, Key] = {
    **keys(ArchSpec),
    "layers.n": Key(name="layers.n", types=(int,), at_least=1),
}


def _checked(key: str, value: Any) -> Any:
    """`value` checked by the rule of `key`; SpecError(key, reason) if it breaks it."""
    try:
        return SPEC_KEYS[key].check(value)
    except SpecError:
        raise
    except ValueError as e:
        raise SpecError(key, str(e)) from None


def _check_keys(prefix: str, raw: Mapping[str, Any], allowed: list[str]) -> None:
    for k in raw:
        if k not in allowed:
            raise SpecError(f"{prefix}{k}", f"unknown key{did_you_mean(k, allowed)}")


# ---- validation ---------------------------------------------------------------------------

_SECTION_DEFAULTS = {
    key: None if rule.default is None else asdict(rule.default)  # read, never changed
    for key, rule in SPEC_KEYS.items()
    if rule.section
}


@cache  # the budget solver validates thousands of specs
def _layout(prefix: str, cls: type) -> tuple[list[str], list[tuple[str, str, Any]]]:
    """The field names of `cls` (the section at `prefix`), and (name, dotted key, default) of
    those that are not sections themselves; a section's default as plain data."""
    names = [f.name for f in fields(cls)]
    rules = [SPEC_KEYS[prefix + name] for name in names]
    plain = [
        (name, rule.name, rule.default) for name, rule in zip(names, rules) if rule.section is None
    ]
    return names, plain


def _read(prefix: str, cls: type, raw: Mapping[str, Any]) -> dict[str, Any]:
    """The keys of `cls` (a section when `prefix` is `ffn.`, ...) that are not sections, each
    checked by its rule; an absent key takes its field default."""
    names, plain = _layout(prefix, cls)
    _check_keys(prefix, raw, names)
    return {name: _checked(key, raw.get(name, default)) for name, key, default in plain}


def _section(key: str, raw: Mapping[str, Any]) -> Any:
    """The raw section `key` (its field default when absent), checked as a whole."""
    return _checked(key, raw[key] if key in raw else _SECTION_DEFAULTS[key])


def _round_to(x: float, multiple: int) -> int:
    return max(multiple, int(round(x / multiple)) * multiple)


def _build_ffn(raw: Mapping[str, Any], d_model: int) -> FFNSpec:
    v = _read("ffn.", FFNSpec, raw)
    if v["kind"] == "swiglu" and v["K"] != 1:
        raise SpecError("ffn.K", f"K={v['K']} needs ffn.kind: hourglass (a SwiGLU FFN has K=1)")
    width, ratio, default_ratio = FFN_WIDTHS[v["kind"]]
    for other, _, _ in FFN_WIDTHS.values():
        if other != width:
            v[other] = None  # only the kind's own width is resolved
    if v[ratio] is not None or v[width] is None:  # the width follows d_model
        v[ratio] = default_ratio if v[ratio] is None else v[ratio]
        derived = _round_to(v[ratio] * d_model, v["multiple_of"])
        if v[width] is not None and v[width] != derived:
            raise SpecError(
                f"ffn.{width}",
                f"ffn.{width} {v[width]} disagrees with ffn.{ratio} (gives {derived}); "
                "give one of them",
            )
        v[width] = derived
    return FFNSpec(**v)


def _build_layers(raw: Mapping[str, Any]) -> LayerSplit:
    layers = LayerSplit(**_read("layers.", LayerSplit, _section("layers", raw)))
    if layers.unique == 0:
        raise SpecError("layers", "the model needs at least one layer")
    return layers


def _heads(v: dict[str, Any]) -> None:
    """Resolve n_kv_heads (multi-head attention) and head_dim (d_model / n_heads) in `v`."""
    d_model, n_heads = v["d_model"], v["n_heads"]
    if v["n_kv_heads"] is None:
        v["n_kv_heads"] = n_heads
    if v["head_dim"] is None:
        if d_model % n_heads:
            raise SpecError("d_model", f"d_model {d_model} is not divisible by n_heads {n_heads}")
        v["head_dim"] = d_model // n_heads
    if n_heads % v["n_kv_heads"]:
        raise SpecError(
            "n_kv_heads", f"n_heads {n_heads} is not divisible by n_kv_heads {v['n_kv_heads']}"
        )
    if v["head_dim"] % 2:
        raise SpecError("head_dim", f"head_dim {v['head_dim']} must be even for rotary embeddings")


def _build(raw: Mapping[str, Any]) -> ArchSpec:
    v = _read("", ArchSpec, raw)
    _heads(v)
    layers = _build_layers(raw)
    loops, injection, lora_rank, eval_loops = (
        v["loops"],
        v["injection"],
        v["lora_rank"],
        v["eval_loops"],
    )
    if v["loop_residual_from"] and injection != "residual":
        raise SpecError(
            "loop_residual_from",
            "the inter-iteration residual is AbbIE-D's (injection: residual), "
            f"got injection: {injection}",
        )
    hyper_raw = _section("hyper", raw)
    hyper = HyperSpec(**_read("hyper.", HyperSpec, hyper_raw)) if hyper_raw is not None else None
    if layers.middle == 0 and (loops > 1 or injection != "none" or lora_rank or eval_loops):
        what = (
            "loops > 1"
            if loops > 1
            else f"injection: {injection}"
            if injection != "none"
            else "lora_rank > 0"
            if lora_rank
            else "eval_loops"
        )
        raise SpecError("layers.middle", f"layers.middle must be > 0 when {what}")
    if injection == "hyper" and hyper is None:
        raise SpecError("hyper", "injection: hyper needs a hyper section (streams, every, mixing)")
    if hyper is not None:
        _check_hyper(hyper, layers, loops, injection)
    return ArchSpec(
        **v, ffn=_build_ffn(_section("ffn", raw), v["d_model"]), layers=layers, hyper=hyper
    )


def _check_hyper(h: HyperSpec, layers: LayerSplit, loops: int, injection: str) -> None:
    looped = is_looped(layers, loops, injection)
    if looped and injection != "hyper":
        raise SpecError(
            "injection",
            f"a looped model with a hyper section needs injection: hyper, got {injection}",
        )
    if h.every == "loop" and not looped:
        raise SpecError(
            "hyper.every", "every: loop needs a looped middle block (layers.middle > 0, loops > 1)"
        )
    if h.loop_embedding and h.every != "loop":
        raise SpecError(
            "hyper.loop_embedding",
            "the loop embedding is added at loop-level connections; needs "
            f"every: loop, got {h.every}",
        )
    if h.read == "block" and h.every == "sublayer":
        raise SpecError(
            "hyper.read",
            "read: block adds a span's whole output; a sublayer connection adds its "
            "branch (read: delta)",
        )
    if not h.tanh and h.mixing != "dynamic":
        raise SpecError(
            "hyper.tanh",
            f"tanh squashes the dynamic part of HC (mixing: dynamic); mixing {h.mixing} has none",
        )
    if h.mixing in ("static", "dynamic") and h.every == "loop":
        raise SpecError(
            "hyper.mixing",
            f"{h.mixing} hyper-connections (Zhu et al.) wrap sublayers or layers, not loops",
        )
    span = h.span_layers
    if span is not None:
        region = layers.middle * loops if looped else layers.unique
        if region % span:
            where = (
                f"{layers.middle} x {loops} unrolled middle layers"
                if looped
                else f"{region} layers"
            )
            raise SpecError("hyper.every", f"every {span} layers does not divide the {where}")


def format_structure(begin: int, middle: int, end: int, loops: int, looped: bool) -> str:
    """The one structure string of plans, rows and leaderboards (Hyperloop Table 1's notation):
    `2L→4L(×3)→2L`, `4L(×2)` without begin and end layers, and `12L` for a model whose middle
    block does not loop (a looped model with one loop and an injection rule, such as Hyperloop's
    hyper-connections, is still `1L→2L(×1)→1L`)."""
    if not (middle and looped):
        return f"{begin + middle + end}L"
    parts = [f"{begin}L" if begin else "", f"{middle}L(×{loops})", f"{end}L" if end else ""]
    return "→".join(p for p in parts if p)


def is_looped(layers: LayerSplit, loops: int, injection: str) -> bool:
    """A middle block that runs more than once or has an injection rule; with one plain loop
    the model is an ordinary Transformer (AbbIE §2.1: r = 1 is the special case)."""
    return layers.middle > 0 and (loops > 1 or injection != "none")


def hyper_spans(spec: ArchSpec, loops: int | None = None) -> list[tuple[int, int, int | None]]:
    """The hyper-connections of a model unrolled for `loops`, as (first layer, layers spanned,
    sublayer or None), positions counted inside the hyper region: the looped middle block for a
    looped model (Hyperloop: streams expand after the begin block and are averaged before the
    end block), the whole stack otherwise (mHC / HC). Placement per Hyperloop Table 5."""
    h = spec.hyper
    if h is None:
        return []
    r = spec.loops if loops is None else loops
    n_layers = spec.layers.middle * r if spec.looped else spec.layers.unique
    if h.every == "sublayer":
        return [(i, 1, s) for i in range(n_layers) for s in (0, 1)]
    k = spec.layers.middle if h.every == "loop" else h.span_layers
    return [(i, k, None) for i in range(0, n_layers, k)]

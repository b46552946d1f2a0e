"""The architecture spec: one plain mapping (YAML or dict) -> a validated, frozen `ArchSpec`.

`family` is a shorthand that fills defaults (the presets below reproduce the seed papers);
explicit keys override it. Every key of ../shared/SPEC.md ("One model: the architecture spec")
is here; unknown keys are rejected with a "did you mean".

Validation happens once, at the edge (`ArchSpec.from_dict`). Errors are `SpecError`s that carry
the dotted key, so a YAML loader can point at the file, line and column of the offending key.
"""

from __future__ import annotations

import copy
import difflib
import json
from dataclasses import asdict, dataclass, field, fields
from typing import Any, Mapping

FAMILIES = (
    "transformer", "looped", "hyperloop", "mhc", "hc",
    "abbie-c", "abbie-d", "depth", "lora-looped",
)
INJECTIONS = ("none", "residual", "concat", "hyper")
MIXINGS = ("identity", "diagonal", "sinkhorn", "static", "dynamic")
EVERY_NAMES = ("sublayer", "layer", "loop")
# How a connection around whole layers reads its span F (Hyperloop eq. 3): `block` adds F(u), the
# span's output (the paper's literal recurrence); `delta` adds F(u) - u, the change the span makes.
READS = ("block", "delta")
# Gate initialisation (models/hyper.py): `home` breaks the symmetry of the n copied streams as the
# public implementations do; `symmetric` is every stream alike (the collapsed ablation).
HYPER_INITS = ("home", "symmetric")
FFN_KINDS = ("swiglu", "hourglass")

# Presets reproduce the papers' own configurations (SPEC.md "Presets"). Only keys that differ
# from the plain Transformer defaults are listed.
PRESETS: dict[str, dict[str, Any]] = {
    "transformer": {},
    # Hyperloop §4.1: ~25% / 50% / 25% of the layers, middle looped 3 times.
    "looped": {"layers": {"begin": 2, "middle": 4, "end": 2}, "loops": 3},
    "lora-looped": {"layers": {"begin": 2, "middle": 4, "end": 2}, "loops": 3, "lora_rank": 8},
    # Hyperloop §3: loop-level HC, 4 streams, diagonal sigmoid H_res, loop position embedding,
    # and eq. 3 read literally: F is the middle block as a whole.
    "hyperloop": {
        "layers": {"begin": 2, "middle": 4, "end": 2}, "loops": 3, "injection": "hyper",
        "hyper": {"streams": 4, "every": "loop", "mixing": "diagonal", "loop_embedding": True, "read": "block"},
    },
    # mHC: no looping, 4 streams at every sublayer, Sinkhorn-projected H_res.
    "mhc": {"hyper": {"streams": 4, "every": "sublayer", "mixing": "sinkhorn"}},
    # HC (Zhu et al.): dynamic (tanh) hyper-connections at every sublayer, expansion rate 4.
    "hc": {"hyper": {"streams": 4, "every": "sublayer", "mixing": "dynamic"}},
    # AbbIE §3.2: head/body/tail, trained at 2 iterations, evaluated at 1/2/4/8.
    "abbie-c": {"layers": {"begin": 2, "middle": 4, "end": 2}, "loops": 2, "eval_loops": [1, 2, 4, 8]},
    # AbbIE-D eq. 4, h_{k+1} = B(h_k) + h_k "for k = 0, ..., N - 1": the inter-iteration residual
    # acts from the first iteration (§2.1 works it through as h_{k+1} = 2 h_k + Δh_k, and §4 reports
    # AbbIE-D's "distinctive reduction of performance at r = 1", which a model that is the plain
    # Transformer at r = 1 would not show). `loop_residual_from: 1` is the other reading.
    "abbie-d": {
        "layers": {"begin": 2, "middle": 4, "end": 2}, "loops": 2, "eval_loops": [1, 2, 4, 8],
        "injection": "residual", "loop_residual_from": 0,
    },
    # AbbIE §3.1 "Depth" (Geiping et al.): concatenated input injection, random initial state.
    "depth": {
        "layers": {"begin": 2, "middle": 4, "end": 2}, "loops": 2, "eval_loops": [1, 2, 4, 8],
        "injection": "concat",
    },
}


class SpecError(ValueError):
    """An invalid architecture spec. `key` is the dotted path of the offending key."""

    def __init__(self, key: str, reason: str):
        self.key = key
        self.reason = reason
        super().__init__(f"{key}: {reason}" if key else reason)


def did_you_mean(word: Any, options) -> str:
    """' (did you mean 'x'?)' for the closest option, else ''. Shared by every validator."""
    close = difflib.get_close_matches(str(word), [str(o) for o in options], n=1, cutoff=0.6)
    return f" (did you mean '{close[0]}'?)" if close else ""


def _choice(key: str, value: Any, options) -> Any:
    if value not in options:
        valid = ", ".join(map(str, options))
        raise SpecError(key, f"'{value}' is not one of {valid}{did_you_mean(value, options)}")
    return value


def _int(key: str, value: Any, lo: int | None = None) -> int:
    if isinstance(value, bool) or not isinstance(value, int):
        if isinstance(value, float) and value.is_integer():
            value = int(value)
        else:
            raise SpecError(key, f"expected an integer, got {value!r}")
    if lo is not None and value < lo:
        raise SpecError(key, f"must be >= {lo}, got {value}")
    return value


def _float(key: str, value: Any, lo: float | None = None) -> float:
    if isinstance(value, bool) or not isinstance(value, (int, float)):
        raise SpecError(key, f"expected a number, got {value!r}")
    if lo is not None and value <= lo:
        raise SpecError(key, f"must be > {lo}, got {value}")
    return float(value)


def _bool(key: str, value: Any) -> bool:
    if not isinstance(value, bool):
        raise SpecError(key, f"expected true or false, got {value!r}")
    return value


def _check_keys(prefix: str, raw: Mapping[str, Any], allowed) -> None:
    if not isinstance(raw, Mapping):
        raise SpecError(prefix, f"expected a mapping, got {type(raw).__name__}")
    for k in raw:
        if k not in allowed:
            key = f"{prefix}.{k}" if prefix else str(k)
            raise SpecError(key, f"unknown key{did_you_mean(k, allowed)}")


def deep_merge(base: Mapping[str, Any], over: Mapping[str, Any]) -> dict[str, Any]:
    """Nested dict update: `over` wins; mappings merge key by key."""
    out = copy.deepcopy(dict(base))
    for k, v in over.items():
        if isinstance(v, Mapping) and isinstance(out.get(k), Mapping):
            out[k] = deep_merge(out[k], v)
        else:
            out[k] = copy.deepcopy(v)
    return out


@dataclass(frozen=True, kw_only=True)
class FFNSpec:
    """Feed-forward shape. `swiglu`: narrow-wide-narrow of width d_ff. `hourglass` (shape paper
    eq. 3-5): K residual SwiGLU sub-blocks of bottleneck width d_h, each with its own norm."""

    kind: str = "swiglu"
    d_ff: int | None = None       # resolved hidden width (swiglu)
    ratio: float | None = None    # d_ff / d_model (Hyperloop uses 2.75)
    K: int = 1
    d_h: int | None = None        # resolved bottleneck width (hourglass)
    dh_ratio: float | None = None
    multiple_of: int = 1          # round resolved widths to a multiple of this

    @property
    def width(self) -> int:
        """The hidden width of one SwiGLU (sub-)block."""
        return self.d_ff if self.kind == "swiglu" else self.d_h

    @property
    def depth(self) -> int:
        return self.K if self.kind == "hourglass" else 1


@dataclass(frozen=True, kw_only=True)
class LayerSplit:
    """The middle-cycle split (Hyperloop §2.1; AbbIE head/body/tail)."""

    begin: int
    middle: int = 0
    end: int = 0

    @property
    def unique(self) -> int:
        return self.begin + self.middle + self.end


@dataclass(frozen=True, kw_only=True)
class HyperSpec:
    """Hyper-connections: `streams` parallel residual streams; `every` places them
    (sublayer | layer | k layers | loop); `mixing` parameterises H_res (and for HC's
    static/dynamic, the whole connection matrix)."""

    streams: int = 4
    every: str | int = "loop"
    mixing: str = "diagonal"
    sinkhorn_iters: int = 20
    loop_embedding: bool = False
    # HC's dynamic part passes through tanh (Zhu et al. eq. 10-13); false gives the paper's
    # "W/O tanh" rows (Tables 1-2).
    tanh: bool = True
    read: str = "delta"           # READS; whole-layer spans only (a sublayer's F is its branch)
    init: str = "home"            # HYPER_INITS

    @property
    def label(self) -> str:
        """How plans and leaderboards name it: `4× diagonal / loop + loop emb.`,
        `2× dynamic w/o tanh / sublayer`, `4× diagonal / loop, F(u) - u, symmetric init`."""
        return (f"{self.streams}× {self.mixing}{'' if self.tanh else ' w/o tanh'} / {self.every}"
                + (" + loop emb." if self.loop_embedding else "")
                + (", F(u) - u" if self.read == "delta" and self.every == "loop" else "")
                + (", symmetric init" if self.init == "symmetric" else ""))

    @property
    def span_layers(self) -> int | None:
        """Layers covered by one connection; None for sublayer or loop placement."""
        if self.every == "layer":
            return 1
        return self.every if isinstance(self.every, int) else None


@dataclass(frozen=True, kw_only=True)
class ArchSpec:
    family: str = "transformer"
    vocab_size: int = 8192
    d_model: int = 256
    n_heads: int = 4
    n_kv_heads: int | None = None   # resolved: defaults to n_heads (multi-head attention)
    head_dim: int | None = None     # resolved: defaults to d_model // n_heads
    tie_embeddings: bool = True
    rope_theta: float = 10000.0
    norm_eps: float = 1e-5
    ffn: FFNSpec = field(default_factory=FFNSpec)
    layers: LayerSplit = field(default_factory=lambda: LayerSplit(begin=4))
    loops: int = 1
    eval_loops: tuple[int, ...] = ()
    injection: str = "none"
    # AbbIE-D (injection: residual): the first iteration k that adds h_k after the block (eq. 4
    # has 0; 1 makes one iteration the plain Transformer).
    loop_residual_from: int = 0
    hyper: HyperSpec | None = None
    lora_rank: int = 0

    # ---- construction -------------------------------------------------------------------
    @classmethod
    def from_dict(cls, raw: Mapping[str, Any]) -> "ArchSpec":
        """Validate a plain mapping (SPEC.md keys; `family` fills defaults) into an ArchSpec."""
        if isinstance(raw, ArchSpec):
            return raw
        _check_keys("", raw, {f.name for f in fields(cls)})
        family = _choice("family", raw.get("family", "transformer"), FAMILIES)
        merged = deep_merge(PRESETS[family], raw)
        return _build(merged)

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
        if raw["ffn"].get("ratio") is not None:
            raw["ffn"]["d_ff"] = None
        if raw["ffn"].get("dh_ratio") is not None:
            raw["ffn"]["d_h"] = None
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


def format_structure(begin: int, middle: int, end: int, loops: int, looped: bool) -> str:
    """The one structure string of plans, rows and leaderboards (Hyperloop Table 1's notation):
    `2L→4L(×3)→2L`, `4L(×2)` without begin and end layers, and `12L` for a model whose middle
    block does not loop (a looped model with one loop and an injection rule, such as Hyperloop's
    hyper-connections, is still `1L→2L(×1)→1L`)."""
    if not (middle and looped):
        return f"{begin + middle + end}L"
    parts = [f"{begin}L" if begin else "", f"{middle}L(×{loops})", f"{end}L" if end else ""]
    return "→".join(p for p in parts if p)


# ---- validation ---------------------------------------------------------------------------

def is_looped(layers: LayerSplit, loops: int, injection: str) -> bool:
    """A middle block that runs more than once or has an injection rule; with one plain loop
    the model is an ordinary Transformer (AbbIE §2.1: r = 1 is the special case)."""
    return layers.middle > 0 and (loops > 1 or injection != "none")


def _round_to(x: float, multiple: int) -> int:
    return max(multiple, int(round(x / multiple)) * multiple)


def _build_ffn(raw: Mapping[str, Any], d_model: int) -> FFNSpec:
    _check_keys("ffn", raw, {f.name for f in fields(FFNSpec)})
    kind = _choice("ffn.kind", raw.get("kind", "swiglu"), FFN_KINDS)
    mult = _int("ffn.multiple_of", raw.get("multiple_of", 1), 1)
    K = _int("ffn.K", raw.get("K", 1), 1)
    ratio = raw.get("ratio")
    dh_ratio = raw.get("dh_ratio")
    d_ff = d_h = None
    if kind == "swiglu":
        if K != 1:
            raise SpecError("ffn.K", f"K={K} needs ffn.kind: hourglass (a SwiGLU FFN has K=1)")
        if ratio is not None or raw.get("d_ff") is None:
            ratio = _float("ffn.ratio", 2.75 if ratio is None else ratio, 0.0)
            d_ff = _round_to(ratio * d_model, mult)
            _same_width("ffn.d_ff", raw.get("d_ff"), d_ff, "ffn.ratio")
        else:
            d_ff = _int("ffn.d_ff", raw["d_ff"], 1)
    else:
        if dh_ratio is not None or raw.get("d_h") is None:
            dh_ratio = _float("ffn.dh_ratio", 0.4 if dh_ratio is None else dh_ratio, 0.0)
            d_h = _round_to(dh_ratio * d_model, mult)
            _same_width("ffn.d_h", raw.get("d_h"), d_h, "ffn.dh_ratio")
        else:
            d_h = _int("ffn.d_h", raw["d_h"], 1)
    return FFNSpec(kind=kind, d_ff=d_ff, ratio=None if ratio is None else float(ratio),
                   K=K, d_h=d_h, dh_ratio=None if dh_ratio is None else float(dh_ratio),
                   multiple_of=mult)


def _same_width(key: str, given: Any, derived: int, ratio_key: str) -> None:
    if given is not None and given != derived:
        raise SpecError(key, f"{key} {given} disagrees with {ratio_key} (gives {derived}); give one of them")


def _build_layers(raw: Any) -> LayerSplit:
    if isinstance(raw, int) and not isinstance(raw, bool):
        raw = {"n": raw}
    _check_keys("layers", raw, {"begin", "middle", "end", "n"})
    if "n" in raw:
        if "begin" in raw:
            raise SpecError("layers.n", "give layers.n or layers.begin, not both")
        raw = {**raw, "begin": raw["n"]}
    begin = _int("layers.begin", raw.get("begin", 0), 0)
    middle = _int("layers.middle", raw.get("middle", 0), 0)
    end = _int("layers.end", raw.get("end", 0), 0)
    if begin + middle + end == 0:
        raise SpecError("layers", "the model needs at least one layer")
    return LayerSplit(begin=begin, middle=middle, end=end)


def set_dotted(raw: dict[str, Any], key: str, value: Any) -> None:
    """raw["a"]["b"] = value for key "a.b", creating the sections on the way."""
    *path, leaf = key.split(".")
    node = raw
    for part in path:
        node = node.setdefault(part, {})
    node[leaf] = value


def _build_hyper(raw: Mapping[str, Any]) -> HyperSpec:
    _check_keys("hyper", raw, {f.name for f in fields(HyperSpec)})
    every = raw.get("every", "loop")
    if isinstance(every, int) and not isinstance(every, bool):
        every = _int("hyper.every", every, 1)
    else:
        every = _choice("hyper.every", every, EVERY_NAMES)
    return HyperSpec(
        streams=_int("hyper.streams", raw.get("streams", 4), 1),
        every=every,
        mixing=_choice("hyper.mixing", raw.get("mixing", "diagonal"), MIXINGS),
        sinkhorn_iters=_int("hyper.sinkhorn_iters", raw.get("sinkhorn_iters", 20), 1),
        loop_embedding=_bool("hyper.loop_embedding", raw.get("loop_embedding", False)),
        tanh=_bool("hyper.tanh", raw.get("tanh", True)),
        read=_choice("hyper.read", raw.get("read", "delta"), READS),
        init=_choice("hyper.init", raw.get("init", "home"), HYPER_INITS),
    )


def _build(raw: Mapping[str, Any]) -> ArchSpec:
    d_model = _int("d_model", raw.get("d_model", 256), 1)
    n_heads = _int("n_heads", raw.get("n_heads", 4), 1)
    n_kv = _int("n_kv_heads", raw.get("n_kv_heads") or n_heads, 1)
    if raw.get("head_dim") is None:
        if d_model % n_heads:
            raise SpecError("d_model", f"d_model {d_model} is not divisible by n_heads {n_heads}")
        head_dim = d_model // n_heads
    else:
        head_dim = _int("head_dim", raw["head_dim"], 1)
    if n_heads % n_kv:
        raise SpecError("n_kv_heads", f"n_heads {n_heads} is not divisible by n_kv_heads {n_kv}")
    if head_dim % 2:
        raise SpecError("head_dim", f"head_dim {head_dim} must be even for rotary embeddings")
    layers = _build_layers(raw.get("layers", {"begin": 4}))
    loops = _int("loops", raw.get("loops", 1), 1)
    eval_loops = raw.get("eval_loops") or []
    if not isinstance(eval_loops, (list, tuple)):
        raise SpecError("eval_loops", f"expected a list of loop counts, got {eval_loops!r}")
    eval_loops = tuple(_int(f"eval_loops[{i}]", r, 1) for i, r in enumerate(eval_loops))
    injection = _choice("injection", raw.get("injection", "none"), INJECTIONS)
    residual_from = _int("loop_residual_from", raw.get("loop_residual_from", 0), 0)
    if residual_from and injection != "residual":
        raise SpecError("loop_residual_from", f"the inter-iteration residual is AbbIE-D's (injection: residual), got injection: {injection}")
    hyper = _build_hyper(raw["hyper"]) if raw.get("hyper") is not None else None
    lora_rank = _int("lora_rank", raw.get("lora_rank", 0), 0)

    if layers.middle == 0 and (loops > 1 or injection != "none" or lora_rank or eval_loops):
        what = ("loops > 1" if loops > 1 else f"injection: {injection}" if injection != "none"
                else "lora_rank > 0" if lora_rank else "eval_loops")
        raise SpecError("layers.middle", f"layers.middle must be > 0 when {what}")
    if injection == "hyper" and hyper is None:
        raise SpecError("hyper", "injection: hyper needs a hyper section (streams, every, mixing)")
    if hyper is not None:
        _check_hyper(hyper, layers, loops, injection)

    spec = ArchSpec(
        family=raw.get("family", "transformer"), vocab_size=_int("vocab_size", raw.get("vocab_size", 8192), 2),
        d_model=d_model, n_heads=n_heads, n_kv_heads=n_kv, head_dim=head_dim,
        tie_embeddings=_bool("tie_embeddings", raw.get("tie_embeddings", True)),
        rope_theta=_float("rope_theta", raw.get("rope_theta", 10000.0), 0.0),
        norm_eps=_float("norm_eps", raw.get("norm_eps", 1e-5), 0.0),
        ffn=_build_ffn(raw.get("ffn", {}), d_model), layers=layers, loops=loops,
        eval_loops=eval_loops, injection=injection, loop_residual_from=residual_from, hyper=hyper,
        lora_rank=lora_rank,
    )
    return spec


def _check_hyper(h: HyperSpec, layers: LayerSplit, loops: int, injection: str) -> None:
    looped = is_looped(layers, loops, injection)
    if looped and injection != "hyper":
        raise SpecError("injection", f"a looped model with a hyper section needs injection: hyper, got {injection}")
    if h.every == "loop" and not looped:
        raise SpecError("hyper.every", "every: loop needs a looped middle block (layers.middle > 0, loops > 1)")
    if h.loop_embedding and h.every != "loop":
        raise SpecError("hyper.loop_embedding", f"the loop embedding is added at loop-level connections; needs every: loop, got {h.every}")
    if h.read == "block" and h.every == "sublayer":
        raise SpecError("hyper.read", "read: block adds a span's whole output; a sublayer connection adds its branch (read: delta)")
    if not h.tanh and h.mixing != "dynamic":
        raise SpecError("hyper.tanh", f"tanh squashes the dynamic part of HC (mixing: dynamic); mixing {h.mixing} has none")
    if h.mixing in ("static", "dynamic") and h.every == "loop":
        raise SpecError("hyper.mixing", f"{h.mixing} hyper-connections (Zhu et al.) wrap sublayers or layers, not loops")
    span = h.span_layers
    if span is not None:
        region = layers.middle * loops if looped else layers.unique
        if region % span:
            where = f"{layers.middle} x {loops} unrolled middle layers" if looped else f"{region} layers"
            raise SpecError("hyper.every", f"every {span} layers does not divide the {where}")


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

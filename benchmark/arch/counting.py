"""Analytic parameter and FLOP accounting: no model is built. `count_params` equals
`param_components(build_model(spec))` exactly, component by component (a test checks it over
every family and a hypothesis sample of specs).

Components (docs/architectures.md "Counting"): embedding, head (0 when tied), attention, ffn, norm, hyper,
loop_embedding, lora, injection (Depth's 2d -> d projection). The count rules (COUNTS), each
the parameters one paper counts as a model's size, and what a budget may count (`count:`):

  total                every tensor once (HC Table 7: OLMo-1B's 1.17676442B includes its tied
                       embedding)
  non_embedding        total - embedding - head (the hourglass paper, Liao et al. §4.1)
  non_embedding_head   non_embedding + the untied LM head (Hyperloop App. A: "we use a
                       weight-untied unembedding matrix and include its number of parameters";
                       Table 1's 135.5M = 102.8M + 32.8M); equals non_embedding when tied

The hourglass paper's "Attention/FFN size" are `attention` and `ffn`.
"""

from __future__ import annotations

from typing import Any, Mapping

from benchmark.arch.spec import ArchSpec, hyper_spans
from benchmark.store import COUNTS as COUNTS  # the rules' names, with the row columns they fill


def with_counts(components: Mapping[str, int], total: int) -> dict[str, int]:
    """The components plus every count rule of COUNTS (`total` given: each tensor once)."""
    non_embedding = total - components["embedding"] - components["head"]
    return {
        **components,
        "total": total,
        "non_embedding": non_embedding,
        "non_embedding_head": non_embedding + components["head"],
    }


def _spec(spec: ArchSpec | Mapping[str, Any]) -> ArchSpec:
    return spec if isinstance(spec, ArchSpec) else ArchSpec.from_dict(spec)


def _attention_shapes(s: ArchSpec) -> list[tuple[int, int]]:
    """(in, out) of q, k, v, o."""
    d = s.d_model
    return [(d, s.q_dim), (d, s.kv_dim), (d, s.kv_dim), (s.q_dim, d)]


def _ffn_shapes(s: ArchSpec) -> list[tuple[int, int]]:
    """(in, out) of every SwiGLU projection in one layer's FFN (K sub-blocks of w1, w3, w2)."""
    d, w = s.d_model, s.ffn.width
    return [(d, w), (d, w), (w, d)] * s.ffn.depth


def _gate_params(s: ArchSpec, index: int) -> int:
    h, n, d = s.hyper, s.hyper.streams, s.d_model
    if h.mixing in ("static", "dynamic"):  # HC App. B, eq. 21 and 25 (|θ_norm| = 0)
        static = n * (n + 2)
        return static + (d * (n + 2) + 2 if h.mixing == "dynamic" else 0)
    n_res = {"identity": 0, "diagonal": n, "sinkhorn": n * n}[h.mixing]
    rows = 2 * n + n_res  # W_pre, W_post, W_res stacked
    return rows * n * d + rows + (3 if n_res else 2)  # weights, biases, α's


def count_params(spec: ArchSpec | Mapping[str, Any]) -> dict[str, int]:
    s = _spec(spec)
    d, L = s.d_model, s.layers.unique
    attn = sum(i * o for i, o in _attention_shapes(s))
    ffn = sum(i * o for i, o in _ffn_shapes(s))
    lora_per_layer = s.lora_rank * sum(i + o for i, o in _attention_shapes(s) + _ffn_shapes(s))
    c = {
        "embedding": s.vocab_size * d,
        "head": 0 if s.tie_embeddings else s.vocab_size * d,
        "attention": attn * L,
        "ffn": ffn * L,
        "norm": d * (L * (1 + s.ffn.depth) + 1),  # attn norm + one per FFN sub-block, final
        "hyper": sum(_gate_params(s, i) for i in range(len(hyper_spans(s)))),
        "loop_embedding": s.loops * d if s.hyper is not None and s.hyper.loop_embedding else 0,
        "lora": lora_per_layer * s.layers.middle * s.loops,
        "injection": 2 * d * d if s.injection == "concat" else 0,
    }
    return with_counts(c, sum(c.values()))


def _hyper_flops(s: ArchSpec, loops: int) -> int:
    """Multiply-adds of the connections: gate projections, read-out (H_pre Y), stream mixing
    (H_res Y) and write-back (H_post ⊗ Δ), x2 for FLOPs."""
    h = s.hyper
    if h is None:
        return 0
    n, d = h.streams, s.d_model
    if h.mixing in ("static", "dynamic"):
        gate = n * d * (n + 2) if h.mixing == "dynamic" else 0
        mix = n * n * d
    else:
        n_res = {"identity": 0, "diagonal": n, "sinkhorn": n * n}[h.mixing]
        gate = n * d * (2 * n + n_res)
        mix = {"identity": 0, "diagonal": n * d, "sinkhorn": n * n * d}[h.mixing]
    per_connection = gate + n * d + mix + n * d
    return 2 * per_connection * len(hyper_spans(s, loops))


def forward_flops(
    spec: ArchSpec | Mapping[str, Any], seq_len: int, loops: int | None = None
) -> int:
    """Forward FLOPs per token (2 x multiply-adds) at `loops` middle iterations: every linear map,
    attention scores and values over the causal context (mean length (T+1)/2), the LM head,
    LoRA adapters, Depth's injection and hyper-connection mixing. Norms, activations, softmax
    and Sinkhorn's elementwise steps are not counted (as in Kaplan et al. and HC Table 8)."""
    s = _spec(spec)
    r = s.loops if loops is None else loops
    if s.hyper is not None and not s.looped:  # mHC / HC wrap the whole stack once
        r = 1
    layers = s.unrolled_layers(r)  # otherwise the middle block runs r times
    ctx = (seq_len + 1) / 2
    per_layer = (
        2 * sum(i * o for i, o in _attention_shapes(s) + _ffn_shapes(s)) + 2 * 2 * s.q_dim * ctx
    )  # QK^T and AV
    lora = 2 * s.lora_rank * sum(i + o for i, o in _attention_shapes(s) + _ffn_shapes(s))
    lora *= s.layers.middle * r
    inject = 2 * 2 * s.d_model * s.d_model * r if s.injection == "concat" else 0
    head = 2 * s.d_model * s.vocab_size
    return int(round(per_layer * layers + lora + inject + head + _hyper_flops(s, r)))


def count_flops(spec: ArchSpec | Mapping[str, Any], seq_len: int) -> dict[str, Any]:
    """FLOPs per token: `forward` at the training loop count; `train` = 3 x forward (backward
    costs twice the forward); `infer` = forward; `infer_by_loops` at each `eval_loops` value."""
    s = _spec(spec)
    fwd = forward_flops(s, seq_len)
    return {
        "forward": fwd,
        "train": 3 * fwd,
        "infer": fwd,
        "infer_by_loops": {r: forward_flops(s, seq_len, r) for r in s.eval_loops},
    }

"""What a model does inside, as data (plots come elsewhere). From the seed papers:

  cross_loop_similarity(model, idx)       Hyperloop Fig. 3: cosine similarity of the residual
                                          stream between every pair of effective layers; and
                                          Table 8: the same middle layer compared across loops
  logit_lens(model, idx, targets)         Hyperloop Fig. 4: cross-entropy, entropy and greedy
                                          accuracy of every layer's stream read by the LM head
  fixed_point_distances(model, idx, K)    AbbIE §4.1 / Fig. 4: ||h_k - h_{k-1}|| / ||h_{k-1}||
                                          of the middle block's state, iterations k = 1..K
  hyper_diagnostics(model, idx)           whether hyper-connections act: stream similarity,
                                          |H_res - I|, loop-embedding norm, gate saturation
                                          (the DIAGNOSTICS columns of every results row)

Which tensor is "the residual stream" after an effective layer (`layer_states`):
  * Without hyper-connections: the layer's output, as the model's trace records it. For AbbIE-D
    the trace holds, at a loop's last layer, the block's output B(h) before the inter-iteration
    residual h is added (AbbIE eq. 4).
  * Whole-layer hyper-connections (Hyperloop: one per loop). The trace holds the n streams only
    where a connection closes; the layers inside it are read with forward hooks. `inner` (Fig. 3,
    Table 8: "inner residual streams") is the layer's own output, the intra-loop stream the next
    layer reads. `outer` (Fig. 4: the "outer" streams) is Hyperloop's footnote 5 "early merge":
    the streams as if the connection closed right after that layer,
        Y_i = H_res Y + H_post ⊗ (F_i + e_l)               (Hyperloop eq. 3)
    with F_i = h_i (`hyper.read: block`) or h_i - u (`delta`), which at the loop's last layer is
    exactly the connection's output.
  * n streams (B, T, n, d) are averaged into one (B, T, d): the read-out the model itself makes
    before its end block and head (Hyperloop §3, mHC), so the lens at the last layer is the
    model's own prediction. Sublayer-level connections (mHC, HC) are read per layer this way.
"""

from __future__ import annotations

import itertools
from contextlib import contextmanager
from dataclasses import dataclass

import torch
import torch.nn.functional as F

from benchmark.arch import hyper_spans
from benchmark.models import LanguageModel
from benchmark.models.hyper import SigmoidGate, hyper_connect, res_matrix
from benchmark.models.lm import span_output
from benchmark.store import DIAGNOSTICS


@dataclass(frozen=True)
class Similarity:
    names: tuple[str, ...]  # effective layers, in depth order
    matrix: torch.Tensor  # (L, L) cosine similarity, averaged over tokens (Fig. 3)
    cross_loop: float | None  # Table 8; None without two loops to compare


@dataclass(frozen=True)
class LogitLens:
    names: tuple[str, ...]
    cross_entropy: torch.Tensor  # (L,) nats per token
    entropy: torch.Tensor  # (L,) nats, of the predicted next-token distribution
    accuracy: torch.Tensor  # (L,) argmax == target


@contextmanager
def _inference(model: LanguageModel):
    """Eval mode (Depth draws its initial state from a fixed generator there) and no gradients;
    the model's mode is restored after."""
    was_training = model.training
    model.eval()
    try:
        with torch.no_grad():
            yield
    finally:
        model.train(was_training)


@contextmanager
def _hooks(handles):
    try:
        yield
    finally:
        for h in handles:
            h.remove()


def _loop_embedding(model: LanguageModel, loop: int | None) -> torch.Tensor | None:
    """e_l for a loop; loops beyond those trained reuse the last one (as the model does)."""
    if model.loop_emb is None or loop is None:
        return None
    return model.loop_emb[min(loop, model.spec.loops - 1)]


def _span_recorder(model: LanguageModel, outer: bool, spans: list):
    """Hooks that append, per whole-layer hyper-connection, the list of (name, (B, T, d)) states
    of the layers inside it; no hooks for models without such connections."""
    hyper = model.spec.hyper
    if hyper is None or hyper.every == "sublayer":
        return []
    parts = {
        id(b): (part, i)
        for part in ("begin", "middle", "end")
        for i, b in enumerate(getattr(model, part))
    }
    spanned = model.middle if model.spec.looped else [*model.begin, *model.middle, *model.end]

    def open_span(gate, args):
        spans.append((gate, args[0], []))  # the streams Y entering it

    def after_layer(block, args, h):
        gate, Y, states = spans[-1]
        (part, i), loop = parts[id(block)], args[2]
        state = h
        if outer:  # early merge; gate.forward skips the hook above
            state = hyper_connect(
                gate,
                Y,
                lambda u: span_output(hyper.read, h, u),
                _loop_embedding(model, loop),
                gates=gate.forward(Y),
            ).mean(dim=-2)
        states.append((f"{part}.{i}" if loop is None else f"{part}.{loop}.{i}", state))

    return [g.register_forward_pre_hook(open_span) for g in model.hyper] + [
        b.register_forward_hook(after_layer) for b in spanned
    ]


def layer_states(
    model: LanguageModel, idx: torch.Tensor, *, loops: int | None = None, outer: bool = False
) -> list[tuple[str, torch.Tensor]]:
    """(name, (B, T, d)) for the residual stream after every effective layer, in depth order; the
    names are the model's trace names, with a hyper-connection's layers named as in a looped model
    (middle.<loop>.<i>). See the module docstring for inner / outer."""
    trace, spans = [], []
    with _inference(model), _hooks(_span_recorder(model, outer, spans)):
        model(idx, loops=loops, trace=trace)
    inside = iter(spans)
    states = []
    for name, x in trace:  # x: (B, T, d) or (B, T, n, d)
        if name.startswith("hyper.") and spans:
            states.extend(next(inside)[2])
        else:
            states.append((name, x.mean(dim=-2) if x.dim() == 4 else x))
    return states


def cross_loop_similarity(
    model: LanguageModel, idx: torch.Tensor, *, loops: int | None = None
) -> Similarity:
    """Hyperloop Fig. 3 and Table 8 from the inner residual stream of every effective layer."""
    states = layer_states(model, idx, loops=loops)
    names = tuple(n for n, _ in states)
    U = F.normalize(torch.stack([x.float() for _, x in states]), dim=-1).flatten(
        1, 2
    )  # (L, B*T, d)
    matrix = torch.einsum("and,bnd->ab", U, U) / U.shape[1]  # (L, L)
    return Similarity(names=names, matrix=matrix, cross_loop=_cross_loop(names, matrix))


def _cross_loop(names: tuple[str, ...], matrix: torch.Tensor) -> float | None:
    """Table 8: the mean over middle layers i and loop pairs l < l' of sim(middle.l.i, middle.l'.i)."""
    by_layer: dict[str, list[int]] = {}
    for a, name in enumerate(names):
        part, *rest = name.split(".")
        if part == "middle" and len(rest) == 2:
            by_layer.setdefault(rest[1], []).append(a)
    pairs = [matrix[a, b] for rows in by_layer.values() for a, b in itertools.combinations(rows, 2)]
    return torch.stack(pairs).mean().item() if pairs else None


def logit_lens(
    model: LanguageModel, idx: torch.Tensor, targets: torch.Tensor, *, loops: int | None = None
) -> LogitLens:
    """Hyperloop Fig. 4: every layer's outer stream through the final norm and LM head (the logit
    lens of nostalgebraist 2020), scored against the next tokens `targets` (B, T)."""
    states = layer_states(model, idx, loops=loops, outer=True)
    ce, ent, acc = [], [], []
    with _inference(model):
        for _, x in states:
            logp = F.log_softmax(model._logits(x).float(), dim=-1)  # (B, T, vocab)
            ce.append(F.nll_loss(logp.flatten(0, 1), targets.flatten()))
            ent.append(-(logp.exp() * logp).sum(dim=-1).mean())
            acc.append((logp.argmax(dim=-1) == targets).float().mean())
    return LogitLens(
        names=tuple(n for n, _ in states),
        cross_entropy=torch.stack(ce),
        entropy=torch.stack(ent),
        accuracy=torch.stack(acc),
    )


def iteration_states(model: LanguageModel, idx: torch.Tensor, loops: int) -> list[torch.Tensor]:
    """The middle block's state entering each of `loops` iterations, h_0 .. h_{loops-1}, read
    where the model reads it, so no loop rule is restated here: the first middle layer's input
    (h = B(h); AbbIE-D's h = B(h) + h), the h half of Depth's input [e; h], or the streams Y
    (B, T, n, d) entering each loop's first hyper-connection (Hyperloop)."""
    spec = model.spec
    if not spec.looped:
        raise ValueError(f"{spec.family}: no looped middle block to iterate")
    every, read = 1, (lambda x: x)
    if spec.injection == "hyper":
        opener, every = list(model.hyper), len(hyper_spans(spec, 1))
        if any(first + k > spec.layers.middle for first, k, _ in hyper_spans(spec, 1)):
            raise ValueError(
                f"hyper.every {spec.hyper.every}: connections straddle loop boundaries"
            )
    elif spec.injection == "concat":
        opener, read = [model.inject], (lambda x: x[..., spec.d_model :])
    else:
        opener = [model.middle[0]]
    seen = []
    with (
        _inference(model),
        _hooks(
            [
                m.register_forward_pre_hook(lambda m, args: seen.append(read(args[0])))
                for m in opener
            ]
        ),
    ):
        model(idx, loops=loops)
    return seen[::every]


def fixed_point_distances(
    model: LanguageModel, idx: torch.Tensor, max_loops: int = 32
) -> torch.Tensor:
    """AbbIE §4.1 / Fig. 4: the distance between the input and output of every iteration,
    ||h_k - h_{k-1}|| / ||h_{k-1}||, per sequence: (B, max_loops), column k-1 for iteration k.
    The model runs max_loops + 1 iterations so that the last output is some iteration's input."""
    S = torch.stack(
        [h.float().flatten(1) for h in iteration_states(model, idx, max_loops + 1)]
    )  # (K+1, B, -)
    return ((S[1:] - S[:-1]).norm(dim=-1) / S[:-1].norm(dim=-1)).T


SATURATED = 0.01  # a sigmoid gate value below 0.01 or above 0.99 passes (almost) no gradient


def hyper_diagnostics(model: LanguageModel, idx: torch.Tensor) -> dict[str, float | None]:
    """Whether a model's hyper-connections act, on the tokens idx (B, T): the DIAGNOSTICS
    columns of every results row, None where the model has no such part.

      stream_cosine    mean cosine similarity of every pair of the n streams after the last
                       connection (1.0: the streams are copies; needs n > 1)
      hres_deviation   mean |H_res - I| per matrix entry, over tokens and connections
      loop_emb_norm    mean L2 norm of Hyperloop's loop embeddings e_l (they start at 0)
      gate_saturation  fraction of the sigmoid gate values (H_pre, H_post, diagonal H_res of mHC
                       and Hyperloop) below 0.01 or above 0.99
    """
    out = dict.fromkeys(DIAGNOSTICS)
    if model.loop_emb is not None:
        out["loop_emb_norm"] = model.loop_emb.detach().float().norm(dim=-1).mean().item()
    if model.spec.hyper is None:
        return out
    records = []

    def record(gate, args, result):
        records.append((gate, args[0], result))

    trace = []
    with _inference(model), _hooks([g.register_forward_hook(record) for g in model.hyper]):
        model(idx, trace=trace)
        Y = [x for name, x in trace if name.startswith("hyper.")][-1].float()  # (B, T, n, d)
        n = Y.shape[-2]
        if n > 1:
            U = F.normalize(Y, dim=-1)
            sim = torch.einsum("btid,btjd->ij", U, U) / (U.shape[0] * U.shape[1])
            out["stream_cosine"] = sim[~torch.eye(n, dtype=torch.bool)].mean().item()
        eye = torch.eye(n, device=Y.device)
        out["hres_deviation"] = (
            torch.stack([(res_matrix(g, r[2]).float() - eye).abs().mean() for g, _, r in records])
            .mean()
            .item()
        )
        sigmoids = [
            torch.sigmoid(z).flatten()
            for g, Yin, _ in records
            if isinstance(g, SigmoidGate)
            for z in g.logits(Yin)[: 2 if g.mixing != "diagonal" else 3]
        ]
        if sigmoids:
            v = torch.cat(sigmoids)
            out["gate_saturation"] = ((v < SATURATED) | (v > 1 - SATURATED)).float().mean().item()
    return out
